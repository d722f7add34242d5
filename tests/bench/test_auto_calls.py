"""The auto tool-call measurement: its cases from MaskBench's function-calling splits, and how outputs count."""

from __future__ import annotations

import os

import pytest

from structspec.bench.auto_calls import Case, Tally, _count, load_cases
from structspec.grammar.tools import ToolSet

MASKBENCH = "/work/shared/data/maskbench"


@pytest.mark.skipif(not os.path.isdir(MASKBENCH), reason="MaskBench's data is not on this machine")
def test_cases_are_tool_lists_with_a_request_that_needs_a_tool_and_one_that_does_not():
    cases = load_cases(MASKBENCH, 20)
    assert len(cases) == 40 and sum(c.needs_tool for c in cases) == 20
    for case in cases:
        ToolSet.parse(case.tools, "auto")  # names made identifiers, parameters object schemas
    assert all(c.prompt.startswith("Use ") for c in cases if c.needs_tool)


def test_an_undeclared_tool_or_bad_arguments_count_as_invalid():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    tally = Tally()
    _count(tally, Case("t", tools, "Use f", True), [("f", {"x": 1})], None, False)
    _count(tally, Case("t", tools, "Use f", True), [("g", {"x": 1})], None, False)
    _count(tally, Case("t", tools, "Use f", True), [("f", {"x": "one"})], None, False)
    _count(tally, Case("t", tools, "Say hello.", False), [], "Hello!", False)
    _count(tally, Case("t", tools, "Say hello.", False), [], None, True)
    assert (tally.requests, tally.calls, tally.invalid_calls, tally.calls_where_tool_needed) == (5, 3, 2, 3)
    assert (tally.text, tally.text_where_no_tool_needed, tally.truncated) == (1, 1, 1)


@pytest.mark.skipif(not os.path.isdir(MASKBENCH), reason="MaskBench's data is not on this machine")
def test_plain_requests_give_the_values_without_naming_the_arguments():
    named = [c for c in load_cases(MASKBENCH, 10, seed=1) if c.needs_tool]
    plain = [c for c in load_cases(MASKBENCH, 10, seed=1, phrasing="plain") if c.needs_tool]
    assert [c.source for c in named] == [c.source for c in plain]  # the same tool lists
    for n, p in zip(named, plain):
        assert p.prompt.startswith("I need ") and p.call == n.call and p.call is not None
        assert all(str(v) in p.prompt for v in p.call["arguments"].values())  # every value, no "with <argument>"
        assert " with " in n.prompt and " with " not in p.prompt.split(" for ", 1)[0]


def test_a_call_copies_a_value_an_example_shows_and_the_request_does_not():
    from structspec.bench.auto_calls import _copied, client_example
    from structspec.prompts import FewShotExample

    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    case = Case("a", tools, "Use weather with city Paris.", True, {"name": "weather", "arguments": {"city": "Paris"}})
    shown = (FewShotExample("What time is it in Oslo?", '{"name":"get_time","arguments":{"zone":"Europe/Oslo"}}'),)
    assert _copied(case, shown, [("weather", {"city": "Paris"})]) == (0, 1)
    assert _copied(case, shown, [("weather", {"city": "Europe/Oslo"})]) == (1, 1)
    other = Case("b", tools, "Use weather with city Lima.", True, {"name": "weather", "arguments": {"city": "Lima"}})
    mine = client_example(case, [case, other])
    assert mine is not None and mine.text == other.prompt and '"Lima"' in mine.output  # another list's call
    assert client_example(case, [case]) is None
