"""A fast MaskBench subset: real-world schemas and instances, walked token by token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from structspec.bench.grammar_bench import (
    format_table,
    run_grammar_bench,
    select_files,
    split_of,
)

MASKBENCH = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "maskbench"
needs_maskbench = pytest.mark.skipif(not MASKBENCH.is_dir(), reason=f"MaskBench data not found at {MASKBENCH}")


def test_split_names():
    assert split_of("Github_easy---o10094.json") == "Github_easy"
    assert split_of("BFCL_parallel_multiple_12.json") == "BFCL_parallel_multiple"
    assert split_of("Glaiveai2K---calculate_area_27950976.json") == "Glaiveai2K"


@needs_maskbench
def test_sampling_covers_every_split():
    files = select_files(MASKBENCH, limit=30)
    assert len(files) == 30
    assert len({split_of(f.name) for f in files}) >= 10


@needs_maskbench
def test_llguidance_subset(view):
    report = run_grammar_bench(MASKBENCH, "llguidance", view, limit=60)
    overall = report["overall"]
    assert overall["schemas"] == 60 and overall["crashed"] == 0 and overall["timed_out"] == 0
    assert overall["compiled"] >= 54
    assert overall["invalidation_errors"] == 0
    assert overall["validation_errors"] <= max(1, overall["valid_instances"] // 20)
    assert 0 < overall["ff_share"] < 1 and overall["mask_us_p50"] > 0
    json.dumps(report)  # the CLI writes it as JSON
    assert "overall" in format_table(report)


@needs_maskbench
def test_outlines_subset(view):
    report = run_grammar_bench(MASKBENCH, "outlines", view, split_prefix="BFCL_simple", limit=20)
    overall = report["overall"]
    assert overall["crashed"] == 0 and overall["compiled"] >= 18
    assert overall["invalidation_errors"] == 0


def test_keys_in_schema_order_and_instances_in_plain_tokens(view):
    """A valid instance written in another key order is a key-order error (outputs always follow the schema's
    order), counted apart from validation errors; special-token look-alikes are walked as plain text."""
    from structspec.bench.grammar_bench import _Tally, _Walk, _judge, _plain_tokens, schema_ordered, walk
    from structspec.grammar import GrammarCompiler
    from structspec.grammar.base import allocate_bitmask

    schema = {"type": "object", "properties": {"b": {"type": "integer"},
                                               "a": {"type": "array", "items": {"$ref": "#/$defs/p"}}},
              "required": ["b", "a"], "additionalProperties": False,
              "$defs": {"p": {"type": "object", "properties": {"y": {"type": "string"}, "x": {"type": "string"}},
                              "required": ["y", "x"], "additionalProperties": False}}}
    value = {"a": [{"x": "1", "y": "2"}], "b": 3}
    assert json.dumps(schema_ordered(value, schema)) == '{"b": 3, "a": [{"y": "2", "x": "1"}]}'
    grammar = GrammarCompiler(view).compile_schema(schema)
    bitmask = allocate_bitmask(1, view.n_vocab)
    words = bitmask.numpy().view("uint32")[0]
    as_written = walk(grammar.matcher(), view, json.dumps(value, separators=(",", ":")), bitmask, words)
    ordered = walk(grammar.matcher(), view, json.dumps(schema_ordered(value, schema), separators=(",", ":")),
                   bitmask, words)
    assert not as_written.accepted and ordered.accepted
    tally = _Tally()
    as_written.key_order = True
    assert _judge({"valid": True, "data": value}, as_written, schema, grammar.info, [tally], "f", lambda *a: None)
    assert (tally.key_order_errors, tally.validation_errors) == (1, 0)
    _judge({"valid": True, "data": value}, _Walk(accepted=False), schema, grammar.info, [tally], "f",
           lambda *a: None, strict=False)
    assert (tally.lenient_validation_errors, tally.validation_errors) == (1, 0)
    # plain tokens carry the same bytes and never use an id the grammar cannot produce
    from tests.grammar.conftest import END_OF_TURN

    data = f'{{"t":"<h1>{END_OF_TURN}</h1>"}}'.encode()
    special = view.tokenizer.convert_tokens_to_ids(END_OF_TURN)
    tokens = _plain_tokens(view, data)
    assert special in view.encode_bytes(data)  # what the tokenizer gives: an id with no bytes to the grammar
    assert special not in tokens and all(view.token_bytes[t] for t in tokens)
    assert b"".join(view.token_bytes[t] for t in tokens) == data
