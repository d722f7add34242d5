"""The store's traffic samples (completed requests' prompt and output ids): persisted, bounded per (model, schema),
pruned with their hour, read with the unwritten ones, kept through a failed write (on SQLite and PostgreSQL:
``backend``); the sampler's reservoir and what the recorder offers it; both stores' migration from version 3."""

from __future__ import annotations

import random

import pytest

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, hour_of
from structspec.stats.traffic import KEEP_PER_KEY, TrafficSampler
from structspec.store import Store, StoreError
from structspec.store.sqlite import SQLiteStore
from tests.store.test_store import NOW, Clock


def finish(store: Store, schema: str = "inv@1", model: str = "m", output: tuple[int, ...] = (7, 8, 9),
           reason: str = "stop") -> bool:
    return store.stats.recorder(model).record_traffic(schema, list(range(40)), list(output), reason)


def test_only_finished_outputs_are_offered_and_the_reservoir_is_uniform_per_hour() -> None:
    book = StatsBook(clock=lambda: 3 * HOUR + 5.0, traffic_per_hour=2)
    rec = book.recorder("m")
    assert not rec.record_traffic("s", [1], [2], "cancelled") and not rec.record_traffic("s", [1], [2], "error")
    assert not rec.record_traffic("s", [1], [], "stop")  # nothing decoded
    assert rec.record_traffic("s", [1, 2], [3, 4], "length")
    (t,) = book.traffic.pending()
    assert (t.model, t.schema_key, t.hour, t.slot, t.created_at, t.finish) == ("m", "s", 3 * HOUR, 0, 3 * HOUR + 5.0,
                                                                               "length")
    assert t.ids == (1, 2, 3, 4) and t.output_tokens == (3, 4)
    assert not StatsBook(traffic_per_hour=0).recorder("m").record_traffic("s", [1], [2], "stop")  # off
    kept = [0] * 10
    for trial in range(2000):
        sampler = TrafficSampler(per_hour=2, rng=random.Random(trial))
        slots = {}
        for i in range(10):
            slot = sampler.slot("m", "s", 0)
            if slot is not None:
                slots[slot] = i
        for i in slots.values():
            kept[i] += 1
    assert all(300 < k < 500 for k in kept), kept  # each request of the hour kept with odds 2 in 10 (400 of 2000)


async def test_traffic_survives_a_restart_and_unwritten_samples_are_read_too(backend) -> None:
    s = await backend.open()
    assert finish(s) and finish(s, schema="other@1") and finish(s, model="m2")
    (first,) = await s.read_traffic_samples("m", "inv@1")  # not flushed yet: read from memory
    await s.flush()
    assert await s.read_traffic_samples("m", "inv@1") == [first]
    assert finish(s, output=(1, 2), reason="length")  # the next slot of the same hour
    assert s.backlog().unwritten["traffic"] == 1
    await s.close()
    s2 = await backend.open()
    got = await s2.read_traffic_samples("m", "inv@1")
    assert [(t.slot, t.output_tokens, t.finish) for t in sorted(got, key=lambda t: t.slot)] == [
        (0, (7, 8, 9), "stop"), (1, (1, 2), "length")]
    assert got[0].prompt_tokens == tuple(range(40)) and got[0].hour == hour_of(NOW)
    assert len(await s2.read_traffic_samples()) == 4 and len(await s2.read_traffic_samples(limit=2)) == 2
    assert [t.model for t in await s2.read_traffic_samples(model="m2")] == ["m2"]
    await s2.close()


async def test_two_writers_never_overwrite_each_others_slots(backend) -> None:
    a, b = await backend.open(traffic_per_hour=1), await backend.open(traffic_per_hour=1)
    assert finish(a, output=(1,)) and finish(b, output=(2,))  # slot 0 of the same hour, each
    await a.flush()
    await b.flush()
    got = await a.read_traffic_samples("m", "inv@1")
    assert sorted(t.output_tokens for t in got) == [(1,), (2,)]
    assert {t.writer for t in got} == {a.stats.traffic.writer, b.stats.traffic.writer}
    await a.close()
    await b.close()


async def test_traffic_is_bounded_per_schema_and_pruned_with_its_hour(backend) -> None:
    clock = Clock(NOW - 700 * HOUR)
    s = await backend.open(clock=clock, traffic_per_hour=1)
    for i in range(KEEP_PER_KEY + 40):  # one sample an hour, more hours than are kept
        clock.t += HOUR
        assert finish(s, output=(i,))
        if i % 100 == 99:
            await s.flush()
    await s.flush()
    rows = await s.read_traffic_samples("m", "inv@1", limit=10_000)
    assert len(rows) == KEEP_PER_KEY and min(r.hour for r in rows) == hour_of(clock.t) - (KEEP_PER_KEY - 1) * HOUR
    assert rows[0].output_tokens == (KEEP_PER_KEY + 39,)  # newest first
    assert finish(s, schema="other@1")  # another key is bounded on its own
    await s.flush()
    removed = await s.prune(clock.t - 10 * HOUR)  # the retention: rows of hours before the cutoff's hour go
    assert removed == KEEP_PER_KEY - 11 and len(await s.read_traffic_samples("m", "inv@1", limit=10_000)) == 11
    assert len(await s.read_traffic_samples("m", "other@1")) == 1
    await s.close()


async def test_a_failed_write_keeps_traffic_for_the_next_flush(backend) -> None:
    s = await backend.open()
    assert finish(s)
    await backend.execute("db", "DROP TABLE traffic_samples")
    with pytest.raises(StoreError):
        await s.flush()
    assert s.backlog().unwritten["traffic"] == 1  # still waiting, counted


async def test_sqlite_migration_from_version_3(tmp_path) -> None:
    path = tmp_path / "v3.db"
    s = SQLiteStore(path, StatsBook(clock=Clock()))
    await s.open()
    assert finish(s)
    await s.close()
    import sqlite3

    with sqlite3.connect(path) as conn:  # as version 3 left it: no traffic table
        conn.execute("DROP TABLE traffic_samples")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    s2 = SQLiteStore(path, StatsBook(clock=Clock()))
    await s2.open()
    assert s2._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("5",)  # type: ignore[union-attr]
    assert await s2.read_traffic_samples() == []
    assert finish(s2)
    await s2.close()
    s3 = SQLiteStore(path, StatsBook(clock=Clock()))
    await s3.open()
    assert len(await s3.read_traffic_samples()) == 1
    await s3.close()


async def test_postgres_migration_from_version_3(postgres) -> None:
    from structspec.store.postgres import PostgresStore

    url = postgres.new_database()
    s = PostgresStore(url, StatsBook(clock=Clock()))
    await s.open()
    await s.close()
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:  # as version 3 left it
        await conn.execute("DROP TABLE traffic_samples")
        await conn.execute("ALTER TABLE rejected_drafts DROP COLUMN writer")  # its primary key went with it
        await conn.execute("ALTER TABLE rejected_drafts ADD PRIMARY KEY (model, schema_key, proposer, hour, slot)")
        await conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    s2 = PostgresStore(url, StatsBook(clock=Clock()))
    await s2.open()
    assert finish(s2)
    await s2.close()
    s3 = PostgresStore(url, StatsBook(clock=Clock()))
    await s3.open()
    assert [t.output_tokens for t in await s3.read_traffic_samples()] == [(7, 8, 9)]
    await s3.close()
