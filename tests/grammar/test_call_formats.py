"""Call formats: each family's grammar allows text then calls to declared tools with valid arguments under auto,
forces the trigger under required and a named tool, refuses it under none; its parser reads outputs back. Every
family takes a tool list through the same intake as the generic JSON call: it accepts and refuses the same
parameters schemas, with the same errors pointing into the tool list, and enforces the same bounds.

The tokenizer is the demo one with the family's markers added as special tokens (Qwen's ``<tool_call>``, Llama's
``<|python_tag|>``, Mistral's ``[TOOL_CALLS]``), and once without (Mistral's older vocabulary: a text trigger)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from structspec.grammar import GrammarCompiler, TokenizerView
from structspec.grammar import call_formats as cf
from structspec.grammar.base import SchemaError
from structspec.grammar.tools import ToolCall, ToolOutput, ToolSet

DEMO_TOKENIZER = Path(__file__).resolve().parents[2] / "structspec" / "models" / "demo" / "target"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
    "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]

# family -> (its special tokens, end of turn)
VOCABS = {"hermes": (["<tool_call>", "</tool_call>"], "<|im_end|>"), "llama3": (["<|python_tag|>"], "<|eot_id|>"),
          "mistral": (["[TOOL_CALLS]"], "</s>"), "mistral-text": ([], "</s>"), "json": ([], "<|im_end|>")}


def call_text(family: str, name: str, arguments: dict, parallel_with: tuple = ()) -> str:
    """Calls written as ``family`` writes them (compact JSON, as the grammar's whitespace option)."""
    key = "parameters" if family == "llama3" else "arguments"
    calls = [{"name": name, key: arguments}, *({"name": n, key: a} for n, a in parallel_with)]
    dumped = [json.dumps(c, separators=(",", ":")) for c in calls]
    if family == "hermes":
        return "\n".join(f"<tool_call>\n{d}\n</tool_call>" for d in dumped)
    if family.startswith("mistral"):
        return "[TOOL_CALLS][" + ",".join(dumped) + "]"
    if family == "llama3":
        return "; ".join(dumped)
    return dumped[0] if not parallel_with else "[" + ",".join(dumped) + "]"


@pytest.fixture(scope="module")
def compilers():
    made = {}
    for family, (special, eos) in VOCABS.items():
        tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
        tok.add_special_tokens({"eos_token": eos, "additional_special_tokens": special} if special else
                               {"eos_token": eos})
        made[family] = (tok, GrammarCompiler(TokenizerView(tok)))
    return made


def fmt_of(family: str) -> cf.CallFormat:
    return cf.BY_FAMILY[family.split("-")[0]]


def accepts(compilers, family: str, text: str, choice="auto", parallel=False, answer_schema=None) -> bool:
    """Whether the grammar takes ``text`` (the tokenizer's split, special tokens as the tokenizer reads them) and
    then the end of turn."""
    tok, compiler = compilers[family]
    grammar = compiler.compile_tools(ToolSet.parse(TOOLS, choice, parallel), call_format=fmt_of(family),
                                     answer_schema=answer_schema)
    matcher = grammar.matcher()
    return matcher.consume(tok.encode(text, add_special_tokens=False)) and matcher.consume([tok.eos_token_id])


FAMILIES = list(VOCABS)


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_takes_a_text_answer_and_a_call(compilers, family):
    assert accepts(compilers, family, "Hello! How can I help?")
    assert accepts(compilers, family, call_text(family, "get_weather", {"city": "Paris"}))
    assert accepts(compilers, family, call_text(family, "get_time", {"zone": "CET"}))


@pytest.mark.parametrize("family", ["hermes", "mistral", "mistral-text"])
def test_auto_takes_text_then_a_call_where_the_family_writes_one(compilers, family):
    assert accepts(compilers, family, "Let me look. " + call_text(family, "get_weather", {"city": "Oslo"}))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_to_an_undeclared_tool_or_with_bad_arguments_is_refused(compilers, family):
    assert not accepts(compilers, family, call_text(family, "get_stock", {"city": "Paris"}))
    assert not accepts(compilers, family, call_text(family, "get_time", {"zone": "PST"}))
    assert not accepts(compilers, family, call_text(family, "get_weather", {"city": "Paris", "unit": "C"}))
    assert not accepts(compilers, family, call_text(family, "get_weather", {"city": "Llanfairpwllgwyngyll"}))


@pytest.mark.parametrize("family", FAMILIES)
def test_required_and_named_force_the_call_from_the_first_token(compilers, family):
    call = call_text(family, "get_weather", {"city": "Paris"})
    assert accepts(compilers, family, call, "required")
    assert not accepts(compilers, family, "Hello!", "required")
    assert accepts(compilers, family, call, "get_weather")
    assert not accepts(compilers, family, call_text(family, "get_time", {"zone": "UTC"}), "get_weather")
    tok, compiler = compilers[family]
    fmt = fmt_of(family)
    matcher = compiler.compile_tools(ToolSet.parse(TOOLS, "get_weather"), call_format=fmt).matcher()
    forced = tok.decode(matcher.forced_tokens())
    if fmt.family in ("hermes", "mistral"):
        assert forced.startswith(fmt.trigger)
    else:
        assert forced.startswith("{")


@pytest.mark.parametrize("family", FAMILIES)
def test_none_refuses_the_trigger_and_calls(compilers, family):
    assert accepts(compilers, family, "Sunny, probably.", "none")
    # Llama's and the generic calls are the whole answer: JSON after text is text
    lead = "" if family in ("llama3", "json") else "Here: "
    assert not accepts(compilers, family, lead + call_text(family, "get_weather", {"city": "Paris"}), "none")
    opening = fmt_of(family).trigger or "["  # the generic call opens with "{" (one) or "[" (a list)
    assert not accepts(compilers, family, opening + " hi", "none")


def test_none_refuses_text_a_prompt_format_opens_a_call_with(compilers):
    """``refused_text``: the plain format's call heading is never part of a text answer, anywhere in it."""
    tok, compiler = compilers["json"]

    def takes(text: str) -> bool:
        matcher = compiler.compile_tools(ToolSet.parse(TOOLS, "none"), call_format=cf.JSON,
                                         refused_text=("### Call:",)).matcher()
        return matcher.consume(tok.encode(text, add_special_tokens=False)) and matcher.consume([tok.eos_token_id])

    assert takes("Sunny.\n### Results\n- dry")
    assert not takes("### Call:\n" + call_text("json", "get_weather", {"city": "Paris"}))
    assert not takes("Let me look.\n### Call:\n")


@pytest.mark.parametrize("family", FAMILIES)
def test_parallel_calls(compilers, family):
    both = call_text(family, "get_weather", {"city": "Rome"}, parallel_with=(("get_time", {"zone": "UTC"}),))
    assert accepts(compilers, family, both, parallel=True)
    assert not accepts(compilers, family, both, parallel=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_answer_schema_replaces_the_free_text(compilers, family):
    answer = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    assert accepts(compilers, family, '{"answer":"sunny"}', answer_schema=answer)
    assert accepts(compilers, family, call_text(family, "get_weather", {"city": "Paris"}), answer_schema=answer)
    assert not accepts(compilers, family, "Sunny.", answer_schema=answer)
    assert not accepts(compilers, family, '{"answer":3}', answer_schema=answer)


@pytest.mark.parametrize("family", FAMILIES)
def test_parsing_round_trips(family):
    fmt, tools = fmt_of(family), ToolSet.parse(TOOLS, "auto", True)
    out = fmt.parse(call_text(family, "get_weather", {"city": "Rome"}, (("get_time", {"zone": "UTC"}),)),
                    tools.tools, tools.choice, True)
    assert [(c.name, c.arguments) for c in out.calls] == [("get_weather", {"city": "Rome"}), ("get_time", {"zone": "UTC"})]
    assert out.text is None
    plain = fmt.parse("Hello there.", tools.tools, tools.choice, True)
    assert plain.text == "Hello there." and plain.calls == ()
    with pytest.raises(ValueError):
        fmt.parse(call_text(family, "get_stock", {}), tools.tools, tools.choice, True)
    if fmt.text_before:
        mixed = fmt.parse("Checking. " + call_text(family, "get_weather", {"city": "Oslo"}), tools.tools,
                          tools.choice, True)
        assert mixed.text == "Checking." and mixed.calls[0].arguments == {"city": "Oslo"}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cut_call_is_never_text(family):
    fmt = fmt_of(family)
    cut = call_text(family, "get_weather", {"city": "Paris"})[:-6]
    assert fmt.partial_text(cut) is None
    assert fmt.partial_text("Hello the") == "Hello the"


def test_the_outlines_backend_refuses_a_native_format_clearly(compilers):
    tok, _ = compilers["hermes"]
    compiler = GrammarCompiler(TokenizerView(tok), backend="outlines")
    with pytest.raises(SchemaError) as err:
        compiler.compile_tools(ToolSet.parse(TOOLS, "auto"), call_format=cf.HERMES)
    assert err.value.kind == "unsupported" and "hermes" in str(err.value)


def test_the_format_is_in_the_cache_key(compilers):
    _, compiler = compilers["hermes"]
    tools = ToolSet.parse(TOOLS, "required")
    native = compiler.compile_tools(tools, call_format=cf.HERMES)
    generic = compiler.compile_tools(tools)
    assert native is not generic and compiler.compile_tools(tools, call_format=cf.HERMES) is native


# -- the intake: every family as the generic JSON call -----------------------------------------------------------

ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


OVERLAPPING = {"type": "object", "patternProperties": {"^a": {"type": "string"}, "^ab": {"type": "integer"}}}
# parameters the intake takes: (schema, arguments the grammar writes, arguments it must not)
TAKEN = {
    "integer-valued float counts": (obj(s={"type": "string", "minLength": 1.0, "maxLength": 2.0}),
                                    {"s": "ab"}, {"s": "abc"}),
    "a maximum no float holds": (obj(n={"type": "integer", "maximum": 2**62 - 1}), {"n": 2**62 - 512}, {"n": 2**62}),
    "a minimum no float holds": (obj(n={"type": "integer", "minimum": -(2**62) + 1}),
                                 {"n": -(2**62) + 512}, {"n": -(2**62)}),
    "a class escape in a pattern": (obj(s={"type": "string", "pattern": "^\\d+$"}), {"s": "12"}, {"s": "1a"}),
    "a float count behind a reference": ({**obj(c={"$ref": "#/$defs/c"}), "$defs": {"c": {"type": "string",
                                                                                          "maxLength": 3.0}}},
                                         {"c": "abc"}, {"c": "abcd"}),
    "a post-checked keyword": (obj(x={"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
                               {"x": [1, 2]}, {"x": "no"}),
    # merged by the backend (a name matching both is held to one of their schemas, the rest post-checked)
    "overlapping patternProperties": (OVERLAPPING, {"a": "x", "ab": 1}, {"a": None}),
    "a format the backend writes as a pattern": (obj(ip={"type": "string", "format": "ipv6"}),
                                                 {"ip": "::ffff:1.2.3.4"}, {"ip": "1.2.3.4"}),
}
# parameters it refuses: (schema, kind, [(pointer under the tool's parameters, keyword)])
REFUSED = {
    "a misspelt type": (obj(x={"type": "int"}), "metaschema", [("/properties/x/type", "type")]),
    "a const past 2^53": (obj(n={"const": 2**53 + 1}), "unsupported", [("/properties/n/const", "const")]),
    "a bound past the float range": (obj(n={"type": "integer", "exclusiveMinimum": 10**400}), "unsupported",
                                     [("/properties/n/exclusiveMinimum", "exclusiveMinimum")]),
    "a count past 2^64": (obj(s={"type": "string", "maxLength": 2**64}), "unsupported",
                          [("/properties/s/maxLength", "maxLength")]),
    "a back-reference": (obj(s={"type": "string", "pattern": "(a)\\1"}), "unsupported",
                         [("/properties/s/pattern", "pattern")]),
    "a reference to nothing": (obj(x={"$ref": "#/$defs/nope"}), "invalid_schema", [("/properties/x/$ref", "$ref")]),
    # refused by the grammar engine itself, not by the intake
    "a lookaround in a pattern": (obj(s={"type": "string", "pattern": "^$a"}), "unsupported",
                                  [("/properties/s/pattern", "pattern")]),
}
# every family and answer schema that compiles a native grammar (the json family without one is the generic call)
NATIVE = [(f, None) for f in FAMILIES if f != "json"] + [(f, ANSWER) for f in FAMILIES]
AT = "/tools/1/function/parameters"  # the tool under test, behind get_weather


def compile_family(compilers, family: str, tools: list, choice="auto", parallel=False, answer_schema=None):
    _, compiler = compilers[family]
    return compiler.compile_tools(ToolSet.parse(tools, choice, parallel), call_format=fmt_of(family),
                                  answer_schema=answer_schema)


def takes(compilers, family: str, grammar, text: str) -> bool:
    tok, _ = compilers[family]
    matcher = grammar.matcher()
    return matcher.consume(tok.encode(text, add_special_tokens=False)) and matcher.consume([tok.eos_token_id])


def refusal(compile) -> SchemaError:
    with pytest.raises(SchemaError) as err:
        compile()
    return err.value


def issues(err: SchemaError) -> list[tuple[str, str]]:
    return [(i.pointer, i.keyword) for i in err.issues]


@pytest.mark.parametrize("case", list(TAKEN))
@pytest.mark.parametrize("family, answer", NATIVE, ids=[f"{f}-{'answer' if a else 'text'}" for f, a in NATIVE])
def test_a_family_takes_what_the_generic_call_takes_and_enforces_its_bounds(compilers, family, answer, case):
    parameters, good, bad = TAKEN[case]
    tools = [WEATHER, {"type": "function", "function": {"name": "f", "parameters": parameters}}]
    generic = compile_family(compilers, "json", tools)
    native = compile_family(compilers, family, tools, answer_schema=answer)
    assert takes(compilers, "json", generic, call_text("json", "f", good))
    assert not takes(compilers, "json", generic, call_text("json", "f", bad))
    assert takes(compilers, family, native, call_text(family, "f", good))
    assert not takes(compilers, family, native, call_text(family, "f", bad))
    warned = [(w.pointer, w.keyword) for w in generic.info.warnings]
    assert [(w.pointer, w.keyword) for w in native.info.warnings] == warned
    assert native.info.post_check_keywords == generic.info.post_check_keywords
    assert all(pointer.startswith(AT) for pointer, _ in warned)


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("family, answer", NATIVE, ids=[f"{f}-{'answer' if a else 'text'}" for f, a in NATIVE])
def test_a_family_refuses_what_the_generic_call_refuses_naming_the_tool(compilers, family, answer, case):
    parameters, kind, where = REFUSED[case]
    tools = [WEATHER, {"type": "function", "function": {"name": "f", "parameters": parameters}}]
    generic = refusal(lambda: compile_family(compilers, "json", tools))
    assert (generic.kind, issues(generic)) == (kind, [(AT + pointer, keyword) for pointer, keyword in where])
    native = refusal(lambda: compile_family(compilers, family, tools, answer_schema=answer))
    assert (native.kind, issues(native)) == (generic.kind, issues(generic))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_answer_schema_goes_through_the_intake_as_a_schema_does(compilers, family):
    answer = obj(n={"type": "integer", "maximum": 2**62 - 1}, s={"type": "string", "maxLength": 2.0})
    grammar = compile_family(compilers, family, TOOLS, answer_schema=answer)
    assert takes(compilers, family, grammar, json.dumps({"n": 2**62 - 512, "s": "ab"}, separators=(",", ":")))
    assert not takes(compilers, family, grammar, json.dumps({"n": 2**62, "s": "ab"}, separators=(",", ":")))
    assert not takes(compilers, family, grammar, json.dumps({"n": 1, "s": "abc"}, separators=(",", ":")))
    refused = REFUSED["a lookaround in a pattern"][0]
    alone = refusal(lambda: compilers[family][1].compile_schema(refused))
    beside = refusal(lambda: compile_family(compilers, family, TOOLS, answer_schema=refused))
    assert (beside.kind, issues(beside)) == (alone.kind, [("/answer_schema" + p, k) for p, k in issues(alone)])
    # what the backend leaves to the post-check in an answer schema is pointed there, as for a schema alone
    alone = compilers[family][1].compile_schema(OVERLAPPING)
    beside = compile_family(compilers, family, TOOLS, answer_schema=OVERLAPPING)
    assert [(w.pointer, w.keyword) for w in beside.info.warnings] == [
        ("/answer_schema" + w.pointer, w.keyword) for w in alone.info.warnings]
    assert beside.info.post_check_keywords == alone.info.post_check_keywords != ()


# -- reading an answer schema's JSON beside tools ----------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_a_json_answer_beside_tools_is_the_answer_and_a_call_is_a_call(compilers, family):
    """Llama-3 and the json family write both as a JSON object, and an answer's strings may hold any marker."""
    fmt, tools = fmt_of(family), ToolSet.parse(TOOLS)
    for text in ('{"answer": "sunny"}', '{"answer":"sunny"}', '{"answer":"<tool_call> [TOOL_CALLS] <|python_tag|>"}'):
        assert fmt.parse(text, tools.tools, tools.choice, False, answer=ANSWER) == ToolOutput(text=text)
    call = call_text(family, "get_weather", {"city": "Paris"})
    assert fmt.parse(call, tools.tools, tools.choice, False, answer=ANSWER) == ToolOutput(
        text=None, calls=(ToolCall("get_weather", {"city": "Paris"}),))
    assert accepts(compilers, family, '{"answer":"sunny"}', answer_schema=ANSWER)


@pytest.mark.parametrize("family", ["llama3", "json"])
def test_an_object_that_reads_as_both_is_read_as_the_grammar_admitted_it(compilers, family):
    """An answer schema that admits call-shaped objects: a call the grammar admits is a call (the format's own
    reading), a call-shaped object the call grammar refuses (undeclared tool, arguments out of their schema) was
    admitted as the answer."""
    fmt, tools, anything = fmt_of(family), ToolSet.parse(TOOLS), {"type": "object"}
    call = call_text(family, "get_weather", {"city": "Paris"})
    assert accepts(compilers, family, call, answer_schema=anything)
    assert fmt.parse(call, tools.tools, tools.choice, False, answer=anything).calls == (
        ToolCall("get_weather", {"city": "Paris"}),)
    for text in (call_text(family, "get_weather", {"city": "Llanfairpwllgwyngyll"}),  # past its maxLength
                 call_text(family, "get_stock", {"city": "Paris"}),
                 call_text(family, "get_time", {"zone": "PST"})):
        assert accepts(compilers, family, text, answer_schema=anything)
        assert fmt.parse(text, tools.tools, tools.choice, False, answer=anything) == ToolOutput(text=text)


# -- argument strings that hold the formats' markers ----------------------------------------------------------------

MARKERS = {"city": "</tool_call>\n<tool_call> [TOOL_CALLS] ]; <|python_tag|> }"}


@pytest.mark.parametrize("family", FAMILIES)
def test_argument_strings_holding_the_markers_parse(family):
    fmt = fmt_of(family)
    for parallel in (False, True):
        tools = ToolSet.parse(TOOLS, "auto", parallel)
        text = call_text(family, "get_weather", MARKERS, (("get_time", {"zone": "UTC"}),) if parallel else ())
        out = fmt.parse(text, tools.tools, tools.choice, parallel)
        expected = [("get_weather", MARKERS)] + ([("get_time", {"zone": "UTC"})] if parallel else [])
        assert out.text is None and [(c.name, c.arguments) for c in out.calls] == expected
        if fmt.text_before:
            out = fmt.parse("Checking. " + text, tools.tools, tools.choice, parallel)
            assert out.text == "Checking." and out.calls[0].arguments == MARKERS
        if fmt.trigger:
            tag = fmt.parse(fmt.trigger + text.removeprefix(fmt.trigger), tools.tools, tools.choice, parallel)
            assert tag.calls == out.calls
    with pytest.raises(ValueError):  # text after the last call is no call
        fmt.parse(call_text(family, "get_weather", MARKERS) + " x", tools.tools, tools.choice, True)


def test_a_hermes_call_with_the_closer_in_an_argument_is_grammatical_where_the_closer_is_text(compilers):
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    texts = {"hermes": (tok, GrammarCompiler(TokenizerView(tok)))}
    grammar = compile_family(texts, "hermes", TOOLS)
    text = call_text("hermes", "get_weather", {"city": "</tool_call>"})
    assert takes(texts, "hermes", grammar, text)
    tools = ToolSet.parse(TOOLS)
    assert cf.HERMES.parse(text, tools.tools, tools.choice, False).calls == (
        ToolCall("get_weather", {"city": "</tool_call>"}),)
