"""Tool calls measured: under ``tool_choice`` auto, are the calls valid, and does the model answer in text where no
tool is needed? Under ``required`` (a forced call), do the calls finish, are they valid, and do they copy a worked
example's values?

A *case* is one tool list from MaskBench's function-calling splits (BFCL simple, multiple, parallel and
parallel_multiple: each file's schema names its tools, ``{tool: parameters}`` or an ``anyOf`` of those; dots in
names become ``_``) with two requests: one that calls for a tool (a sentence built from the ground-truth call,
"Use <tool> with <arguments>") and one that does not (a greeting or a general question). Each output is counted
as a *call* (and *invalid* where it names an undeclared tool or its arguments fail the tool's schema under
jsonschema), a *text* answer, *truncated* (cut at ``max_tokens``) or an *error*. The same requests go to
llama-cpp-python's own tool calling (``chat_format="chatml-function-calling"``, its grammar) on a GGUF as far as
it runs.

Under ``--tool-choice required`` only the requests that need a tool go out, each as a forced call, with the
server's own worked examples (``build_example_book`` at the profile's ``few_shot``, what ``structspec serve`` adds to
a request that brings none) or, ``--examples client``, a worked call the client brings: another tool list's
request and call (``client_example``), as a caller shows its own. A call *finished* where it closed before
``max_tokens``; its *copied* values are its arguments' values an example shown holds and the request does not
(``WorkItem.copied``).

    python -m structspec.bench.auto_calls --model smollm2 --cases 10 [--llamacpp-gguf PATH] [--json out.json]
    python -m structspec.bench.auto_calls --model gemma-3-270m --tool-choice required --cases 40 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import importlib
import json
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import jsonschema

from structspec.assembly import AssemblyConfig, assemble_engine
from structspec.bench.llamacpp_baselines import unrepacked_weights
from structspec.bench.text_table import aligned
from structspec.bench.workloads import WorkItem
from structspec.engine.api import ChatMessage, ToolCallRequest
from structspec.engine.default_examples import build_example_book
from structspec.engine.types import Outcome, SamplingParams
from structspec.models.loading import load_profile, model_profile
from structspec.prompts import FewShotExample, compact_json, episode_examples

SPLITS = ("BFCL_simple", "BFCL_multiple", "BFCL_parallel", "BFCL_parallel_multiple")
NO_TOOL = ("Say hello.", "Thank you, that is all for today.", "What is your name?", "Tell me a short joke.",
           "How are you today?", "Write one sentence about the sea.")


@dataclass
class Case:
    source: str
    tools: list[dict[str, Any]]
    prompt: str
    needs_tool: bool
    call: dict[str, Any] | None = None  # the ground truth's first call, {"name", "arguments"} (a request that needs one)


@dataclass
class Tally:
    requests: int = 0
    calls: int = 0  # requests answered with calls
    invalid_calls: int = 0  # calls to an undeclared tool or with arguments failing the schema
    text: int = 0
    text_where_no_tool_needed: int = 0
    calls_where_tool_needed: int = 0
    truncated: int = 0
    errors: int = 0
    seconds: float = 0.0
    copied_values: int = 0  # call arguments' values an example shown holds and the request does not
    counted_values: int = 0  # the values that could be copied (``WorkItem.copied``)
    examples: list[str] = field(default_factory=list)


def _name(raw: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", raw)[:64]


def _ask(raw: str, args: dict[str, Any], phrasing: str) -> str:
    """A request for the call ``raw(args)``: ``named`` names the tool and each argument ("Use get weather with city
    Paris."), ``plain`` says what is wanted and the values alone, as a user asks ("I need get weather for Paris.")."""
    if phrasing == "plain":
        words = raw.replace("_", " ").replace(".", " ")
        return f"I need {words} for {' and '.join(str(v) for v in args.values())}."
    return f"Use {raw.replace('_', ' ')} with {', '.join(f'{k} {v}' for k, v in args.items())}."


def load_cases(folder: str, n: int, seed: int = 0, phrasing: str = "named") -> list[Case]:
    """``n`` tool lists (spread over the splits), each with a request that needs a tool (``_ask``: ``phrasing``)
    and one that does not."""
    files = sorted(f for split in SPLITS for f in glob.glob(os.path.join(folder, f"{split}_[0-9]*.json")))
    random.Random(seed).shuffle(files)
    cases: list[Case] = []
    for i, path in enumerate(files[:n]):
        with open(path) as f:
            doc = json.load(f)
        schema = doc["schema"]
        tools = {}
        for branch in schema.get("anyOf", [schema]):
            for raw, parameters in branch.get("properties", {}).items():
                tools[_name(raw)] = {"type": "function", "function": {"name": _name(raw), "parameters": parameters}}
        if not tools:
            continue
        truth: dict[str, Any] = next((t["data"] for t in doc.get("tests", []) if t.get("valid")), {})
        asks = [_ask(raw, args, phrasing) for raw, args in truth.items() if isinstance(args, dict)]
        prompt = " ".join(asks) or f"Use {next(iter(tools))}."
        first = next(((_name(raw), args) for raw, args in truth.items() if isinstance(args, dict)), None)
        call = {"name": first[0], "arguments": first[1]} if first else None
        cases.append(Case(os.path.basename(path), list(tools.values()), prompt, True, call))
        cases.append(Case(os.path.basename(path), list(tools.values()), NO_TOOL[i % len(NO_TOOL)], False))
    return cases


def valid_call(case: Case, name: str, arguments: Any) -> bool:
    """Whether ``name(arguments)`` calls a tool the case declares, with arguments its schema takes."""
    declared = {t["function"]["name"]: t["function"]["parameters"] for t in case.tools}
    return name in declared and isinstance(arguments, dict) and not any(
        True for _ in jsonschema.Draft202012Validator(declared[name]).iter_errors(arguments))


def _count(tally: Tally, case: Case, calls: list[tuple[str, Any]] | None, text: str | None, truncated: bool) -> None:
    tally.requests += 1
    if truncated:
        tally.truncated += 1
        return
    if calls:
        tally.calls += 1
        tally.calls_where_tool_needed += case.needs_tool
        for name, arguments in calls:
            if not valid_call(case, name, arguments):
                tally.invalid_calls += 1
                tally.examples.append(f"{case.source}: {name}({json.dumps(arguments)[:120]})")
                break
    else:
        tally.text += 1
        tally.text_where_no_tool_needed += not case.needs_tool


def client_example(case: Case, others: list[Case]) -> FewShotExample | None:
    """A worked call a client brings with ``case``: the first other tool list's request and its ground-truth call
    (its first tool's), as a caller shows one of its own."""
    for other in others:
        if other.source != case.source and other.needs_tool and other.call is not None:
            return FewShotExample(other.prompt, compact_json(other.call))
    return None


def _copied(case: Case, shown: tuple[FewShotExample, ...], calls: list[tuple[str, Any]]) -> tuple[int, int]:
    item = WorkItem("toolcall", case.source, case.prompt, {}, tools=tuple(case.tools), examples=shown)
    copied = counted = 0
    for name, arguments in calls:
        c, n = item.copied({"name": name, "arguments": arguments})
        copied, counted = copied + c, counted + n
    return copied, counted


def run_structspec(model: str, cases: list[Case], max_tokens: int, executor: str = "auto",
                   tool_choice: str = "auto", examples: str = "server") -> Tally:
    """``examples``: ``server`` (the server's worked examples, as ``structspec serve`` adds them), ``client`` (a
    worked call the request brings, ``client_example``) or ``none``."""
    models = load_profile(model, executor=executor)
    book = build_example_book(model_profile(model).few_shot) if examples == "server" else None
    engine = assemble_engine(models, AssemblyConfig(examples=book))
    engine.start()
    tally, start = Tally(), time.perf_counter()
    try:
        for case in cases:
            own = client_example(case, cases) if examples == "client" else None
            request = ToolCallRequest(messages=(ChatMessage("user", case.prompt),), tools=tuple(case.tools),
                                      tool_choice=tool_choice, examples=(own,) if own else (),
                                      sampling=SamplingParams(max_tokens=max_tokens))
            try:
                res = asyncio.run(engine.call_tool(request))
            except Exception as exc:  # noqa: BLE001 - a refused tool list is counted, not fatal
                tally.requests += 1
                tally.errors += 1
                tally.examples.append(f"{case.source}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if res.result.outcome not in (Outcome.VALID, Outcome.TEXT, Outcome.TRUNCATED):
                tally.examples.append(f"{case.source}: {res.result.outcome.name}: {res.result.error}")
            calls = [(c.name, c.arguments) for c in res.calls]
            _count(tally, case, calls, res.text, res.result.outcome is Outcome.TRUNCATED)
            shown = request.examples or (book.for_tools(request.tools, forced=tool_choice == "required") if book else ())
            copied, counted = _copied(case, tuple(shown) + episode_examples(tool_choice == "auto"), calls)
            tally.copied_values += copied
            tally.counted_values += counted
    finally:
        engine.stop()
    tally.seconds = time.perf_counter() - start
    return tally


def run_llamacpp(gguf: str, cases: list[Case], max_tokens: int) -> Tally:
    """llama-cpp-python's own tool calling, tool_choice auto, on the same GGUF."""
    llama_cpp = importlib.import_module("llama_cpp")  # optional: the baseline runs where it is installed
    with unrepacked_weights():  # as the engine's executor loads it (and no AMX repack: see there)
        llm = llama_cpp.Llama(model_path=gguf, chat_format="chatml-function-calling", n_ctx=4096, verbose=False,
                              seed=0)
    tally, start = Tally(), time.perf_counter()
    for case in cases:
        try:
            out = llm.create_chat_completion(messages=[{"role": "user", "content": case.prompt}], tools=case.tools,
                                             tool_choice="auto", max_tokens=max_tokens, temperature=0.0)
        except Exception as exc:  # noqa: BLE001 - its handler raising on an output is a result too
            tally.requests += 1
            tally.errors += 1
            tally.examples.append(f"{case.source}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        choice = out["choices"][0]
        calls = []
        for call in choice["message"].get("tool_calls") or []:
            try:
                arguments = json.loads(call["function"]["arguments"])
            except (json.JSONDecodeError, TypeError):
                arguments = call["function"]["arguments"]
            calls.append((call["function"]["name"], arguments))
        _count(tally, case, calls, choice["message"].get("content"), choice.get("finish_reason") == "length" and
               not calls)
    tally.seconds = time.perf_counter() - start
    return tally


def table(results: dict[str, Tally]) -> str:
    keys = ("requests", "calls", "invalid_calls", "calls_where_tool_needed", "text", "text_where_no_tool_needed",
            "truncated", "errors", "copied_values", "counted_values", "seconds")
    rows = [["", *keys]] + [[name, *(f"{getattr(t, k):.0f}" for k in keys)] for name, t in results.items()]
    return aligned(rows, right=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--executor", default="auto")
    parser.add_argument("--maskbench", default="/work/shared/data/maskbench")
    parser.add_argument("--cases", type=int, default=150, help="tool lists (two requests each)")
    parser.add_argument("--seed", type=int, default=0, help="which tool lists (held-out sets: another seed)")
    parser.add_argument("--phrasing", default="named", choices=("named", "plain"),
                        help="named: 'Use <tool> with <argument> <value>'; plain: 'I need <tool> for <values>'")
    parser.add_argument("--tool-choice", default="auto", choices=("auto", "required"),
                        help="required: a forced call per request that needs a tool (the others are not sent)")
    parser.add_argument("--examples", default="server", choices=("server", "client", "none"),
                        help="the worked examples: the server's own, a call the client brings, or none")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--llamacpp-gguf", default=None, help="also run llama-cpp-python's own tool calling on it")
    parser.add_argument("--no-structspec", action="store_true", help="only the llama-cpp-python baseline")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cases = load_cases(args.maskbench, args.cases, args.seed, args.phrasing)
    if args.tool_choice == "required":
        cases = [c for c in cases if c.needs_tool]
    results = {} if args.no_structspec else {
        f"structspec {args.model} {args.tool_choice} {args.examples} {args.phrasing}": run_structspec(
            args.model, cases, args.max_tokens, args.executor, args.tool_choice, args.examples)}
    if args.llamacpp_gguf:
        results["llama-cpp-python chatml-function-calling"] = run_llamacpp(args.llamacpp_gguf, cases, args.max_tokens)
    print(table(results))
    for name, t in results.items():
        for line in t.examples[:5]:
            print(f"  {name}: {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: asdict(t) for name, t in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
