"""The SQLite store against the ``Store`` protocol."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from structspec.store import Store, batch_bucket, open_store, stats_bucket
from structspec.store.sqlite import SQLiteStore


async def opened(path: Path | str) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    return store


async def test_protocol_and_urls(tmp_path: Path) -> None:
    assert isinstance(SQLiteStore(":memory:"), Store)
    assert open_store("", tmp_path).path == str(tmp_path / "structspec.db")  # type: ignore[attr-defined]
    assert open_store("sqlite:///abs/x.db").path == "/abs/x.db"  # type: ignore[attr-defined]
    assert open_store("sqlite:rel/x.db").path == "rel/x.db"  # type: ignore[attr-defined]
    assert open_store("sqlite://:memory:").path == ":memory:"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="PostgreSQL"):
        open_store("postgresql://db/structspec")
    with pytest.raises(ValueError, match="scheme"):
        open_store("mysql://x")


async def test_versions_are_content_addressed_and_never_reused(tmp_path: Path) -> None:
    s = await opened(tmp_path / "db.sqlite")
    a, created = await s.put_schema("inv", '{"a":1}', "h1", "first", "api", 100.0)
    assert (a.version, created) == (1, True)
    again, created = await s.put_schema("inv", '{"a":1}', "h1", "ignored", "api", 200.0)
    assert (again, created) == (a, False)
    b, _ = await s.put_schema("inv", '{"a":2}', "h2", "", "api", 300.0)
    assert b.version == 2 and (await s.get_schema("inv")) == b and (await s.get_schema("inv", 1)) == a
    assert await s.get_schema("inv", 7) is None and await s.get_schema("other") is None
    await s.put_schema("aaa", "{}", "h0", "", "builtin", 1.0)
    assert [(r.schema_id, r.version) for r in await s.list_schemas()] == [("aaa", 1), ("inv", 2)]
    assert [r.version for r in await s.list_schemas("inv", all_versions=True)] == [1, 2]
    assert await s.delete_schema("inv", 2) == [2]
    assert (await s.get_schema("inv")).version == 1  # type: ignore[union-attr]
    c, _ = await s.put_schema("inv", '{"a":2}', "h2", "", "api", 400.0)
    assert c.version == 3
    assert await s.delete_schema("inv") == [1, 3] and await s.delete_schema("inv") == []
    await s.close()


async def test_persistence_across_reopen(tmp_path: Path) -> None:
    s = await opened(tmp_path / "db.sqlite")
    await s.put_schema("x", "{}", "h", "d", "api", 5.5)
    s.record_acceptance("x@1", "draft", 2, 10, 6, time.time())
    await s.close()  # flushes buffered statistics
    s2 = await opened(tmp_path / "db.sqlite")
    rec = await s2.get_schema("x")
    assert rec is not None and rec.created_at == 5.5 and rec.description == "d"
    totals = await s2.acceptance_totals(since=time.time() - 60)
    assert [(t.schema_key, t.drafted, t.accepted, t.events) for t in totals] == [("x@1", 10, 6, 1)]
    await s2.close()


async def test_concurrent_registrations_get_distinct_versions(tmp_path: Path) -> None:
    s = await opened(tmp_path / "db.sqlite")
    recs = await asyncio.gather(*(s.put_schema("c", f'{{"i":{i}}}', f"h{i}", "", "api", 1.0) for i in range(10)))
    assert sorted(r.version for r, _ in recs) == list(range(1, 11))
    await s.close()


async def test_acceptance_windows_buffer_and_prune() -> None:
    s = await opened(":memory:")
    now = 1_000_000.0
    s.record_acceptance("k", "draft", 1, 5, 4, now - 10)
    s.record_acceptance("k", "draft", 1, 5, 1, now - 5)
    s.record_acceptance("k", "ngram", 8, 3, 3, now - 4000)
    s.record_acceptance("j", "draft", 2, 2, 0, now)
    buffered = await s.acceptance_totals(since=now - 300, schema_key="k")  # visible before a flush
    assert [(t.proposer, t.drafted, t.accepted, t.events) for t in buffered] == [("draft", 10, 5, 2)]
    assert buffered[0].acceptance_rate == pytest.approx(0.5)
    await s.flush()
    s.record_acceptance("k", "draft", 1, 10, 10, now - 1)  # buffered + stored add up
    t = await s.acceptance_totals(since=now - 300, schema_key="k")
    assert (t[0].drafted, t[0].accepted, t[0].events) == (20, 15, 3)
    assert {x.schema_key for x in await s.acceptance_totals(since=now - 86400)} == {"j", "k"}
    assert len(await s.acceptance_totals(since=now - 86400, schema_key="k")) == 2
    assert await s.acceptance_totals(since=now - 86400, until=now - 3000, schema_key="k") == [
        x for x in await s.acceptance_totals(since=now - 86400, schema_key="k") if x.proposer == "ngram"
    ]
    await s.flush()
    assert await s.prune_acceptance(now - 3600) == 1
    assert {x.proposer for x in await s.acceptance_totals(since=0, schema_key="k")} == {"draft"}
    await s.close()


async def test_counts_stay_visible_while_a_flush_is_writing_them() -> None:
    """A flush takes the buffered rows before its write gets the lock; a read in between must still count
    them (before: they were in neither the buffer nor the table), and after the write exactly once."""
    s = await opened(":memory:")
    now = 1_000_000.0
    s.record_acceptance("k", "draft", 1, 5, 4, now)

    async def totals() -> tuple[int, int, int]:
        (t,) = await s.acceptance_totals(since=now - 300, schema_key="k")
        return t.drafted, t.accepted, t.events

    with s._lock:  # the write waits for the connection, as it would behind a slow read
        flushing = asyncio.create_task(s.flush())
        await asyncio.sleep(0.05)  # the flush has taken the rows and is waiting on the lock
        assert not s._buffer._rows
        # what a read adds to the table's rows: the in-flight counts are still there
        assert list(s._buffer.snapshot().values()) == [(5, 4, 1)]
    assert await totals() == (5, 4, 1)  # whichever gets the lock first, the read or the write
    await flushing
    assert await totals() == (5, 4, 1)  # in the table, counted once
    s.record_acceptance("k", "draft", 1, 1, 1, now)
    assert await totals() == (6, 5, 2)
    await s.close()


def test_buckets() -> None:
    assert [batch_bucket(n) for n in (0, 1, 2, 3, 4, 5, 9, 16)] == [1, 1, 2, 4, 4, 8, 16, 16]
    assert stats_bucket(119.9) == 60
