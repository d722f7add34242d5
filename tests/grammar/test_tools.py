"""Tool-call grammars: single, parallel, auto (text or call), required, none, named; invalid tool lists."""

from __future__ import annotations

import json

import pytest

from structspec.grammar import (
    SchemaError,
    is_post_check_error,
    parse_tool_output,
    tool_call_errors,
)
from structspec.grammar.cache import schema_digest
from structspec.grammar.tools import ToolCall, ToolSet

from .conftest import accepts

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                       "required": ["to", "body"], "additionalProperties": False}}},
    {"type": "function", "function": {  # local references inside the parameters still resolve once embedded
        "name": "add_items", "description": "Add items to a cart.",
        "parameters": {"$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string"}},
                                          "required": ["sku"], "additionalProperties": False}},
                       "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
                       "required": ["items"], "additionalProperties": False}}},
]
WEATHER = '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}'
EMAIL = '{"name":"send_email","arguments":{"to":"bob@example.org","body":"Hi"}}'
ITEMS = '{"name":"add_items","arguments":{"items":[{"sku":"A-1"},{"sku":"B-2"}]}}'
TEXT = "Hello, how can I help you today?"


def test_single_call(compiler, view):
    grammar = compiler.compile_tools(ToolSet.parse(TOOLS, "required"))
    for call in (WEATHER, EMAIL, ITEMS):
        assert accepts(grammar, view, call)
    assert not accepts(grammar, view, '{"name":"get_weather","arguments":{"city":"Paris","unit":"kelvin"}}')
    assert not accepts(grammar, view, '{"name":"nope","arguments":{}}')
    assert not accepts(grammar, view, f"[{WEATHER}]")
    assert not accepts(grammar, view, TEXT)
    out = parse_tool_output(WEATHER, TOOLS, "required")
    assert out == parse_tool_output(WEATHER, TOOLS) and out.text is None
    assert out.calls == (ToolCall("get_weather", {"city": "Paris", "unit": "celsius"}),)


def test_parallel_calls(compiler, view):
    grammar = compiler.compile_tools(ToolSet.parse(TOOLS, "required", parallel=True))
    assert accepts(grammar, view, f"[{WEATHER},{EMAIL}]")
    assert accepts(grammar, view, f"[{ITEMS}]")
    assert not accepts(grammar, view, "[]")
    assert not accepts(grammar, view, WEATHER)
    out = parse_tool_output(f"[{WEATHER},{EMAIL}]", TOOLS, parallel=True)
    assert [c.name for c in out.calls] == ["get_weather", "send_email"]


def test_auto_is_text_or_a_call(compiler, view):
    grammar = compiler.compile_tools(ToolSet.parse(TOOLS, "auto"))
    assert accepts(grammar, view, TEXT)
    assert accepts(grammar, view, WEATHER)
    assert not accepts(grammar, view, '{"answer": 42}')  # "{" starts a call, and this is not one
    assert not accepts(grammar, view, "[1, 2]")
    assert parse_tool_output(TEXT, TOOLS) .text == TEXT
    assert parse_tool_output(WEATHER, TOOLS, "auto").calls[0].name == "get_weather"


def test_none_is_plain_text_only(compiler, view):
    grammar = compiler.compile_tools(ToolSet.parse(TOOLS, "none"))
    assert accepts(grammar, view, TEXT)
    assert parse_tool_output(WEATHER, TOOLS, "none").text == WEATHER  # text, even if it looks like a call
    assert grammar.info.post_check_keywords == ()


def test_named_tool(compiler, view):
    choice = {"type": "function", "function": {"name": "send_email"}}
    grammar = compiler.compile_tools(ToolSet.parse(TOOLS, choice))
    assert accepts(grammar, view, EMAIL)
    assert not accepts(grammar, view, WEATHER)
    assert compiler.compile_tools(ToolSet.parse(TOOLS, "send_email")) is not None  # a bare name works too
    with pytest.raises(ValueError):
        parse_tool_output(WEATHER, TOOLS, choice)


def test_named_tool_forces_its_header(compilers, view):
    matcher = compilers["llguidance"].compile_tools(ToolSet.parse(TOOLS, "get_weather")).matcher()
    assert view.decode_bytes(matcher.forced_tokens()).startswith(b'{"name":"get_weather","arguments":{"city')


@pytest.mark.parametrize("tools, pointer, keyword", [
    ([], "/tools", ""),
    ([{"type": "function", "function": {"name": "a b", "parameters": {"type": "object"}}}],
     "/tools/0/function/name", "name"),
    ([TOOLS[0], {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
     "/tools/1/function/name", "name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
     "/tools/0/function/parameters/type", "type"),
    ([{"type": "retrieval"}], "/tools/0/type", "type"),
])
def test_invalid_tool_lists(compiler, tools, pointer, keyword):
    with pytest.raises(SchemaError) as info:
        compiler.compile_tools(ToolSet.parse(tools, "auto"))
    assert info.value.kind == "invalid_schema"
    assert (pointer, keyword) in [(i.pointer, i.keyword) for i in info.value.issues]


def test_tool_parameters_go_through_intake(compiler):
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "int"}}}}}
    with pytest.raises(SchemaError) as info:
        compiler.compile_tools(ToolSet.parse(TOOLS + [bad], "auto"))
    assert info.value.kind == "metaschema"
    assert [(i.pointer, i.keyword) for i in info.value.issues] == [("/tools/3/function/parameters/properties/x/type", "type")]
    external = {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "other.json#/x"}}}}}
    with pytest.raises(SchemaError) as info:
        compiler.compile_tools(ToolSet.parse([external], "auto"))
    assert info.value.kind == "external_ref"


def test_unknown_tool_choice(compiler):
    with pytest.raises(SchemaError) as info:
        compiler.compile_tools(ToolSet.parse(TOOLS, "launch_rockets"))
    assert [(i.pointer, i.keyword) for i in info.value.issues] == [("/tool_choice", "tool_choice")]


def test_post_check_warnings_point_into_the_tool_list(compiler, view):
    tagged = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"], "additionalProperties": False}}}
    grammar = compiler.compile_tools(ToolSet.parse(TOOLS + [tagged], "auto", parallel=True))
    assert "uniqueItems" in grammar.info.post_check_keywords
    assert ("/tools/3/function/parameters/properties/tags/uniqueItems", "uniqueItems") in [
        (w.pointer, w.keyword) for w in grammar.info.warnings]
    text = '[{"name":"tag","arguments":{"tags":["a","a"]}}]'
    assert accepts(grammar, view, text)
    errors = tool_call_errors(parse_tool_output(text, TOOLS + [tagged]), TOOLS + [tagged])
    assert [i for i, _ in errors] == [0]
    assert all(is_post_check_error(e, grammar.info.post_check_keywords) for _, e in errors)


def test_parse_rejects_malformed_calls():
    for text in ('{"name":"get_weather"}', '{"name":"nope","arguments":{}}', "{not json", "[]",
                 '{"name":"get_weather","arguments":{},"extra":1}'):
        with pytest.raises(ValueError):
            parse_tool_output(text, TOOLS)
    with pytest.raises(ValueError):
        parse_tool_output(TEXT, TOOLS, "required")
    with pytest.raises(ValueError):
        parse_tool_output(WEATHER, TOOLS, parallel=True)
    assert json.loads(WEATHER)["arguments"] == parse_tool_output(WEATHER).calls[0].arguments  # no tool list: shape only


# The keys as they were before the tool list was parsed once (statistics already stored are kept under them).
PINNED = {  # (tool_choice, parallel): (grammar digest, statistics key)
    ("auto", False): ("351badf4585dc91b577af25ff42a3a6e702c266ef3ea9435f1bac03dfc4299c6",
                      "tools:d222f9d8abf5383ac743524ea20fe26141b98f2a002027ad4543d68163b6a5a2"),
    ("required", True): ("bd73a54c57445090221918f4b5fff858701f63cb28fa3cc49b070c78f5009547",
                         "tools:a594afd8ec15b1a932fff459e68e8f7b8480c4507fa9ceb097087dc6167f7c2a"),
    ("send_email", False): ("a43679c26db70197a00e1f01ea5771ad943ae30edd572de5bbf8b91e8dd2a6eb",
                            "tools:719492bbe104d9b9e2c3165fed4ae18a1bfd7a9ff9dbac4112a8fa09b5c6dcd7"),
}


@pytest.mark.parametrize("choice, parallel", list(PINNED))
def test_a_tool_sets_keys_are_the_ones_stored(choice, parallel):
    tools = ToolSet.parse(tuple(TOOLS), choice, parallel)
    assert (tools.grammar_digest, tools.statistics_key) == PINNED[choice, parallel]
    assert tools.digest == "2a4f068e372446895ab5607802c68d91353d50bd7214a4f66375c4e80df07a9f"  # the worked examples'
    shape = {"tools": TOOLS, **({"tool_choice": choice, "parallel_calls": parallel} if choice != "auto" or parallel
                                else {})}
    assert tools.statistics_key == f"tools:{schema_digest(shape)}"
    assert tools.grammar_digest == schema_digest({"tools": TOOLS, "tool_choice": choice, "parallel": parallel})
    assert tools.size == len(json.dumps(TOOLS, separators=(",", ":"), ensure_ascii=False).encode())


def test_an_answer_schema_is_in_the_statistics_key():
    """Answers of one schema are other text than another's: each answer schema keys statistics and history of
    its own; no answer schema keeps the key stored already."""
    s1 = {"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "number"}}}
    s2 = {"type": "object", "properties": {"verdict": {"type": "boolean"}}}
    bare = ToolSet.parse(tuple(TOOLS)).statistics_key
    one, two = (ToolSet.parse(tuple(TOOLS), answer_schema=s).statistics_key for s in (s1, s2))
    assert bare == PINNED["auto", False][1] and len({bare, one, two}) == 3
    assert one.startswith("tools:") and two.startswith("tools:")
    # canonical: the order of a schema's keys aside, its properties' order kept (it is the output's)
    reordered = {"properties": {"city": {"type": "string"}, "temp": {"type": "number"}}, "type": "object"}
    assert ToolSet.parse(tuple(TOOLS), answer_schema=reordered).statistics_key == one
    swapped = {"type": "object", "properties": {"temp": {"type": "number"}, "city": {"type": "string"}}}
    assert ToolSet.parse(tuple(TOOLS), answer_schema=swapped).statistics_key != one
    assert ToolSet.parse(tuple(TOOLS), "required", answer_schema=s1).statistics_key not in (one, bare)
    with pytest.raises(SchemaError) as exc:
        ToolSet.parse(tuple(TOOLS), answer_schema={"bad": {1, 2}})  # not JSON
    assert [i.pointer for i in exc.value.issues] and all(i.pointer.startswith("/answer_schema") for i in exc.value.issues)


def test_a_tool_set_reads_outputs_as_the_raw_list_does():
    for choice, parallel, text in (("required", False, WEATHER), ("auto", False, TEXT), ("none", False, WEATHER),
                                   ("send_email", False, EMAIL), ("required", True, f"[{WEATHER},{EMAIL}]")):
        assert ToolSet.parse(TOOLS, choice, parallel).read(text) == parse_tool_output(text, TOOLS, choice, parallel)
    with pytest.raises(ValueError):
        ToolSet.parse(TOOLS, "send_email").read(WEATHER)
    assert ToolSet.parse(TOOLS).parameters("send_email") is TOOLS[1]["function"]["parameters"]


def test_a_tool_list_too_deep_or_not_json_is_refused_before_it_is_parsed():
    deep: dict = {"type": "object"}
    for _ in range(130):
        deep = {"type": "object", "properties": {"x": deep}}
    entry = {"type": "retrieval", "function": {"name": "f", "parameters": deep}}  # not a function tool either
    with pytest.raises(SchemaError) as info:
        ToolSet.parse([entry])
    (issue,) = info.value.issues
    assert info.value.kind == "too_deep" and issue.pointer.startswith("/tools/0/function/parameters/properties/x/")
    assert issue.pointer.count("/") == 128  # the request's levels: /tools is one of them
    with pytest.raises(SchemaError) as info:
        ToolSet.parse([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": {1, 2}}}}])
    assert info.value.kind == "invalid_schema" and "not JSON" in str(info.value)
