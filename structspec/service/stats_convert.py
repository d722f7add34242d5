"""The statistics views (``structspec.front.views``) as protobuf messages: what GetSchemaStats, ListSchemaStats and
ListRejectedDrafts send. The client decodes them back into the same views (``structspec.client.stats_decode``).

A time never recorded (a view's None) travels as 0; an acceptance or threshold never read is left unset, as is a
draft price's step time where no step cost is known.
"""

from __future__ import annotations

from typing import Sequence

from structspec.front import views
from structspec.proto_gen.v1 import structspec_pb2 as pb


def proposer_stats(p: views.ProposerStats) -> pb.ProposerStats:
    return pb.ProposerStats(
        proposer=p.proposer, batch_bucket=p.batch_bucket, drafted=p.drafted, accepted=p.accepted, events=p.events,
        acceptance_rate=p.acceptance_rate, probe_verifications=p.probe_verifications, reached=p.reached,
        accepted_at=p.accepted_at, acceptance_by_position=p.acceptance_by_position)


def _buckets(buckets: Sequence[views.HistogramBucket]) -> list[pb.HistogramBucket]:
    return [pb.HistogramBucket(upper_bound=b.upper_bound, count=b.count) for b in buckets]


def stats_window(w: views.StatsWindow) -> pb.StatsWindow:
    return pb.StatsWindow(
        estimated_speedup=w.estimated_speedup,
        speedup_costs_measured=w.speedup_costs_measured,
        window_seconds=w.window_seconds,
        proposers=[proposer_stats(p) for p in w.proposers],
        requests=w.requests,
        output_tokens=w.output_tokens,
        target_passes=w.target_passes,
        forced_tokens=w.forced_tokens,
        finish_reasons=w.finish_reasons,
        output_tokens_p50=w.output_tokens_p50,
        output_tokens_p95=w.output_tokens_p95,
        latency_ms_p50=w.latency_ms_p50,
        latency_ms_p99=w.latency_ms_p99,
        latency_ms_mean=w.latency_ms_mean,
        passes_per_token=w.passes_per_token,
        decisions=[pb.DecisionCount(proposer=d.proposer, reason=d.reason, requests=d.requests) for d in w.decisions],
        output_length=_buckets(w.output_length),
        latency_ms=_buckets(w.latency_ms),
        names=w.names,
    )


def _readings(acceptance: float | None, threshold: float | None) -> dict[str, float]:
    """The optional fields of a policy decision that were read (a None stays unset)."""
    return {k: v for k, v in (("acceptance", acceptance), ("threshold", threshold)) if v is not None}


def policy_state(p: views.ProposerPolicyState) -> pb.ProposerPolicyState:
    return pb.ProposerPolicyState(proposer=p.proposer, state=p.state, reason=p.reason, since=p.since,
                                  changed_at=p.changed_at, last_switch_off=p.last_switch_off or 0.0,
                                  last_switch_on=p.last_switch_on or 0.0, batch_bucket=p.batch_bucket,
                                  **_readings(p.acceptance, p.threshold))


def policy_change(c: views.PolicyChange) -> pb.PolicyChange:
    return pb.PolicyChange(proposer=c.proposer, at=c.at, state=c.state, reason=c.reason, previous=c.previous,
                           batch_bucket=c.batch_bucket, **_readings(c.acceptance, c.threshold))


def hour_stats(h: views.HourStats) -> pb.HourStats:
    return pb.HourStats(
        hour_start=h.hour_start, requests=h.requests, output_tokens=h.output_tokens, target_passes=h.target_passes,
        latency_ms_p50=h.latency_ms_p50, latency_ms_p99=h.latency_ms_p99,
        proposers=[pb.ProposerHour(proposer=p.proposer, drafted=p.drafted, accepted=p.accepted, examined=p.examined,
                                   accepted_examined=p.accepted_examined) for p in h.proposers])


def _set(**values: float | None) -> dict[str, float]:
    """The optional fields that hold a value (a None stays unset)."""
    return {k: v for k, v in values.items() if v is not None}


def draft_pricing(p: views.DraftPricing) -> pb.DraftPricing:
    return pb.DraftPricing(
        proposer=p.proposer, batch_bucket=p.batch_bucket, evidence_tokens=p.evidence_tokens,
        min_evidence_tokens=p.min_evidence_tokens, cold=p.cold, chosen=p.chosen, gain_margin=p.gain_margin,
        reason=p.reason, replayed_tokens=p.replayed_tokens, restricted_chosen=p.restricted_chosen,
        prices=[pb.DraftPrice(k=d.k, propose_seconds=d.propose_seconds, expected_accepted=d.expected_accepted,
                              step_source=d.step_source,
                              **_set(step_seconds=d.step_seconds, seconds_per_token=d.seconds_per_token))
                for d in p.prices],
        **_set(acceptance=p.acceptance, replayed_acceptance=p.replayed_acceptance))


def schema_stats(s: views.SchemaStats, windows: Sequence[int]) -> pb.SchemaStats:
    """``windows``: those the request asked for, in its order (a window asked for twice is sent twice)."""
    return pb.SchemaStats(model=s.model, schema_key=s.schema_key, windows=[stats_window(s.windows[w]) for w in windows],
                          policy=[policy_state(p) for p in s.policy],
                          policy_changes=[policy_change(c) for c in s.policy_changes],
                          timeline=[hour_stats(h) for h in s.timeline],
                          pricing=[draft_pricing(p) for p in s.pricing])


def rejected_draft(r: views.RejectedDraft) -> pb.RejectedDraft:
    return pb.RejectedDraft(
        model=r.model, schema_key=r.schema_key, proposer=r.proposer, created_at=r.created_at,
        batch_bucket=r.batch_bucket, context_tokens=r.context_tokens, context_text=r.context_text,
        draft_tokens=r.draft_tokens, draft_text=r.draft_text, position=r.position,
        rejected_token=r.rejected_token, rejected_text=r.rejected_text, target_token=r.target_token,
        target_text=r.target_text, grammatical=r.grammatical)
