"""Benchmark workloads: held-out generated documents and tool requests, each with its ground truth.

The same items go to every configuration in one run. Seeds differ from the
demo training corpus (train 1, eval 2-3), so the demo models never saw them.
Base models (Gemma 3 270M) get few-shot prompts, the server's own worked
examples (``build_example_book``), so they finish with ``stop`` rather than
looping until the token cap.

``mixed`` interleaves every task, including ``ticket_triage``: a short output (a queue
label and a confidence, under 20 tokens). ``shift`` is one schema's traffic in three
phases (``shift_phases``): ``before`` (contacts, as usual), ``shifted`` (a caller starts
sending other documents, invoices, support tickets, events, to the contact schema: the
values the output holds are no longer in the document, the models make them up and
disagree, so copying and the draft model stop being accepted; nothing to score) and
``after`` (contacts again): what the drafting policy must notice and recover from.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any

from structspec.demo.corpus import Example, flatten, generate, triage_from_ticket
from structspec.engine.default_examples import ExampleBook, build_example_book
from structspec.prompts import FewShotExample, schema_title
from structspec.schemas import load_builtin_schemas, load_builtin_tools

WORKLOADS = ("extraction", "toolcall", "freetext", "mixed", "shift", "chat", "manifest", "classify", "nested_tools")
# manifest, classify and nested_tools: held out from the demo corpus and the policy's tuning (``heldout_workloads``)
# The ``chat`` workload: free-text answers (no schema, no tools) the model writes itself, nothing to copy from the
# prompt: where copy lookup has little to find and a draft model earns its keep.
CHAT_ASKS = ("Write a short paragraph about {}.", "Describe {} in three sentences.", "Explain {} to a child.",
             "Tell me something interesting about {}.")
CHAT_TOPICS = ("the ocean", "coffee", "trains", "the moon", "gardening", "bicycles", "rain", "libraries", "bread",
               "mountains", "music", "bees", "winter", "chess", "volcanoes", "the internet", "dogs", "sailing",
               "tea", "the desert", "clocks", "photography", "rivers", "owls", "paper", "bridges", "cheese",
               "the stars", "forests", "running")
SHIFT_SCHEMA = "contact"  # copy lookup is accepted well on its documents (it has something to lose)
SHIFT_PHASES = ("before", "shifted", "after")
BENCH_SEED = 7


@dataclass(frozen=True)
class WorkItem:
    kind: str  # extract | toolcall | chat
    schema_name: str
    source: str  # the document or the user's message
    truth: dict[str, Any]
    freetext_fields: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    examples: tuple[FewShotExample, ...] = field(default=())
    phase: str = ""  # the ``shift`` workload's phase
    # ``examples`` are the server's own for this schema: a request sends none, and an engine that holds the
    # server's book (``build_example_book``) adds them as it does to a user's request (its copy guard included)
    served: bool = False

    def score(self, value: Any) -> tuple[int, int]:
        """(right, total) over the non-prose leaf fields."""
        truth = flatten(self.truth)
        got = flatten(value) if isinstance(value, (dict, list)) else {}
        keys = [k for k in truth if not any(k == f or k.startswith(f + ".") for f in self.freetext_fields)]
        return sum(int(k in got and got[k] == truth[k]) for k in keys), len(keys)

    def copied(self, value: Any) -> tuple[int, int]:
        """(copied, counted): the output's values that a worked example holds but the input does not.

        Counted: string leaves of 3+ characters and numbers, except values the schema enumerates (a
        ``USD`` inferred from "US dollars" is no copy) and a tool call's tool name. Copied: the value is a
        leaf of an example's output or a phrase (numbers: a number) of an example's text, and is not in
        the input; a string of 4+ words also when most of its 4-word runs are an example's and not the
        input's (an example's summary with the product name swapped). What the base model fills in from
        the worked example instead of the document."""
        if not self.examples or not isinstance(value, (dict, list)):
            return 0, 0
        enumerated = _enumerated(self.schema if self.schema is not None else list(self.tools))
        leaves = flatten(value)
        if self.kind == "toolcall":
            leaves.pop("name", None)
        shown_text = _norm(" ".join(ex.text for ex in self.examples))
        shown_runs = _runs(" ".join(ex.text + " " + ex.output for ex in self.examples))
        shown_values: set[Any] = set()
        for ex in self.examples:
            try:
                shown_values |= {_hashable(v) for v in flatten(json.loads(ex.output)).values()}
            except ValueError:
                pass
        source, source_numbers, source_runs = _norm(self.source), _numbers(self.source), _runs(self.source)
        shown_numbers = _numbers(" ".join(ex.text for ex in self.examples))
        copied = counted = 0
        for v in leaves.values():
            if isinstance(v, bool) or v is None or _hashable(v) in enumerated:
                continue
            if isinstance(v, (int, float)):
                counted += 1
                copied += int(_number(v) not in source_numbers and
                              (_number(v) in shown_numbers or _hashable(v) in shown_values))
            elif isinstance(v, str) and len(v.strip()) >= 3:
                counted += 1
                runs = _runs(v)
                borrowed = len(runs & shown_runs - source_runs) / len(runs) if runs else 0.0
                copied += int(_norm(v) not in source and (v in shown_values or _norm(v) in shown_text or
                                                          borrowed >= 0.5))
        return copied, counted


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


_WORD = re.compile(r"\w+")


def _runs(text: str, n: int = 4) -> set[tuple[str, ...]]:
    """The text's runs of ``n`` consecutive words (case-folded)."""
    words = _WORD.findall(text.casefold())
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> set[float]:
    return {float(m.replace(",", "")) for m in _NUMBER.findall(text)}


def _hashable(v: Any) -> Any:
    return _number(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v if isinstance(v, str) else None


def _number(v: int | float) -> float:
    """``v`` as a float; an integer too large for one (a model can write 400 digits) as infinity."""
    try:
        return float(v)
    except OverflowError:
        return float("inf")


def _enumerated(schema: Any) -> set[Any]:
    """Every ``enum`` member and ``const`` in a schema (or tool list), as comparable values."""
    found: set[Any] = set()
    if isinstance(schema, dict):
        for key, sub in schema.items():
            if key == "enum" and isinstance(sub, list):
                found |= {_hashable(v) for v in sub}
            elif key == "const":
                found.add(_hashable(sub))
            else:
                found |= _enumerated(sub)
    elif isinstance(schema, list):
        for sub in schema:
            found |= _enumerated(sub)
    found.discard(None)
    return found


def _wanted(ex: Example, workload: str) -> bool:
    if workload == "extraction":
        return ex.task == "extract" and ex.schema_name != "summary"
    if workload == "toolcall":
        return ex.task == "toolcall"
    if workload == "freetext":
        return ex.schema_name == "summary"
    if workload == "shift":
        return ex.task == "extract" and ex.schema_name == SHIFT_SCHEMA
    return True


def shift_phases(items: list[WorkItem], seed: int = BENCH_SEED) -> list[WorkItem]:
    """The ``shift`` workload's measured items in three phases of a third each; the middle third's documents
    are other schemas' (with no ground truth to score)."""
    others = [e for e in generate(seed + 1, 400) if e.task == "extract" and e.schema_name not in (SHIFT_SCHEMA, "summary")]
    third = -(-len(items) // 3)
    out = []
    for i, item in enumerate(items):
        phase = SHIFT_PHASES[min(2, i // third)]
        if phase == "shifted":
            item = replace(item, source=others[i % len(others)].source, truth={}, freetext_fields=())
        out.append(replace(item, phase=phase))
    return out


EXAMPLE_SOURCES = ("shipped", "synthesized")


def build_workload(workload: str, n: int, few_shot: int = 0, seed: int = BENCH_SEED,
                   examples: str = "shipped") -> list[WorkItem]:
    """``n`` held-out items; ``few_shot`` worked examples per schema (for tool calls: per tool).

    ``examples``: ``shipped`` (the server's examples for the built-in schemas) or ``synthesized`` (the
    placeholder examples the server makes for a schema or tool list of the caller's own, at most two per
    schema or tool): how such a caller's requests fare."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; one of {', '.join(WORKLOADS)}")
    if workload == "chat":
        return chat_items(n, seed)
    from structspec.bench.heldout_workloads import HELDOUT_WORKLOADS, build_heldout_workload  # it imports WorkItem
    if workload in HELDOUT_WORKLOADS:
        return build_heldout_workload(workload, n, seed)
    share = {"toolcall": 0.9, "extraction": 0.0, "freetext": 0.0, "mixed": 0.25, "shift": 0.0}[workload]
    pool = [e for e in generate(seed, max(400, n * 12), toolcall_share=share) if _wanted(e, workload)]
    if workload == "mixed":  # a short-output schema among the rest: triage items from support tickets
        r = random.Random(seed)
        pool += [triage_from_ticket(e, r) for e in pool if e.schema_name == "support_ticket"]
        r.shuffle(pool)
    items = pool[:n]
    if len(items) < n:
        raise ValueError(f"workload {workload}: only {len(items)} items generated for {n} requests")
    schemas = load_builtin_schemas()
    tools = tuple(load_builtin_tools())
    # The worked examples are the server's own (``build_example_book``: what a base-model profile adds to
    # requests for the built-in schemas and tools), so the benchmark measures the prompts users get.
    if examples not in EXAMPLE_SOURCES:
        raise ValueError(f"unknown examples source {examples!r}; one of {', '.join(EXAMPLE_SOURCES)}")
    shipped = build_example_book(few_shot)
    book = shipped
    if examples == "synthesized":  # as the server treats a schema it has no examples for
        book = ExampleBook(synthesize=few_shot, foreign=shipped.foreign)
        # The contact schema's own example is the server's foreign one: its items get another schema's.
        event = schemas["event"]
        other = ExampleBook(synthesize=few_shot, foreign=replace(shipped.for_schema(event)[0], title=schema_title(event))
                            if few_shot else None)
    out = []
    for ex in items:
        if ex.task == "toolcall":
            # The agent's whole tool list, as a deployed agent sends it: one grammar for the workload.
            out.append(WorkItem("toolcall", "agent_tools", ex.source, ex.value, ex.freetext_fields,
                                tools=tools, examples=book.for_tools(tools)))
        else:
            schema = schemas[ex.schema_name]
            out.append(WorkItem("extract", ex.schema_name, ex.source, ex.value, ex.freetext_fields,
                                schema=schema, examples=(other if examples == "synthesized" and
                                                         ex.schema_name == "contact" else book).for_schema(schema),
                                served=examples == "shipped" and few_shot > 0))
    return out


def chat_items(n: int, seed: int = BENCH_SEED) -> list[WorkItem]:
    """``n`` free-text asks (``CHAT_ASKS`` x ``CHAT_TOPICS``, shuffled by ``seed``): no ground truth to score."""
    asks = [a.format(t) for t in CHAT_TOPICS for a in CHAT_ASKS]
    random.Random(seed).shuffle(asks)
    if n > len(asks):
        raise ValueError(f"workload chat: {len(asks)} asks for {n} requests")
    return [WorkItem("chat", "chat", ask, {}) for ask in asks[:n]]
