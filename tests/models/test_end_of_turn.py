"""Where a model's end-of-turn ids are read: a folder's generation_config (else config), a GGUF's EOS, EOT and EOM
metadata, the tokenizer's EOS; and what loading hands the engine (``LoadedModels.end_of_turn_ids``)."""

from __future__ import annotations

import json
import os

import pytest

from structspec.models.end_of_turn import as_id_set, declared_ids, end_of_turn_ids, folder_ids
from structspec.models.gguf_export import export_gguf
from structspec.models.loading import gguf_for, load_profile
from tests.conftest import need_llamacpp
from tests.engine.test_end_of_turn import FAMILIES, chain_model, family_tokenizer, save_folder, words


class _Tok:
    def __init__(self, eos):
        self.eos_token_id = eos


def test_an_eos_field_is_one_id_or_a_list():
    assert declared_ids(128009) == (128009,)
    assert declared_ids([128001, 128008, 128009]) == (128001, 128008, 128009)
    assert declared_ids(None) == declared_ids("1") == declared_ids(True) == declared_ids([-1]) == ()


def test_a_folder_declares_its_generation_configs_ids_else_its_configs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert folder_ids(tmp_path) == (1,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 106]}))  # Gemma 3 it
    assert folder_ids(tmp_path) == (1, 106)
    multimodal = tmp_path / "mm"
    multimodal.mkdir()
    (multimodal / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": [1, 106]}}))
    assert folder_ids(multimodal) == (1, 106)
    assert folder_ids(tmp_path / "missing") == folder_ids(None) == folder_ids(tmp_path / "mm" / "config.json") == ()


def test_the_tokenizers_eos_comes_first_each_id_once_and_none_past_the_logits():
    assert end_of_turn_ids(_Tok(32000), (32007, 32001, 32000)) == (32000, 32007, 32001)  # Phi-3.5
    assert end_of_turn_ids(_Tok(128009), (128001, 128008, 128009), (128009,)) == (128009, 128001, 128008)  # Llama 3
    assert end_of_turn_ids(_Tok(2), (2, 50), n_vocab=49) == (2,)
    assert end_of_turn_ids(_Tok(None), ()) == ()
    assert as_id_set(3) == as_id_set([3, 3]) == frozenset({3})
    with pytest.raises(ValueError):
        as_id_set(())


@pytest.mark.parametrize("family,expected", [
    ("llama3", ("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>")),
    ("gemma3-it", ("<eos>", "<end_of_turn>")),
    ("phi3.5", ("<|endoftext|>", "<|end|>", "<|assistant|>")),
])
def test_a_folder_model_loads_with_every_declared_end_of_turn(tmp_path, family, expected):
    models = load_profile(str(save_folder(tmp_path / family, FAMILIES[family], FAMILIES[family].eos)))
    assert tuple(models.tokenizer.convert_ids_to_tokens(list(models.end_of_turn_ids))) == expected


def test_a_gguf_loads_with_its_eos_eot_and_eom_metadata(tmp_path):
    need_llamacpp()
    from structspec.models.llamacpp_model import LlamaCppModel

    family = FAMILIES["llama3"]
    tok = family_tokenizer(tmp_path / "tokenizer", family)  # the tokenizer alone: its EOS is <|eot_id|>
    ids = tok.convert_tokens_to_ids(["<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"])
    path = tmp_path / "llama3.gguf"
    export_gguf(chain_model(tok, [*words(tok), ids[1]]), path, eos_token_id=ids[0], eot_token_id=ids[1],
                eom_token_id=ids[2])
    assert LlamaCppModel(path).info.end_of_turn_ids == tuple(ids)
    models = load_profile(str(path), tokenizer=str(tmp_path / "tokenizer"), executor="llamacpp")
    assert models.end_of_turn_ids == (ids[1], ids[0], ids[2])
    export_gguf(chain_model(tok, [*words(tok), ids[1]]), tmp_path / "bare.gguf")
    assert LlamaCppModel(tmp_path / "bare.gguf").info.end_of_turn_ids == ()


def test_a_folder_whose_config_lists_its_eos_ids_converts_for_llamacpp(tmp_path, monkeypatch):
    need_llamacpp()
    monkeypatch.setenv("STRUCTSPEC_CACHE_DIR", str(tmp_path / "cache"))
    folder = save_folder(tmp_path / "llama3", FAMILIES["llama3"], "<|eot_id|>")
    config = json.loads((folder / "config.json").read_text())
    # Llama 3.1 Instruct's config.json lists them as its generation_config does
    config["eos_token_id"] = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    assert os.path.isfile(gguf_for(str(folder)))
    models = load_profile(str(folder), executor="llamacpp")
    tok = models.tokenizer
    assert set(models.end_of_turn_ids) == set(tok.convert_tokens_to_ids(list(FAMILIES["llama3"].declared)))
