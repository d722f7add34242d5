"""The statistics book: what the recorder counts, flush bookkeeping, the store's counters merged in."""

from __future__ import annotations

import gc
import threading
import time

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, CounterKey, Series
from structspec.stats.summary import summarize


def by_series(rows, **match):
    out = {}
    for k, v in rows.items():
        if all(getattr(k, f) == x for f, x in match.items()):
            out[(k.series, k.label)] = out.get((k.series, k.label), 0) + v
    return out


def test_a_verification_counts_the_positions_the_verifier_examined():
    book = StatsBook(clock=lambda: 10 * HOUR)
    rec = book.recorder("m")
    rec.record_verification("s", "ngram", 3, drafted=5, accepted=2, probe=True)  # positions 1-2 kept, 3 rejected
    rec.record_verification("s", "ngram", 4, drafted=2, accepted=2, probe=False)  # all kept: no position 3
    rows = by_series(book.rows(), proposer="ngram", batch_bucket=4)
    assert rows[(Series.REACHED, "1")] == 2 and rows[(Series.REACHED, "3")] == 1
    assert (Series.REACHED, "4") not in rows and (Series.ACCEPTED_AT, "3") not in rows
    assert rows[(Series.ACCEPTED_AT, "2")] == 2
    assert rows[(Series.DRAFTED, "")] == 7 and rows[(Series.ACCEPTED, "")] == 4
    assert rows[(Series.VERIFICATIONS, "")] == 2 and rows[(Series.PROBE_VERIFICATIONS, "")] == 1
    (summary,) = summarize(book.rows(), 3600)
    (p,) = summary.proposers
    assert (p.reached, p.accepted_at) == ((2, 2, 1), (2, 2, 0))
    assert p.acceptance_by_position() == [1.0, 1.0, 0.0]


def test_requests_and_decisions_reach_the_summary():
    book = StatsBook(clock=lambda: 10 * HOUR)
    rec = book.recorder("m")
    rec.record_request("s", 40, 20, 5, "stop", 900.0)
    rec.record_request("s", 64, 64, 0, "length", 3000.0)  # truncated: a long output all the same
    rec.record_request("s", 3, 3, 0, "cancelled", 20.0)  # cancelled: says nothing about the schema's outputs
    rec.record_decision("s", "short_output", {"draft": "short_output"})
    (s,) = summarize(book.rows(), 3600)
    assert (s.requests, s.output_tokens, s.target_passes, s.forced_tokens) == (3, 107, 87, 5)
    assert s.finish == {"stop": 1, "length": 1, "cancelled": 1} and s.output_length == {"48": 1, "64": 1}
    assert s.decisions == {("", "short_output"): 1, ("draft", "short_output"): 1}
    assert s.output_quantile(0.5) == 48.0


def test_flush_bookkeeping_loses_nothing_and_counts_nothing_twice():
    book = StatsBook(clock=lambda: 10 * HOUR)
    rec = book.recorder("m")
    rec.record_request("s", 1, 1, 0, "stop", 1.0)
    taken = book.take()
    rec.record_request("s", 1, 1, 0, "stop", 1.0)  # while the first is being written
    assert by_series(book.unflushed())[(Series.REQUESTS, "")] == 2
    book.restore(taken)  # the write failed
    assert by_series(book.take())[(Series.REQUESTS, "")] == 2
    assert by_series(book.unflushed())[(Series.REQUESTS, "")] == 2  # in flight until committed
    book.committed(next(iter(book._in_flight)))
    assert book.unflushed() == {}
    assert by_series(book.rows())[(Series.REQUESTS, "")] == 2  # the book still holds them for the policy


def test_replace_persisted_takes_the_stores_counters_and_keeps_the_unwritten_ones():
    clock = [100 * HOUR]
    book = StatsBook(horizon_seconds=48 * HOUR, clock=lambda: clock[0])
    rec = book.recorder("m")
    rec.record_request("s", 1, 1, 0, "stop", 1.0)  # not yet written
    key = CounterKey("m", "s", 100 * HOUR, Series.REQUESTS)
    old = CounterKey("m", "s", 10 * HOUR, Series.REQUESTS)  # past the horizon
    book.replace_persisted([(key, 5.0), (old, 7.0), (CounterKey("r2", "s", 100 * HOUR, Series.REQUESTS), 3.0)])
    assert book.rows()[key] == 6.0 and old not in book.rows()
    assert book.rows_for("r2", "s") == {CounterKey("r2", "s", 100 * HOUR, Series.REQUESTS): 3.0}


def _reload_while_recording(size: int):
    """A reload of ``size`` stored counters built while another thread records: (the build's seconds, the slowest
    add's, adds made meanwhile, the book, the key recorded, the stored rows)."""
    book = StatsBook(clock=lambda: 100 * HOUR)
    rec = book.recorder("m")
    requests = CounterKey("m", "s", 100 * HOUR, Series.REQUESTS)
    rec.record_request("s", 1, 1, 0, "stop", 1.0)  # unwritten when the reload begins
    stored = [(CounterKey("r2", f"s{i}", 100 * HOUR, Series.REQUESTS), 1.0) for i in range(size)]
    stored.append((requests, 10.0))  # another replica's
    reload = book.begin_reload()
    recorded, worst = 0, 0.0
    done = threading.Event()

    def record() -> None:
        nonlocal recorded, worst
        while not done.is_set():
            started = time.perf_counter()
            rec.record_request("s", 1, 1, 0, "stop", 1.0)
            worst = max(worst, time.perf_counter() - started)
            recorded += 1
            time.sleep(0.001)

    thread = threading.Thread(target=record)
    gc.disable()  # a collection pauses every thread, whatever the book does: the test measures waiting on the book
    try:
        thread.start()
        started = time.perf_counter()
        book.replace_persisted(stored, reload)
        took = time.perf_counter() - started
        done.set()
        thread.join()
    finally:
        gc.enable()
    return took, worst, recorded, book, requests, stored


def test_a_reload_builds_outside_the_lock_and_counts_what_is_recorded_meanwhile():
    """The decode path (a recorder's add) never waits for a reload to build the book from the stored counters; what
    it records meanwhile is in the new rows, once."""
    size = 200_000
    took, worst, recorded, book, requests, stored = _reload_while_recording(size)
    while took <= 0.2 and size < 3_200_000:  # a fast machine: more rows, until an add waiting for it would show
        size *= 2
        took, worst, recorded, book, requests, stored = _reload_while_recording(size)
    assert took > 0.2, took  # long enough that an add waiting for it would show (it waited all of it)
    assert worst < took / 3, (worst, took)
    rows = book.rows()
    assert rows[requests] == 10 + 1 + recorded and rows[stored[-2][0]] == 1.0
    assert not book._reloads  # ended
