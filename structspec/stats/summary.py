"""Counters of a window summed into what the stats views show, per (model, schema key).

``summarize(counters, window_seconds)`` is what GetSchemaStats, ListSchemaStats and the
CLI report; nothing here reads a clock or a store.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from structspec.stats.book import Counters
from structspec.stats.counters import LATENCY_BOUNDS_MS, LENGTH_BOUNDS, Series, histogram_quantile


@dataclass(frozen=True)
class ProposerSummary:
    """One proposer at one batch-size bucket."""

    proposer: str
    batch_bucket: int
    verifications: int  # verifications that carried its draft
    drafted: int
    accepted: int
    probe_verifications: int  # of ``verifications``, those made by recovery probes
    reached: tuple[int, ...]  # [i]: drafts whose position i+1 the verifier examined
    accepted_at: tuple[int, ...]  # [i]: of those, accepted at position i+1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def acceptance_by_position(self) -> list[float]:
        """P(accepted at i | examined at i), per position."""
        return [a / r if r else 0.0 for r, a in zip(self.reached, self.accepted_at)]


@dataclass(frozen=True)
class SchemaSummary:
    model: str
    schema_key: str
    window_seconds: int
    requests: int = 0
    output_tokens: int = 0
    target_passes: int = 0
    forced_tokens: int = 0
    latency_ms_sum: float = 0.0
    finish: dict[str, int] = field(default_factory=dict)  # stop | length | cancelled | error -> requests
    output_length: dict[str, int] = field(default_factory=dict)  # histogram: upper bound label -> requests (stop or length)
    latency_ms: dict[str, int] = field(default_factory=dict)  # histogram: upper bound label -> requests
    decisions: dict[tuple[str, str], int] = field(default_factory=dict)  # (proposer or "", reason) -> requests
    names: dict[str, int] = field(default_factory=dict)  # readable names callers gave the (inline) schema -> requests
    proposers: tuple[ProposerSummary, ...] = ()

    @property
    def passes_per_token(self) -> float:
        return self.target_passes / self.output_tokens if self.output_tokens else 0.0

    def output_quantile(self, q: float) -> float | None:
        return histogram_quantile({k: float(v) for k, v in self.output_length.items()}, q, LENGTH_BOUNDS)

    def latency_quantile(self, q: float) -> float | None:
        return histogram_quantile({k: float(v) for k, v in self.latency_ms.items()}, q, LATENCY_BOUNDS_MS)

    def acceptance(self, proposer: str) -> float:
        """Over every batch bucket."""
        rows = [p for p in self.proposers if p.proposer == proposer]
        drafted = sum(p.drafted for p in rows)
        return sum(p.accepted for p in rows) / drafted if drafted else 0.0


_REQUEST_SERIES = {Series.REQUESTS: "requests", Series.OUTPUT_TOKENS: "output_tokens",
                   Series.TARGET_PASSES: "target_passes", Series.FORCED_TOKENS: "forced_tokens"}
_DRAFT_SERIES = {Series.VERIFICATIONS: 0, Series.DRAFTED: 1, Series.ACCEPTED: 2, Series.PROBE_VERIFICATIONS: 3}


def summarize(counters: Counters, window_seconds: int) -> list[SchemaSummary]:
    """One summary per (model, schema key) in ``counters`` (the model's own series left out), sorted."""
    scalars: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    maps: dict[tuple[str, str], dict[str, dict[Any, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    drafts: dict[tuple[str, str], dict[tuple[str, int], list[Any]]] = defaultdict(dict)
    for key, value in counters.items():
        if not key.schema_key:
            continue
        who = (key.model, key.schema_key)
        s = key.series
        if s in _REQUEST_SERIES:
            scalars[who][_REQUEST_SERIES[s]] += value
        elif s == Series.LATENCY_MS_SUM:
            scalars[who]["latency_ms_sum"] += value
        elif s in (Series.FINISH, Series.OUTPUT_LENGTH, Series.LATENCY_MS, Series.NAME):
            maps[who][s][key.label] += int(value)
        elif s == Series.DECISION:
            maps[who][s][(key.proposer, key.label)] += int(value)
        elif s in _DRAFT_SERIES or s in (Series.REACHED, Series.ACCEPTED_AT):
            row = drafts[who].setdefault((key.proposer, key.batch_bucket), [0, 0, 0, 0, {}, {}])
            if s in _DRAFT_SERIES:
                row[_DRAFT_SERIES[s]] += int(value)
            else:
                pos = int(key.label)
                target = row[4] if s == Series.REACHED else row[5]
                target[pos] = target.get(pos, 0) + int(value)
    out = []
    for who in sorted(set(scalars) | set(maps) | set(drafts)):
        sc, mp = scalars.get(who, {}), maps.get(who, {})
        proposers = []
        for (proposer, bucket), (ver, dr, ac, probes, reached, acc_at) in sorted(drafts.get(who, {}).items()):
            depth = max([*reached, *acc_at, 0])
            proposers.append(ProposerSummary(proposer, bucket, ver, dr, ac, probes,
                                             tuple(reached.get(i, 0) for i in range(1, depth + 1)),
                                             tuple(acc_at.get(i, 0) for i in range(1, depth + 1))))
        out.append(SchemaSummary(
            who[0], who[1], window_seconds,
            requests=int(sc.get("requests", 0)), output_tokens=int(sc.get("output_tokens", 0)),
            target_passes=int(sc.get("target_passes", 0)), forced_tokens=int(sc.get("forced_tokens", 0)),
            latency_ms_sum=float(sc.get("latency_ms_sum", 0.0)),
            finish=dict(mp.get(Series.FINISH, {})), output_length=dict(mp.get(Series.OUTPUT_LENGTH, {})),
            latency_ms=dict(mp.get(Series.LATENCY_MS, {})), decisions=dict(mp.get(Series.DECISION, {})),
            names=dict(mp.get(Series.NAME, {})),
            proposers=tuple(proposers)))
    return out
