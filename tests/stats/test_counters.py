"""Counters: hours, buckets, histograms and their quantiles."""

from __future__ import annotations

import math

import pytest

from structspec.stats.counters import (
    LENGTH_BOUNDS,
    batch_bucket,
    histogram_label,
    histogram_quantile,
    hour_of,
    model_key,
)


def test_hours_buckets_and_model_keys():
    assert hour_of(7199.9) == 3600 and hour_of(7200) == 7200
    assert [batch_bucket(n) for n in (0, 1, 2, 3, 4, 5, 9, 16)] == [1, 1, 2, 4, 4, 8, 16, 16]
    assert model_key("gemma-3-270m") == "gemma-3-270m" and model_key("demo", "abc") == "demo+draft:abc"


def test_histogram_labels_are_upper_bounds():
    assert histogram_label(4, LENGTH_BOUNDS) == "4" and histogram_label(5, LENGTH_BOUNDS) == "8"
    assert histogram_label(10**9, LENGTH_BOUNDS) == "inf"


def test_quantiles_interpolate_within_the_buckets_own_bounds():
    # one 40-token output: bucket (32, 48]; its median is the bucket's middle, not a value from 0
    assert histogram_quantile({"48": 1}, 0.5, LENGTH_BOUNDS) == pytest.approx(40)
    counts = {"8": 10, "16": 10, "inf": 5}
    assert histogram_quantile(counts, 0.2, LENGTH_BOUNDS) == pytest.approx(4 + 4 * 0.5)
    assert histogram_quantile(counts, 0.6, LENGTH_BOUNDS) == pytest.approx(8 + 8 * 0.5)
    assert histogram_quantile(counts, 0.99, LENGTH_BOUNDS) == 4096  # the unbounded bucket: its lower bound
    assert histogram_quantile({}, 0.5, LENGTH_BOUNDS) is None
    assert not math.isinf(histogram_quantile({"inf": 3}, 0.5, LENGTH_BOUNDS))
