"""Call formats: each family's grammar allows text then calls to declared tools with valid arguments under auto,
forces the trigger under required and a named tool, refuses it under none; its parser reads outputs back.

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
from structspec.grammar.tools import ToolSet

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
