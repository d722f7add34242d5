"""The drafting policy on tables: overrides, short outputs, the acceptance guard, the cost model, batch size, probes."""

from __future__ import annotations

import dataclasses
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
from structspec.stats.counters import HOUR, Reason, hour_of, narrow_key
from structspec.stats.evidence import CostEvidence, ProposerEvidence, SchemaEvidence, schema_evidence

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


NOW = 100 * HOUR


def evidence(drafted_hours_ago: float = 0, **per_proposer: ProposerEvidence) -> SchemaEvidence:
    """Evidence read at ``NOW``; each proposer's newest drafting ``drafted_hours_ago``."""
    newest = NOW - int(drafted_hours_ago) * HOUR
    return SchemaEvidence({(p, 1): ev for p, ev in per_proposer.items()}, dict(per_proposer), 120.0, 50.0,
                          last_measured={p: newest for p in per_proposer}, hour=NOW)


def request(**kw) -> PolicyRequest:
    return PolicyRequest(kw.pop("schema_key", "s@1"), kw.pop("schema", LONG), kw.pop("drafting_asked", True), **kw)


# A CPU-like cost: a k-token verification costs 7.5% more a token (1.6x at k = 8); a GPU-like one barely more.
CPU = CostEvidence({(1, k): 0.040 * (1 + 0.075 * k) for k in range(9)})
GPU = CostEvidence({(1, k): 0.010 * (1 + 0.005 * k) for k in range(9)})
COSTLY = CostEvidence({(1, k): 0.040 * (1 + 0.8 * k) for k in range(9)})


def run(ev: SchemaEvidence, costs: CostEvidence = CostEvidence(), req: PolicyRequest | None = None, batch: int = 1,
        cfg: PolicyConfig = CFG, proposers=PROPOSERS):
    return decide(ev, costs, req or request(), batch, cfg, proposers)


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


def test_a_short_output_drafts_the_whole_rest_where_a_long_draft_pays_and_nothing_where_it_does_not():
    triage = json.loads((SCHEMAS / "ticket_triage.json").read_text())
    # transformers with Gemma: an 8-token draft costs 1.42 decode steps
    cheap = CostEvidence({(1, k): 0.137 * (1 + 0.0525 * k) for k in range(9)})
    report = run(SchemaEvidence(), cheap, request(schema=triage))
    assert report.reasons["draft"] == Reason.SHORT_OUTPUT and "draft" not in report.max_draft
    assert report.drafted and report.max_draft == {"ngram": 8, "history": 8}  # a short draft would save no pass
    # llama.cpp with Gemma: an 8-token draft costs 3 decode steps; fast-forward only
    llamacpp = CostEvidence({(1, k): 0.0194 * (1 + 0.25 * k) for k in range(9)})
    dear = run(SchemaEvidence(), llamacpp, request(schema=triage))
    assert (dear.drafted, dear.reason, set(dear.reasons.values())) == (False, Reason.SHORT_OUTPUT,
                                                                       {Reason.SHORT_OUTPUT})
    # ... unless the schema's own evidence says its drafts run long enough to pay there too
    sure = run(evidence(ngram=positional(0.97, drafts=200)), llamacpp, request(schema=triage), proposers=("ngram",))
    assert sure.max_draft == {"ngram": 8}


def test_cold_proposers_draft_at_full_length_where_no_step_cost_is_known():
    report = run(SchemaEvidence(), CostEvidence())
    assert report.drafted and report.reason == Reason.COLD and report.max_draft == {p: 8 for p in PROPOSERS}


def test_a_cold_proposer_is_priced_at_the_prior_acceptance_against_the_measured_costs():
    # GPU-like: a k-token verification barely costs more than a decode step, so drafting pays even at the prior
    gpu = run(SchemaEvidence(), GPU)
    assert gpu.reason == Reason.COLD and all(k >= 4 for k in gpu.max_draft.values())
    # a k-row step costing k + 1 decode steps: no draft length can pay, whatever the acceptance
    forwards = CostEvidence({(1, k): 0.014 * (k + 1) for k in range(9)})
    report = run(SchemaEvidence(), forwards)
    assert (report.drafted, report.max_draft) == (False, {})
    assert set(report.reasons.values()) == {Reason.PRICED_OUT} and report.reason == Reason.PRICED_OUT
    # the CPU table: a short draft pays at the prior, a long one does not
    cpu = run(SchemaEvidence(), CPU)
    assert cpu.reason == Reason.COLD and all(1 <= k < 8 for k in cpu.max_draft.values())


def test_drafts_priced_out_at_the_output_layer_still_run_where_every_scored_set_is_small():
    """Gemma on llama.cpp: a full row costs an output layer over 262k ids (a k-row step ~ k + 1 decode steps), a row
    scored over a small allowed set barely anything. A cold schema drafts nothing at the full head, and the cheap
    proposers draft structural stretches at the restricted head's price; never the draft model (its sampled drafts
    may not be cut by where they lead)."""
    full = {(1, k): 0.014 * (k + 1) for k in range(9)}
    cheap = CostEvidence(full, restricted_profile={(1, k): 0.006 * (1 + 0.05 * k) for k in range(9)})
    report = run(SchemaEvidence(), cheap)
    assert report.max_draft == {} and set(report.reasons.values()) == {Reason.PRICED_OUT}
    assert report.drafted and set(report.restricted_max_draft) == {"ngram", "history"}
    assert all(k >= 4 for k in report.restricted_max_draft.values())
    # restricted forwards as dear as full ones: nothing drafts anywhere
    dear = CostEvidence(full, restricted_profile=dict(full))
    assert (run(SchemaEvidence(), dear).drafted, run(SchemaEvidence(), dear).restricted_max_draft) == (False, {})
    # served restricted steps, once measured, are what prices them (the profile scaled to them elsewhere)
    served = CostEvidence(full, restricted_steps={(1, k): 0.006 * (k + 1) for k in range(9)},
                          restricted_profile=cheap.restricted_profile)
    assert run(SchemaEvidence(), served).restricted_max_draft == {}
    # a measured schema: a restricted cap only where it is longer than the full head's
    costs = CostEvidence(CPU.steps, restricted_profile=cheap.restricted_profile)
    high = run(evidence(ngram=positional(0.9, drafts=400)), costs, proposers=("ngram",))
    assert (high.max_draft, high.restricted_max_draft) == ({"ngram": 8}, {})  # the full cap is already the longest
    mid = run(evidence(ngram=positional(0.6, drafts=400)), costs, proposers=("ngram",))
    assert mid.max_draft["ngram"] < mid.restricted_max_draft["ngram"]


def test_a_restricted_cap_is_priced_with_the_proposers_own_narrow_drafts():
    """SmolLM2's nested tool calls: copy lookup is kept well inside values, but its drafts at a key or separator
    are mostly refused. Those drafts are recorded apart (``narrow_key``), and they alone price the restricted cap."""
    full = {(1, k): 0.014 * (k + 1) for k in range(9)}
    cheap = CostEvidence(full, restricted_profile={(1, k): 0.006 * (1 + 0.05 * k) for k in range(9)})
    narrow = narrow_key("ngram")
    refused = run(evidence(**{"ngram": positional(0.9, drafts=400), narrow: positional(0.05, drafts=400)}), cheap,
                  proposers=("ngram",))
    assert refused.max_draft == {} and refused.restricted_max_draft == {}
    kept = run(evidence(**{"ngram": positional(0.6, drafts=400), narrow: positional(0.9, drafts=400)}), cheap,
               proposers=("ngram",))
    assert kept.max_draft == {} and kept.restricted_max_draft == {"ngram": 8}
    # with none of its own, the restricted cap is priced at the prior, whatever the proposer's acceptance elsewhere
    cold = run(evidence(ngram=positional(0.9, drafts=400)), cheap, proposers=("ngram",))
    prior = run(SchemaEvidence(), cheap, proposers=("ngram",))
    assert cold.restricted_max_draft == prior.restricted_max_draft


def test_copy_lookups_long_matches_are_priced_apart_and_draft_where_its_short_ones_do_not_pay():
    """SmolLM2's manifests: copy lookup's drafts from a match of 24 characters or more (a repeat of the output's own
    text, mostly) were accepted at 0.89-0.95 a token, its other drafts at about 0.4. Priced apart (``ngram/long``),
    the long matches draft at a step cost where the proposer as a whole is priced out; the short ones stay off."""
    costs = CostEvidence({(1, k): 0.040 * (1 + 0.5 * k) for k in range(9)})  # a k-row step: 1 + k/2 plain steps
    keys = ("ngram", "ngram/long")
    cold = run(SchemaEvidence(), costs, proposers=keys)  # the prior prices both out
    assert cold.max_draft == {} and cold.reasons == {"ngram": Reason.PRICED_OUT, "ngram/long": Reason.PRICED_OUT}
    replayed = dataclasses.replace(SchemaEvidence(), replayed={"ngram/long": positional(0.93, drafts=60),
                                                                "ngram": positional(0.4, drafts=60)})
    learned = run(replayed, costs, proposers=keys)  # what the finished outputs say each would have had kept
    assert learned.reasons == {"ngram": Reason.PRICED_OUT, "ngram/long": Reason.COLD}
    assert learned.max_draft["ngram/long"] >= 1
    measured = run(evidence(ngram=positional(0.4, drafts=400), **{"ngram/long": positional(0.93, drafts=400)}),
                   costs, proposers=keys)
    assert "ngram" not in measured.max_draft and measured.reasons["ngram"] in (Reason.NO_GAIN, Reason.LOW_ACCEPTANCE)
    assert measured.max_draft["ngram/long"] >= 3 and measured.reasons["ngram/long"] == Reason.DRAFTED


def test_a_cold_proposer_widens_as_its_own_evidence_comes_in():
    costly = CostEvidence({(1, k): 0.040 * (1 + 0.45 * k) for k in range(9)})  # priced out at the prior
    assert run(SchemaEvidence(), costly).reasons["ngram"] == Reason.PRICED_OUT
    caps = []
    for drafts in (5, 20, 60):  # drafts of 8 tokens, every position accepted at 0.97: still under the floor
        thin = positional(0.97, drafts=drafts)
        assert thin.drafted < CFG.min_evidence_tokens
        report = run(evidence(ngram=thin), costly, proposers=("ngram",))
        caps.append(report.max_draft.get("ngram", 0))
        assert report.reasons["ngram"] in (Reason.COLD, Reason.PRICED_OUT)
    assert caps[0] <= caps[1] <= caps[2] and caps[2] >= 2, caps
    # thin evidence of rejections keeps it priced out
    assert run(evidence(ngram=positional(0.1, drafts=40)), costly, proposers=("ngram",)).max_draft == {}


def test_a_priced_out_proposer_is_probed_within_the_probe_budget():
    forwards = CostEvidence({(1, k): 0.014 * (k + 1) for k in range(9)})
    measured_now = evidence(ngram=positional(0.9, drafts=2))  # drafted this hour: the floor is not due
    quiet = run(measured_now, forwards, request(draw=0.5), proposers=("ngram",))
    assert (quiet.drafted, quiet.probe) == (False, False)
    probe = run(measured_now, forwards, request(draw=0.001), proposers=("ngram",))
    assert probe.probe and probe.max_draft == {"ngram": CFG.probe_max_draft}
    # never measured for the schema: priced out, not known bad, so the interval floor does not probe it
    never = run(SchemaEvidence(hour=NOW), forwards, request(draw=0.5), proposers=("ngram",))
    assert (never.probe, never.max_draft) == (False, {})
    # known bad (switched off on evidence before), quiet for longer than the interval: the floor probes it
    stale = run(evidence(drafted_hours_ago=CFG.probe_interval_hours + 1, ngram=positional(0.1)), forwards,
                request(draw=0.5), proposers=("ngram",))
    assert stale.probe and stale.reasons["ngram"] == Reason.PROBE


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


def test_a_deep_position_few_drafts_reached_does_not_cap_the_draft_length():
    # warm copy lookup accepted at 0.9 per position, but its position 7 refused the 2 times it was reached
    ev = positional(0.9, k=6)
    thin = ProposerEvidence(ev.drafted, ev.accepted, ev.reached + (2.0,), ev.accepted_at + (0.0,))
    assert thin.drafted >= CFG.min_evidence_tokens
    assert run(evidence(ngram=thin), GPU, proposers=("ngram",)).max_draft["ngram"] == 8
    unpooled = PolicyConfig(depth_prior_tokens=0.0)  # the raw rate taken at face value caps the draft at 6
    assert run(evidence(ngram=thin), GPU, cfg=unpooled, proposers=("ngram",)).max_draft["ngram"] == 6


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


def test_a_switched_off_proposer_is_probed_when_its_newest_evidence_is_probe_interval_old():
    interval = CFG.probe_interval_hours
    fresh = run(evidence(interval - 1, draft=positional(0.3)), CPU, proposers=("draft",), cfg=ALWAYS)
    assert not fresh.probe and fresh.reason == Reason.LOW_ACCEPTANCE
    stale = run(evidence(interval, draft=positional(0.3)), CPU, proposers=("draft",), cfg=ALWAYS)
    assert stale.probe and stale.reason == Reason.PROBE
    assert stale.max_draft == {"draft": CFG.probe_max_draft} and CFG.probe_max_draft < CFG.max_draft  # drafts short
    drawn = run(evidence(0, draft=positional(0.3)), CPU, request(draw=CFG.probe_rate / 2), proposers=("draft",),
                cfg=ALWAYS)
    assert drawn.probe  # the draw's share, whatever the evidence's age


def test_a_re_decision_keeps_the_requests_probe_and_never_draws_again():
    stale = evidence(CFG.probe_interval_hours, draft=positional(0.3))
    for was_probe in (False, True):  # a request not probed at admission is not probed later, though overdue now
        again = run(stale, CPU, request(redecision=True, probe=was_probe), proposers=("draft",), cfg=ALWAYS)
        assert again.probe is was_probe
    drawn = run(evidence(0, draft=positional(0.3)), CPU, request(draw=0.0, redecision=True), proposers=("draft",),
                cfg=ALWAYS)
    assert not drawn.probe


def probe_share(cfg: PolicyConfig, n: int = 4000) -> float:
    rng = random.Random(7)
    ev = evidence(draft=positional(0.3))
    return sum(decide(ev, COSTLY, request(draw=rng.random()), 1, cfg, ("draft",)).probe for _ in range(n)) / n


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
    problems = PolicyConfig(probe_interval_hours=0.5, probe_max_draft=0).problems()
    assert [p.split(":")[0] for p in problems] == ["probe_interval_hours", "probe_max_draft"]


# -- the draft model end to end: with it or without it -----------------------------------------


def arms(with_draft: tuple[float, float], without: tuple[float, float]) -> SchemaEvidence:
    """Evidence where the draft model passes the guard and the cost model, and the two arms measured
    (requests, ms per token)."""
    from structspec.stats.evidence import ArmEvidence

    made = {a: ArmEvidence(n, ms * 100 * n, 100 * n, n) for a, (n, ms) in (("draft", with_draft), ("no_draft", without))}
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
    top = request(draw=1.0 - CFG.probe_rate)  # the draws at the top end explore; those at the bottom probe
    explored = run(faster_with, req=top, proposers=("draft", "ngram"))
    assert explored.arm == "no_draft" and explored.reasons["draft"] == Reason.EXPLORE and not explored.probe
    slower_with = arms((20, 3.0), (20, 2.0))
    off = run(slower_with, proposers=("draft", "ngram"))
    assert off.arm == "no_draft" and off.reasons["draft"] == Reason.NO_GAIN and off.max_draft == {"ngram": 8}
    explored = run(slower_with, req=top, proposers=("draft", "ngram"))  # the slower arm measured: at its own cap
    assert explored.arm == "draft" and explored.reasons["draft"] == Reason.EXPLORE and not explored.probe
    assert explored.max_draft["draft"] == 8
    assert run(slower_with, req=request(draw=0.0), proposers=("draft", "ngram")).arm == "no_draft"  # no probe


def test_a_re_decision_keeps_the_requests_arm():
    slower_with = arms((20, 3.0), (20, 2.0))
    kept = run(slower_with, req=request(redecision=True, arm="draft", arm_reason="explore"), proposers=("draft",))
    assert kept.arm == "draft" and "draft" in kept.max_draft and kept.reasons["draft"] == "explore"
    faster_with = arms((20, 2.0), (20, 3.0))
    explored = run(faster_with, req=request(arm="no_draft", arm_reason="explore"), proposers=("draft", "ngram"))
    assert explored.arm == "no_draft" and explored.reasons["draft"] == "explore" and not explored.probe


def record(book: StatsBook, verifications: int, drafted: int, accepted: int, proposer: str = "draft") -> None:
    rec = book.recorder("m")
    for _ in range(verifications):
        rec.record_verification("s", proposer, 1, drafted, accepted, probe=False)


def bad_hour_then_probes(book: StatsBook, clock: list[float], probe_hours: int) -> None:
    """720 drafted tokens at acceptance 0.1 per examined token, then an hourly probe of 60 tokens at about 0.1."""
    record(book, 80, 8, 0)
    record(book, 10, 8, 1)
    for _ in range(probe_hours):
        clock[0] += HOUR
        record(book, 18, 3, 0)
        record(book, 2, 3, 1)


def test_a_proposer_measured_bad_stays_off_while_only_probes_add_evidence():
    """Acceptance 0.1 seven hours ago plus six hourly 60-token probes at 0.1: known bad, not cold."""
    clock = [500 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    bad_hour_then_probes(book, clock, 6)
    ev = schema_evidence(book.rows_for("m", "s"), hour_of(clock[0]) + HOUR, 3.0, CFG.evidence_window_tokens,
                         CFG.evidence_max_age_hours)
    assert ev.pooled["draft"].acceptance < 0.15
    assert run(ev, proposers=("draft",)).reasons["draft"] == Reason.LOW_ACCEPTANCE


def test_known_bad_stays_off_on_thin_evidence_and_only_evidence_turns_it_on():
    thin = positional(0.1, k=3, drafts=40)  # 120 tokens: under the evidence floor
    assert thin.drafted < CFG.min_evidence_tokens
    assert run(evidence(draft=thin), proposers=("draft",)).reasons["draft"] == Reason.COLD  # never judged: measured
    for why in (Reason.LOW_ACCEPTANCE, Reason.NO_GAIN):
        kept = run(evidence(draft=thin), req=request(off={"draft": why}), proposers=("draft",))
        assert kept.reasons["draft"] == why and "draft" not in kept.max_draft
    good = positional(0.9, k=3, drafts=CFG.min_evidence_tokens / 3)  # enough new evidence, and good
    back = run(evidence(draft=good), req=request(off={"draft": Reason.LOW_ACCEPTANCE}), proposers=("draft",))
    assert back.reasons["draft"] == Reason.DRAFTED and "draft" in back.max_draft


def test_drafts_replayed_on_finished_outputs_price_a_cold_proposer_in_or_keep_it_out():
    costly = CostEvidence({(1, k): 0.040 * (1 + 0.45 * k) for k in range(9)})  # priced out at the prior
    never = SchemaEvidence(hour=NOW)
    assert run(never, costly, proposers=("ngram",)).reasons["ngram"] == Reason.PRICED_OUT
    copies = SchemaEvidence(hour=NOW, replayed={"ngram": positional(0.95, drafts=40)})  # what it would have kept
    report = run(copies, costly, proposers=("ngram",))
    assert report.reasons["ngram"] == Reason.COLD and report.max_draft["ngram"] >= 2  # cold, and drafting
    misses = SchemaEvidence(hour=NOW, replayed={"ngram": positional(0.2, drafts=40)})
    assert run(misses, costly, proposers=("ngram",)).reasons["ngram"] == Reason.PRICED_OUT
    # a k-row step costing k + 1 decode steps: nothing pays, whatever the replays say
    forwards = CostEvidence({(1, k): 0.014 * (k + 1) for k in range(9)})
    assert run(copies, forwards, proposers=("ngram",)).reasons["ngram"] == Reason.PRICED_OUT
    # once the proposer's own evidence holds min_evidence_tokens, replays are not read
    own = dataclasses.replace(evidence(ngram=positional(0.1, drafts=200)), replayed=copies.replayed)
    assert run(own, costly, proposers=("ngram",)).max_draft == {}


def test_replayed_drafts_are_read_by_position_pooled_over_buckets_and_apart_from_real_drafting():
    book = StatsBook(clock=lambda: NOW)
    rec = book.recorder("m")
    rec.record_replay("s@1", "ngram", 1, [(4, 4), (4, 1), (2, 0)])
    rec.record_replay("s@1", "ngram", 8, [(3, 3)])
    rec.record_replay("s@1", "ngram", 1, [])  # nothing replayed: nothing recorded
    ev = schema_evidence(book.rows_for("m", "s@1", 0), hour_of(NOW), CFG.half_life_hours)
    replayed = ev.replayed["ngram"]
    assert replayed.drafted == 13 and replayed.accepted == 8
    # position 1 reached by every draft; 2 by the 4/4, 4/1 and 3/3 drafts; 3 and 4 by the 4/4 and 3/3 ones (4: one)
    assert replayed.reached == (4, 3, 2, 1) and replayed.accepted_at == (3, 2, 2, 1)
    assert ev.by_bucket == {} and ev.pooled == {} and ev.last_measured == {}  # not drafting, not a measurement


def test_a_short_outputs_cap_is_priced_at_the_rows_its_drafts_fill():
    # Gemma on transformers on a host where a 3-row step costs 1.12 plain steps and an 8-row one 2.62 (timed): a
    # short output's copy drafts fill 2 rows (40 drafts, 34 tokens accepted)
    from structspec.speculation.policy import priced_evidence, short_draft_length

    host = CostEvidence({(1, k): 0.090 * r for k, r in enumerate((1, 1.02, 1.10, 1.12, 1.77, 1.84, 1.92, 1.96, 2.62))})
    short = ProposerEvidence(80.0, 34.0, (40.0, 20.0), (20.0, 14.0))
    assert short_draft_length(short, host, "ngram", 1, CFG) == CFG.max_draft  # (1.10) / (1 + 0.85) plain steps
    # priced as if every draft filled the cap, the same evidence drafts nothing
    full = host.step_seconds(1, 8) / (1 + priced_evidence(short, CFG).expected_accepted(8))
    assert full > host.step_seconds(1, 0) * (1 - CFG.gain_margin)
    # replayed drafts count as its own; under SHORT_DRAFTS_READ drafts the cap is priced at the prior, in full
    assert short_draft_length(None, host, "ngram", 1, CFG, replayed=short) == CFG.max_draft
    few = ProposerEvidence(4.0, 2.0, (2.0, 1.0), (1.0, 1.0))
    assert short_draft_length(few, host, "ngram", 1, CFG) == 0
    # drafts that fill 2 rows and are refused at once do not pay however cheap their rows
    refused = ProposerEvidence(80.0, 0.0, (40.0,), (2.0,))
    assert short_draft_length(refused, host, "ngram", 1, CFG) == 0


def test_lookups_that_find_nothing_can_price_a_proposer_out():
    """A demo-like target whose step costs 4.4 ms and barely more with a draft: copy lookup at acceptance 0.6 pays
    where each lookup makes a draft, and not where 1 lookup in 20 does (each draft then carries twenty 0.5 ms
    lookups)."""
    steps = {(1, k): 0.0044 * (1 + 0.03 * k) for k in range(9)}
    found = CostEvidence(steps, {("ngram", k): 0.0005 for k in range(1, 9)})
    ev = evidence(ngram=positional(0.6, drafts=200))
    assert run(ev, found, proposers=("ngram",)).max_draft.get("ngram", 0) > 0
    rare = CostEvidence(steps, dict(found.proposals), proposal_hits={"ngram": 0.05})
    report = run(ev, rare, proposers=("ngram",))
    assert "ngram" not in report.max_draft and report.reasons["ngram"] == Reason.NO_GAIN
