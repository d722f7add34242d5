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
from structspec.grammar.tools import ToolCall

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
    grammar = compiler.compile_tools(TOOLS, "required")
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
    grammar = compiler.compile_tools(TOOLS, "required", parallel=True)
    assert accepts(grammar, view, f"[{WEATHER},{EMAIL}]")
    assert accepts(grammar, view, f"[{ITEMS}]")
    assert not accepts(grammar, view, "[]")
    assert not accepts(grammar, view, WEATHER)
    out = parse_tool_output(f"[{WEATHER},{EMAIL}]", TOOLS, parallel=True)
    assert [c.name for c in out.calls] == ["get_weather", "send_email"]


def test_auto_is_text_or_a_call(compiler, view):
    grammar = compiler.compile_tools(TOOLS, "auto")
    assert accepts(grammar, view, TEXT)
    assert accepts(grammar, view, WEATHER)
    assert not accepts(grammar, view, '{"answer": 42}')  # "{" starts a call, and this is not one
    assert not accepts(grammar, view, "[1, 2]")
    assert parse_tool_output(TEXT, TOOLS) .text == TEXT
    assert parse_tool_output(WEATHER, TOOLS, "auto").calls[0].name == "get_weather"


def test_none_is_plain_text_only(compiler, view):
    grammar = compiler.compile_tools(TOOLS, "none")
    assert accepts(grammar, view, TEXT)
    assert parse_tool_output(WEATHER, TOOLS, "none").text == WEATHER  # text, even if it looks like a call
    assert grammar.info.post_check_keywords == ()


def test_named_tool(compiler, view):
    choice = {"type": "function", "function": {"name": "send_email"}}
    grammar = compiler.compile_tools(TOOLS, choice)
    assert accepts(grammar, view, EMAIL)
    assert not accepts(grammar, view, WEATHER)
    assert compiler.compile_tools(TOOLS, "send_email") is not None  # a bare name works too
    with pytest.raises(ValueError):
        parse_tool_output(WEATHER, TOOLS, choice)


def test_named_tool_forces_its_header(compilers, view):
    matcher = compilers["llguidance"].compile_tools(TOOLS, "get_weather").matcher()
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
        compiler.compile_tools(tools, "auto")
    assert info.value.kind == "invalid_schema"
    assert (pointer, keyword) in [(i.pointer, i.keyword) for i in info.value.issues]


def test_tool_parameters_go_through_intake(compiler):
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "int"}}}}}
    with pytest.raises(SchemaError) as info:
        compiler.compile_tools(TOOLS + [bad], "auto")
    assert info.value.kind == "metaschema"
    assert [(i.pointer, i.keyword) for i in info.value.issues] == [("/tools/3/function/parameters/properties/x/type", "type")]
    external = {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "other.json#/x"}}}}}
    with pytest.raises(SchemaError) as info:
        compiler.compile_tools([external], "auto")
    assert info.value.kind == "external_ref"


def test_unknown_tool_choice(compiler):
    with pytest.raises(SchemaError) as info:
        compiler.compile_tools(TOOLS, "launch_rockets")
    assert [(i.pointer, i.keyword) for i in info.value.issues] == [("/tool_choice", "tool_choice")]


def test_post_check_warnings_point_into_the_tool_list(compiler, view):
    tagged = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"], "additionalProperties": False}}}
    grammar = compiler.compile_tools(TOOLS + [tagged], "auto", parallel=True)
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
