"""How sure a benchmark's speed ratio is: a paired bootstrap interval over its requests.

A row of ``bench heldout`` compares configurations that served the same requests, one after the other
(interleaved), so a request's own length and difficulty are shared by every configuration and cancel in their
ratio: resampling whole requests, each with every configuration's tokens and latency (paired), measures how much
the ratio depends on which requests were drawn, without counting the spread between requests twice. The ratio is
of tokens per second over the resampled requests (their tokens over their latency), as the row's own figure.

The interval is scipy's BCa bootstrap (``scipy.stats.bootstrap``, ``paired=True``), seeded: a rerun of the same
report gives the same interval. With the few requests of a row (6-24) it is wide; that width is the point: a
row whose interval holds 0.95 of the best has not shown a miss, and one whose upper end is under it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class RatioInterval:
    """One configuration's tokens/s over another's on the same requests, and its bootstrap interval."""

    ratio: float
    low: float
    high: float
    requests: int


def paired_ratio(tokens: Sequence[float], seconds: Sequence[float], base_tokens: Sequence[float],
                 base_seconds: Sequence[float], confidence: float = CONFIDENCE, seed: int = 0) -> RatioInterval | None:
    """(sum tokens / sum seconds) over (sum base_tokens / sum base_seconds), request i of each being the same
    request, with its ``confidence`` interval; None with under 3 requests or a request of no time. Raises: Never
    on such input (ValueError on sequences of unequal length)."""
    t, s, bt, bs = (np.asarray(v, dtype=float) for v in (tokens, seconds, base_tokens, base_seconds))
    if not (len(t) == len(s) == len(bt) == len(bs)):
        raise ValueError("every sequence holds one value per request")
    if len(t) < 3 or (s <= 0).any() or (bs <= 0).any() or bt.sum() <= 0:
        return None

    def ratio(t: np.ndarray, s: np.ndarray, bt: np.ndarray, bs: np.ndarray, axis: int = -1) -> np.ndarray:
        return (t.sum(axis) / s.sum(axis)) / np.maximum(bt.sum(axis), 1e-12) * bs.sum(axis)

    point = float(ratio(t, s, bt, bs))
    if np.allclose(t / s, (t / s)[0]) and np.allclose(bt / bs, (bt / bs)[0]):  # no spread: nothing to resample
        return RatioInterval(point, point, point, len(t))
    for method in ("BCa", "percentile"):  # BCa, degenerate on a tiny sample: the percentile interval
        res = stats.bootstrap((t, s, bt, bs), ratio, paired=True, vectorized=True, confidence_level=confidence,
                              n_resamples=RESAMPLES, method=method, rng=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high):
            break
    return RatioInterval(point, low, high, len(t))
