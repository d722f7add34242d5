"""The policy in its loop, on a simulated clock: the router decides, verifications are recorded, the book feeds the
next decision. A schema whose traffic shifts gets its proposer switched off, probed, and switched back on."""

from __future__ import annotations

import random
from dataclasses import dataclass

from structspec.engine.config import PolicyConfig
from structspec.engine.types import SchemaSpeculation
from structspec.models.step_profile import StepProfile
from structspec.speculation.configs import ProposerSet
from structspec.speculation.router import Router
from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason
from structspec.stats.policy_states import OFF, ON, PolicyChange, proposer_states

LONG = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(8)}}


@dataclass
class Seq:
    schema_key: str = "invoice@1"
    schema: dict | None = None
    speculate: bool = True
    schema_speculation: SchemaSpeculation = SchemaSpeculation.AUTO
    decision: object = None
    speculation: object = None  # the router's per-sequence state (bound to the draft at the first decision)
    serving: object = None  # what it was admitted under (None: the router's statistics)


class DraftStub:
    name = "draft"


def simulate(phases: list[tuple[int, float]], config: PolicyConfig, per_hour: int = 40, seed: int = 0,
             step_costs: dict[int, float] | None = None, books: list[StatsBook] | None = None,
             costs_first: bool = False) -> list[dict]:
    """``phases``: (hours, per-position acceptance). Per hour: counts of decisions by reason. ``books`` gets the
    simulation's statistics book. ``costs_first``: ``step_costs`` are also the router's step profile, measured
    before the first request (as the assembly measures the executor's)."""
    clock = [1000 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    if books is not None:
        books.append(book)
    rec = book.recorder("demo")
    profile = StepProfile("test", {(1, k): v for k, v in step_costs.items()}) if costs_first and step_costs else None
    router = Router(None, ProposerSet(ngram=False, history=False, draft=True), 16, draft=DraftStub(), stats=rec,
                    policy=config, rng=random.Random(seed), step_profile=profile)
    rng = random.Random(seed + 1)
    hours = []
    for n_hours, c in phases:
        for _ in range(n_hours):
            counts: dict[str, int] = {}
            for _ in range(per_hour):
                clock[0] += HOUR / per_hour
                report = router.decide(Seq(schema=LONG), 1)
                counts[report.reason] = counts.get(report.reason, 0) + 1
                if "draft" in report.max_draft:
                    k = min(8, report.max_draft["draft"])
                    for _ in range(12):  # a request's verifications
                        accepted = 0
                        while accepted < k and rng.random() < c:
                            accepted += 1
                        rec.record_verification("invoice@1", "draft", 1, k, accepted, report.probe)
                        if step_costs is not None:
                            rec.record_step(1, k, step_costs[k])
                            rec.record_step(1, 0, step_costs[0])
                rec.record_request("invoice@1", 120, 40, 10, "stop", 900.0)
            hours.append(counts)
    return hours


def drafting(hour: dict) -> int:
    """Requests the policy let draft outside probes."""
    return hour.get(Reason.DRAFTED, 0) + hour.get(Reason.COLD, 0)


def switch_points(hours: list[dict], shift: int, recover: int) -> tuple[int | None, int | None]:
    """Hours after ``shift`` until no request drafts outside probes; hours after ``recover`` until most do again."""
    off = next((h - shift for h in range(shift, recover) if drafting(hours[h]) == 0), None)
    on = next((h - recover for h in range(recover, len(hours)) if drafting(hours[h]) > len(hours[h]) // 2), None)
    return off, on


def test_a_shift_switches_the_proposer_off_within_the_window_and_back_on_after_recovery():
    hours = simulate([(6, 0.9), (8, 0.2), (10, 0.9)], PolicyConfig())
    assert all(drafting(h) == 40 for h in hours[:6])  # good traffic: everyone drafts (cold, then on evidence)
    off, on = switch_points(hours, 6, 14)
    assert off is not None and off <= 1, hours[6:8]  # the shift shows within the hour after it
    off_hours = hours[6 + off + 1:14]
    assert all(h.get(Reason.LOW_ACCEPTANCE, 0) > 30 for h in off_hours)  # switched off, with its reason
    probes, expected = sum(h.get(Reason.PROBE, 0) for h in off_hours), 0.02 * 40 * len(off_hours)
    assert 1 <= probes <= expected + 3 * expected ** 0.5  # probed, at the probe rate (2%)
    assert on is not None and on <= 3, hours[14:18]  # the probes bring it back


def test_the_policys_switches_are_recorded_when_they_happen():
    books: list[StatsBook] = []
    hours = simulate([(6, 0.9), (8, 0.2), (10, 0.9)], PolicyConfig(), books=books)
    off, on = switch_points(hours, 6, 14)
    switches = [c for c in books[0].policy.take() if c.is_switch]
    assert [c.state for c in switches] == [ON, OFF, ON], switches  # cold, off after the shift, on after recovery
    start = 1000 * HOUR
    assert switches[1].reason == Reason.LOW_ACCEPTANCE and switches[1].acceptance < 0.55 == switches[1].threshold
    assert 6 <= (switches[1].at - start) / HOUR <= 6 + off + 1
    assert 14 <= (switches[2].at - start) / HOUR <= 14 + on + 1 and switches[2].acceptance >= 0.55
    assert [s.state for s in proposer_states(switches).values()] == [ON]


def test_the_loop_test_has_power_a_policy_without_the_guard_never_switches_off():
    hours = simulate([(6, 0.9), (8, 0.2), (10, 0.9)], PolicyConfig(acceptance_threshold=0.0))
    off, _ = switch_points(hours, 6, 14)
    assert off is None


def test_the_cost_model_switches_off_where_verification_is_too_costly_for_the_acceptance():
    # acceptance 0.6 passes the guard, but a 1 + 0.8 k verification never pays for it
    costly = {k: 0.04 * (1 + 0.8 * k) for k in range(9)}
    hours = simulate([(6, 0.6)], PolicyConfig(), step_costs=costly)  # measured while drafting cold
    assert hours[-1].get(Reason.NO_GAIN, 0) + hours[-1].get(Reason.PRICED_OUT, 0) >= 35
    # with the costs measured before the schema's first request, it never drafts to find out (probes aside)
    hours = simulate([(6, 0.6)], PolicyConfig(), step_costs=costly, costs_first=True)
    assert all(h.get(Reason.PRICED_OUT, 0) + h.get(Reason.PROBE, 0) == 40 for h in hours), hours
    assert sum(h.get(Reason.PROBE, 0) for h in hours) <= 0.02 * 240 + 4  # the draw's share alone, no floor
    cheap = {k: 0.04 * (1 + 0.01 * k) for k in range(9)}
    assert drafting(simulate([(6, 0.6)], PolicyConfig(), step_costs=cheap)[-1]) == 40


def simulate_arms(ms_with: float, ms_without: float, requests: int = 400, seed: int = 3) -> list[str]:
    """Each request decodes 100 tokens at the arm's speed; the arms the policy chose, in order."""
    clock = [2000 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    rec = book.recorder("demo")
    router = Router(None, ProposerSet(ngram=True, history=False, draft=True), 16, draft=DraftStub(), stats=rec,
                    policy=PolicyConfig(), rng=random.Random(seed))
    router.ngram = type("Ngram", (), {"name": "ngram"})()
    assert router.names == ("draft", "ngram", "ngram/long")  # derived from the proposers present
    chosen = []
    for _ in range(requests):
        clock[0] += 30.0
        report = router.decide(Seq(schema=LONG), 1)
        chosen.append(report.arm)
        ms = ms_with if report.arm == "draft" else ms_without
        rec.record_request("invoice@1", 100, 40, 10, "stop", 100 * ms, report.arm, 100 * ms, 1)
    return chosen


def test_the_draft_model_is_kept_only_where_it_is_faster_end_to_end():
    slower = simulate_arms(ms_with=3.0, ms_without=2.5)
    assert slower[:16].count("draft") == 8  # cold: both arms measured, in turn
    late = slower[100:]
    assert late.count("no_draft") / len(late) > 0.9  # then without it, but for the explored share
    assert 0 < late.count("draft") <= 0.02 * len(late) + 3 * (0.02 * len(late)) ** 0.5  # 2%, 3 sd of slack
    faster = simulate_arms(ms_with=2.0, ms_without=2.5)
    late = faster[100:]
    assert late.count("draft") / len(late) > 0.9
    assert 0 < late.count("no_draft") < 0.06 * len(late)  # explored at the probe rate (2%), with slack


# -- probes: a share of requests, a floor per interval shared through the store, no re-draw ---------------------


BAD = PolicyConfig(probe_rate=0.0)  # only the floor probes: every probe below is a forced one


def bad_evidence(rec, schema_key: str = "invoice@1") -> None:
    for _ in range(100):  # 800 drafted tokens, none accepted: off
        rec.record_verification(schema_key, "draft", 1, 8, 0, False)


def replica(book: StatsBook, config: PolicyConfig = BAD, seed: int = 0) -> Router:
    return Router(None, ProposerSet(ngram=False, history=False, draft=True), 16, draft=DraftStub(),
                  stats=book.recorder("demo"), policy=config, rng=random.Random(seed))


def test_the_probe_floor_is_shared_by_replicas_through_the_store_and_survives_a_restart():
    clock = [3000 * HOUR]
    a, b = StatsBook(clock=lambda: clock[0]), StatsBook(clock=lambda: clock[0])
    store: dict = {}

    def flush_and_refresh() -> None:  # what the server's flush and refresh tasks do, every second and 30 s
        for book in (a, b):
            rows = book.take()
            for key, value in rows.items():
                store[key] = store.get(key, 0.0) + value
            book.committed(rows)
        for book in (a, b):
            book.replace_persisted(store.items())

    bad_evidence(a.recorder("demo"))
    flush_and_refresh()
    ra, rb = replica(a), replica(b)
    assert ra.decide(Seq(schema=LONG), 1).reasons["draft"] == Reason.LOW_ACCEPTANCE
    assert rb.decide(Seq(schema=LONG), 1).reasons["draft"] == Reason.LOW_ACCEPTANCE  # drafted this hour: no probe
    clock[0] += BAD.probe_interval_hours * HOUR
    probe = ra.decide(Seq(schema=LONG), 1)
    assert probe.probe and probe.max_draft == {"draft": BAD.probe_max_draft}  # overdue: replica a probes
    a.recorder("demo").record_verification("invoice@1", "draft", 1, 3, 0, True)
    flush_and_refresh()
    assert not rb.decide(Seq(schema=LONG), 1).probe  # replica b reads a's probe from the store
    assert not replica(b).decide(Seq(schema=LONG), 1).probe  # nor does a restarted replica probe at once


def test_a_re_decision_never_draws_the_probe_again():
    clock = [4000 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    bad_evidence(book.recorder("demo"))
    router = replica(book, PolicyConfig(probe_rate=0.5))
    for _ in range(20):
        seq = Seq(schema=LONG)
        first = router.decide(seq, 1)
        seq.decision = first
        for i in range(30):  # the running batch crosses bucket boundaries: each time a re-decision
            seq.decision = router.decide(seq, 1 + i % 2 * 2)
            assert seq.decision.probe is first.probe


def test_a_proposer_switched_off_before_stays_off_on_thin_evidence_after_a_restart():
    """The store's latest state of the proposer seeds the restarted process: thin evidence does not make it cold."""
    clock = [5000 * HOUR]
    books = [StatsBook(clock=lambda: clock[0]) for _ in range(2)]
    for book in books:
        book.recorder("demo").record_verification("invoice@1", "draft", 1, 3, 0, True)  # one probe's 3 tokens
    assert replica(books[0]).decide(Seq(schema=LONG), 1).reasons["draft"] == Reason.COLD  # never judged: measured
    books[1].policy.seed([PolicyChange("demo", "invoice@1", "draft", clock[0] - 50 * HOUR, OFF,
                                       Reason.LOW_ACCEPTANCE, ON)])
    assert replica(books[1]).decide(Seq(schema=LONG), 1).reasons["draft"] == Reason.LOW_ACCEPTANCE
