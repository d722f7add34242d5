"""A model's content identity (``models.identity``): what its statistics key names besides the served name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from structspec.assembly import engine_model_key, history_model_key
from structspec.models import identity
from structspec.models.identity import DUMMY_PREFIX, dummy_identity, folder_digest, gguf_digest
from structspec.models.loading import gguf_identity, load_profile
from structspec.models.profiles import DEMO_DIR

DEMO_TARGET = DEMO_DIR / "target"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_CACHE_DIR", str(tmp_path / "cache"))


def _folder(path: Path, weights: bytes, config: str = '{"a": 1}') -> Path:
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(weights)
    (path / "config.json").write_text(config)
    return path


def test_a_folders_digest_follows_its_weights_and_config_not_its_path(tmp_path):
    a = folder_digest(_folder(tmp_path / "a" / "output", b"weights one"))
    assert folder_digest(_folder(tmp_path / "b" / "output", b"weights two")) != a  # a second fine-tune, same name
    assert folder_digest(_folder(tmp_path / "c" / "elsewhere", b"weights one")) == a  # the same weights, moved
    assert folder_digest(_folder(tmp_path / "d", b"weights one", '{"a": 2}')) != a


def test_a_digest_is_remembered_until_a_file_changes(tmp_path, monkeypatch):
    folder = _folder(tmp_path / "m", b"weights one")
    first = folder_digest(folder)
    reads = []
    real = identity._digest_files
    monkeypatch.setattr(identity, "_digest_files", lambda files: reads.append(files) or real(files))
    assert folder_digest(folder) == first and reads == []  # a restart reads no weights
    (folder / "model.safetensors").write_bytes(b"weights retrained")
    assert folder_digest(folder) != first and len(reads) == 1


def test_a_broken_memo_is_read_again(tmp_path):
    folder = _folder(tmp_path / "m", b"weights one")
    first = folder_digest(folder)
    (tmp_path / "cache" / "identities.json").write_text("{not json")
    assert folder_digest(folder) == first


def test_dummy_weights_and_ggufs_have_identities_of_their_own(tmp_path):
    folder = _folder(tmp_path / "m", b"weights one")
    assert dummy_identity(folder).startswith(DUMMY_PREFIX) and dummy_identity(folder) != folder_digest(folder)
    file = tmp_path / "model-Q4_K_M.gguf"
    file.write_bytes(b"GGUF" + b"x" * 100)
    other = tmp_path / "other" / "model-Q4_K_M.gguf"
    other.parent.mkdir()
    other.write_bytes(b"GGUF" + b"y" * 100)
    assert gguf_digest(gguf_identity(file)) != gguf_digest(gguf_identity(other))
    assert len(gguf_digest(gguf_identity(file))) == 12


def test_two_fine_tunes_served_from_output_keep_apart(tmp_path):
    one = tmp_path / "run1" / "output"
    two = tmp_path / "run2" / "output"
    shutil.copytree(DEMO_TARGET, one)
    shutil.copytree(DEMO_TARGET, two)
    weights = load_file(two / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01  # a second fine-tune: the same files, other weights
    save_file(weights, two / "model.safetensors", metadata={"format": "pt"})
    a, b = load_profile(str(one)), load_profile(str(two))
    assert a.profile == b.profile == "output"
    assert engine_model_key(a) != engine_model_key(b)
    assert history_model_key(a) != history_model_key(b)
    assert engine_model_key(a) == f"output@{a.identity}+plain-v5" == history_model_key(a)


def test_dummy_weights_never_write_into_the_real_weights_key(tmp_path):
    real = load_profile(str(DEMO_TARGET), served_name="demo-target")
    dummy = load_profile(str(DEMO_TARGET), served_name="demo-target", load_format="dummy")
    assert dummy.identity.startswith(DUMMY_PREFIX)
    assert engine_model_key(dummy) != engine_model_key(real)
    assert engine_model_key(real) == f"demo-target@{folder_digest(DEMO_TARGET)}+plain-v5"
