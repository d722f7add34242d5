"""Worked examples synthesised from a schema alone (the default for schemas and tool lists that bring none): named
values only, never a placeholder a model copies."""

from __future__ import annotations

import json
import time

from structspec.engine.default_examples import FOREIGN_CALLS, MAX_SYNTHESIZED, ExampleBook, build_example_book
from structspec.engine.synthetic_examples import (
    example_instance,
    synthesize_extraction_example,
    synthesize_extraction_examples,
    synthesize_tool_examples,
)
from structspec.grammar.postcheck import validator
from structspec.schemas import load_builtin_schemas, load_builtin_tools
from tests.conftest import MASKBENCH


def _strings(value):
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, (str, int, float)) and not isinstance(value, bool) else []


def _named(schema) -> set:
    """Every value the schema names (const, enum, examples, default), anywhere in it."""
    if isinstance(schema, dict):
        out = set()
        for key, sub in schema.items():
            if key in ("enum", "examples") and isinstance(sub, list):
                out |= set(_strings(sub))
            elif key in ("const", "default"):
                out |= set(_strings(sub))
            else:
                out |= _named(sub)
        return out
    return {v for sub in schema for v in _named(sub)} if isinstance(schema, (list, tuple)) else set()


def _fixed_set():
    """The built-in schemas and tools, MaskBench's function-calling tool lists and some of its schemas."""
    schemas = list(load_builtin_schemas().values())
    tool_lists = [load_builtin_tools()]
    if MASKBENCH.is_dir():
        schemas += [json.loads(p.read_text())["schema"] for p in sorted(MASKBENCH.glob("Github_*.json"))[:300]]
    return schemas, tool_lists


def test_no_example_shows_a_value_the_schema_does_not_name():
    """The placeholder copy rate is 0 by construction: every string or number an example shows is one its schema
    names, so a model that copies it copies a value the schema offers (an enum member), never a placeholder."""
    schemas, tool_lists = _fixed_set()
    for schema in schemas:
        for ex in synthesize_extraction_examples(schema, 2):
            value = json.loads(ex.output)
            assert validator(schema).is_valid(value)
            assert set(_strings(value)) <= _named(schema), ex.output
    for tools in tool_lists:
        for ex in synthesize_tool_examples(tools, 2):
            call = json.loads(ex.output)
            (tool,) = [t for t in tools if t["function"]["name"] == call["name"]]
            assert validator(tool["function"]["parameters"]).is_valid(call["arguments"])
            assert set(_strings(call["arguments"])) <= _named(tool["function"]["parameters"]), ex.output


def test_examples_hold_named_values_and_a_free_value_means_no_example():
    weather = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
    assert synthesize_extraction_example(weather) is None
    assert synthesize_tool_examples([{"function": {"name": "w", "parameters": weather}}]) == ()
    # an optional free property: no partial example either (it would teach the model to leave it out)
    loose = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}}
    assert example_instance(loose) == {"unit": "c"} and synthesize_extraction_example(loose) is None
    named = {"type": "object", "required": ["unit", "days", "city", "exact"],
             "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "default": 3},
                            "city": {"type": "string", "examples": ["Lima", "Pune"]}, "exact": {"type": "boolean"},
                            "kind": {"$ref": "#/$defs/kind"}},
             "$defs": {"kind": {"const": "daily"}}}
    (first, second) = synthesize_tool_examples([{"function": {"name": "w", "parameters": named}}], 2)
    assert json.loads(first.output)["arguments"] == {"unit": "c", "days": 3, "city": "Lima", "exact": True,
                                                     "kind": "daily"}
    assert json.loads(second.output)["arguments"]["city"] == "Pune" and "Unit: c" in first.text
    assert synthesize_tool_examples([{"function": {"name": "now"}}])[0].output == '{"name":"now","arguments":{}}'
    # Unbuildable: ``not``, a dangling $ref; a named value the schema itself refuses
    assert example_instance({"not": {"type": "string"}}) is None
    assert example_instance({"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}, "required": ["x"]}) is None
    assert example_instance({"type": "string", "default": "abc", "maxLength": 2}) is None
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


def test_the_book_synthesises_for_unknown_schemas_only_and_keeps_a_bounded_number():
    book = build_example_book(1)
    invoice = load_builtin_schemas()["invoice"]
    assert "sample" not in book.for_schema(invoice)[0].text  # a built-in schema keeps its shipped example
    own = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}
    made, real = book.for_schema(own)  # a made example, then a real one of another schema under its title
    assert made.output == '{"unit":"c"}' and book.for_schema(own) is book.for_schema(own)
    free = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    (only,) = book.for_schema(free)  # a free value: no example made, the real one alone
    assert only.title == "Contact"
    assert real.title == "Contact" and real.text in {e.text for e in book.for_schema(load_builtin_schemas()["contact"])}
    # cut to the schema's one key: shown eight keys, a model runs on inside the last string of a one-key object
    # whose grammar forbids a second key
    assert list(json.loads(real.output)) == ["name"]
    # a tool list of one's own with free arguments: no call of its own, a call of another tool under its own list
    shown = book.for_tools(load_builtin_tools()[:2])
    assert len(shown) == 2 and all(ex in FOREIGN_CALLS and ex.title.startswith("- ") for ex in shown)
    assert ExampleBook(synthesize=1).for_tools([{"function": {"name": "now"}}])  # one it can show: one call
    assert ExampleBook().for_schema(own) == ()  # a profile that needs no examples gets none
    small = ExampleBook(synthesize=True)
    for i in range(MAX_SYNTHESIZED + 5):
        small.for_schema({"type": "object", "properties": {f"k{i}": {"type": "string"}}})
    assert len(small._made) == MAX_SYNTHESIZED
