"""Benchmark workloads: held-out generated documents and tool requests, each with its ground truth.

The same items go to every configuration in one run. Seeds differ from the
demo training corpus (train 1, eval 2-3), so the demo models never saw them.
Base models (Gemma 3 270M) get few-shot prompts: worked document -> JSON
examples of the same schema first, so they finish with ``stop`` rather than
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

import random
from dataclasses import dataclass, field, replace
from typing import Any

from structspec.demo.corpus import Example, flatten, generate, triage_from_ticket
from structspec.prompts import FewShotExample
from structspec.schemas import load_builtin_schemas, load_builtin_tools

WORKLOADS = ("extraction", "toolcall", "freetext", "mixed", "shift")
SHIFT_SCHEMA = "contact"  # copy lookup is accepted well on its documents (it has something to lose)
SHIFT_PHASES = ("before", "shifted", "after")
BENCH_SEED = 7


@dataclass(frozen=True)
class WorkItem:
    kind: str  # extract | toolcall
    schema_name: str
    source: str  # the document or the user's message
    truth: dict[str, Any]
    freetext_fields: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    examples: tuple[FewShotExample, ...] = field(default=())
    phase: str = ""  # the ``shift`` workload's phase

    def score(self, value: Any) -> tuple[int, int]:
        """(right, total) over the non-prose leaf fields."""
        truth = flatten(self.truth)
        got = flatten(value) if isinstance(value, (dict, list)) else {}
        keys = [k for k in truth if not any(k == f or k.startswith(f + ".") for f in self.freetext_fields)]
        return sum(int(k in got and got[k] == truth[k]) for k in keys), len(keys)


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


def build_workload(workload: str, n: int, few_shot: int = 0, seed: int = BENCH_SEED) -> list[WorkItem]:
    """``n`` held-out items; ``few_shot`` worked examples per schema (for tool calls: per tool)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; one of {', '.join(WORKLOADS)}")
    share = {"toolcall": 0.9, "extraction": 0.0, "freetext": 0.0, "mixed": 0.25, "shift": 0.0}[workload]
    pool = [e for e in generate(seed, max(400, n * 12), toolcall_share=share) if _wanted(e, workload)]
    if workload == "mixed":  # a short-output schema among the rest: triage items from support tickets
        r = random.Random(seed)
        pool += [triage_from_ticket(e, r) for e in pool if e.schema_name == "support_ticket"]
        r.shuffle(pool)
    items, shots = pool[:n], pool[n:]
    if len(items) < n:
        raise ValueError(f"workload {workload}: only {len(items)} items generated for {n} requests")
    schemas = load_builtin_schemas()
    tools = {t["function"]["name"]: t for t in load_builtin_tools()}
    out = []
    # Tool calls: ``few_shot`` worked calls *per tool*, the same for every request (as in an agent's system
    # prompt). Fewer than one per tool and a base model calls the tools it was shown, with their values.
    tool_shots, seen = [], {}
    for s in shots:
        if s.task == "toolcall" and seen.get(s.value["name"], 0) < few_shot:
            seen[s.value["name"]] = seen.get(s.value["name"], 0) + 1
            tool_shots.append(FewShotExample(s.source, s.output))
    for ex in items:
        # Extraction: the first worked example(s) of the same schema, fixed per schema.
        examples = tuple(FewShotExample(s.source, s.output) for s in
                         [s for s in shots if s.schema_name == ex.schema_name][:few_shot])
        if ex.task == "toolcall":
            examples = tuple(tool_shots)
            # The agent's whole tool list, as a deployed agent sends it: one grammar for the workload.
            out.append(WorkItem("toolcall", "agent_tools", ex.source, ex.value, ex.freetext_fields,
                                tools=tuple(tools.values()), examples=examples))
        else:
            out.append(WorkItem("extract", ex.schema_name, ex.source, ex.value, ex.freetext_fields,
                                schema=schemas[ex.schema_name], examples=examples))
    return out
