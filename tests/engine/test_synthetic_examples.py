"""Worked examples synthesised from a schema alone (the default for schemas and tool lists that bring none)."""

from __future__ import annotations

import json
import time

import pytest

from structspec.engine.default_examples import MAX_SYNTHESIZED, ExampleBook, build_example_book
from structspec.engine.synthetic_examples import (
    example_instance,
    synthesize_extraction_example,
    synthesize_tool_examples,
)
from structspec.grammar.postcheck import validator
from structspec.schemas import load_builtin_schemas, load_builtin_tools
from tests.conftest import MASKBENCH


def test_every_builtin_schema_and_tool_gets_a_valid_placeholder_example():
    for name, schema in load_builtin_schemas().items():
        ex = synthesize_extraction_example(schema)
        assert ex is not None, name
        value = json.loads(ex.output)
        assert validator(schema).is_valid(value), name
        assert "sample" in ex.text or name == "ticket_triage"  # placeholders, plainly not data (triage: enums only)
    tools = load_builtin_tools()
    calls = [json.loads(e.output) for e in synthesize_tool_examples(tools)]
    assert [c["name"] for c in calls] == [t["function"]["name"] for t in tools]
    for call, tool in zip(calls, tools):
        assert validator(tool["function"]["parameters"]).is_valid(call["arguments"])


def test_constraints_are_met_or_no_example_is_made():
    schema = {"type": "object", "required": ["id", "n", "tags", "when", "kind"], "additionalProperties": False,
              "properties": {"id": {"type": "string", "pattern": "^TCK-[0-9]{5}$"},
                             "n": {"type": "integer", "minimum": 10, "maximum": 12, "multipleOf": 11},
                             "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 2},
                             "when": {"type": "string", "format": "date-time"},
                             "kind": {"$ref": "#/$defs/kind"}},
              "$defs": {"kind": {"enum": ["a", "b"]}}}
    value = example_instance(schema)
    assert value == {"id": "TCK-00000", "n": 11, "tags": ["samp", "samp"], "when": "2000-01-31T09:30:00Z",
                     "kind": "a"}
    # Unbuildable: ``not``, a dangling $ref, a required property under a pattern nothing short matches.
    assert example_instance({"not": {"type": "string"}}) is None
    assert example_instance({"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}, "required": ["x"]}) is None
    assert example_instance({"type": "object", "required": ["x"],
                             "properties": {"x": {"type": "string", "pattern": "^(?=a)b$"}}}) is None
    # An optional property that cannot be filled is left out; the example is still made.
    assert example_instance({"type": "object", "properties": {"x": {"not": {}}, "y": {"type": "boolean"}}}) == {"y": True}


def test_hostile_schemas_never_raise_and_stay_fast():
    hostile = [{"type": "string", "pattern": "^(a+)+$"}, {"type": "string", "pattern": "(unclosed"},
               {"$ref": "#"}, {"type": "array", "minItems": 10 ** 9}, "not a schema", None, [1, 2],
               {"type": "object", "properties": {"a": {"type": "object", "properties": {"a": {"$ref": "#"}}}},
                "required": ["a"]}]
    t0 = time.perf_counter()
    for schema in hostile:
        assert synthesize_extraction_example(schema) is None or validator(schema).is_valid(
            json.loads(synthesize_extraction_example(schema).output))
    assert synthesize_tool_examples([{"function": {"name": 3}}, "junk", {"function": {"name": "ok"}}])[0].output == \
        '{"name":"ok","arguments":{}}'
    assert time.perf_counter() - t0 < 2.0  # linear-time patterns, bounded depth


def test_most_real_world_schemas_get_an_example_and_each_one_validates():
    if not MASKBENCH.is_dir():
        pytest.skip(f"MaskBench data not found at {MASKBENCH}")
    files = sorted(MASKBENCH.glob("Github_*.json"))[:800]
    made = 0
    for path in files:
        schema = json.loads(path.read_text())["schema"]
        ex = synthesize_extraction_example(schema)
        if ex is not None:
            made += 1
            assert validator(schema).is_valid(json.loads(ex.output)), path.name
    assert made >= 0.85 * len(files)


def test_the_book_synthesises_for_unknown_schemas_only_and_keeps_a_bounded_number():
    book = build_example_book(1)
    invoice = load_builtin_schemas()["invoice"]
    assert "sample" not in book.for_schema(invoice)[0].text  # a built-in schema keeps its shipped example
    own = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    made, real = book.for_schema(own)  # a placeholder example, then a real one of another schema under its title
    assert made.output == '{"city":"sample city"}' and book.for_schema(own) is book.for_schema(own)
    assert real.title == "Contact" and real.text in {e.text for e in book.for_schema(load_builtin_schemas()["contact"])}
    # cut to the schema's one key: shown eight keys, a model runs on inside the last string of a one-key object
    # whose grammar forbids a second key
    assert list(json.loads(real.output)) == ["name"]
    assert book.for_tools(load_builtin_tools()[:2])  # a tool list of one's own: one call per tool
    assert ExampleBook().for_schema(own) == ()  # a profile that needs no examples gets none
    small = ExampleBook(synthesize=True)
    for i in range(MAX_SYNTHESIZED + 5):
        small.for_schema({"type": "object", "properties": {f"k{i}": {"type": "string"}}})
    assert len(small._made) == MAX_SYNTHESIZED
