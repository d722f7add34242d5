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
