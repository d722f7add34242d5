"""The drafting policy on tables: overrides, short outputs, the acceptance guard, the cost model, batch size, probes."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from structspec.engine.config import PolicyConfig
from structspec.engine.types import SchemaSpeculation
from structspec.speculation.policy import (
    PolicyRequest,
    best_draft_length,
    decide,
    estimate_output_tokens,
    predicted_length,
)
from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason
from structspec.stats.evidence import CostEvidence, ProposerEvidence, SchemaEvidence, cost_evidence, schema_evidence

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
LONG = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(8)}}
PROPOSERS = ("draft", "ngram", "history")
CFG = PolicyConfig()


def positional(c: float, k: int = 8, drafts: float = 200.0) -> ProposerEvidence:
    """Evidence of drafts of ``k`` tokens whose every position is accepted with probability ``c`` once examined."""
    reached, accepted_at, reach = [], [], drafts
    for _ in range(k):
        reached.append(reach)
        accepted_at.append(reach * c)
        reach *= c
    drafted = drafts * k
    return ProposerEvidence(drafted, sum(accepted_at), tuple(reached), tuple(accepted_at))


def evidence(**per_proposer: ProposerEvidence) -> SchemaEvidence:
    return SchemaEvidence({(p, 1): ev for p, ev in per_proposer.items()}, dict(per_proposer), 120.0, 50.0)


def request(**kw) -> PolicyRequest:
    return PolicyRequest(kw.pop("schema_key", "s@1"), kw.pop("schema", LONG), kw.pop("drafting_asked", True), **kw)


# A CPU-like cost: a k-token verification costs 7.5% more a token (1.6x at k = 8); a GPU-like one barely more.
CPU = CostEvidence({(1, k): 0.040 * (1 + 0.075 * k) for k in range(9)})
GPU = CostEvidence({(1, k): 0.010 * (1 + 0.005 * k) for k in range(9)})
COSTLY = CostEvidence({(1, k): 0.040 * (1 + 0.8 * k) for k in range(9)})


def run(ev: SchemaEvidence, costs: CostEvidence = CostEvidence(), req: PolicyRequest | None = None, batch: int = 1,
        cfg: PolicyConfig = CFG, seed: int = 0, proposers=PROPOSERS, probed=PROPOSERS):
    req = req or request(probed_this_hour=frozenset(probed))
    return decide(ev, costs, req, batch, random.Random(seed), cfg, proposers)


@pytest.mark.parametrize("req, reason", [
    (request(drafting_asked=False), Reason.REQUEST_OFF),
    (request(schema_override=SchemaSpeculation.OFF), Reason.SCHEMA_OFF),
])
def test_overrides_switch_drafting_off(req, reason):
    report = run(evidence(draft=positional(0.9)), CPU, req)
    assert (report.drafted, report.reason, report.max_draft) == (False, reason, {})
    assert set(report.reasons.values()) == {reason}


def test_the_owners_on_bypasses_the_guard_and_short_outputs():
    triage = json.loads((SCHEMAS / "ticket_triage.json").read_text())
    report = run(evidence(draft=positional(0.1)), COSTLY, request(schema=triage, schema_override=SchemaSpeculation.ON))
    assert report.drafted and report.reason == Reason.SCHEMA_ON and report.max_draft == {p: 8 for p in PROPOSERS}


def test_no_proposers_is_the_servers_choice():
    assert run(SchemaEvidence(), proposers=()).reason == Reason.SERVER_OFF


def test_short_outputs_run_fast_forward_only():
    triage = json.loads((SCHEMAS / "ticket_triage.json").read_text())
    assert estimate_output_tokens(triage) < CFG.min_predicted_length  # the schema's own estimate
    report = run(SchemaEvidence(), req=request(schema=triage))
    assert (report.drafted, report.reason) == (False, Reason.SHORT_OUTPUT)
    # the schema's measured p50 wins over its estimate once there are enough complete outputs
    measured = SchemaEvidence(output_p50=12.0, finished=40.0)
    assert run(measured).reason == Reason.SHORT_OUTPUT
    assert run(SchemaEvidence(output_p50=12.0, finished=3.0)).reason == Reason.COLD  # too few: the estimate (long)
    assert predicted_length(SchemaEvidence(output_p50=80.0, finished=40.0), triage, CFG) == 80.0


def test_cold_proposers_draft_at_full_length_until_there_is_evidence():
    report = run(SchemaEvidence(), CPU)
    assert report.drafted and report.reason == Reason.COLD and report.max_draft == {p: 8 for p in PROPOSERS}
    thin = positional(0.1, drafts=CFG.min_evidence_tokens / 8 - 1)  # just under the evidence floor
    assert run(evidence(draft=thin), CPU).reasons["draft"] == Reason.COLD


ALWAYS = PolicyConfig(acceptance_guard="always")


def test_the_strict_guard_switches_a_low_acceptance_proposer_off_whatever_the_costs():
    low = positional(0.5)  # under 0.55 per examined token
    assert low.acceptance < CFG.acceptance_threshold
    report = run(evidence(draft=low, ngram=positional(0.95)), GPU, cfg=ALWAYS)  # on a GPU it would still "pay"
    assert report.reasons["draft"] == Reason.LOW_ACCEPTANCE and "draft" not in report.max_draft
    assert report.reasons["ngram"] == Reason.DRAFTED and report.max_draft["ngram"] == 8
    assert report.drafted and report.reason == Reason.DRAFTED


def test_the_default_guard_yields_only_to_measured_costs_that_show_a_gain():
    low = positional(0.4)
    assert run(evidence(ngram=low), CostEvidence(), proposers=("ngram",)).reasons["ngram"] == Reason.LOW_ACCEPTANCE
    cheap = run(evidence(ngram=low), GPU, proposers=("ngram",))  # verification nearly free: 0.4 still pays
    assert cheap.reasons["ngram"] == Reason.DRAFTED and cheap.max_draft["ngram"] >= 1
    costly = run(evidence(ngram=low), COSTLY, proposers=("ngram",))
    assert costly.reasons["ngram"] == Reason.LOW_ACCEPTANCE


def test_the_cost_model_adapts_the_draft_length_to_the_hardware():
    ev = positional(0.6)
    assert ev.acceptance == pytest.approx(0.6)  # per examined token, whatever the drafts' length
    cpu_k, gpu_k = best_draft_length(ev, CPU, "ngram", 1, CFG), best_draft_length(ev, GPU, "ngram", 1, CFG)
    assert gpu_k == 8  # verification nearly free: draft as far as allowed
    assert 1 <= cpu_k < gpu_k  # verification costly: stop where another token's acceptance no longer pays
    # the chosen length minimises (T(k) + D(k)) / (1 + E[accepted | k]) by brute force
    times = {k: CPU.step_seconds(1, k) / (1 + ev.expected_accepted(k)) for k in range(1, 9)}
    assert cpu_k == min(times, key=times.get)
    # a costly verification with mediocre acceptance beats no plain step: off, with its reason
    report = run(evidence(ngram=positional(0.7)), COSTLY, proposers=("ngram",))
    assert (report.drafted, report.reasons["ngram"]) == (False, Reason.NO_GAIN)


def test_drafting_time_counts_in_the_cost():
    ev = positional(0.9)
    slow_draft = CostEvidence(GPU.steps, {("draft", k): 0.010 * k for k in range(1, 9)})  # a draft step = a target step
    assert best_draft_length(ev, GPU, "draft", 1, CFG) == 8
    assert best_draft_length(ev, slow_draft, "draft", 1, CFG) == 0


def test_the_draft_model_stops_past_its_batch_limit_and_copy_lookup_goes_on():
    ev = SchemaEvidence({}, {"draft": positional(0.9), "ngram": positional(0.9)})
    report = run(ev, CostEvidence(), batch=CFG.draft_model_max_batch + 1, proposers=("draft", "ngram"))
    assert report.reasons["draft"] == Reason.BATCH_SIZE and report.max_draft == {"ngram": 8}
    assert run(ev, batch=CFG.draft_model_max_batch, proposers=("draft", "ngram")).max_draft["draft"] == 8


def test_ngram_draft_length_shrinks_as_the_batch_grows_where_the_costs_say_so():
    # measured at two buckets: verification is cheap at batch 1, expensive at batch 16
    costs = CostEvidence({**{(1, k): 0.02 * (1 + 0.01 * k) for k in range(9)},
                          **{(16, k): 0.05 * (1 + 0.2 * k) for k in range(9)}})
    ev = positional(0.8)
    assert best_draft_length(ev, costs, "ngram", 1, CFG) > best_draft_length(ev, costs, "ngram", 16, CFG) >= 1


def test_a_switched_off_proposer_is_probed_once_an_hour_at_least():
    ev = evidence(draft=positional(0.3))
    first = run(ev, CPU, request(), proposers=("draft",), cfg=ALWAYS)  # nothing probed this hour yet
    assert first.probe and first.reason == Reason.PROBE and first.max_draft == {"draft": 8}
    later = run(ev, CPU, request(probed_this_hour=frozenset({"draft"})), proposers=("draft",), cfg=ALWAYS)
    assert not later.probe and later.reason == Reason.LOW_ACCEPTANCE


def probe_share(cfg: PolicyConfig, n: int = 4000) -> float:
    rng = random.Random(7)
    ev, req = evidence(draft=positional(0.3)), request(probed_this_hour=frozenset({"draft"}))
    return sum(decide(ev, COSTLY, req, 1, rng, cfg, ("draft",)).probe for _ in range(n)) / n


def test_the_probe_rate_is_the_configured_share():
    """A binomial test at 2% over 4,000 draws: the 99.9% band is about 1.3%-2.7%. It has the power to
    reject a policy that ignores the rate (0% or 100%) or applies a wrong one (5% is 7 standard errors out)."""
    n, p = 4000, CFG.probe_rate
    band = 3.3 * math.sqrt(p * (1 - p) / n)
    assert abs(probe_share(CFG, n) - p) < band
    for wrong in (0.0, 0.05, 1.0):
        assert abs(probe_share(PolicyConfig(probe_rate=wrong), n) - p) >= band


def test_probes_are_not_made_for_short_outputs_or_batch_limits():
    short = SchemaEvidence(output_p50=10.0, finished=50.0)
    assert not run(short, req=request()).probe
    ev = SchemaEvidence({}, {"draft": positional(0.9)})
    assert not run(ev, req=request(), batch=64, proposers=("draft",)).probe


def test_config_problems_name_the_field():
    assert PolicyConfig().problems() == []
    problems = PolicyConfig(acceptance_threshold=1.5, probe_rate=-0.1, evidence_window_tokens=10,
                            acceptance_guard="never").problems()
    assert [p.split(":")[0] for p in problems] == ["acceptance_threshold", "acceptance_guard", "evidence_window_tokens",
                                                   "probe_rate"]


# -- evidence from counters ------------------------------------------------------------------


def test_expected_accepted_chains_the_positional_rates():
    ev = ProposerEvidence(0, 0, (100.0, 50.0, 10.0), (50.0, 10.0, 10.0))  # c = 0.5, 0.2, 1.0
    assert ev.expected_accepted(1) == pytest.approx(0.5)
    assert ev.expected_accepted(3) == pytest.approx(0.5 + 0.1 + 0.1)
    assert ev.expected_accepted(4) == pytest.approx(0.5 + 0.1 + 0.1 + 0.1)  # unexamined: the last rate


def record(book: StatsBook, model: str, schema: str, verifications: int, drafted: int, accepted: int) -> None:
    rec = book.recorder(model)
    for _ in range(verifications):
        rec.record_verification(schema, "draft", 1, drafted, accepted, probe=False)


def test_acceptance_is_measured_over_the_most_recent_window_of_drafted_tokens():
    clock = [100 * HOUR + 10.0]
    book = StatsBook(clock=lambda: clock[0])
    record(book, "m", "s", 500, 8, 8)  # 4,000 tokens all accepted, two hours ago
    clock[0] += 2 * HOUR
    record(book, "m", "s", 100, 8, 1)  # 800 tokens, 1 in 8 accepted, this hour
    now = int(clock[0] // HOUR) * HOUR
    ev = schema_evidence(book.rows_for("m", "s"), now, 3.0, window_tokens=1000).pooled["draft"]
    assert ev.drafted == pytest.approx(1000)  # 800 of this hour + 200 of the older hour
    assert ev.accepted == pytest.approx(100 + 200)
    assert ev.acceptance == pytest.approx((100 + 200) / (100 + 100 + 200))  # examined: 1st + 2nd of this hour's
    assert ev.reached[0] == pytest.approx(100 + 25) and ev.accepted_at[1] == pytest.approx(25)
    # the other model's traffic of the same schema is never read
    record(book, "other", "s", 1000, 8, 8)
    assert schema_evidence(book.rows_for("m", "s"), now, 3.0, 1000).pooled["draft"].accepted == pytest.approx(300)


def test_step_costs_are_means_per_bucket_and_draft_length():
    book = StatsBook(clock=lambda: 50 * HOUR)
    rec = book.recorder("m")
    for _ in range(10):
        rec.record_step(1, 0, 0.02)
        rec.record_step(3, 4, 0.06)
        rec.record_proposal("draft", 4, 0.004)
    rec.record_step(1, 8, 0.5)  # one sample: under the minimum, not used
    costs = cost_evidence(book.rows_for("m", ""), 50 * HOUR, 3.0)
    assert costs.step_seconds(1, 0) == pytest.approx(0.02) and costs.step_seconds(4, 4) == pytest.approx(0.06)
    assert costs.step_seconds(1, 8) is None and costs.step_seconds(4, 2) is None  # not extrapolated
    assert costs.propose_seconds("draft", 2) == pytest.approx(0.002)


# -- the draft model end to end: with it or without it -----------------------------------------


def arms(with_draft: tuple[float, float], without: tuple[float, float]) -> SchemaEvidence:
    """Evidence where the draft model passes the guard and the cost model, and the two arms measured
    (requests, ms per token)."""
    from structspec.stats.evidence import ArmEvidence

    made = {a: ArmEvidence(n, ms * 100 * n, 100 * n) for a, (n, ms) in (("draft", with_draft), ("no_draft", without))}
    return SchemaEvidence({}, {"draft": positional(0.9)}, 120.0, 50.0, {}, made)


def test_the_arms_are_measured_in_turn_while_cold():
    report = run(arms((0, 0), (0, 0)), proposers=("draft", "ngram"))
    assert report.arm == "draft" and "draft" in report.max_draft
    report = run(arms((3, 5.0), (1, 5.0)), proposers=("draft", "ngram"))
    assert report.arm == "no_draft" and report.reasons["draft"] == Reason.COLD and "draft" not in report.max_draft
    assert report.drafted and report.max_draft["ngram"] == 8  # the cheap proposers draft in its place


def test_the_faster_arm_is_kept_and_the_other_explored_at_the_probe_rate():
    faster_with = arms((20, 2.0), (20, 3.0))
    kept = run(faster_with, proposers=("draft", "ngram"))
    assert kept.arm == "draft" and kept.reasons["draft"] == Reason.DRAFTED
    explored = run(faster_with, proposers=("draft", "ngram"), cfg=PolicyConfig(probe_rate=1.0))
    assert explored.arm == "no_draft" and explored.reasons["draft"] == Reason.EXPLORE
    slower_with = arms((20, 3.0), (20, 2.0))
    off = run(slower_with, proposers=("draft", "ngram"))  # probed this hour already: off
    assert off.arm == "no_draft" and off.reasons["draft"] == Reason.NO_GAIN and off.max_draft == {"ngram": 8}
    probe = run(slower_with, proposers=("draft", "ngram"), probed=())
    assert probe.probe and probe.arm == "draft" and probe.max_draft["draft"] == 8


def test_a_re_decision_keeps_the_requests_arm():
    slower_with = arms((20, 3.0), (20, 2.0))
    kept = run(slower_with, req=request(probed_this_hour=frozenset(PROPOSERS), arm="draft", arm_reason="probe"),
               proposers=("draft",))
    assert kept.arm == "draft" and "draft" in kept.max_draft and kept.reasons["draft"] == "probe"
    faster_with = arms((20, 2.0), (20, 3.0))
    explored = run(faster_with, req=request(arm="no_draft", arm_reason="explore"), proposers=("draft", "ngram"))
    assert explored.arm == "no_draft" and explored.reasons["draft"] == "explore" and not explored.probe


def test_stale_evidence_expires_so_a_long_switched_off_proposer_is_measured_afresh():
    clock = [500 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    record(book, "m", "s", 200, 8, 0)  # a bad hour: off while it is recent
    for hours_later, reason in ((1, Reason.LOW_ACCEPTANCE), (5, Reason.LOW_ACCEPTANCE), (7, Reason.COLD)):
        now = 500 * HOUR + hours_later * HOUR
        ev = schema_evidence(book.rows_for("m", "s"), now, 3.0, 1000, CFG.evidence_max_age_hours)
        assert run(ev, proposers=("draft",), cfg=PolicyConfig(min_arm_requests=1)).reasons["draft"] == reason
