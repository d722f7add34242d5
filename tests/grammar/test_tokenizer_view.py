"""TokenizerView: fingerprint, vocabulary sizes, EOS; and the shipped demo tokenizer when present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from structspec.grammar import GrammarCompiler, TokenizerView

from .conftest import END_OF_TURN, accepts, allowed

DEMO = Path(__file__).resolve().parents[2] / "structspec" / "models" / "demo" / "target"


def test_fingerprint_is_stable_and_covers_the_vocabulary_size(tokenizer, view):
    assert TokenizerView(tokenizer, n_vocab=view.n_vocab).fingerprint == view.fingerprint
    assert TokenizerView(tokenizer).fingerprint != view.fingerprint
    assert TokenizerView(tokenizer, n_vocab=view.n_vocab, eos_token_ids=[1]).fingerprint != view.fingerprint


def test_sizes_and_eos(tokenizer, view):
    assert view.n_vocab == len(tokenizer) + 45 and view.mask_words == (view.n_vocab + 31) // 32
    assert view.eos_token_ids == (tokenizer.eos_token_id,)
    assert view.ll_tokenizer.vocab_size == view.n_vocab
    with pytest.raises(ValueError):
        TokenizerView(tokenizer, n_vocab=len(tokenizer) - 1)


def test_token_bytes_round_trip(view):
    text = '{"city":"Zürich"}'
    ids = view.encode(text)
    assert b"".join(view.token_bytes[i] for i in ids) == text.encode() == view.decode_bytes(ids)
    assert view.token_bytes[view.eos_token_id] == b""  # special tokens never match grammar text
    assert view.encode_bytes(text.encode()[:12]) == view.encode('{"city":"Zü')[: len(view.encode_bytes(text.encode()[:12]))]


def test_several_eos_ids_all_end_a_sequence(tokenizer, backend):
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    view = TokenizerView(tokenizer, eos_token_ids=[tokenizer.eos_token_id, end])
    matcher = GrammarCompiler(view, backend=backend).compile_schema({"type": "boolean"}).matcher()
    assert matcher.consume(view.encode("true"))
    assert {view.eos_token_id, end} <= allowed(matcher, view)
    assert matcher.consume([end]) and matcher.is_stopped()


@pytest.mark.skipif(not DEMO.is_dir(), reason="the shipped demo tokenizer is not built (structspec/models/demo/target)")
def test_demo_tokenizer_compiles_the_builtin_schemas(backend):
    from transformers import AutoTokenizer

    from structspec.schemas import load_builtin_schemas

    tokenizer = AutoTokenizer.from_pretrained(DEMO)
    config = json.loads((DEMO / "config.json").read_text())
    view = TokenizerView(tokenizer, n_vocab=config.get("vocab_size", len(tokenizer)))
    compiler = GrammarCompiler(view, backend=backend)
    summary = compiler.compile_schema(load_builtin_schemas()["summary"])
    assert accepts(summary, view, '{"kind":"invoice","summary":"Three items, 42 EUR in total."}')
    for schema in load_builtin_schemas().values():
        assert compiler.compile_schema(schema).matcher().error is None
