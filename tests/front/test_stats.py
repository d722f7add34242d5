"""The statistics views (``front.stats``) from a real store: windows, entries per (model, schema), the speedup
priced with the model's own step times, the policy's state, the timeline and the changes, the rejected drafts."""

from __future__ import annotations

import pytest

from structspec.front import stats
from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason
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
