"""The statistics views on the wire: summaries -> views (``front.stats``) -> messages (``stats_convert``), and the
client's decoding (``client.stats_decode``) giving back the same views."""

from __future__ import annotations

import math

import pytest

from structspec.client import stats_decode
from structspec.front import stats, views
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.service import stats_convert
from structspec.stats.counters import LATENCY_BOUNDS_MS, LENGTH_BOUNDS
from structspec.stats.summary import ProposerSummary, SchemaSummary


def summary() -> SchemaSummary:
    p = ProposerSummary("ngram", 2, verifications=3, drafted=9, accepted=4, probe_verifications=1,
                        reached=(3, 2, 1), accepted_at=(2, 1, 1))
    return SchemaSummary("m", "k@1", 3600, requests=4, output_tokens=100, target_passes=50, forced_tokens=20,
                         latency_ms_sum=400.0, finish={"stop": 3, "error": 1}, output_length={"32": 2, "inf": 1},
                         latency_ms={"100": 4}, decisions={("ngram", "cold"): 4, ("", "drafted"): 4}, proposers=(p,))


def test_stats_windows_from_summaries() -> None:
    w = stats_convert.stats_window(stats.stats_window(3600, summary()))
    (ps,) = w.proposers
    assert (ps.proposer, ps.batch_bucket, ps.events, ps.drafted, ps.accepted, ps.probe_verifications) == ("ngram", 2, 3, 9, 4, 1)
    assert list(ps.reached) == [3, 2, 1] and list(ps.accepted_at) == [2, 1, 1]
    assert list(ps.acceptance_by_position) == pytest.approx([2 / 3, 0.5, 1.0]) and ps.acceptance_rate == pytest.approx(4 / 9)
    assert (w.requests, w.output_tokens, w.target_passes, w.forced_tokens) == (4, 100, 50, 20)
    assert dict(w.finish_reasons) == {"stop": 3, "error": 1} and w.passes_per_token == 0.5 and w.latency_ms_mean == 100
    assert [(d.proposer, d.reason, d.requests) for d in w.decisions] == [("", "drafted", 4), ("ngram", "cold", 4)]
    assert [b.upper_bound for b in w.output_length] == list(LENGTH_BOUNDS) and math.isinf(w.output_length[-1].upper_bound)
    assert {b.upper_bound: b.count for b in w.output_length if b.count} == {32: 2, math.inf: 1}
    assert [b.upper_bound for b in w.latency_ms] == list(LATENCY_BOUNDS_MS)
    assert 0 < w.output_tokens_p50 <= w.output_tokens_p95 and 0 < w.latency_ms_p50 <= w.latency_ms_p99 <= 100
    empty = stats_convert.stats_window(stats.stats_window(60, None))
    assert empty == pb.StatsWindow(window_seconds=60)  # nothing recorded: an empty window
    assert w.estimated_speedup == 0.0 and not w.speedup_costs_measured  # no estimate given


def test_the_client_decodes_the_views_it_was_sent() -> None:
    policy = [views.ProposerPolicyState("ngram", "off", "low_acceptance", 7200.0, 7200.0, 7200.0, None, 0.3, None, 4),
              views.ProposerPolicyState("draft", "on", "cold", 3600.0, 3600.0, None, 3600.0, None, 0.55, 1)]
    changes = [views.PolicyChange("ngram", 7200.0, "off", "low_acceptance", "on", 4, 0.3, 0.55),
               views.PolicyChange("draft", 3600.0, "on", "cold", "", 1, None, None)]
    timeline = [views.HourStats(3600, 2, 30, 20, 120.0, 480.0, [views.ProposerHour("ngram", 12, 6, 9, 6)])]
    pricing = [views.DraftPricing("draft", 4, 120.5, 500, 0.62, True, 2, 0.05,
                                  [views.DraftPrice(0, 0.0125, 0.0, 0.0, 0.0125, "served"),
                                   views.DraftPrice(1, 0.014, 0.003, 0.55, 0.011, "profile"),
                                   views.DraftPrice(2, None, 0.006, 0.9, None, "")], "cold"),
               views.DraftPricing("ngram", 1, 0.0, 500, None, True, 0, 0.05, [], "", 160.0, 0.37)]
    sent = views.SchemaStats("k@1", {3600: stats.stats_window(3600, summary()), 60: views.StatsWindow(60)}, "m",
                             policy, changes, timeline, pricing)
    message = stats_convert.schema_stats(sent, (3600, 60))
    assert stats_decode.schema_stats(pb.SchemaStats.FromString(message.SerializeToString())) == sent
    assert not message.pricing[1].HasField("acceptance") and not message.pricing[0].prices[2].HasField("step_seconds")
    assert message.pricing[1].HasField("replayed_acceptance") and not message.pricing[0].HasField("replayed_acceptance")
    assert message.pricing[0].prices[0].HasField("step_seconds")
    assert not message.policy[0].HasField("threshold") and message.policy[1].last_switch_off == 0.0  # None on the wire
    assert [w.window_seconds for w in stats_convert.schema_stats(sent, (60, 3600, 60)).windows] == [60, 3600, 60]

    draft = views.RejectedDraft("m", "k@1", "ngram", 3600.5, 2, [1, 2], "ab", [3, 4], "cd", 1, 4, "d", 9, "x", False)
    assert stats_decode.rejected_draft(stats_convert.rejected_draft(draft)) == draft
    assert draft.accepted_text_tokens == [3]
