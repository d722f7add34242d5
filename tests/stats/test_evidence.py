"""The policy's evidence from hourly counters: the acceptance window, step costs, the arms, the newest drafting."""

from __future__ import annotations

import pytest

from structspec.engine.config import PolicyConfig
from structspec.speculation.policy import PolicyRequest, choose_arm
from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Arm, Reason
from structspec.stats.evidence import CostEvidence, ProposerEvidence, cost_evidence, schema_evidence

CFG = PolicyConfig()


def test_expected_accepted_chains_the_positional_rates():
    ev = ProposerEvidence(0, 0, (100.0, 50.0, 10.0), (50.0, 10.0, 10.0))  # c = 0.5, 0.2, 1.0
    assert ev.expected_accepted(1) == pytest.approx(0.5)
    assert ev.expected_accepted(3) == pytest.approx(0.5 + 0.1 + 0.1)
    assert ev.expected_accepted(4) == pytest.approx(0.5 + 0.1 + 0.1 + 0.1)  # unexamined: the last rate


def test_pooled_depth_pulls_a_thinly_examined_position_toward_the_pooled_rate():
    # 200 drafts: position 1 at 0.5, positions 2-6 at 0.9 on many examinations, position 7 refused the 2 times it
    # was reached
    reached = (200.0, 100.0, 90.0, 81.0, 73.0, 66.0, 2.0)
    accepted = (100.0, 90.0, 81.0, 73.0, 66.0, 59.0, 0.0)
    ev = ProposerEvidence(200, 469, reached, accepted)
    pooled = ev.with_pooled_depth(8.0)
    rate = sum(accepted[1:]) / sum(reached[1:])
    assert pooled.accepted_at[6] / pooled.reached[6] == pytest.approx(8 * rate / 10)  # 0 of 2 no longer reads 0
    assert pooled.accepted_at[0] == 100 and pooled.reached[0] == 200  # the first position as measured
    assert pooled.accepted_at[1] / pooled.reached[1] == pytest.approx(0.9, abs=0.01)  # well measured: barely moved
    assert ev.expected_accepted(8) == pytest.approx(ev.expected_accepted(6))  # raw: the 0 caps every deeper one
    assert pooled.expected_accepted(8) > pooled.expected_accepted(6) + 0.3
    assert ev.with_pooled_depth(0.0) == ev and ProposerEvidence().with_pooled_depth(8.0) == ProposerEvidence()


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


def test_restricted_forwards_are_priced_apart_from_those_that_ran_the_output_layer():
    book = StatsBook(clock=lambda: 50 * HOUR)
    rec = book.recorder("m")
    for _ in range(10):
        rec.record_step(1, 0, 0.020)
        rec.record_step(1, 0, 0.005, restricted=True)
        rec.record_step(1, 3, 0.008, restricted=True)
    rec.record_profile({("full", 1, 0): 0.010, ("full", 1, 3): 0.040, ("restricted", 1, 0): 0.004,
                        ("restricted", 1, 3): 0.006})
    costs = cost_evidence(book.rows_for("m", ""), 50 * HOUR, 3.0)
    assert costs.step_seconds(1, 0) == pytest.approx(0.020)  # the cheap forwards do not pull the plain step down
    assert costs.step_seconds(1, 3) == pytest.approx(0.040 * 2)  # the full profile, scaled to the served plain step
    restricted = costs.restricted()
    assert restricted is not None
    assert restricted.step_seconds(1, 0) == pytest.approx(0.005) and restricted.step_seconds(1, 3) == pytest.approx(0.008)
    assert restricted.profile == {(1, 0): pytest.approx(0.004), (1, 3): pytest.approx(0.006)}
    assert cost_evidence(StatsBook().recorder("n").book.rows_for("n", ""), 0, 3.0).restricted() is None


def test_an_unserved_draft_length_is_priced_at_the_rows_serving_measured():
    """A served drafted row costs what the profile's row costs times what rows cost served: the served plain step
    alone would scale a row by the plain steps' ratio and underprice it (served rows carry their grammar masks)."""
    costs = CostEvidence(steps={(1, 0): 0.010}, profile={(1, 0): 0.008, (1, 1): 0.010, (1, 2): 0.012, (1, 4): 0.016})
    assert costs.step_seconds(1, 2) == pytest.approx(0.012 * 0.010 / 0.008)  # no drafted step served: the ratio
    costs.steps[(1, 1)] = 0.020  # a served row: 0.010 against the profile's 0.002
    assert costs.step_seconds(1, 2) == pytest.approx(0.010 + 0.004 * 5)
    costs.steps[(1, 4)] = 0.030  # rows served 0.010 + 0.020 over profiled 0.002 + 0.008: a row 3x the profile's
    assert costs.step_seconds(1, 2) == pytest.approx(0.010 + 0.004 * 3)
    assert costs.step_seconds(1, 4) == pytest.approx(0.030)  # served lengths are read as served


def one_token_drafts(book: StatsBook, n: int, acceptance: float) -> None:
    """``n`` one-token drafts, ``acceptance`` of them accepted (per examined token: ``acceptance``)."""
    rec, hits = book.recorder("m"), round(n * acceptance)
    for i in range(n):
        rec.record_verification("s", "draft", 1, 1, 1 if i < hits else 0, probe=False)


def test_the_window_is_whole_hours_so_one_hours_old_and_new_evidence_mix():
    """20,000 tokens at 0.8 then 1,000 at 0.1 in the same hour read the hour's mean (0.767, not the 0.1 of the newest
    1,000 tokens: hourly counters cannot tell them apart); the change shows in full once a later hour holds the
    window."""
    clock = [300 * HOUR + 10.0]
    book = StatsBook(clock=lambda: clock[0])
    one_token_drafts(book, 20_000, 0.8)
    one_token_drafts(book, 1_000, 0.1)
    same_hour = schema_evidence(book.rows_for("m", "s"), 300 * HOUR, 3.0, window_tokens=1000).pooled["draft"]
    assert same_hour.drafted == pytest.approx(1000)
    assert same_hour.acceptance == pytest.approx(16_100 / 21_000)
    clock[0] += HOUR
    one_token_drafts(book, 1_000, 0.1)
    later = schema_evidence(book.rows_for("m", "s"), 301 * HOUR, 3.0, window_tokens=1000).pooled["draft"]
    assert later.acceptance == pytest.approx(0.1)


def test_a_measured_arm_stays_measured_however_quiet_the_schema():
    """Eight requests in each arm thirty hours ago, the faster arm's traffic since: the slower arm is not cold again
    (its weighted count, 8 x 2^-10, is under min_arm_requests; its count is not)."""
    clock = [400 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    rec = book.recorder("m")
    for _ in range(CFG.min_arm_requests):
        rec.record_request("s", 100, 40, 10, "stop", 300.0, Arm.DRAFT, 300.0, 1)
        rec.record_request("s", 100, 40, 10, "stop", 200.0, Arm.NO_DRAFT, 200.0, 1)
    clock[0] += 30 * HOUR
    rec.record_request("s", 100, 40, 10, "stop", 200.0, Arm.NO_DRAFT, 200.0, 1)
    ev = schema_evidence(book.rows_for("m", "s"), 430 * HOUR, CFG.half_life_hours)
    assert ev.arms_pooled[Arm.DRAFT].requests < 0.01 and ev.arms_pooled[Arm.DRAFT].count == CFG.min_arm_requests
    arm, why = choose_arm(ev, PolicyRequest("s", None, True), 1, CFG)
    assert (arm, why) == (Arm.NO_DRAFT, Reason.NO_GAIN)


def test_the_newest_hour_a_proposer_drafted_or_was_probed_is_read_from_every_bucket():
    clock = [600 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    rec = book.recorder("m")
    rec.record_verification("s", "ngram", 4, 3, 1, probe=True)
    clock[0] += 3 * HOUR
    rec.record_decision("s", Reason.PROBE, {"history": Reason.PROBE, "ngram": Reason.DRAFTED})  # drafted nothing
    clock[0] += 2 * HOUR
    rec.record_verification("s", "draft", 1, 3, 1, probe=False)
    ev = schema_evidence(book.rows_for("m", "s"), 605 * HOUR, 3.0)
    assert ev.last_measured == {"ngram": 600 * HOUR, "history": 603 * HOUR, "draft": 605 * HOUR}
    assert ev.hour == 605 * HOUR
    aged = schema_evidence(book.rows_for("m", "s"), 605 * HOUR, 3.0, max_age_hours=4)
    assert aged.last_measured == {"history": 603 * HOUR, "draft": 605 * HOUR}  # older than the age limit: not read


def test_a_lookup_that_finds_nothing_is_charged_to_the_drafts_made():
    """Asked at every position it may draft at, a copy proposer pays a lookup whether or not it finds a draft: with
    1 lookup in 4 making a draft, a draft costs 4 lookups. Old records (no empty lookups counted) read as all made."""
    book = StatsBook(clock=lambda: 50 * HOUR)
    rec = book.recorder("m")
    for i in range(40):
        rec.record_proposal("ngram", 4, 0.001, made=i % 4 == 0)
        rec.record_proposal("history", 4, 0.001)
    costs = cost_evidence(book.rows_for("m", ""), 50 * HOUR, 3.0)
    assert costs.proposal_hits == {"ngram": pytest.approx(0.25), "history": pytest.approx(1.0)}
    assert costs.propose_seconds("ngram", 4) == pytest.approx(0.004)
    assert costs.propose_seconds("ngram", 8) == pytest.approx(0.008)  # scaled from the measured length
    assert costs.propose_seconds("history", 4) == pytest.approx(0.001)
    restricted = CostEvidence(restricted_steps={(1, 0): 0.01}, proposals=costs.proposals,
                              proposal_hits=costs.proposal_hits).restricted()
    assert restricted is not None and restricted.propose_seconds("ngram", 4) == pytest.approx(0.004)
    never = CostEvidence(proposals={("ngram", 4): 0.001}, proposal_hits={"ngram": 0.0})
    assert never.propose_seconds("ngram", 4) == pytest.approx(0.1)  # bounded: MIN_HIT_RATE
