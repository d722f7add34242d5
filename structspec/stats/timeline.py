"""Counters of a window as one point per hour, per (model, schema key): what the report plots over time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from structspec.stats.book import Counters
from structspec.stats.counters import LATENCY_BOUNDS_MS, Series, acceptance_of, histogram_quantile


@dataclass(frozen=True)
class ProposerHour:
    """One proposer's drafting in one hour, every batch bucket pooled."""

    drafted: int = 0
    accepted: int = 0
    examined: int = 0  # drafted tokens the verifier examined (a draft is examined up to its first rejection)
    accepted_examined: int = 0  # of those, accepted

    @property
    def acceptance(self) -> float | None:
        """Accepted per examined drafted token (the policy's measure; ``counters.acceptance_of``)."""
        return acceptance_of(self.accepted_examined, self.examined, self.accepted, self.drafted)


@dataclass(frozen=True)
class HourPoint:
    hour: int  # unix seconds
    requests: int = 0
    output_tokens: int = 0
    target_passes: int = 0
    latency_ms: dict[str, int] = field(default_factory=dict)  # histogram: upper-bound label -> requests
    proposers: dict[str, ProposerHour] = field(default_factory=dict)

    @property
    def passes_per_token(self) -> float | None:
        return self.target_passes / self.output_tokens if self.output_tokens else None

    def latency_quantile(self, q: float) -> float | None:
        return histogram_quantile({k: float(v) for k, v in self.latency_ms.items()}, q, LATENCY_BOUNDS_MS)


_SCALARS = {Series.REQUESTS: 0, Series.OUTPUT_TOKENS: 1, Series.TARGET_PASSES: 2}
_DRAFTING = {Series.DRAFTED: 0, Series.ACCEPTED: 1, Series.REACHED: 2, Series.ACCEPTED_AT: 3}


def timeline(counters: Counters) -> dict[tuple[str, str], list[HourPoint]]:
    """Per (model, schema key), its hours with any record, oldest first (the model's own series left out)."""
    scalars: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    latency: dict[tuple[str, str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    drafting: dict[tuple[str, str, int], dict[str, list[float]]] = defaultdict(dict)
    for key, value in counters.items():
        if not key.schema_key:
            continue
        at = (key.model, key.schema_key, key.hour)
        s = key.series
        if s in _SCALARS:
            scalars[at][_SCALARS[s]] += value
        elif s == Series.LATENCY_MS:
            latency[at][key.label] += int(value)
        elif s in _DRAFTING:
            drafting[at].setdefault(key.proposer, [0.0, 0.0, 0.0, 0.0])[_DRAFTING[s]] += value
    out: dict[tuple[str, str], list[HourPoint]] = defaultdict(list)
    for at in sorted(set(scalars) | set(latency) | set(drafting)):
        req, tokens, passes = scalars.get(at, (0.0, 0.0, 0.0))
        proposers = {p: ProposerHour(*(int(x) for x in v)) for p, v in sorted(drafting.get(at, {}).items())}
        out[(at[0], at[1])].append(HourPoint(at[2], int(req), int(tokens), int(passes), dict(latency.get(at, {})),
                                             proposers))
    return dict(out)
