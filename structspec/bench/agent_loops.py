"""Agent loops measured: does a tool-calling loop (a call, the tool's result, then an answer in words) end?

A *loop* runs one request of ``auto_calls.load_cases`` as an agent framework runs it: the conversation goes out
under ``tool_choice`` auto; each call the model makes is answered by a tool result (``tool_result``: a short JSON
object of the tool's name and a value, as a tool returns) appended after the assistant's call, and the
conversation goes out again, until the model answers in text or ``--max-requests`` requests have gone out. Per
loop that needs a tool: *ended* (a text answer within the requests), *called* (its first answer was a call),
*repeated* (it called the same tool with the same arguments after that call's result), *cited* (its answer holds
the last result's value), invalid calls and truncated outputs. A request that needs no tool is one request: *text* where it was answered in words.

    python -m structspec.bench.agent_loops --model gemma-3-270m --cases 40 --seed 1 [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from structspec.assembly import AssemblyConfig, assemble_engine
from structspec.bench.auto_calls import Case, load_cases, valid_call
from structspec.engine.api import ChatMessage, ToolCallRequest
from structspec.engine.default_examples import build_example_book
from structspec.engine.types import Outcome, SamplingParams, ToolCall
from structspec.models.loading import load_profile, model_profile
from structspec.prompts import compact_json


@dataclass
class LoopTally:
    loops: int = 0  # requests that need a tool, each run as a loop
    ended: int = 0  # loops answered in text within max_requests
    cited: int = 0  # ended loops whose answer holds the last tool result's value
    called: int = 0  # loops whose first answer was a call
    repeated: int = 0  # loops that repeated a call after its result
    requests: int = 0  # model requests the loops sent
    invalid_calls: int = 0
    truncated: int = 0
    errors: int = 0
    no_tool: int = 0  # requests that need no tool
    text_where_no_tool_needed: int = 0
    examples: list[str] = field(default_factory=list)  # a few ended loops' answers and unended loops' last calls


def result_value(turn: int) -> int:
    """The value the tools return after request ``turn`` (differs per turn, so no two results read alike)."""
    return 17 + 5 * turn


def tool_result(call: ToolCall, turn: int) -> str:
    """What the tool returns: its name and a value."""
    return compact_json({"tool": call.name, "status": "done", "value": result_value(turn)})


async def run_loop(engine: Any, case: Case, max_requests: int, max_tokens: int, tally: LoopTally) -> None:
    """One case: a loop where it needs a tool, one request where it does not."""
    messages: list[ChatMessage] = [ChatMessage("user", case.prompt)]
    made: list[tuple[str, str]] = []  # (name, arguments) of the calls made so far
    repeated = False
    for turn in range(max_requests if case.needs_tool else 1):
        request = ToolCallRequest(messages=tuple(messages), tools=tuple(case.tools), tool_choice="auto",
                                  sampling=SamplingParams(max_tokens=max_tokens))
        res = await engine.call_tool(request)
        tally.requests += case.needs_tool
        if res.result.outcome is Outcome.TRUNCATED:
            tally.truncated += 1
            return
        if not res.calls:
            tally.text_where_no_tool_needed += not case.needs_tool
            tally.ended += case.needs_tool
            tally.cited += case.needs_tool and turn > 0 and str(result_value(turn - 1)) in (res.text or "")
            if case.needs_tool and len(tally.examples) < 12:
                tally.examples.append(f"{case.source} ended after {turn + 1}: {(res.text or '')[:100]!r}")
            return
        tally.called += case.needs_tool and turn == 0
        tally.invalid_calls += sum(not valid_call(case, c.name, c.arguments) for c in res.calls)
        keys = [(c.name, compact_json(c.arguments)) for c in res.calls]
        if any(k in made for k in keys) and not repeated:
            repeated, tally.repeated = True, tally.repeated + 1
        made += keys
        messages.append(ChatMessage("assistant", "", tool_calls=tuple(res.calls),
                                    tool_call_ids=tuple(f"call_{turn}_{i}" for i in range(len(res.calls)))))
        messages += [ChatMessage("tool", tool_result(c, turn), tool_call_id=f"call_{turn}_{i}", name=c.name)
                     for i, c in enumerate(res.calls)]
    if case.needs_tool and len(tally.examples) < 12:
        tally.examples.append(f"{case.source} did not end: last call {made[-1][0]}({made[-1][1][:80]})")


def run(model: str, cases: list[Case], max_requests: int, max_tokens: int, executor: str = "auto") -> LoopTally:
    models = load_profile(model, executor=executor)
    engine = assemble_engine(models, AssemblyConfig(examples=build_example_book(model_profile(model).few_shot)))
    engine.start()
    tally = LoopTally()
    try:
        for case in cases:
            tally.loops += case.needs_tool
            tally.no_tool += not case.needs_tool
            try:
                asyncio.run(run_loop(engine, case, max_requests, max_tokens, tally))
            except Exception as exc:  # noqa: BLE001 - a refused request is counted, not fatal
                tally.errors += 1
                tally.examples.append(f"{case.source}: {type(exc).__name__}: {str(exc)[:120]}")
    finally:
        engine.stop()
    return tally


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--executor", default="auto")
    parser.add_argument("--maskbench", default="/work/shared/data/maskbench")
    parser.add_argument("--cases", type=int, default=40, help="tool lists (a loop and a no-tool request each)")
    parser.add_argument("--seed", type=int, default=1, help="which tool lists (0: the tuning lists)")
    parser.add_argument("--phrasing", default="named", choices=("named", "plain"))
    parser.add_argument("--max-requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cases = load_cases(args.maskbench, args.cases, args.seed, args.phrasing)
    tally = run(args.model, cases, args.max_requests, args.max_tokens, args.executor)
    print(json.dumps({k: v for k, v in asdict(tally).items() if k != "examples"}))
    for line in tally.examples:
        print(" ", line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **asdict(tally)}, f, indent=1)


if __name__ == "__main__":
    main()
