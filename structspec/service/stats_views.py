"""What the statistics RPCs answer, read from a ``Store``: the one code path behind GetSchemaStats,
ListSchemaStats and ListRejectedDrafts, and behind ``structspec stats`` reading a data directory itself.

Per (model, schema key) and window: the summary of its counters, the estimated speedup (priced
with the model's own step times in the same window); per (model, schema key): the policy's
state per proposer and, on request, the hourly timeline and the policy's changes within the
longest window.

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

from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.service import convert
from structspec.front.registry import SCHEMA_ID_RE
from structspec.stats.book import Counters
from structspec.stats.counters import hour_of
from structspec.stats.evidence import CostEvidence, cost_evidence
from structspec.stats.policy_states import proposer_states
from structspec.stats.speedup import estimate_speedup
from structspec.stats.summary import summarize
from structspec.stats.timeline import timeline
from structspec.store.base import Store, sum_counters

FLAT_HALF_LIFE_HOURS = 1e9  # step times averaged evenly over a window (the policy weighs recent ones more)
MAX_REJECTED = 1000


def readable_by_tenants(schema_key: str) -> bool:
    """Whether ``schema_key`` names a registered schema version (``<id>@<version>``), whose statistics any caller
    may read."""
    schema_id, at, version = schema_key.rpartition("@")
    return bool(at) and version.isdigit() and SCHEMA_ID_RE.match(schema_id) is not None


def _costs(window: Counters, now: float) -> dict[str, CostEvidence]:
    """Per model, the mean measured step and drafting times of the window."""
    own: dict[str, Counters] = {}
    for k, v in window.items():
        if not k.schema_key:
            own.setdefault(k.model, {})[k] = v
    return {m: cost_evidence(rows, hour_of(now), FLAT_HALF_LIFE_HOURS) for m, rows in own.items()}


async def read_stats(store: Store, windows: Sequence[int], *, model: str | None = None, schema_key: str | None = None,
                     include_timeline: bool = False, now: float | None = None) -> list[pb.SchemaStats]:
    """One entry per (model, schema key) with any record in the longest window, sorted; with ``model`` and
    ``schema_key`` both given, exactly that one (its windows empty when nothing was recorded)."""
    now = time.time() if now is None else now
    longest = max(windows)
    since = now - longest
    counters = await store.read_counters(since=since, model=model, schema_key=schema_key)
    if schema_key is not None:  # the model's own series (schema key "") price the drafted passes
        counters.update(await store.read_counters(since=since, model=model, schema_key=""))
    changes = await store.read_policy_changes(model, schema_key)
    states = proposer_states(changes)
    per_window = []
    for w in windows:
        window = sum_counters(counters.items(), now - w, None)
        per_window.append((w, {(s.model, s.schema_key): s for s in summarize(window, w)}, _costs(window, now)))
    found = max(per_window, key=lambda x: x[0])[1]
    keys = sorted(found) if model is None or schema_key is None else [(model, schema_key)]
    hours = timeline(sum_counters(counters.items(), since, None)) if include_timeline else {}
    out = []
    for m, key in keys:
        windows_pb = []
        for w, summaries, costs in per_window:
            s = summaries.get((m, key))
            speedup = estimate_speedup(s, costs.get(m, CostEvidence())) if s is not None else None
            windows_pb.append(convert.stats_window(w, s, speedup))
        entry = pb.SchemaStats(model=m, schema_key=key, windows=windows_pb,
                               policy=[convert.policy_state(p) for (mm, kk, _), p in sorted(states.items())
                                       if (mm, kk) == (m, key)])
        if include_timeline:
            entry.timeline.extend(convert.hour_stats(h) for h in hours.get((m, key), []))
            entry.policy_changes.extend(convert.policy_change(c) for c in changes
                                        if (c.model, c.schema_key) == (m, key) and c.at >= since)
        out.append(entry)
    return out


async def read_rejected_drafts(store: Store, *, model: str | None = None, schema_key: str | None = None,
                               proposer: str | None = None, limit: int = 20) -> list[pb.RejectedDraft]:
    limit = min(MAX_REJECTED, limit or 20)
    rows = await store.read_rejected_drafts(model, schema_key, proposer, limit)
    return [convert.rejected_draft(r) for r in rows]
