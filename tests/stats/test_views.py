"""Process totals (bounded labels, monotonic), the hourly timeline and the speedup estimate."""

from __future__ import annotations

import pytest

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Series
from structspec.stats.evidence import CostEvidence
from structspec.stats.speedup import estimate_speedup
from structspec.stats.summary import summarize
from structspec.stats.timeline import timeline
from structspec.stats.totals import TotalKey, schema_label


def test_schema_labels_are_bounded():
    assert schema_label("invoice@2") == "invoice@2"
    assert {schema_label(k) for k in ("inline:3f2a", "3f2a" * 16, "contact", "a@b@3", "x@")} == {"inline"}
    assert schema_label("tools:abc") == "tools"


def test_totals_keep_growing_when_the_book_is_replaced():
    clock = [10 * HOUR]
    book = StatsBook(clock=lambda: clock[0])
    rec = book.recorder("m")
    for i in range(3):
        rec.record_request(f"inline:{i}", 10, 5, 1, "stop", 100.0)
    rec.record_verification("inv@1", "ngram", 3, drafted=4, accepted=1, probe=False)
    book.replace_persisted([])  # a refresh: the book's rows are the store's now
    clock[0] += 30 * 86400
    book.replace_persisted([])
    rec.record_request("inv@1", 7, 7, 0, "length", 50.0)
    totals = book.totals.snapshot()
    assert totals[TotalKey(Series.REQUESTS, "inline")] == 3 and totals[TotalKey(Series.OUTPUT_TOKENS, "inline")] == 30
    assert totals[TotalKey(Series.FINISH, "inline", label="stop")] == 3
    assert totals[TotalKey(Series.DRAFTED, "inv@1", "ngram", 4)] == 4
    assert totals[TotalKey(Series.FINISH, "inv@1", label="length")] == 1
    assert not any(k.series in (Series.REACHED, Series.LATENCY_MS) for k in totals)  # not exported
    assert {k.schema for k in totals} == {"inline", "inv@1"}


def test_the_timeline_has_one_point_per_hour_with_the_policys_acceptance():
    clock = [10 * HOUR + 5]
    book = StatsBook(clock=lambda: clock[0])
    rec = book.recorder("m")
    rec.record_request("s", 40, 20, 0, "stop", 900.0)
    rec.record_verification("s", "ngram", 1, drafted=4, accepted=1, probe=False)  # examined 2, accepted 1
    clock[0] += 2 * HOUR
    rec.record_request("s", 10, 10, 0, "stop", 80.0)
    rec.record_request("s", 10, 10, 0, "stop", 120.0)
    rec.record_step(1, 0, 0.01)  # the model's own series: not a schema's
    (points,) = timeline(book.rows()).values()
    assert [p.hour for p in points] == [10 * HOUR, 12 * HOUR]
    first, last = points
    assert (first.requests, first.output_tokens, first.passes_per_token) == (1, 40, 0.5)
    ngram = first.proposers["ngram"]
    assert (ngram.drafted, ngram.accepted, ngram.examined, ngram.accepted_examined) == (4, 1, 2, 1)
    assert ngram.acceptance == 0.5
    assert last.requests == 2 and last.proposers == {} and 50 <= last.latency_quantile(0.5) <= 250


def test_the_speedup_prices_drafted_passes_with_measured_step_times():
    book = StatsBook(clock=lambda: HOUR)
    rec = book.recorder("m")
    rec.record_request("s", 100, 60, 0, "stop", 100.0)
    for _ in range(20):
        rec.record_verification("s", "ngram", 1, drafted=4, accepted=2, probe=False)  # 40 accepted in 20 passes
    (summary,) = summarize(book.rows(), HOUR)
    unmeasured = estimate_speedup(summary, CostEvidence())
    assert unmeasured.speedup == pytest.approx(100 / 60) and not unmeasured.measured_costs
    costs = CostEvidence({(1, 0): 0.010, (1, 4): 0.015}, {("ngram", 4): 0.001})
    measured = estimate_speedup(summary, costs)
    # 20 drafted passes cost 0.6 plain passes more each: 100 / (60 + 12)
    assert measured.speedup == pytest.approx(100 / 72) and measured.measured_costs
    assert (measured.passes_without, measured.passes) == (100, 60)
    (empty,) = summarize({k: v for k, v in book.rows().items() if k.series == Series.REQUESTS}, HOUR)
    assert estimate_speedup(empty, costs) is None
