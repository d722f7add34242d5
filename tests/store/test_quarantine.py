"""Rows a store refuses for what they hold are quarantined (counted, logged, kept apart) and hold back none of the
rows behind them, on SQLite and PostgreSQL; a store that cannot be written keeps everything for the next flush."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from structspec.stats.counters import Series
from structspec.store import StoreError
from tests.store.test_samples_and_changes import reject
from tests.store.test_store import NOW, key

TOO_BIG = 2**70  # fits neither SQLite's 64-bit INTEGER nor PostgreSQL's INTEGER column


def poison(s) -> None:
    """A rejected-draft sample the store refuses: a token id out of its column's range."""
    assert reject(s, schema="bad@1")
    s.stats.samples.restore([dataclasses.replace(r, target_token=TOO_BIG) if r.schema_key == "bad@1" else r
                             for r in s.stats.samples.take()])


async def test_a_refused_row_is_quarantined_and_the_rest_of_its_flush_lands(backend, caplog) -> None:
    caplog.set_level(logging.INFO, logger="structspec")
    s = await backend.open()
    rec = s.stats.recorder("m")
    for i in range(5):
        assert reject(s, schema=f"good{i}@1")
    poison(s)
    rec.record_request("inv@1", 3, 3, 0, "stop", 5.0)
    s.append_history("m", "inv@1", '{"a":1}', NOW)
    await s.flush()  # no error: the refused row is set apart
    backlog = s.backlog()
    assert backlog.quarantined == {"counters": 0, "history": 0, "samples": 1, "traffic": 0, "policy_changes": 0}
    assert sum(backlog.unwritten.values()) == 0
    (refused,) = s.quarantine.rows()
    assert refused.kind == "samples" and refused.row.target_token == TOO_BIG and refused.reason
    assert "refused a samples row" in caplog.text and "integer" in caplog.text.lower()
    assert (await s.read_counters(since=NOW - 60))[key("m", "inv@1", Series.REQUESTS)] == 1
    rec.record_request("inv@1", 3, 3, 0, "stop", 5.0)  # the next flush is not held back either
    await s.flush()
    await s.close()

    s2 = await backend.open()
    assert sorted(r.schema_key for r in await s2.read_rejected_drafts(limit=100)) == [f"good{i}@1" for i in range(5)]
    assert (await s2.read_counters(since=NOW - 60))[key("m", "inv@1", Series.REQUESTS)] == 2
    assert await s2.load_history("m", 8, 8) == [("inv@1", '{"a":1}')]
    await s2.close()


async def test_a_store_that_cannot_be_written_quarantines_nothing(backend) -> None:
    s = await backend.open()
    reject(s)
    s.stats.recorder("m").record_request("inv@1", 3, 3, 0, "stop", 5.0)
    await backend.execute("db", "DROP TABLE rejected_drafts")  # every write of samples fails alike
    with pytest.raises(StoreError):
        await s.flush()
    assert s.backlog().unwritten["samples"] == 1 and s.backlog().quarantined["samples"] == 0


def test_the_quarantine_is_bounded_and_counts_what_it_no_longer_keeps() -> None:
    from structspec.store.quarantine import Quarantine, halves

    q = Quarantine(limit=2)
    for i in range(5):
        q.add("history", i, ValueError(f"bad {i}"))
    assert [r.row for r in q.rows()] == [3, 4] and q.dropped == 3 and q.counts() == {"history": 5}
    assert q.rows()[-1].reason == "ValueError: bad 4"
    assert halves([1, 2, 3]) == ([1], [2, 3]) and halves({"a": 1, "b": 2}) == ({"a": 1}, {"b": 2})
