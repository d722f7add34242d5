"""The statistics RPCs' answers decoded into the statistics views (``structspec.front.views``), the same values
``structspec stats`` reads from a store: a time sent as 0 (never recorded) becomes None, an unset acceptance,
threshold or draft price's step time None."""

from __future__ import annotations

from typing import Any

from structspec.front import views
from structspec.proto_gen.v1 import structspec_pb2 as pb


def _optional(message: Any, name: str) -> float | None:
    return getattr(message, name) if message.HasField(name) else None


def proposer_stats(p: pb.ProposerStats) -> views.ProposerStats:
    return views.ProposerStats(p.proposer, p.batch_bucket, p.drafted, p.accepted, p.events, p.acceptance_rate,
                               p.probe_verifications, list(p.reached), list(p.accepted_at),
                               list(p.acceptance_by_position))


def stats_window(w: pb.StatsWindow) -> views.StatsWindow:
    return views.StatsWindow(
        w.window_seconds, [proposer_stats(p) for p in w.proposers], w.requests, w.output_tokens,
        w.target_passes, w.forced_tokens, dict(w.finish_reasons), w.output_tokens_p50, w.output_tokens_p95,
        w.latency_ms_p50, w.latency_ms_p99, w.latency_ms_mean, w.passes_per_token,
        [views.DecisionCount(d.proposer, d.reason, d.requests) for d in w.decisions],
        [views.HistogramBucket(b.upper_bound, b.count) for b in w.output_length],
        [views.HistogramBucket(b.upper_bound, b.count) for b in w.latency_ms], dict(w.names),
        w.estimated_speedup, w.speedup_costs_measured,
    )


def policy_state(p: pb.ProposerPolicyState) -> views.ProposerPolicyState:
    return views.ProposerPolicyState(p.proposer, p.state, p.reason, p.since, p.changed_at, p.last_switch_off or None,
                                     p.last_switch_on or None, _optional(p, "acceptance"), _optional(p, "threshold"),
                                     p.batch_bucket)


def policy_change(c: pb.PolicyChange) -> views.PolicyChange:
    return views.PolicyChange(c.proposer, c.at, c.state, c.reason, c.previous, c.batch_bucket,
                              _optional(c, "acceptance"), _optional(c, "threshold"))


def hour_stats(h: pb.HourStats) -> views.HourStats:
    return views.HourStats(h.hour_start, h.requests, h.output_tokens, h.target_passes, h.latency_ms_p50,
                           h.latency_ms_p99, [views.ProposerHour(p.proposer, p.drafted, p.accepted, p.examined,
                                                                 p.accepted_examined) for p in h.proposers])


def draft_pricing(p: pb.DraftPricing) -> views.DraftPricing:
    return views.DraftPricing(p.proposer, p.batch_bucket, p.evidence_tokens, p.min_evidence_tokens,
                              _optional(p, "acceptance"), p.cold, p.chosen, p.gain_margin,
                              [views.DraftPrice(d.k, _optional(d, "step_seconds"), d.propose_seconds,
                                                d.expected_accepted, _optional(d, "seconds_per_token"), d.step_source)
                               for d in p.prices], p.reason, p.replayed_tokens, _optional(p, "replayed_acceptance"),
                              p.restricted_chosen)


def schema_stats(s: pb.SchemaStats) -> views.SchemaStats:
    """The windows keyed by their length, in the order sent."""
    return views.SchemaStats(s.schema_key, {w.window_seconds: stats_window(w) for w in s.windows}, s.model,
                             [policy_state(p) for p in s.policy], [policy_change(c) for c in s.policy_changes],
                             [hour_stats(h) for h in s.timeline], [draft_pricing(p) for p in s.pricing])


def rejected_draft(r: pb.RejectedDraft) -> views.RejectedDraft:
    return views.RejectedDraft(r.model, r.schema_key, r.proposer, r.created_at, r.batch_bucket,
                               list(r.context_tokens), r.context_text, list(r.draft_tokens), r.draft_text, r.position,
                               r.rejected_token, r.rejected_text, r.target_token, r.target_text, r.grammatical)
