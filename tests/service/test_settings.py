"""Settings: precedence flags > env > file > defaults, validation, secrets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from structspec.service.settings import SECRET_FIELDS, Secret, ServiceSettings, SettingsError, load_settings, settings_fields


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings(env={})
    assert (s.profile, s.device, s.port, s.metrics_port, s.speculation) == ("gemma-3-270m", "auto", 50051, 9464, "policy")
    assert s.host == "127.0.0.1" and s.tokens() == frozenset() and not s.tls_enabled


def test_precedence(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.toml", 'port = 1000\nmax_batch = 4\nlog-level = "debug"\n[serve]\nprofile = "gemma-3-270m"\ndata_dir = "state"\n')
    env = {"STRUCTSPEC_PORT": "2000", "STRUCTSPEC_MAX_QUEUE": "9", "STRUCTSPEC_REGISTER_BUILTIN_SCHEMAS": "false"}
    s = load_settings(cfg, overrides={"port": 3000, "max_queue": None}, env=env)
    assert s.port == 3000  # flag beats env and file
    assert s.max_queue == 9  # env beats default; a None flag means "not given"
    assert s.max_batch == 4 and s.profile == "gemma-3-270m" and s.log_level == "DEBUG"  # file
    assert s.data_dir == tmp_path / "state"  # relative to the file
    assert s.register_builtin_schemas is False
    assert load_settings(env={**env, "STRUCTSPEC_CONFIG": str(cfg)}).port == 2000  # env beats file


def test_errors_name_the_source(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="STRUCTSPEC_PORT"):
        load_settings(env={"STRUCTSPEC_PORT": "many"})
    with pytest.raises(SettingsError, match="unknown setting 'prot'"):
        load_settings(write(tmp_path / "a.toml", "prot = 1\n"), env={})
    with pytest.raises(SettingsError, match="token values"):
        load_settings(write(tmp_path / "b.toml", 'auth_token = "x"\n'), env={})
    with pytest.raises(SettingsError) as err:
        load_settings(env={}, overrides={"device": "tpu", "kv_budget_tokens": 0, "tls_cert_file": str(tmp_path / "nope.pem")})
    text = str(err.value)
    assert "device" in text and "kv_budget_tokens: must be >= 1" in text and "tls_key_file" in text and "not a readable file" in text
    with pytest.raises(SettingsError, match="mutual TLS"):
        ServiceSettings(tls_client_ca_file=write(tmp_path / "ca.pem", "x")).validate()


def test_engine_config_is_built_in_one_place_with_the_engines_defaults() -> None:
    from structspec.engine.config import EngineConfig, SchedulerLimits
    from structspec.speculation.configs import SPECULATION_CONFIGS

    built = load_settings(env={}).engine_config()
    assert built.step_profile_dir == str(load_settings(env={}).data_dir / "step-costs")  # the server's data directory
    assert dataclasses.replace(built, step_profile_dir="") == EngineConfig()  # each default is written once, in the engine
    s = load_settings(env={}, overrides={"max_queue": 3, "max_batch": 2, "kv_budget_tokens": 999, "speculation": "ff",
                                         "max_batch_for_speculation": 4, "prefix_cache_tokens": 0, "profile": "demo"})
    config = s.engine_config()
    assert config.profile == "demo" and config.speculation == "ff"
    assert config.limits == SchedulerLimits(max_batch=2, max_queue=3, kv_budget_tokens=999, max_spec_batch=4,
                                            prefix_cache_tokens=0)
    choices = next(f for f in dataclasses.fields(ServiceSettings) if f.name == "speculation").metadata["choices"]
    assert tuple(choices) == tuple(SPECULATION_CONFIGS)  # one registry of configuration names
    with pytest.raises(SettingsError, match="speculation"):
        load_settings(env={}, overrides={"speculation": "ngram-only"})


def test_policy_settings_reach_the_engine_config_and_are_checked_by_it() -> None:
    from structspec.engine.config import PolicyConfig

    s = load_settings(env={"STRUCTSPEC_PROBE_RATE": "0.1"}, overrides={
        "acceptance_threshold": 0.7, "min_evidence_tokens": 100, "acceptance_half_life_hours": 1.5,
        "min_predicted_length": 4, "draft_model_max_batch": 8, "gain_margin": 0.1})
    policy = s.engine_config().policy
    assert policy == PolicyConfig(acceptance_threshold=0.7, min_evidence_tokens=100, half_life_hours=1.5,
                                  min_predicted_length=4, draft_model_max_batch=8, probe_rate=0.1, gain_margin=0.1,
                                  max_draft=s.engine_config().limits.max_draft)
    with pytest.raises(SettingsError) as err:
        load_settings(env={}, overrides={"acceptance_threshold": 1.5, "acceptance_half_life_hours": 0,
                                         "probe_rate": -1, "stats_refresh_seconds": 0})
    text = str(err.value)
    assert "acceptance_threshold: must be in [0, 1]" in text and "probe_rate" in text
    assert "acceptance_half_life_hours: must be > 0" in text  # the setting's name, not the engine field's
    assert "stats_refresh_seconds: must be > 0" in text
    d = load_settings(env={})
    assert (d.stats_flush_interval_seconds, d.stats_refresh_seconds, d.max_batch_for_speculation) == (1.0, 30.0, 64)


def test_tokens_and_secrets(tmp_path: Path) -> None:
    f = write(tmp_path / "t", "a\n\n# comment\nb\n")
    s = load_settings(env={"STRUCTSPEC_AUTH_TOKEN": "c", "STRUCTSPEC_ADMIN_TOKEN": "s3cr3t-adm"}, overrides={"auth_token_file": str(f)})
    assert s.tokens() == {"a", "b", "c"} and s.admin_tokens() == {"s3cr3t-adm"}
    assert isinstance(s.auth_token, Secret) and "s3cr3t" not in repr(s) and s.public_dict()["admin_token"] == "***"


def test_every_field_documented() -> None:
    for f in settings_fields():
        assert f.metadata.get("help"), f.name
    assert SECRET_FIELDS <= {f.name for f in settings_fields()}
