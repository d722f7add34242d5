"""What waits for the store is bounded, and what the bound turns away is counted: the book's counter keys, the
rejected-draft samples, the history buffer."""

from __future__ import annotations

from structspec.stats.book import StatsBook
from structspec.stats.counters import CounterKey, Series
from structspec.stats.samples import RejectedDraft, RejectedDraftReservoir
from structspec.store.base import HistoryBuffer


def k(schema: str, hour: int = 0) -> CounterKey:
    return CounterKey("m", schema, hour, Series.REQUESTS)


def test_counters_past_the_bound_are_dropped_and_counted_but_still_seen() -> None:
    book = StatsBook(max_unwritten=2)
    book.add([(k("a"), 1.0), (k("b"), 1.0), (k("c"), 1.0)])  # c: a third key while two wait
    assert book.dropped == 1 and book.unwritten_keys() == 2
    book.add([(k("a"), 2.0)])  # a waiting key takes more at no cost
    assert book.dropped == 1 and book.unflushed() == {k("a"): 3.0, k("b"): 1.0}
    assert book.rows()[k("c")] == 1.0  # the policy still sees it (only the store never will)
    taken = book.take()  # in flight still counts against the bound
    book.add([(k("d"), 1.0)])
    assert book.dropped == 2
    book.committed(taken)
    book.add([(k("d"), 1.0)])
    assert book.dropped == 2 and book.unflushed() == {k("d"): 1.0}


def test_a_restored_write_keeps_the_bound() -> None:
    book = StatsBook(max_unwritten=3)
    book.add([(k("a"), 1.0), (k("b"), 1.0)])
    taken = book.take()
    book.add([(k("a"), 1.0)])  # pending a, in flight a and b: 3 keys wait
    book.restore(taken)
    assert book.unflushed() == {k("a"): 2.0, k("b"): 1.0} and book.unwritten_keys() == 2 and book.dropped == 0


def sample(slot: int) -> RejectedDraft:
    return RejectedDraft("m", "s", "ngram", 0, slot, float(slot), 1, (), "", (1,), "", 0, 1, "", 2, "", True)


def test_samples_waiting_are_bounded_oldest_dropped() -> None:
    sampler = RejectedDraftReservoir(max_pending=2)
    for slot in range(3):
        sampler.put(sample(slot))
    assert [r.slot for r in sampler.pending()] == [1, 2] and sampler.dropped == 1
    taken = sampler.take()
    sampler.put(sample(5))
    sampler.restore(taken)  # the restored are older: the oldest of them goes
    assert [r.slot for r in sampler.pending()] == [2, 5] and sampler.dropped == 2


def test_history_buffer_keeps_the_newest() -> None:
    buf = HistoryBuffer(limit=2)
    for i in range(3):
        buf.append("m", "k", f"t{i}", float(i))
    assert [r[2] for r in buf.take()] == ["t1", "t2"] and buf.dropped == 1 and len(buf) == 0
    buf.append("m", "k", "t3", 3.0)
    buf.restore([("m", "k", "t1", 1.0), ("m", "k", "t2", 2.0)])
    assert [r[2] for r in buf.take()] == ["t2", "t3"] and buf.dropped == 2
