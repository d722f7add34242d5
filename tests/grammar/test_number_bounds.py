"""Bounded numbers: a call's number without bounds of its own ends within 16 integer and 10 fractional digits; a
bound the schema states is kept; the caller's own schema still checks the output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from structspec.grammar import GrammarCompiler, TokenizerView
from structspec.grammar import call_formats as cf
from structspec.grammar.number_bounds import FRACTION_STEP, SAFE_INTEGER, bound_numbers
from structspec.grammar.tools import ToolCall, ToolOutput, ToolSet, tool_call_errors

DEMO_TOKENIZER = Path(__file__).resolve().parents[2] / "structspec" / "models" / "demo" / "target"
MOVE = {"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["speed", "steps"],
    "properties": {"speed": {"type": "number"}, "steps": {"type": "integer"},
                   "angle": {"type": ["number", "null"], "minimum": 0, "maximum": 360},
                   "huge": {"type": "integer", "minimum": 10**17}}}}}


def test_missing_bounds_are_added_and_stated_ones_kept():
    schema = {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "integer", "minimum": 0}, "c": {"type": ["number", "string"]},
        "d": {"type": "number", "maximum": 5, "multipleOf": 0.5}, "e": {"type": "number", "enum": [1.5, 2.5]},
        "f": {"type": "integer", "minimum": 10**17}, "g": {"type": "string"},
        "h": {"type": "array", "items": {"anyOf": [{"type": "number"}, {"const": 3}]}}}}
    p = bound_numbers(json.loads(json.dumps(schema)))["properties"]
    assert p["a"] == {"type": "number", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER, "multipleOf": FRACTION_STEP}
    assert p["b"] == {"type": "integer", "minimum": 0, "maximum": SAFE_INTEGER}  # no multipleOf on an integer
    assert p["c"]["maximum"] == SAFE_INTEGER and p["c"]["multipleOf"] == FRACTION_STEP  # bounds a number only
    assert p["d"] == {"type": "number", "maximum": 5, "multipleOf": 0.5, "minimum": -SAFE_INTEGER}
    assert p["e"] == schema["properties"]["e"] and p["g"] == schema["properties"]["g"]
    assert p["f"] == schema["properties"]["f"]  # a maximum below its own minimum would contradict it: not added
    assert p["h"]["items"]["anyOf"][0]["multipleOf"] == FRACTION_STEP and p["h"]["items"]["anyOf"][1] == {"const": 3}


@pytest.fixture(scope="module")
def forced():
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    tools = ToolSet.parse([MOVE], "required", False)
    return tok, GrammarCompiler(TokenizerView(tok)).compile_tools(tools, call_format=cf.JSON), tools


def accepts(forced, arguments: str) -> bool:
    tok, grammar, _ = forced
    matcher = grammar.matcher()
    text = '{"name":"move","arguments":' + arguments + "}"
    return matcher.consume(tok.encode(text, add_special_tokens=False)) and matcher.consume([tok.eos_token_id])


@pytest.mark.parametrize("speed", ["1.5", "-0.25", "0.0000000001", "9007199254740991", "0"])
def test_a_forced_call_takes_numbers_within_the_bounds(forced, speed):
    assert accepts(forced, f'{{"speed":{speed},"steps":3}}')


@pytest.mark.parametrize("speed", ["0.00000000001", "10000000000000000", "1e3"])
def test_a_number_that_would_run_on_is_refused(forced, speed):
    assert not accepts(forced, f'{{"speed":{speed},"steps":3}}')
    assert not accepts(forced, f'{{"speed":1,"steps":{speed}}}')


def test_a_run_of_zeros_must_close(forced):
    # the base model's failure: "0." then zeros until max_tokens; after 10 the grammar allows no more digits
    tok, grammar, _ = forced
    matcher = grammar.matcher()
    assert matcher.consume(tok.encode('{"name":"move","arguments":{"speed":0.', add_special_tokens=False))
    zero = tok.encode("0", add_special_tokens=False)
    assert len(zero) == 1
    taken = 0
    while taken < 40 and matcher.consume(zero):
        taken += 1
    assert taken == 10


def test_stated_bounds_hold_and_the_callers_schema_checks_the_output(forced):
    assert accepts(forced, '{"speed":1,"steps":2,"angle":12.5}')
    assert not accepts(forced, '{"speed":1,"steps":2,"angle":361}')
    assert accepts(forced, '{"speed":1,"steps":2,"huge":100000000000000000}')  # its own minimum, no cap added
    # the bound is the grammar's: the output is checked against the caller's schema, where 0.3 is no multiple
    # of a float step to test and 10**17 with no minimum is valid
    output = ToolOutput(None, (ToolCall("move", {"speed": 0.3, "steps": 10**17}),))
    assert tool_call_errors(output, [MOVE]) == []
