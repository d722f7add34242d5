"""The agent-loop measurement: a loop answers each call with a tool result and sends the conversation again until
a text answer or the request limit; how loops count."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from structspec.bench.agent_loops import LoopTally, run_loop
from structspec.bench.auto_calls import Case
from structspec.engine.types import ToolCall
from structspec.engine.types import Outcome

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]


class Scripted:
    """An engine answering each request with the next scripted reply: a list of calls, a text, or None (cut)."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []

    async def call_tool(self, request):
        self.requests.append(request)
        reply = self.replies.pop(0)
        if reply is None:
            return SimpleNamespace(result=SimpleNamespace(outcome=Outcome.TRUNCATED), calls=(), text=None)
        if isinstance(reply, str):
            return SimpleNamespace(result=SimpleNamespace(outcome=Outcome.TEXT), calls=(), text=reply)
        return SimpleNamespace(result=SimpleNamespace(outcome=Outcome.VALID), calls=tuple(reply), text=None)


def loop(replies, needs_tool=True, max_requests=4):
    engine, tally = Scripted(replies), LoopTally()
    asyncio.run(run_loop(engine, Case("c", TOOLS, "Use f with x 1.", needs_tool), max_requests, 32, tally))
    return engine, tally


def test_a_call_then_an_answer_ends_after_two_requests_with_the_result_in_the_conversation():
    engine, tally = loop([[ToolCall("f", {"x": 1})], "It is done: 17."])
    assert (tally.ended, tally.called, tally.repeated, tally.requests, tally.invalid_calls) == (1, 1, 0, 2, 0)
    assert tally.cited == 1  # the answer says the result's value
    second = engine.requests[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool"]
    assert second[1].tool_calls == (ToolCall("f", {"x": 1}),) and second[2].tool_call_id == second[1].tool_call_ids[0]
    assert '"value":17' in second[2].content


def test_a_loop_that_calls_again_and_again_does_not_end_and_counts_its_repeat_once():
    _, tally = loop([[ToolCall("f", {"x": 1})]] * 4)
    assert (tally.ended, tally.called, tally.repeated, tally.requests) == (0, 1, 1, 4)


def test_an_answer_without_a_call_ends_but_is_not_called_and_a_cut_output_does_not_end():
    _, tally = loop(["Sure."])
    assert (tally.ended, tally.called, tally.requests, tally.cited) == (1, 0, 1, 0)
    _, tally = loop([[ToolCall("f", {"x": 1})], "It is done."])
    assert (tally.ended, tally.cited) == (1, 0)  # ended, but not on the result's value
    _, tally = loop([[ToolCall("f", {"x": "one"})], None])
    assert (tally.ended, tally.called, tally.invalid_calls, tally.truncated) == (0, 1, 1, 1)


def test_a_request_that_needs_no_tool_is_one_request():
    engine, tally = loop(["Hello!"], needs_tool=False)
    assert (tally.text_where_no_tool_needed, tally.ended, tally.requests, len(engine.requests)) == (1, 0, 0, 1)
    engine, tally = loop([[ToolCall("f", {"x": 1})], "unused"], needs_tool=False)
    assert (tally.text_where_no_tool_needed, tally.called, len(engine.requests)) == (0, 0, 1)
