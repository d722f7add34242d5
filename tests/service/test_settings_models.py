"""The model settings (``--model``, ``--draft``, ``--tokenizer``, ``--served-model-name``, ``--chat-template``,
``--load-format``): what the engine is given, the served name ``/v1/models`` shows, the start-up refusal of a draft
of another tokenizer, and the model commands that take a path."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from structspec import cli
from structspec.cli import app
from structspec.models.profiles import DEMO_DIR, served_name_of
from structspec.service.settings import ServiceSettings, SettingsError, load_settings
from tests.models.test_sources import draft_with_another_tokenizer
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

DEMO_TARGET = str(DEMO_DIR / "target")
runner = CliRunner()


def test_model_wins_over_profile_and_the_rest_reaches_the_engine(tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    s = load_settings(env={"STRUCTSPEC_MODEL": "/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf"},
                      overrides={"profile": "demo", "draft": "/drafts/d", "tokenizer": "/tok",
                                 "chat_template": str(template)})
    config = s.engine_config()
    assert (config.profile, config.draft, config.tokenizer, config.chat_template, config.load_format) == (
        "/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf", "/drafts/d", "/tok", str(template), "auto")
    assert s.served_name == "Qwen2.5-7B-Instruct-Q4_K_M" and config.served_name == ""  # the default: by the path
    named = load_settings(env={}, overrides={"model": DEMO_TARGET, "served_model_name": "invoices"})
    assert (named.served_name, named.engine_config().served_name) == ("invoices", "invoices")
    assert load_settings(env={}, overrides={"profile": "demo"}).engine_config().profile == "demo"


@pytest.mark.parametrize("model", ["", "demo", "/models/x.Q4_K_M.gguf", DEMO_TARGET, DEMO_TARGET + "/"])
def test_the_served_name_is_the_models_own_rule(model: str) -> None:
    s = ServiceSettings(model=model, profile="gemma-3-270m")
    assert s.served_name == served_name_of(model or "gemma-3-270m")


def test_model_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(env={}, overrides={"model": "/models/x.gguf", "load_format": "dummy",
                                         "chat_template": str(tmp_path / "none.jinja")})
    text = str(err.value)
    assert "load_format: dummy builds a model folder's config" in text and "chat_template:" in text
    with pytest.raises(SettingsError, match="load_format: 'random' is not one of auto, dummy"):
        load_settings(env={}, overrides={"load_format": "random"})


def test_v1_models_shows_the_served_name(tmp_path: Path) -> None:
    for extra, name in (({"served_model_name": "invoices"}, "invoices"), ({}, "target")):
        settings = settings_for(tmp_path, http_port=0, model=DEMO_TARGET, **extra)
        with ServerThread(settings, FakeEngine()) as st:
            body = httpx.get(f"http://127.0.0.1:{st.server.http_port}/v1/models").json()
        assert [m["id"] for m in body["data"]] == [name]


def test_serve_refuses_a_draft_of_another_tokenizer_before_it_starts(tmp_path: Path) -> None:
    other = draft_with_another_tokenizer(tmp_path)
    result = runner.invoke(app, ["serve", "--model", DEMO_TARGET, "--draft", str(other), "--data-dir",
                                 str(tmp_path / "data"), "--port", "0", "--http-port", "-1", "--metrics-port", "-1"])
    assert result.exit_code == 2
    assert f"draft {other} does not share the tokenizer of target {DEMO_TARGET}" in result.output
    assert "vocab 4096 vs 4097 tokens" in result.output and "EOS id 0 vs 4096" in result.output


def test_model_commands_take_a_path(monkeypatch) -> None:
    monkeypatch.setattr(cli.console, "width", 400)  # the table's paths in full
    listed = runner.invoke(app, ["models", "list", "--model", DEMO_TARGET])
    assert listed.exit_code == 0 and "model folder" in listed.output and DEMO_TARGET in listed.output
    prepared = runner.invoke(app, ["models", "prepare", "--model", DEMO_TARGET, "--executor", "transformers"])
    assert prepared.exit_code == 0 and "target: ready for transformers" in prepared.output
    unknown = runner.invoke(app, ["models", "list", "--model", "no-such-model"])
    assert unknown.exit_code == 2 and "unknown model 'no-such-model'" in unknown.output
    for command in (["bench", "decode"], ["bench", "step"]):
        assert "--model" in runner.invoke(app, [*command, "--help"], terminal_width=200).output
