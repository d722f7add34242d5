"""The paired bootstrap interval of a benchmark's speed ratio: it covers the true ratio, it resolves a real miss
from a few requests, and it is paired (the spread between requests' lengths cancels)."""

from __future__ import annotations

import numpy as np
import pytest

from structspec.bench.ratio_interval import paired_ratio


def requests(rng: np.random.Generator, n: int, ratio: float, noise: float = 0.10, spread: float = 0.4):
    """n requests of very different lengths and paces (a request's own speed, ``spread``: lognormal, shared by both
    configurations, as a looping output is drafted fast by every one), served by a base at 40 tok/s times that pace
    and by another configuration at ``ratio`` times the base; each latency off by ``noise`` (lognormal), apart."""
    tokens = rng.integers(20, 400, n).astype(float)
    pace = 40.0 * rng.lognormal(0.0, spread, n)
    base = tokens / pace * rng.lognormal(0.0, noise, n)
    other = tokens / (pace * ratio) * rng.lognormal(0.0, noise, n)
    return tokens, other, tokens, base


def test_the_interval_covers_the_true_ratio_about_as_often_as_it_says():
    rng = np.random.default_rng(7)
    covered = 0
    for seed in range(60):
        got = paired_ratio(*requests(rng, 12, 1.0), seed=seed)
        assert got is not None
        covered += got.low <= 1.0 <= got.high
    assert covered >= 48  # 95% nominal; BCa on 12 requests runs a little under (P(X<=47 | p=0.9) < 0.02)


def test_a_policy_at_080_of_the_best_is_shown_under_095_from_a_dozen_requests():
    rng = np.random.default_rng(11)
    resolved = sum(got.high < 0.95 for got in (paired_ratio(*requests(rng, 12, 0.80), seed=s) for s in range(30))
                   if got is not None)
    assert resolved >= 24  # power >= 0.8: at 10% noise a 20% miss is resolved from 12 requests


def test_the_spread_between_requests_cancels_in_the_pair():
    """Lengths spread 20x and paces 2x either way, latencies off by 2%: the paired interval is a few percent wide.
    Resampling each configuration's requests apart (unpaired) is tens of percent wide and fails this."""
    rng = np.random.default_rng(3)
    got = paired_ratio(*requests(rng, 10, 0.9, noise=0.02))
    assert got is not None
    assert got.low < 0.9 < got.high and got.high - got.low < 0.06


def test_too_few_requests_or_a_request_of_no_time_give_none():
    assert paired_ratio([1, 2], [1, 1], [1, 2], [1, 1]) is None
    assert paired_ratio([1, 2, 3], [1, 0, 1], [1, 2, 3], [1, 1, 1]) is None
    with pytest.raises(ValueError):
        paired_ratio([1, 2, 3], [1, 1], [1, 2, 3], [1, 1, 1])


def test_identical_speeds_give_a_point():
    got = paired_ratio([10, 20, 30], [1, 2, 3], [10, 20, 30], [2, 4, 6])
    assert got is not None and got.ratio == got.low == got.high == pytest.approx(2.0)
