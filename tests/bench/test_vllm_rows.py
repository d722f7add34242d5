"""What the decode benchmark's vLLM rows load (no vLLM needed): with dummy weights, the own engine's, as a folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from structspec.bench.vllm_rows import VllmModel, dummy_weights_folder, vllm_config, vllm_model
from structspec.engine.config import VllmOptions
from structspec.models.loading import load_profile
from structspec.models.profiles import DEMO_DIR

TINY = Path(__file__).resolve().parents[2] / "bench" / "device_configs" / "tiny"
TOKENIZER = str(DEMO_DIR / "target")


def test_dummy_weights_reach_vllm_as_the_own_engines_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    models = load_profile(str(TINY), tokenizer=TOKENIZER, load_format="dummy", with_draft=False)
    model = vllm_model(str(TINY), TOKENIZER, "dummy", models)
    assert model == VllmModel(str(tmp_path / f"structspec-{models.identity}-float32"), TOKENIZER, "auto", "tiny")
    saved = AutoModelForCausalLM.from_pretrained(model.profile, dtype=torch.float32)
    ours = models.target.state_dict()
    assert all(torch.equal(t, ours[name]) for name, t in saved.state_dict().items())  # the same weights
    assert [p.name for p in tmp_path.iterdir()] == [Path(model.profile).name]  # nothing half-written left

    def never(*_args, **_kwargs):
        raise AssertionError("written twice")

    monkeypatch.setattr(models.target, "save_pretrained", never)
    assert dummy_weights_folder(models.target, models.identity, "float32") == model.profile  # reused
    config = vllm_config("vllm:ngram", model, "float32", VllmOptions(), None, 4)
    assert (config.profile, config.tokenizer, config.load_format, config.served_name) == \
        (model.profile, TOKENIZER, "auto", "tiny")
    assert config.vllm.speculative_config and config.speculation == "off"


def test_stored_weights_reach_vllm_as_they_are():
    assert vllm_model("demo", "", "auto", None) == VllmModel("demo")
    config = vllm_config("vllm:off", VllmModel("demo"), "float32", VllmOptions(speculative_config="{}"), None, 1)
    assert (config.profile, config.load_format, config.vllm.speculative_config) == ("demo", "auto", "")


def test_a_failed_write_leaves_nothing(tmp_path):
    class Broken:
        def save_pretrained(self, folder):
            (Path(folder) / "config.json").write_text("{}")
            raise OSError("disk full")

    with pytest.raises(OSError):
        dummy_weights_folder(Broken(), "dummy-x", "float32", root=tmp_path)
    assert list(tmp_path.iterdir()) == []
