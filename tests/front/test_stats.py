"""The statistics views (``front.stats``) from a real store: windows, entries per (model, schema), the speedup
priced with the model's own step times, the policy's state, the timeline and the changes, the rejected drafts."""

from __future__ import annotations

import pytest

from structspec.engine.config import PolicyConfig
from structspec.front import stats
from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason
from structspec.stats.evidence import stored_profile
from structspec.store.sqlite import SQLiteStore

NOW = 500_000 * HOUR + 1800.0


@pytest.fixture
async def store():
    clock = [NOW - 3 * HOUR]
    s = SQLiteStore(":memory:", StatsBook(clock=lambda: clock[0]))
    await s.open()
    rec = s.stats.recorder("m")
    rec.record_policy("k@1", {"ngram": Reason.COLD}, 1, {}, 0.55)
    rec.record_request("k@1", 100, 60, 0, "stop", 500.0)
    for _ in range(20):
        rec.record_verification("k@1", "ngram", 1, 4, 2, False)
        rec.record_step(1, 4, 0.015)
        rec.record_step(1, 0, 0.010)
    rec.record_request("other@1", 5, 5, 0, "error", 10.0)
    await s.flush()
    clock[0] = NOW
    rec.record_policy("k@1", {"ngram": Reason.LOW_ACCEPTANCE}, 1, {"ngram": 0.3}, 0.55)
    rec.record_request("k@1", 10, 10, 0, "length", 900.0)
    s.stats.recorder("m2").record_request("k@1", 1, 1, 0, "cancelled", 5.0)
    rec.record_rejection("k@1", "ngram", 1, [1, 2], [3, 4], 0, 9, True, str)  # unwritten: read all the same
    yield s
    await s.close()


async def test_entries_windows_speedup_and_policy(store: SQLiteStore) -> None:
    found = await stats.read_stats(store, (HOUR, 6 * HOUR), now=NOW)
    assert [(e.model, e.schema_key) for e in found] == [("m", "k@1"), ("m", "other@1"), ("m2", "k@1")]
    k = found[0]
    assert [w.requests for w in k.windows.values()] == [1, 2]  # the last hour, then both requests
    six = k.windows[6 * HOUR]
    assert dict(six.finish_reasons) == {"stop": 1, "length": 1}
    assert six.estimated_speedup == pytest.approx((70 + 40) / (70 + 20 * 0.5)) and six.speedup_costs_measured
    (policy,) = k.policy
    assert (policy.proposer, policy.state, policy.reason, policy.since, policy.last_switch_on) == (
        "ngram", "off", Reason.LOW_ACCEPTANCE, NOW, NOW - 3 * HOUR)
    assert policy.acceptance == pytest.approx(0.3) and policy.threshold == pytest.approx(0.55)
    assert not k.timeline and not k.policy_changes  # only when asked for
    assert found[2].policy == []  # m2 decided nothing


async def test_one_schema_with_its_timeline_and_changes(store: SQLiteStore) -> None:
    (k,) = await stats.read_stats(store, (6 * HOUR,), model="m", schema_key="k@1", include_timeline=True,
                                  now=NOW)
    assert [h.hour_start for h in k.timeline] == [NOW - 3 * HOUR - 1800, NOW - 1800]
    first = k.timeline[0]
    (ngram,) = first.proposers
    assert (first.requests, first.output_tokens, ngram.drafted, ngram.accepted, ngram.examined) == (1, 100, 80, 40, 60)
    assert [(c.state, c.previous) for c in k.policy_changes] == [("on", ""), ("off", "on")]
    assert k.windows[6 * HOUR].estimated_speedup > 1  # the step times of the model's own series were read too
    (nothing,) = await stats.read_stats(store, (HOUR,), model="m9", schema_key="k@1", now=NOW)
    assert (nothing.model, nothing.schema_key, nothing.windows[HOUR].requests) == ("m9", "k@1", 0)


async def test_rejected_drafts_are_read_newest_first_and_bounded(store: SQLiteStore) -> None:
    (r,) = await stats.read_rejected_drafts(store, schema_key="k@1")
    assert (r.model, r.proposer, list(r.draft_tokens), r.position, r.rejected_text, r.target_text) == (
        "m", "ngram", [3, 4], 0, "(3,)", "[9]")
    assert await stats.read_rejected_drafts(store, proposer="draft") == []


# -- the draft pricing: the policy's cost model per proposer, priced with the stored step profile -----------------

DEAR = {0: 0.010, 1: 0.020, 2: 0.030, 4: 0.050, 8: 0.090}  # a CPU's full head: each drafted row costs a step
CHEAP = {0: 0.010, 1: 0.0105, 2: 0.011, 4: 0.012, 8: 0.014}  # a GPU's at batch 1: drafted rows nearly free


def profile(steps: dict[int, float], draft_token: float = 0.004) -> dict[tuple[str, int, int], float]:
    return {**{("full", 1, k): s for k, s in steps.items()}, ("restricted", 1, 0): 1.0, ("draft", 1, 1): draft_token}


@pytest.fixture
async def priced():
    """Model "dear" (its profile recorded twice, by two starts) with a cold schema the policy priced out; model
    "cheap" with a schema whose copies are accepted 3 in 4 (drafts of 4, the 4th always refused); model "old",
    its profile recorded 200 hours ago (past the policy's horizon)."""
    clock = [NOW - 200 * HOUR]
    s = SQLiteStore(":memory:", StatsBook(clock=lambda: clock[0]))
    await s.open()
    s.stats.recorder("old").record_profile(profile(CHEAP))
    await s.flush()
    clock[0] = NOW - HOUR
    dear, cheap, old = s.stats.recorder("dear"), s.stats.recorder("cheap"), s.stats.recorder("old")
    dear.record_profile(profile({k: v * 0.9 for k, v in DEAR.items()}))
    await s.flush()
    clock[0] = NOW
    dear.record_profile(profile({k: v * 1.1 for k, v in DEAR.items()}, 0.006))  # a restart: the mean is read
    dear.record_policy("cold@1", {"ngram": Reason.PRICED_OUT}, 1, {"ngram": None}, 0.55)
    dear.record_decision("cold@1", Reason.PRICED_OUT, {"ngram": Reason.PRICED_OUT, "history": Reason.PRICED_OUT})
    dear.record_request("cold@1", 40, 30, 10, "stop", 400.0)
    cheap.record_profile(profile(CHEAP))
    for _ in range(150):
        cheap.record_verification("copy@1", "ngram", 1, 4, 3, False)
    cheap.record_request("copy@1", 600, 150, 0, "stop", 2000.0)
    old.record_request("cold@1", 40, 30, 10, "stop", 400.0)
    await s.flush()
    yield s
    await s.close()


async def test_a_cold_schema_on_a_dear_profile_is_priced_out_with_its_prices(priced: SQLiteStore) -> None:
    (entry,) = await stats.read_stats(priced, (HOUR,), model="dear", now=NOW)
    assert [p.proposer for p in entry.pricing] == ["history", "ngram"]  # decided for: priced though nothing drafted
    p = entry.pricing[1]
    assert (p.proposer, p.batch_bucket, p.cold, p.chosen, p.evidence_tokens, p.acceptance, p.reason) == (
        "ngram", 1, True, 0, 0, None, Reason.PRICED_OUT)
    assert (p.min_evidence_tokens, p.gain_margin) == (500, 0.05)
    assert [d.k for d in p.prices] == list(range(9))  # k = 0 (plain) .. max_draft
    plain, one = p.prices[0], p.prices[1]
    assert plain.step_seconds == pytest.approx(0.010) and plain.seconds_per_token == pytest.approx(0.010)  # the mean
    assert one.expected_accepted == pytest.approx(0.4) and p.priced_acceptance == pytest.approx(0.4)  # the prior
    assert one.seconds_per_token == pytest.approx(0.020 / 1.4)
    assert p.prices[2].expected_accepted == pytest.approx(0.4 + 0.4 * 0.7)  # prior_continuation after the first
    assert p.prices[3].step_seconds == pytest.approx(0.040)  # between the profile's lengths
    assert {d.step_source for d in p.prices} == {"profile"}
    assert all(d.seconds_per_token is not None and d.seconds_per_token > 0.0095 for d in p.prices[1:])  # none pays
    assert p.best is not None and p.best.k == 1  # the cheapest that still lost


async def test_measured_high_acceptance_on_a_cheap_profile_drafts(priced: SQLiteStore) -> None:
    (entry,) = await stats.read_stats(priced, (HOUR,), model="cheap", now=NOW)
    assert entry.policy == []  # no decision recorded: priced because it drafted
    (p,) = entry.pricing
    assert (p.cold, p.evidence_tokens, p.acceptance, p.reason) == (False, 600, pytest.approx(450 / 600), "")
    # the 4th is always refused (an unexamined 5th: the last rate); positions after the first pulled toward
    # their pooled rate (2 of 3) by 8 examinations
    c, c4 = (150 + 8 * 2 / 3) / 158, (8 * 2 / 3) / 158
    want = [0, 1, 1 + c, 1 + c + c * c, 1 + c + c * c + c * c * c4, 1 + c + c * c + c * c * c4 + c * c * c4 * c4]
    assert [d.expected_accepted for d in p.prices[:6]] == pytest.approx(want)
    assert p.chosen == 3 and p.best is not None and p.best.k == 3
    assert p.prices[3].seconds_per_token == pytest.approx(0.0115 / (1 + want[3]))
    # the server's own configuration is read: past its min_evidence_tokens the same evidence is cold
    (cold,) = await stats.read_stats(priced, (HOUR,), model="cheap", now=NOW,
                                     policy=PolicyConfig(min_evidence_tokens=1000, evidence_window_tokens=1000))
    assert cold.pricing[0].cold and cold.pricing[0].min_evidence_tokens == 1000


async def test_served_steps_price_before_the_profile_and_an_old_profile_is_still_read(priced: SQLiteStore) -> None:
    rec = priced.stats.recorder("dear")
    for _ in range(10):
        rec.record_step(1, 0, 0.020)  # serving's plain step: twice the profile's
        rec.record_step(1, 1, 0.025)
    (entry,) = await stats.read_stats(priced, (HOUR,), model="dear", now=NOW)
    prices = entry.pricing[1].prices
    assert [d.step_source for d in prices[:3]] == ["served", "served", "profile"]
    assert prices[1].step_seconds == pytest.approx(0.025)
    # the profile fitted to serving: the served plain step, then the profile's rows at what a served row cost
    # (0.005 against the profile's 0.010)
    assert prices[2].step_seconds == pytest.approx(0.020 + (0.030 - 0.010) * 0.5)
    (old,) = await stats.read_stats(priced, (HOUR,), model="old", now=NOW)
    assert old.pricing == []  # no decision and no drafting: nothing to price
    costs = await stats._model_costs(priced, "old", {}, NOW, PolicyConfig())
    assert costs.profile[(1, 0)] == pytest.approx(0.010) and costs.draft_token == {1: pytest.approx(0.004)}


def test_the_stored_profile_reads_each_head_and_the_draft_model_per_token() -> None:
    book = StatsBook(clock=lambda: NOW)
    book.recorder("m").record_profile({**profile({0: 0.01, 2: 0.03}), ("draft", 2, 1): 0.005})
    full, draft_token, restricted = stored_profile(book.rows_for("m", ""))
    assert full == {(1, 0): pytest.approx(0.01), (1, 2): pytest.approx(0.03)}
    assert restricted == {(1, 0): pytest.approx(1.0)}  # apart from the full head's
    assert draft_token == {1: pytest.approx(0.004), 2: pytest.approx(0.005)}
