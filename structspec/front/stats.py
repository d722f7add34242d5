"""The statistics views read from a ``Store``: the one code path behind GetSchemaStats, ListSchemaStats and
ListRejectedDrafts, and behind ``structspec stats`` reading a data directory itself.

Per (model, schema key) and window: the summary of its counters, the estimated speedup (priced
with the model's own step times in the same window); per (model, schema key): the policy's
state per proposer and, on request, the hourly timeline and the policy's changes within the
longest window; and per proposer the drafting policy's pricing of its draft lengths (``draft_pricing``: the
schema's evidence as the policy reads it, priced with the model's step costs: the steps measured while serving and
the step profile the engine measured at start, both from the store). Each comes back as a ``structspec.front.views``
value (no protocol types), with the values the wire carries: floats where the wire has doubles, a time never
recorded as None.

Who reads what (``readable_by_tenants``): where auth tokens are configured, a caller without the admin token reads
the statistics of registered schemas alone (``<id>@<version>``: schemas every caller may read, registered by an
admin). An inline schema (``inline:<hash>``) and a tool list (``tools:<hash>``) are keyed by their content and
shared by every caller that sends the same one, so their statistics cannot be told apart per tenant: they would
show one tenant another's schemas, names, volumes and latencies. The admin token, or a server without tokens (one
tenant), reads every key.
"""

from __future__ import annotations

import time
from typing import Sequence

from structspec.engine.config import PolicyConfig
from structspec.front import views
from structspec.front.errors import invalid
from structspec.front.keys import DEFAULT_WINDOWS, MAX_WINDOW_SECONDS, MAX_WINDOWS, SCHEMA_ID_RE
from structspec.speculation.policy import DraftPricing, price_draft
from structspec.stats.book import Counters
from structspec.stats.counters import HOUR, LATENCY_BOUNDS_MS, LENGTH_BOUNDS, Series, hour_of, label_bound
from structspec.stats.evidence import CostEvidence, cost_evidence, schema_evidence, stored_profile
from structspec.stats.policy_states import PolicyChange, ProposerState, proposer_states
from structspec.stats.samples import RejectedDraft
from structspec.stats.speedup import SpeedupEstimate, estimate_speedup
from structspec.stats.summary import ProposerSummary, SchemaSummary, summarize
from structspec.stats.timeline import HourPoint, timeline
from structspec.store.base import Store, sum_counters

FLAT_HALF_LIFE_HOURS = 1e9  # step times averaged evenly over a window (the policy weighs recent ones more)
MAX_REJECTED = 1000


def windows(requested: Sequence[int]) -> tuple[int, ...]:
    """The windows a request asks for (``DEFAULT_WINDOWS`` when none); raises ``FrontError`` (INVALID_ARGUMENT,
    field ``window_seconds``) past ``MAX_WINDOWS`` or outside [1, ``MAX_WINDOW_SECONDS``]."""
    out = tuple(requested) or DEFAULT_WINDOWS
    if len(out) > MAX_WINDOWS:
        raise invalid("window_seconds", f"at most {MAX_WINDOWS} windows")
    for w in out:
        if not 1 <= w <= MAX_WINDOW_SECONDS:
            raise invalid("window_seconds", f"each window must be in [1, {MAX_WINDOW_SECONDS}] seconds")
    return out


def readable_by_tenants(schema_key: str) -> bool:
    """Whether ``schema_key`` names a registered schema version (``<id>@<version>``), whose statistics any caller
    may read."""
    schema_id, at, version = schema_key.rpartition("@")
    return bool(at) and version.isdigit() and SCHEMA_ID_RE.match(schema_id) is not None


# -- summaries -> views ----------------------------------------------------------------------------


def proposer_stats(p: ProposerSummary) -> views.ProposerStats:
    return views.ProposerStats(
        proposer=p.proposer,
        batch_bucket=p.batch_bucket,
        drafted=p.drafted,
        accepted=p.accepted,
        events=p.verifications,
        acceptance_rate=float(p.acceptance_rate),
        probe_verifications=p.probe_verifications,
        reached=list(p.reached),
        accepted_at=list(p.accepted_at),
        acceptance_by_position=[float(a) for a in p.acceptance_by_position()],
    )


def histogram(counts: dict[str, int], bounds: Sequence[float]) -> list[views.HistogramBucket]:
    """Every bucket of ``bounds`` in order, zeros included (and any other bound the counters name); [] when empty."""
    if not any(counts.values()):
        return []
    by_bound = {label_bound(label): n for label, n in counts.items()}
    return [views.HistogramBucket(upper_bound=float(b), count=by_bound.get(b, 0))
            for b in sorted(set(bounds) | set(by_bound))]


def stats_window(window_seconds: int, s: SchemaSummary | None,
                 speedup: SpeedupEstimate | None = None) -> views.StatsWindow:
    """One window of one (model, schema); ``None``: nothing recorded in it."""
    if s is None:
        return views.StatsWindow(window_seconds=window_seconds)
    return views.StatsWindow(
        estimated_speedup=float(speedup.speedup) if speedup is not None else 0.0,
        speedup_costs_measured=speedup is not None and bool(speedup.measured_costs),
        window_seconds=window_seconds,
        proposers=[proposer_stats(p) for p in s.proposers],
        requests=s.requests,
        output_tokens=s.output_tokens,
        target_passes=s.target_passes,
        forced_tokens=s.forced_tokens,
        finish_reasons=dict(s.finish),
        output_tokens_p50=float(s.output_quantile(0.5) or 0.0),
        output_tokens_p95=float(s.output_quantile(0.95) or 0.0),
        latency_ms_p50=float(s.latency_quantile(0.5) or 0.0),
        latency_ms_p99=float(s.latency_quantile(0.99) or 0.0),
        latency_ms_mean=float(s.latency_ms_sum / s.requests) if s.requests else 0.0,
        passes_per_token=float(s.passes_per_token),
        decisions=[views.DecisionCount(proposer=p, reason=r, requests=n) for (p, r), n in sorted(s.decisions.items())],
        output_length=histogram(s.output_length, LENGTH_BOUNDS),
        latency_ms=histogram(s.latency_ms, LATENCY_BOUNDS_MS),
        names=dict(s.names),
    )


def _float_or_none(value: float | None) -> float | None:
    return float(value) if value is not None else None


def policy_state(p: ProposerState) -> views.ProposerPolicyState:
    """A time never recorded (no switch off yet, say) is None."""
    return views.ProposerPolicyState(
        proposer=p.proposer, state=p.state, reason=p.reason, since=float(p.since), changed_at=float(p.changed_at),
        last_switch_off=float(p.last_off) if p.last_off else None,
        last_switch_on=float(p.last_on) if p.last_on else None,
        acceptance=_float_or_none(p.acceptance), threshold=_float_or_none(p.threshold), batch_bucket=p.batch_bucket)


def policy_change(c: PolicyChange) -> views.PolicyChange:
    return views.PolicyChange(
        proposer=c.proposer, at=float(c.at), state=c.state, reason=c.reason, previous=c.previous,
        batch_bucket=c.batch_bucket, acceptance=_float_or_none(c.acceptance), threshold=_float_or_none(c.threshold))


def hour_stats(h: HourPoint) -> views.HourStats:
    return views.HourStats(
        hour_start=h.hour, requests=h.requests, output_tokens=h.output_tokens, target_passes=h.target_passes,
        latency_ms_p50=float(h.latency_quantile(0.5) or 0.0), latency_ms_p99=float(h.latency_quantile(0.99) or 0.0),
        proposers=[views.ProposerHour(proposer=name, drafted=p.drafted, accepted=p.accepted, examined=p.examined,
                                      accepted_examined=p.accepted_examined) for name, p in h.proposers.items()])


def rejected_draft(r: RejectedDraft) -> views.RejectedDraft:
    return views.RejectedDraft(
        model=r.model, schema_key=r.schema_key, proposer=r.proposer, created_at=float(r.created_at),
        batch_bucket=r.batch_bucket, context_tokens=list(r.context_tokens), context_text=r.context_text,
        draft_tokens=list(r.draft_tokens), draft_text=r.draft_text, position=r.position,
        rejected_token=r.rejected_token, rejected_text=r.rejected_text, target_token=r.target_token,
        target_text=r.target_text, grammatical=bool(r.grammatical))


def _step_source(costs: CostEvidence, bucket: int, k: int, step: float | None) -> str:
    """Where a priced step time comes from: served (measured while serving), profile (the start's profile, scaled
    to serving's plain step where that is measured), interpolated (between served lengths); "" none."""
    if step is None:
        return ""
    if (bucket, k) in costs.steps:
        return "served"
    if CostEvidence(profile=costs.profile).step_seconds(bucket, k) is not None:
        return "profile"
    return "interpolated"


def draft_price_view(pricing: DraftPricing, costs: CostEvidence, config: PolicyConfig,
                     reason: str = "") -> views.DraftPricing:
    b = pricing.batch_bucket
    return views.DraftPricing(
        proposer=pricing.proposer, batch_bucket=b, evidence_tokens=float(pricing.evidence_tokens),
        min_evidence_tokens=config.min_evidence_tokens, acceptance=_float_or_none(pricing.acceptance),
        cold=pricing.cold, chosen=pricing.chosen, gain_margin=float(config.gain_margin),
        prices=[views.DraftPrice(k=p.k, step_seconds=_float_or_none(p.step_seconds),
                                 propose_seconds=float(p.propose_seconds), expected_accepted=float(p.expected_accepted),
                                 seconds_per_token=_float_or_none(p.seconds_per_token),
                                 step_source=_step_source(costs, b, p.k, p.step_seconds)) for p in pricing.prices],
        reason=reason, replayed_tokens=float(pricing.replayed_tokens),
        replayed_acceptance=_float_or_none(pricing.replayed_acceptance), restricted_chosen=pricing.restricted_chosen)


def latest_decisions(schema_rows: Counters) -> dict[str, str]:
    """Per proposer, its most frequent reason (ties by name) in the newest hour the policy decided for it in
    (``Series.DECISION``): what it decided for the proposers it keeps no state for (a cold proposer priced out)."""
    newest: dict[str, int] = {}
    counts: dict[tuple[str, int, str], float] = {}
    for key, value in schema_rows.items():
        if key.series != Series.DECISION or not key.proposer or value <= 0:
            continue
        newest[key.proposer] = max(newest.get(key.proposer, key.hour), key.hour)
        counts[(key.proposer, key.hour, key.label)] = counts.get((key.proposer, key.hour, key.label), 0.0) + value
    out = {}
    for p, hour in newest.items():
        reasons = {r: n for (pp, h, r), n in counts.items() if (pp, h) == (p, hour)}
        out[p] = max(sorted(reasons), key=lambda r: reasons[r])
    return out


def draft_pricing(schema_rows: Counters, costs: CostEvidence, states: Sequence[ProposerState], now: float,
                  config: PolicyConfig) -> list[views.DraftPricing]:
    """Per proposer the policy has a state for (priced at the batch bucket of its latest state, with its reason),
    decided for or that drafted within the policy's horizon (at batch bucket 1, with its latest decision's reason),
    by proposer: the schema's evidence read as the policy reads it (``schema_rows``: the schema's counters of the
    horizon) priced with ``costs``."""
    evidence = schema_evidence(schema_rows, hour_of(now), config.half_life_hours, config.evidence_window_tokens,
                               config.evidence_max_age_hours)
    reasons = latest_decisions(schema_rows)
    buckets = {}
    for st in states:
        buckets[st.proposer], reasons[st.proposer] = st.batch_bucket, st.reason
    drafted = {p for p, ev in evidence.pooled.items() if ev.drafted > 0}
    return [draft_price_view(price_draft(evidence, costs, p, buckets.get(p) or 1, config), costs, config,
                             reasons.get(p, "")) for p in sorted(set(reasons) | drafted)]


# -- reading ---------------------------------------------------------------------------------------


def _costs(window: Counters, now: float) -> dict[str, CostEvidence]:
    """Per model, the mean measured step and drafting times of the window."""
    own: dict[str, Counters] = {}
    for k, v in window.items():
        if not k.schema_key:
            own.setdefault(k.model, {})[k] = v
    return {m: cost_evidence(rows, hour_of(now), FLAT_HALF_LIFE_HOURS) for m, rows in own.items()}


async def _model_costs(store: Store, model: str, own: Counters, now: float, config: PolicyConfig) -> CostEvidence:
    """The step costs the policy prices with: the model's own series of the horizon (``own``) with the step profile
    the store holds; a profile recorded before the horizon (a server up longer) is read from every kept hour."""
    costs = cost_evidence(own, hour_of(now), config.half_life_hours)
    if costs.profile:
        return costs
    return costs.with_profile(*stored_profile(await store.read_counters(since=0.0, model=model, schema_key="")))


async def read_stats(store: Store, windows: Sequence[int], *, model: str | None = None, schema_key: str | None = None,
                     include_timeline: bool = False, now: float | None = None,
                     policy: PolicyConfig | None = None) -> list[views.SchemaStats]:
    """One entry per (model, schema key) with any record in the longest window, sorted; with ``model`` and
    ``schema_key`` both given, exactly that one (its windows empty when nothing was recorded). ``policy``: the
    drafting policy's configuration the draft pricing reads (its horizon, half life, prior and margins; None: the
    defaults)."""
    config = PolicyConfig() if policy is None else policy
    now = time.time() if now is None else now
    longest = max(windows)
    since = now - longest
    horizon = now - config.evidence_max_age_hours * HOUR  # what the policy reads of a schema's evidence
    read_since = min(since, horizon)
    counters = await store.read_counters(since=read_since, model=model, schema_key=schema_key)
    if schema_key is not None:  # the model's own series (schema key "") price the drafted passes
        counters.update(await store.read_counters(since=read_since, model=model, schema_key=""))
    changes = await store.read_policy_changes(model, schema_key)
    states = proposer_states(changes)
    per_window = []
    for w in windows:
        window = sum_counters(counters.items(), now - w, None)
        per_window.append((w, {(s.model, s.schema_key): s for s in summarize(window, w)}, _costs(window, now)))
    found = max(per_window, key=lambda x: x[0])[1]
    keys = sorted(found) if model is None or schema_key is None else [(model, schema_key)]
    hours = timeline(sum_counters(counters.items(), since, None)) if include_timeline else {}
    recent: dict[tuple[str, str], Counters] = {}  # (model, schema key) -> its counters of the policy's horizon
    for k, v in sum_counters(counters.items(), horizon, None).items():
        recent.setdefault((k.model, k.schema_key), {})[k] = v
    model_costs = {m: await _model_costs(store, m, recent.get((m, ""), {}), now, config) for m in sorted({m for m, _ in keys})}
    out = []
    for m, key in keys:
        by_window = {}
        for w, summaries, costs in per_window:
            s = summaries.get((m, key))
            speedup = estimate_speedup(s, costs.get(m, CostEvidence())) if s is not None else None
            by_window[w] = stats_window(w, s, speedup)
        own_states = [p for (mm, kk, _), p in sorted(states.items()) if (mm, kk) == (m, key)]
        shown = [policy_state(p) for p in own_states]
        pricing = draft_pricing(recent.get((m, key), {}), model_costs[m], own_states, now, config)
        if include_timeline:
            out.append(views.SchemaStats(
                key, by_window, m, shown,
                [policy_change(c) for c in changes if (c.model, c.schema_key) == (m, key) and c.at >= since],
                [hour_stats(h) for h in hours.get((m, key), [])], pricing))
        else:
            out.append(views.SchemaStats(key, by_window, m, shown, pricing=pricing))
    return out


async def read_rejected_drafts(store: Store, *, model: str | None = None, schema_key: str | None = None,
                               proposer: str | None = None, limit: int = 20) -> list[views.RejectedDraft]:
    """The newest sampled rejected drafts first, at most ``MAX_REJECTED`` (``limit`` 0: 20)."""
    limit = min(MAX_REJECTED, limit or 20)
    rows = await store.read_rejected_drafts(model, schema_key, proposer, limit)
    return [rejected_draft(r) for r in rows]
