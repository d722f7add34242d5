"""``structspec bench policy``: the drafting policy over days of one schema's traffic, on a simulated clock.

What is real and what is simulated. Real: the router's ``decide`` (so the policy's ``decide`` and
``choose_arm``, the evidence read from the statistics book, the policy's state per proposer), the
statistics book each replica records into, and what each replica records (decisions, verifications,
target steps, drafting times, finished requests with their arm, as the engine records them). Simulated:
the clock, the arrivals (Poisson at ``rate_per_hour``, each sent to a replica chosen at random), the
shared store, and each request's decoding, drawn from a stated cost model (``CostModel``).

The store: a shared in-memory stand-in with the semantics of the SQLite and PostgreSQL stores
(``structspec.store.base``): a replica's records are written at its next flush, one second after
them, and each replica reloads every replica's counters (and seeds the policy's states) at its own
refresh ticks, every ``REFRESH_SECONDS``, with what was written by then plus its own unwritten records.

Decoding one request (``CostModel.decode``): ``free_tokens`` positions the model decides (forced tokens
are fast-forwarded, free of cost). At each step the proposers the decision allows, in the cost model's
order, offer a draft with probability ``coverage``; the first that does drafts ``min(cap, tokens left)``
tokens, each accepted with probability ``acceptance`` once examined (the first rejection ends the
draft). The step costs ``step_ms + verify_ms_per_token * k`` plus the proposer's drafting time,
``ms_per_token * k``, and commits the accepted tokens plus one. The defaults are measured figures:
gemma-3-270m on transformers on this CPU (42 ms decode step, 49 ms a 4-token verification, README
"Gemma on transformers"), its draft model's forward 0.09 of a target step (README "Models"), copy
lookup good on this schema, schema history bad (a proposer the policy should keep off), the draft
model passing the cost model per step but losing end to end to copy lookup alone, by its prefill of
each request's prompt (``request_ms``), which no per-step cost sees.

Terms of the report. *slower arm*: of decoding with the draft model and without it (copy lookup alone,
history being bad), the one whose fixed configuration is slower in the cost model; its *share*: the
requests decoded in it. *probe share*: requests that were recovery probes. *best fixed*: the fastest of
the fixed configurations (every allowed proposer drafting up to ``max_draft``) in the same cost model,
each decoded over ``fixed_requests`` requests. *speed*: output tokens per second of decoding. The
*bounds* each share is held to: ``probe_rate`` plus the floor the configuration states, one forced probe
per ``probe_interval_hours`` (at most one per replica when two race within a refresh) and, for the arm
over the whole run, the requests measured at start (``min_arm_requests`` an arm; twice that when both
replicas measure before a refresh shows them each other's).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from structspec.bench.text_table import aligned
from structspec.engine.config import PolicyConfig
from structspec.engine.sequence import EngineSequence
from structspec.engine.types import SchemaSpeculation
from structspec.speculation.configs import ProposerSet
from structspec.speculation.draft_model import DraftModelProposer
from structspec.speculation.policy import DRAFT_MODEL
from structspec.speculation.router import Router
from structspec.stats.book import Counters, Recorder, StatsBook
from structspec.stats.counters import HOUR, Reason

MODEL = "sim"
SCHEMA_KEY = "sim@1"
SCHEMA = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(8)}}
FLUSH_SECONDS = 1.0  # the server's stats_flush_interval_seconds
REFRESH_SECONDS = 30.0  # the server's stats_refresh_seconds
START = 1000 * HOUR
BAD = "history"  # the proposer the default cost model makes bad


@dataclass(frozen=True)
class ProposerTruth:
    coverage: float  # share of steps at which it has a draft to offer
    acceptance: float  # per examined drafted token
    ms_per_token: float = 0.0  # its own drafting time per drafted token
    request_ms: float = 0.0  # its own time once per request it drafts in, which no per-step cost sees (a prefill)


def _default_proposers() -> dict[str, ProposerTruth]:
    return {"history": ProposerTruth(0.5, 0.05), "ngram": ProposerTruth(0.4, 0.7),
            DRAFT_MODEL: ProposerTruth(1.0, 0.35, 0.09 * 42.0, 400.0)}


@dataclass(frozen=True)
class CostModel:
    step_ms: float = 42.0  # a decode step (one scored position)
    verify_ms_per_token: float = 7.0 / 4  # each drafted token a verification carries (49 ms at k = 4)
    free_tokens: int = 100  # positions the model decides, per request
    forced_tokens: int = 20  # fast-forwarded: output tokens at no cost
    order: tuple[str, ...] = ("history", "ngram", DRAFT_MODEL)  # who drafts first where several could
    proposers: dict[str, ProposerTruth] = field(default_factory=_default_proposers)

    def decode(self, caps: dict[str, int], rng: random.Random) -> tuple[list[tuple[str, int, int]], float]:
        """One request: its verifications (proposer, drafted, accepted), one per step (proposer "" and 0 drafted for
        a plain step), and its decoding time in ms."""
        steps, ms, left, used = [], 0.0, self.free_tokens, set()
        while left > 0:
            proposer, k = "", 0
            for p in self.order:
                if p in caps and rng.random() < self.proposers[p].coverage:
                    proposer, k = p, min(caps[p], left)
                    break
            accepted = 0
            if k:
                c = self.proposers[proposer].acceptance
                while accepted < k and rng.random() < c:
                    accepted += 1
                ms += self.proposers[proposer].ms_per_token * k
                used.add(proposer)
            ms += self.step_ms + self.verify_ms_per_token * k
            steps.append((proposer, k, accepted))
            left -= min(left, accepted + 1)
        return steps, ms + sum(self.proposers[p].request_ms for p in used)

    def fixed_speed(self, proposers: tuple[str, ...] | dict[str, int], max_draft: int, requests: int,
                    seed: int) -> float:
        """Output tokens per second of a fixed configuration: ``proposers`` drafting up to ``max_draft`` (or each up
        to its own cap)."""
        caps = proposers if isinstance(proposers, dict) else {p: max_draft for p in proposers}
        rng, total_ms = random.Random(seed), 0.0
        for _ in range(requests):
            total_ms += self.decode(caps, rng)[1]
        return requests * (self.free_tokens + self.forced_tokens) / (total_ms / 1000.0)

    def arm_speeds(self, max_draft: int, requests: int, seed: int) -> dict[str, float]:
        """Each arm at its best: without the draft model, copy lookup up to ``max_draft``; with it, the same and the
        draft model at its fastest cap."""
        with_draft = max(self.fixed_speed({"ngram": max_draft, DRAFT_MODEL: k}, max_draft, requests, seed)
                         for k in range(1, max_draft + 1))
        return {"draft": with_draft, "no_draft": self.fixed_speed(("ngram",), max_draft, requests, seed)}


FIXED = {"ff": (), "ff+ngram": ("ngram",), "ff+ngram+history": ("ngram", "history"),
         "all": ("ngram", "history", DRAFT_MODEL)}


@dataclass
class SimSeq:
    """What the router reads of a sequence (``EngineSequence``'s fields of the same names)."""

    request_id: str
    schema_key: str = SCHEMA_KEY
    schema: dict | None = None
    speculate: bool = True
    schema_speculation: SchemaSpeculation = SchemaSpeculation.AUTO
    decision: Any = None
    decision_bucket: int = 1
    speculation: Any = None
    serving: Any = None


class _DraftStub:
    """Stands where the draft model's proposer would: the router needs its name; nothing drafts through it."""

    name = DRAFT_MODEL

    def release(self, state) -> None:
        pass

    def close(self) -> None:
        pass


class _Rows:
    """Collects what a ``Recorder`` adds during one request, so the replica's book takes it in one ``add`` (the same
    counters, summed: what the engine's calls add one by one)."""

    def __init__(self, clock):
        self.clock = clock
        self.rows: list = []

    def add(self, rows) -> None:
        self.rows.extend(rows)


class SharedStore:
    """Every replica's written counters and policy changes (what the real stores hold)."""

    def __init__(self) -> None:
        self.rows: Counters = {}
        self.changes: list = []

    def write(self, rows: Counters, changes: list) -> None:
        for key, value in rows.items():
            self.rows[key] = self.rows.get(key, 0.0) + value
        self.changes.extend(changes)


class Replica:
    def __init__(self, index: int, clock, config: PolicyConfig, seed: int):
        self.book = StatsBook(clock=clock)
        self.recorder = self.book.recorder(MODEL)
        self.router = Router(None, ProposerSet(ngram=True, history=True, draft=True), 16, draft=cast(DraftModelProposer, _DraftStub()),
                             stats=self.recorder, policy=config, rng=random.Random(seed), draft_version="sim")
        self.refresh_offset = (7.0 * index) % REFRESH_SECONDS  # replicas refresh at their own moments
        self.last_tick = -1
        self.last_record = -math.inf  # when its oldest unwritten record was made (-inf: none waiting)

    def tick_at(self, t: float) -> int:
        return int((t - self.refresh_offset) // REFRESH_SECONDS)


@dataclass(frozen=True)
class Scenario:
    name: str
    rate_per_hour: float
    replicas: int = 2
    hours: float = 72.0
    seed: int = 0
    warmup_hours: float = 12.0  # the shares are also reported past this (the cold start excluded)


@dataclass
class Tally:
    requests: int = 0
    output_tokens: int = 0
    decode_ms: float = 0.0
    slower_arm: int = 0
    probes: int = 0
    explores: int = 0
    cold: int = 0

    def add(self, tokens: int, ms: float, slower: bool, report) -> None:
        self.requests += 1
        self.output_tokens += tokens
        self.decode_ms += ms
        self.slower_arm += slower
        self.probes += report.probe
        self.explores += report.reasons.get(DRAFT_MODEL) == Reason.EXPLORE
        self.cold += report.reason == Reason.COLD

    def shares(self) -> dict[str, float]:
        n = max(self.requests, 1)
        return {"requests": self.requests, "slower_arm_share": self.slower_arm / n, "probe_share": self.probes / n,
                "explore_share": self.explores / n, "cold_share": self.cold / n,
                "tokens_per_s": self.output_tokens / (self.decode_ms / 1000.0) if self.decode_ms else 0.0}


def simulate(scenario: Scenario, config: PolicyConfig | None = None, cost: CostModel | None = None,
             fixed_requests: int = 600) -> dict[str, Any]:
    """Run ``scenario``; the report (a dict, JSON-ready). Raises: Never for valid inputs."""
    config = config or PolicyConfig()
    cost = cost or CostModel()
    rng = random.Random(scenario.seed)
    now = [float(START)]
    store = SharedStore()
    replicas = [Replica(i, lambda: now[0], config, scenario.seed * 100 + i) for i in range(scenario.replicas)]
    fixed = {name: cost.fixed_speed(ps, config.max_draft, fixed_requests, scenario.seed + 1)
             for name, ps in FIXED.items()}
    arm_speed = cost.arm_speeds(config.max_draft, fixed_requests // 4, scenario.seed + 2)
    slower = min(arm_speed, key=lambda arm: arm_speed[arm])
    whole, late = Tally(), Tally()
    bad = {"drafted_tokens": 0, "drafted_tokens_in_probes": 0, "first_off_hour": None,
           "requests_drafting_after_off_outside_probes": 0, "drafted_tokens_after_off_outside_probes": 0}
    end = START + scenario.hours * HOUR
    i = 0
    while True:
        now[0] += rng.expovariate(scenario.rate_per_hour / HOUR)
        t = now[0]
        if t >= end:
            break
        rep = replicas[rng.randrange(len(replicas))]
        _sync(replicas, store, t, rep)
        seq = SimSeq(f"req-{scenario.seed}-{i}", schema=SCHEMA)
        report = rep.router.decide(cast(EngineSequence, seq), 1)  # (a stand-in with the fields decide reads)
        seq.decision = report
        rows = _Rows(rep.book.clock)
        rec = Recorder(cast(StatsBook, rows), MODEL)  # (a stand-in that keeps the rows)
        rec.record_decision(SCHEMA_KEY, report.reason, report.reasons)
        steps, ms = cost.decode(dict(report.max_draft), random.Random(scenario.seed * 1_000_003 + i))
        for proposer, k, accepted in steps:
            rec.record_step(1, k, (cost.step_ms + cost.verify_ms_per_token * k) / 1000.0)
            if k:
                rec.record_verification(SCHEMA_KEY, proposer, 1, k, accepted, report.reasons.get(proposer) == Reason.PROBE)
                rec.record_proposal(proposer, k, cost.proposers[proposer].ms_per_token * k / 1000.0)
        tokens = cost.free_tokens + cost.forced_tokens
        rec.record_request(SCHEMA_KEY, tokens, len(steps), cost.forced_tokens, "stop", ms, report.arm, ms, 1)
        merged: Counters = {}
        for key, value in rows.rows:
            merged[key] = merged.get(key, 0.0) + value
        rep.book.add(merged.items())
        if rep.last_record == -math.inf:
            rep.last_record = t
        in_slower = (DRAFT_MODEL in report.max_draft) == (slower == "draft")
        whole.add(tokens, ms, in_slower, report)
        if t >= START + scenario.warmup_hours * HOUR:
            late.add(tokens, ms, in_slower, report)
        _tally_bad(bad, report, steps, (t - START) / HOUR)
        i += 1
    best = max(fixed, key=lambda arm: fixed[arm])
    floor_hours = getattr(config, "probe_interval_hours", 1.0)  # the configuration's stated floor
    requests_per_interval = scenario.rate_per_hour * floor_hours
    return {
        "scenario": asdict(scenario),
        "slower_arm": slower,
        "arm_tokens_per_s": arm_speed,
        "fixed_tokens_per_s": fixed,
        "best_fixed": best,
        "whole_run": whole.shares(),
        "after_warmup": late.shares(),
        "speed_vs_best_fixed": whole.shares()["tokens_per_s"] / fixed[best],
        "bad_proposer": {"name": BAD, **bad},
        "bounds": {
            "probe_share": config.probe_rate + 1.0 / requests_per_interval,
            "slower_arm_share": config.probe_rate + 1.0 / requests_per_interval,
            "slower_arm_share_whole_run": config.probe_rate + 1.0 / requests_per_interval
            + 2 * config.min_arm_requests / max(whole.requests, 1),
            "floor": f"one forced probe per {floor_hours:g} h: 1 / ({scenario.rate_per_hour:g} requests/h x "
                     f"{floor_hours:g} h); the whole run adds up to 2 x {config.min_arm_requests} requests "
                     "measured at start in the slower arm",
        },
    }


def _sync(replicas: list[Replica], store: SharedStore, t: float, deciding: Replica) -> None:
    """Every flush due by ``t`` and the deciding replica's latest refresh, in time order: a refresh sees the writes
    made before it. (Another replica's refreshes change nothing it reads before its own next decision, which
    refreshes it then.)"""
    due: list[tuple[float, int, Replica]] = []
    for r in replicas:
        if r.last_record + FLUSH_SECONDS <= t:
            due.append((r.last_record + FLUSH_SECONDS, 0, r))
    tick = deciding.tick_at(t)
    if tick > deciding.last_tick:
        due.append((tick * REFRESH_SECONDS + deciding.refresh_offset, 1, deciding))
    for _when, kind, r in sorted(due, key=lambda d: (d[0], d[1])):
        if kind == 0:
            rows = r.book.take()
            store.write(rows, r.book.policy.take())
            r.book.committed(rows)
            r.last_record = -math.inf
        else:
            r.book.replace_persisted(store.rows.items())
            r.book.policy.seed(store.changes)
            r.last_tick = r.tick_at(t)


def _tally_bad(bad: dict, report, steps: list[tuple[str, int, int]], hour: float) -> None:
    drafted = sum(k for p, k, _ in steps if p == BAD)
    reason = report.reasons.get(BAD)
    bad["drafted_tokens"] += drafted
    if reason == Reason.PROBE:
        bad["drafted_tokens_in_probes"] += drafted
    if bad["first_off_hour"] is None and reason in (Reason.LOW_ACCEPTANCE, Reason.NO_GAIN):
        bad["first_off_hour"] = round(hour, 2)
    elif bad["first_off_hour"] is not None and BAD in report.max_draft and reason != Reason.PROBE:
        bad["requests_drafting_after_off_outside_probes"] += 1
        bad["drafted_tokens_after_off_outside_probes"] += drafted


SCENARIOS = (Scenario("4 requests/h, 2 replicas", 4.0), Scenario("40 requests/h, 2 replicas", 40.0))


def run(scenarios: tuple[Scenario, ...] = SCENARIOS, config: PolicyConfig | None = None,
        cost: CostModel | None = None) -> dict[str, Any]:
    config = config or PolicyConfig()
    cost = cost or CostModel()
    return {"config": asdict(config), "cost_model": asdict(cost),
            "scenarios": [simulate(s, config, cost) for s in scenarios]}


def format_table(report: dict[str, Any]) -> str:
    head = ("scenario", "requests", "slower arm", "share (bound)", "late share", "probes (bound)", "late probes",
            "bad drafted outside probes", "speed / best fixed")
    rows = []
    for s in report["scenarios"]:
        w, late, b, bad = s["whole_run"], s["after_warmup"], s["bounds"], s["bad_proposer"]
        rows.append((s["scenario"]["name"], str(w["requests"]), s["slower_arm"],
                     f"{w['slower_arm_share']:.1%} ({b['slower_arm_share_whole_run']:.1%})",
                     f"{late['slower_arm_share']:.1%}", f"{w['probe_share']:.1%} ({b['probe_share']:.1%})",
                     f"{late['probe_share']:.1%}", str(bad["drafted_tokens_after_off_outside_probes"]),
                     f"{s['speed_vs_best_fixed']:.3f} ({s['best_fixed']})"))
    return aligned((head, *rows), sep=" | ") + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=72.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("reports/policy-sim.json"))
    args = parser.parse_args(argv)
    scenarios = tuple(replace(s, hours=args.hours, seed=args.seed) for s in SCENARIOS)
    report = run(scenarios)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report), end="")
    print(f"report written to {args.out}")


if __name__ == "__main__":
    main()
