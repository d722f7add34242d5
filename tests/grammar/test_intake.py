"""Schema intake: each refused case, and keywords left to the post-check."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from structspec.grammar import (
    GrammarCompiler,
    GrammarOptions,
    SchemaError,
    intake,
    is_post_check_error,
)
from structspec.grammar.deadline import abandoned, run_with_deadline
from structspec.grammar.postcheck import instance_errors
from structspec.grammar.tools import ToolSet

from .conftest import accepts


def refusal(compiler, schema, **options) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        compiler.compile_schema(schema, GrammarOptions(**options))
    return info.value


def where(error: SchemaError) -> list[tuple[str, str]]:
    return [(i.pointer, i.keyword) for i in error.issues]


def test_metaschema_invalid(compiler):
    error = refusal(compiler, {"type": "object", "properties": {"a": {"type": "strin"}}})
    assert error.kind == "metaschema"
    assert where(error) == [("/properties/a/type", "type")]


def test_metaschema_of_the_named_draft(compiler):
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 1,
              "exclusiveMinimum": True}
    compiler.compile_schema(draft4)  # a boolean exclusiveMinimum is draft-4 syntax
    error = refusal(compiler, {**draft4, "$schema": "https://json-schema.org/draft/2020-12/schema"})
    assert error.kind == "metaschema" and where(error) == [("/exclusiveMinimum", "exclusiveMinimum")]
    error = refusal(compiler, {"$schema": "https://example.com/my-draft", "type": "string"})
    assert error.kind == "metaschema" and where(error) == [("/$schema", "$schema")]


def test_external_ref(compiler):
    error = refusal(compiler, {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}})
    assert error.kind == "external_ref"
    assert where(error) == [("/properties/a/$ref", "$ref")]


def test_local_refs_resolve_or_are_refused(compiler, view):
    schema = {"$defs": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/n"}}
    assert accepts(compiler.compile_schema(schema), view, "[1,2]")
    error = refusal(compiler, {"type": "array", "items": {"$ref": "#/$defs/missing"}})
    assert error.kind == "invalid_schema" and where(error) == [("/items/$ref", "$ref")]


TREE = {"$dynamicAnchor": "node", "type": "object", "properties": {
    "value": {"type": "integer"}, "children": {"type": "array", "items": {"$dynamicRef": "#node"}}},
    "required": ["value"], "additionalProperties": False}


def test_dynamic_refs_in_one_resource_resolve_statically(compiler, view):
    """One schema resource: the dynamic scope holds no other ``$dynamicAnchor``, so ``#node`` is the root."""
    grammar = compiler.compile_schema(TREE)
    assert accepts(grammar, view, '{"value":1,"children":[{"value":2,"children":[]}]}')
    assert not accepts(grammar, view, '{"value":1,"children":[{"value":"x"}]}')
    defs = {"$defs": {"leaf": {"$dynamicAnchor": "leaf", "type": "string"}},
            "type": "array", "items": {"$dynamicRef": "#leaf"}}
    grammar = compiler.compile_schema(defs)
    assert accepts(grammar, view, '["a"]') and not accepts(grammar, view, "[1]")
    assert TREE["properties"]["children"]["items"] == {"$dynamicRef": "#node"}  # the caller's schema as it was


def test_a_dynamic_anchor_the_root_declares_wins_from_every_resource(compiler, view):
    """Evaluation starts at the root: its ``$dynamicAnchor`` is the outermost on every path."""
    schema = {"$id": "https://example.com/root", "$dynamicAnchor": "n", "type": "object",
              "properties": {"v": {"type": "integer"}, "x": {"$ref": "#/$defs/list"}}, "additionalProperties": False,
              "$defs": {"list": {"$id": "list", "$dynamicAnchor": "n", "type": "array", "items": {"$dynamicRef": "#n"}}}}
    grammar = compiler.compile_schema(schema)
    for text in ('{"x":[{"v":1}]}', '{"x":[[1]]}', '{"x":[{"v":"a"}]}'):
        assert accepts(grammar, view, text) is not instance_errors(json.loads(text), schema), text


def test_recursive_refs_in_one_resource_resolve_statically(compiler, view):
    schema = {"$schema": "https://json-schema.org/draft/2019-09/schema", "$recursiveAnchor": True,
              "type": "object", "properties": {"next": {"$recursiveRef": "#"}}, "additionalProperties": False}
    grammar = compiler.compile_schema(schema)
    assert accepts(grammar, view, '{"next":{"next":{}}}') and not accepts(grammar, view, '{"next":1}')


def test_dynamic_refs_whose_target_depends_on_the_path_are_refused(compiler):
    """An embedded resource declares the anchor again: which one applies depends on how it was reached."""
    schema = {"$id": "https://example.com/root", "$ref": "#/$defs/list", "$defs": {
        "list": {"$id": "list", "$dynamicAnchor": "item", "type": "array", "items": {"$dynamicRef": "#item"}},
        "strings": {"$id": "strings", "$dynamicAnchor": "item", "type": "string"}}}
    error = refusal(compiler, schema)
    assert error.kind == "unsupported" and where(error) == [("/$defs/list/items/$dynamicRef", "$dynamicRef")]
    assert "evaluation path" in error.issues[0].message


def test_unicode_property_long_names_compile(compiler, view):
    schema = {"type": "string", "pattern": "^\\p{Letter}+$"}
    grammar = compiler.compile_schema(schema)
    assert accepts(grammar, view, '"h\u00e9llo"') and not accepts(grammar, view, '"h1"')
    assert instance_errors("h1", schema) and not instance_errors("h\u00e9llo", schema)
    error = refusal(compiler, {"type": "string", "pattern": "^\\p{Alphabetic}$"})  # a property RE2 lacks
    assert error.kind == "unsupported" and "Unicode property" in error.issues[0].message
    assert "backtracking" not in error.issues[0].message


OVERLAPPING = {"type": "object", "patternProperties": {"^a": {"type": "integer"},
                                                     "b$": {"type": "integer", "minimum": 5}},
               "additionalProperties": False}


def test_overlapping_pattern_properties_are_left_to_the_post_check(compilers, view):
    """Every valid instance is admitted; a name matching both patterns is held to both by the post-check."""
    grammar = compilers["llguidance"].compile_schema(OVERLAPPING)
    assert grammar.info.post_check_keywords == ("patternProperties",)
    assert [(w.pointer, w.keyword) for w in grammar.info.warnings] == [("/patternProperties", "patternProperties")]
    for text in ('{"ax":1}', '{"xb":7}', '{"ab":6}'):
        assert accepts(grammar, view, text) and not instance_errors(json.loads(text), OVERLAPPING)
    assert not accepts(grammar, view, '{"ax":"s"}') and not accepts(grammar, view, '{"xb":"s"}')
    assert not accepts(grammar, view, '{"c":1}')  # additionalProperties: as before
    assert accepts(grammar, view, '{"ab":1}')  # only the post-check sees minimum here
    errors = instance_errors({"ab": 1}, OVERLAPPING)
    assert errors and all(is_post_check_error(e, grammar.info.post_check_keywords) for e in errors)
    strict = refusal(compilers["llguidance"], OVERLAPPING, allow_post_check=False)
    assert strict.kind == "unsupported" and where(strict) == [("/patternProperties", "patternProperties")]


def test_overlapping_pattern_properties_with_one_schema_are_exact(compilers, view):
    schema = {"type": "object", "patternProperties": {"^a": {"type": "integer"}, "b$": {"type": "integer"},
                                                      "^z$": {"type": "string"}}, "additionalProperties": False}
    grammar = compilers["llguidance"].compile_schema(schema, GrammarOptions(allow_post_check=False))
    assert grammar.info.post_check_keywords == ()
    assert accepts(grammar, view, '{"ab":1,"z":"s"}') and not accepts(grammar, view, '{"ab":"s"}')
    assert not accepts(grammar, view, '{"z":1}')


def test_too_large(compiler):
    schema = {"type": "string", "enum": [f"value-{i}" for i in range(100)]}
    error = refusal(compiler, schema, max_schema_bytes=200)
    assert error.kind == "too_large"


def test_not_an_object(compiler):
    assert refusal(compiler, ["type", "string"]).kind == "invalid_schema"


class SlowBackend:
    """A backend stuck on every compile (sleeping releases the GIL, as llguidance's build does)."""

    name = "slow"

    def __init__(self, inner):
        self.inner = inner

    def compile_json_schema(self, schema, options):
        time.sleep(5.0)
        return self.inner.compile_json_schema(schema, options)


def test_timeout(compiler, view):
    slow = GrammarCompiler(view, backend=SlowBackend(compiler.backend))
    started = time.perf_counter()
    error = refusal(slow, {"type": "string"}, compile_timeout_s=0.05)
    # Returned long before the stuck compile would have: the bound leaves room for a loaded machine.
    assert error.kind == "timeout" and time.perf_counter() - started < 2.5
    assert error is refusal(slow, {"type": "string"}, compile_timeout_s=0.05)  # cached like any refusal


def test_deadline_abandons_a_slow_compile():
    with pytest.raises(SchemaError) as info:
        run_with_deadline(lambda: time.sleep(0.3), 0.05)
    assert info.value.kind == "timeout" and abandoned() >= 1
    assert run_with_deadline(lambda: 7, 1.0) == 7
    with pytest.raises(KeyError):
        run_with_deadline(lambda: {}["x"], 1.0)  # the compile's own errors pass through


def test_unsupported_keyword_refused_in_strict_mode(compiler):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                         "uniqueItems": True}}}
    error = refusal(compiler, schema, allow_post_check=False)
    assert error.kind == "unsupported"
    assert ("/properties/tags/uniqueItems", "uniqueItems") in where(error)


def test_unsupported_regex_refused_with_its_pointer(compilers):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(?!x)[a-z]+$"}}}
    error = refusal(compilers["llguidance"], schema)
    assert error.kind == "unsupported" and where(error) == [("/properties/code/pattern", "pattern")]


def test_post_check_keywords_are_listed(compiler, view):
    schema = {"type": "object",
              "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
              "required": ["tags"], "additionalProperties": False}
    grammar = compiler.compile_schema(schema)
    assert "uniqueItems" in grammar.info.post_check_keywords
    assert ("/properties/tags/uniqueItems", "uniqueItems") in [(w.pointer, w.keyword) for w in grammar.info.warnings]
    text = '{"tags":["a","a"]}'
    assert accepts(grammar, view, text)  # the grammar cannot see duplicates...
    errors = instance_errors({"tags": ["a", "a"]}, schema)
    assert errors and all(is_post_check_error(e, grammar.info.post_check_keywords) for e in errors)  # ...the post-check does


def test_outlines_lists_numeric_bounds(compilers):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}, "required": ["n"]}
    info = compilers["outlines"].compile_schema(schema).info
    assert info.post_check_keywords == ("minimum",)
    assert [(w.pointer, w.keyword) for w in info.warnings] == [("/properties/n/minimum", "minimum")]
    assert compilers["llguidance"].compile_schema(schema).info.post_check_keywords == ()  # enforced


def test_unknown_format_is_an_annotation_not_a_post_check(compiler):
    info = compiler.compile_schema({"type": "string", "format": "phone-number"}).info
    assert info.post_check_keywords == ()
    assert [(w.pointer, w.keyword) for w in info.warnings] == [("/format", "format")]
    assert "annotation" in info.warnings[0].message
    assert refusal(compiler, {"type": "string", "format": "phone-number"}, allow_post_check=False).kind == "unsupported"


def test_format_the_validator_knows_is_post_checked(compiler):
    info = compiler.compile_schema({"type": "string", "format": "regex"}).info
    assert info.post_check_keywords == ("format",)


def test_approximated_formats_are_declared_but_not_refused(compiler, view):
    schema = {"type": "string", "format": "date"}
    info = compiler.compile_schema(schema).info
    assert info.post_check_keywords == ("format",) and "approximated" in info.warnings[0].message
    strict = compiler.compile_schema(schema, GrammarOptions(allow_post_check=False))  # enforced, if loosely
    assert accepts(strict, view, '"2024-02-28"') and not accepts(strict, view, '"2024-13-01"')


def test_post_check_error_classification():
    schema = {"type": "object", "properties": {
        "a": {"type": "array", "uniqueItems": True},
        "b": {"anyOf": [{"type": "string", "not": {"const": "x"}}, {"type": "integer"}]},
        "c": {"type": "integer"}}}
    post = ("uniqueItems", "not")
    by_path = {tuple(e.absolute_path): e for e in instance_errors({"a": [1, 1], "b": "x", "c": "1"}, schema)}
    assert is_post_check_error(by_path[("a",)], post)
    assert is_post_check_error(by_path[("b",)], post)  # the string branch failed only on "not"
    assert not is_post_check_error(by_path[("c",)], post)
    assert isinstance(by_path[("c",)], jsonschema.ValidationError)


def test_a_pathological_outlines_build_is_killed(view):
    compiler = GrammarCompiler(view, backend="outlines")
    blowup = {"type": "string", "pattern": "^(a|b)*a(a|b){22}$"}  # a DFA with millions of states
    started = time.perf_counter()
    error = refusal(compiler, blowup, compile_timeout_s=0.5)
    assert error.kind == "timeout" and time.perf_counter() - started < 3
    builder = compiler.backend.builder
    for _ in range(40):  # the abandoned build hits its own deadline and kills the worker
        if not builder.running:
            break
        time.sleep(0.05)
    assert not builder.running
    assert compiler.compile_schema({"type": "integer"}).matcher().consume(view.encode("7"))  # a fresh worker
    assert builder.running
    builder.close()


# -- hostile schemas: nesting, backtracking regexes, grammars that cannot start -------------------


def test_nesting_limits_are_refused_with_the_pointer(compiler):
    deep: dict = {"type": "string"}
    for _ in range(60):
        deep = {"type": "array", "items": deep}
    err = refusal(compiler, deep)
    assert err.kind == "too_deep" and err.issues[0].pointer == "/items" * 48
    deep_data = {"const": 1}
    for _ in range(200):
        deep_data = {"const": [deep_data["const"]]}
    err = refusal(compiler, {"type": "array", "const": deep_data["const"]})
    assert err.kind == "too_deep" and "128 levels" in err.issues[0].message


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "string", "pattern": "(a)\\1"}, "/pattern"),
    ({"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?=a)a$"}}}, "/properties/p/pattern"),
    ({"type": "object", "patternProperties": {"(?<!x)y": {}}}, "/patternProperties/(?<!x)y"),
])
def test_patterns_that_need_backtracking_are_refused(compiler, schema, pointer):
    err = refusal(compiler, schema)
    assert err.kind == "unsupported" and pointer in [i.pointer for i in err.issues]


def test_self_reference_with_nothing_to_generate_says_so_in_words(compilers):
    err = refusal(compilers["llguidance"], {"$ref": "#"})
    assert err.kind == "invalid_schema"
    (issue,) = err.issues
    assert (issue.pointer, issue.keyword) == ("/$ref", "$ref")
    assert "no JSON value can be generated" in issue.message and "NoExtension" not in issue.message



# -- boolean schemas, integer-valued counts, integers past 2^53 -----------------------------------


def test_true_is_any_json_and_false_is_refused_in_words(compiler, view):
    grammar = compiler.compile_schema(True)
    for text in ("1", '"x"', "null", '{"a":[1,{"b":false}]}'):
        assert accepts(grammar, view, text)
    err = refusal(compiler, False)
    assert err.kind == "invalid_schema" and "allows no value" in err.issues[0].message


def test_integer_valued_counts_are_integers(compiler, view):
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 1.0, "maxLength": 2.0},
                                               "a": {"type": "array", "maxItems": 1.0}},
              "required": ["s", "a"], "additionalProperties": False}
    grammar = compiler.compile_schema(schema)
    assert accepts(grammar, view, '{"s":"ab","a":[1]}')
    assert not accepts(grammar, view, '{"s":"abc","a":[1]}') and not accepts(grammar, view, '{"s":"ab","a":[1,2]}')
    assert schema["properties"]["s"]["maxLength"] == 2.0 and isinstance(schema["properties"]["s"]["maxLength"], float)
    assert refusal(compiler, {"type": "string", "maxLength": 2.5}).kind == "metaschema"


def test_counts_in_tool_parameters_too(compiler, view):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 2.0}}, "required": ["s"],
        "additionalProperties": False}}}]
    grammar = compiler.compile_tools(ToolSet.parse(tools, "required"))
    assert accepts(grammar, view, '{"name":"f","arguments":{"s":"ab"}}')
    assert not accepts(grammar, view, '{"name":"f","arguments":{"s":"abc"}}')


def test_for_backends_copies_only_what_it_changes():
    plain = {"type": "string", "maxLength": 2}
    assert intake.for_backends(plain) is plain
    assert intake.for_backends(True) == {}
    schema = {"type": "array", "items": {"type": "string", "pattern": "^\\d+$"}, "minItems": 1.0}
    out = intake.for_backends(schema)
    assert out == {"type": "array", "items": {"type": "string", "pattern": "^[0-9]+$"}, "minItems": 1}
    assert schema["items"]["pattern"] == "^\\d+$" and isinstance(schema["minItems"], float)


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "object", "properties": {"n": {"const": 2**53 + 1}}}, "/properties/n/const"),
    ({"enum": ["a", {"x": [-(2**53) - 1]}]}, "/enum"),
    ({"type": "integer", "multipleOf": 2**53 + 1}, "/multipleOf"),
    ({"type": "integer", "exclusiveMinimum": 10**400}, "/exclusiveMinimum"),  # no finite float above it
    ({"type": "number", "const": 2.0**62}, "/const"),  # llguidance writes it 4611686018427388000
    ({"const": -(2**63)}, "/const"),  # crashed the process (llguidance 1.9)
    ({"type": "integer", "minimum": -(2**63), "maximum": 0}, "/minimum"),
    ({"type": "string", "maxLength": 2**64}, "/maxLength"),
    ({"type": "string", "examples": [1, 10**400]}, "/examples/1"),
])
def test_integers_a_float_cannot_hold_are_refused(compiler, schema, pointer):
    err = refusal(compiler, schema)
    assert err.kind == "unsupported" and [i.pointer for i in err.issues] == [pointer]
    assert "2^" in err.issues[0].message or "64-bit float" in err.issues[0].message


def test_bounds_a_float_cannot_hold_are_rounded_inward(compilers, view):
    """llguidance compares against the bound as a float: 2^62-1 would be 2^62, and let 2^62 through."""
    schema = {"type": "integer", "minimum": -(2**62) + 1, "maximum": 2**62 - 1}
    grammar = compilers["llguidance"].compile_schema(schema)  # outlines leaves bounds to the post-check
    assert accepts(grammar, view, str(2**62 - 512)) and accepts(grammar, view, str(-(2**62) + 512))
    assert not accepts(grammar, view, str(2**62)) and not accepts(grammar, view, str(-(2**62)))
    assert schema["maximum"] == 2**62 - 1  # the caller's schema (the post-check's) as it was
    grammar = compilers["llguidance"].compile_schema({"type": "integer", "maximum": 2**60})  # exact: as it is
    assert accepts(grammar, view, str(2**60)) and not accepts(grammar, view, str(2**60 + 1))


def test_integers_past_64_bits_elsewhere_compile(compiler, view):
    """llguidance takes no integer past 64 bits in any position: a default of 2^70 was a crash (ValueError)."""
    grammar = compiler.compile_schema({"type": "integer", "default": 2**70, "examples": [-(2**80)]})
    assert accepts(grammar, view, "7")
