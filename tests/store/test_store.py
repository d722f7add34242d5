"""The stores against the ``Store`` protocol: the registry, the statistics' counters, the schema history.

Tests taking ``backend`` run on SQLite and on PostgreSQL (``conftest.py``); the SQLite file's own concerns (its URLs,
its migrations from versions 1 and 2, its connection lock) are tested on SQLite only, PostgreSQL's in
``test_postgres_store.py``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, CounterKey, Series, hour_of
from structspec.store import Store, StoreError, open_store
from structspec.store.sqlite import UNKNOWN_MODEL, SQLiteStore

NOW = 1_000_000 * 3600.0 + 1800.0  # half past some hour


class Clock:
    def __init__(self, t: float = NOW):
        self.t = t

    def __call__(self) -> float:
        return self.t


async def opened(path: Path | str, clock: Clock | None = None) -> SQLiteStore:
    store = SQLiteStore(path, StatsBook(clock=clock or Clock()))
    await store.open()
    return store


def key(model: str, schema: str, series: str, hour: float = NOW, proposer: str = "", bucket: int = 0,
        label: str = "") -> CounterKey:
    return CounterKey(model, schema, hour_of(hour), series, proposer, bucket, label)


async def test_protocol_and_urls(tmp_path: Path) -> None:
    from structspec.store.postgres import PostgresStore

    assert isinstance(SQLiteStore(":memory:"), Store) and isinstance(PostgresStore("postgresql:///x"), Store)
    assert open_store("", tmp_path).path == str(tmp_path / "structspec.db")  # type: ignore[attr-defined]
    assert open_store("sqlite:///abs/x.db").path == "/abs/x.db"  # type: ignore[attr-defined]
    assert open_store("sqlite:rel/x.db").path == "rel/x.db"  # type: ignore[attr-defined]
    assert open_store("sqlite://:memory:").path == ":memory:"  # type: ignore[attr-defined]
    book = StatsBook()
    assert open_store("sqlite://:memory:", stats=book).stats is book
    pg = open_store("postgresql://u:secret@db/structspec", pool_size=2, timeout=1.5)
    assert isinstance(pg, PostgresStore) and (pg.pool_size, pg.timeout) == (2, 1.5) and "secret" not in pg.where
    assert isinstance(open_store("postgres://db/structspec"), PostgresStore)
    with pytest.raises(ValueError, match="scheme"):
        open_store("mysql://x")


# -- registry ------------------------------------------------------------------------------------


async def test_versions_are_content_addressed_and_never_reused(backend) -> None:
    s = await backend.open()
    a, created = await s.put_schema("inv", '{"a":1}', "h1", "first", "api", 100.0)
    assert (a.version, created, a.speculation) == (1, True, "auto")
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


async def test_concurrent_registrations_get_distinct_versions(backend) -> None:
    s = await backend.open()
    recs = await asyncio.gather(*(s.put_schema("c", f'{{"i":{i}}}', f"h{i}", "", "api", 1.0) for i in range(10)))
    assert sorted(r.version for r, _ in recs) == list(range(1, 11))
    await s.close()


async def test_set_schema_speculation(backend) -> None:
    s = await backend.open()
    v1, _ = await s.put_schema("inv", '{"a":1}', "h1", "", "api", 1.0)
    v2, _ = await s.put_schema("inv", '{"a":2}', "h2", "", "api", 2.0)
    off = await s.set_schema_speculation("inv", 1, "off")
    assert off == SchemaRecord_with(v1, "off")
    assert (await s.get_schema("inv", 1)).speculation == "off"  # type: ignore[union-attr]
    assert (await s.get_schema("inv", 2)).speculation == "auto"  # type: ignore[union-attr]  # one version only
    assert [r.speculation for r in await s.list_schemas("inv", all_versions=True)] == ["off", "auto"]
    again, created = await s.put_schema("inv", '{"a":1}', "h1", "", "api", 3.0)  # same content: the same record
    assert (again.speculation, created) == ("off", False)
    assert await s.set_schema_speculation("inv", 9, "on") is None
    assert await s.set_schema_speculation("nope", 1, "on") is None
    with pytest.raises(ValueError, match="speculation mode"):
        await s.set_schema_speculation("inv", 2, "sometimes")
    assert (await s.set_schema_speculation("inv", 2, "on")) == SchemaRecord_with(v2, "on")
    await s.close()
    s2 = await backend.open()  # the override is stored, not cached
    assert [r.speculation for r in await s2.list_schemas("inv", all_versions=True)] == ["off", "on"]
    await s2.close()


def SchemaRecord_with(rec, mode: str):  # noqa: N802 - reads like the constructor it stands for
    from dataclasses import replace

    return replace(rec, speculation=mode)


# -- counters ------------------------------------------------------------------------------------


async def test_counters_windows_filters_and_prune(backend) -> None:
    clock = Clock()
    s = await backend.open(clock=clock)
    rec = s.stats.recorder("m1")
    rec.record_verification("k", "ngram", 3, drafted=4, accepted=2, probe=False)
    rec.record_verification("k", "ngram", 3, drafted=4, accepted=4, probe=True)
    clock.t = NOW - 2 * HOUR  # two hours ago
    rec.record_verification("k", "ngram", 3, drafted=5, accepted=0, probe=False)
    rec.record_verification("j", "draft_model", 1, drafted=2, accepted=1, probe=False)
    clock.t = NOW

    now_keys = await s.read_counters(since=NOW - 60)  # visible before a flush
    assert now_keys[key("m1", "k", Series.VERIFICATIONS, proposer="ngram", bucket=4)] == 2
    assert now_keys[key("m1", "k", Series.DRAFTED, proposer="ngram", bucket=4)] == 8
    assert now_keys[key("m1", "k", Series.ACCEPTED, proposer="ngram", bucket=4)] == 6
    assert now_keys[key("m1", "k", Series.PROBE_VERIFICATIONS, proposer="ngram", bucket=4)] == 1
    # position 3 was examined by both drafts (2 accepted, then the third rejected; 4 of 4 accepted)
    assert now_keys[key("m1", "k", Series.REACHED, proposer="ngram", bucket=4, label="3")] == 2
    assert now_keys[key("m1", "k", Series.ACCEPTED_AT, proposer="ngram", bucket=4, label="3")] == 1
    assert {k.schema_key for k in now_keys} == {"k"}  # the hour two hours back is outside the window

    await s.flush()
    rec.record_verification("k", "ngram", 3, drafted=1, accepted=1, probe=False)  # unflushed + stored add up
    drafted = key("m1", "k", Series.DRAFTED, proposer="ngram", bucket=4)
    assert (await s.read_counters(since=NOW - 60))[drafted] == 9
    day = await s.read_counters(since=NOW - 86400)
    assert {k.schema_key for k in day} == {"j", "k"}
    assert {k.hour for k in day if k.schema_key == "k"} == {hour_of(NOW), hour_of(NOW - 2 * HOUR)}
    only_k = await s.read_counters(since=NOW - 86400, schema_key="k")
    assert {k.schema_key for k in only_k} == {"k"}
    old = await s.read_counters(since=NOW - 86400, until=hour_of(NOW), schema_key="k")  # [since, until): the old hour only
    assert {k.hour for k in old} == {hour_of(NOW - 2 * HOUR)} and old[key("m1", "k", Series.DRAFTED, NOW - 2 * HOUR, "ngram", 4)] == 5
    # a window reaching into an hour counts all of that hour (hourly resolution)
    assert (await s.read_counters(since=hour_of(NOW) - 1))[drafted] == 9

    await s.flush()
    removed = await s.prune(NOW - HOUR)  # the hours ending before an hour ago: the old one
    assert removed == len([k for k in day if k.hour == hour_of(NOW - 2 * HOUR)])
    assert {k.hour for k in await s.read_counters(since=0)} == {hour_of(NOW)}
    await s.close()


async def test_models_never_mix(backend) -> None:
    s = await backend.open()
    gemma, demo = s.stats.recorder("gemma-3-270m"), s.stats.recorder("demo")
    gemma.record_request("invoice@1", 40, 30, 10, "stop", 900.0)
    gemma.record_decision("invoice@1", "drafted", {"ngram": "drafted"})
    demo.record_request("invoice@1", 12, 12, 0, "length", 90.0)
    await s.flush()
    demo.record_request("invoice@1", 8, 8, 0, "stop", 80.0)  # unflushed
    demo.record_decision("invoice@1", "cold", {"ngram": "cold"})
    both = await s.read_counters(since=NOW - 60, schema_key="invoice@1")
    assert {k.model for k in both} == {"gemma-3-270m", "demo"}
    of_gemma = await s.read_counters(since=NOW - 60, model="gemma-3-270m")
    of_demo = await s.read_counters(since=NOW - 60, model="demo")
    assert {k.model for k in of_gemma} == {"gemma-3-270m"} and {k.model for k in of_demo} == {"demo"}
    assert of_gemma[key("gemma-3-270m", "invoice@1", Series.OUTPUT_TOKENS)] == 40
    assert of_gemma[key("gemma-3-270m", "invoice@1", Series.DECISION, proposer="ngram", label="drafted")] == 1
    assert of_demo[key("demo", "invoice@1", Series.OUTPUT_TOKENS)] == 20
    assert of_demo[key("demo", "invoice@1", Series.REQUESTS)] == 2
    assert of_demo[key("demo", "invoice@1", Series.FINISH, label="length")] == 1
    assert of_demo[key("demo", "invoice@1", Series.DECISION, label="cold")] == 1
    assert key("demo", "invoice@1", Series.DECISION, label="drafted") not in of_demo
    assert await s.read_counters(since=NOW - 60, model="other") == {}
    await s.close()


async def test_counters_persist_across_reopen(backend) -> None:
    s = await backend.open()
    await s.put_schema("x", "{}", "h", "d", "api", 5.5)
    s.stats.recorder("m").record_verification("x@1", "draft_model", 2, drafted=10, accepted=6, probe=False)
    await s.close()  # flushes what was recorded
    s2 = await backend.open()
    rec = await s2.get_schema("x")
    assert rec is not None and rec.created_at == 5.5 and rec.description == "d"
    counters = await s2.read_counters(since=NOW - 60)
    assert counters[key("m", "x@1", Series.DRAFTED, proposer="draft_model", bucket=2)] == 10
    assert counters[key("m", "x@1", Series.ACCEPTED, proposer="draft_model", bucket=2)] == 6
    assert not s2.stats.rows()  # nothing loaded into the book before a refresh
    await s2.refresh_stats()
    assert s2.stats.rows_for("m", "x@1") == counters
    await s2.close()


async def test_refresh_loads_every_replicas_counters_once(backend) -> None:
    """Two stores on one database (two replicas): after a refresh each book holds both processes' counts,
    its own unflushed ones included, none twice."""
    a = await backend.open()
    b = await backend.open()
    a.stats.recorder("m").record_verification("k", "ngram", 1, drafted=3, accepted=3, probe=False)
    b.stats.recorder("m").record_verification("k", "ngram", 1, drafted=5, accepted=1, probe=False)
    await a.flush()
    await b.refresh_stats()  # b's own counts are not flushed yet
    drafted = key("m", "k", Series.DRAFTED, proposer="ngram", bucket=1)
    assert b.stats.rows_for("m", "k")[drafted] == 8
    await b.flush()
    await b.refresh_stats()
    assert b.stats.rows_for("m", "k")[drafted] == 8
    await a.refresh_stats()
    assert a.stats.rows_for("m", "k")[drafted] == 8
    await a.close()
    await b.close()


async def test_reads_racing_flushes_count_every_row_once(backend) -> None:
    """Records, flushes and reads interleaved: each read sees at least what was recorded before it started and at
    most what was recorded before it ended (never a row twice, never one missing while it is being written)."""
    s = await backend.open()
    rec = s.stats.recorder("m")
    drafted = key("m", "k", Series.DRAFTED, proposer="ngram", bucket=1)
    recorded = 0

    async def writer() -> None:
        nonlocal recorded
        for i in range(40):
            rec.record_verification("k", "ngram", 1, drafted=1, accepted=1, probe=False)
            recorded += 1
            if i % 3 == 0:
                await s.flush()
            await asyncio.sleep(0)

    async def reader() -> list[tuple[int, float, int]]:
        seen = []
        for _ in range(40):
            before = recorded
            value = (await s.read_counters(since=NOW - 60, schema_key="k")).get(drafted, 0.0)
            seen.append((before, value, recorded))
        return seen

    _, seen = await asyncio.gather(writer(), reader())
    assert all(lo <= value <= hi for lo, value, hi in seen), seen
    await s.flush()
    assert (await s.read_counters(since=NOW - 60, schema_key="k"))[drafted] == recorded == 40
    await s.close()


# -- schema history ------------------------------------------------------------------------------


async def test_history_persists_bounded_and_oldest_first(backend) -> None:
    s = await backend.open()
    keep = type(s).HISTORY_KEEP
    s.append_history("m", "b", "b0", NOW)
    for i in range(keep + 5):
        s.append_history("m", "a", f"a{i}", NOW + i)
    s.append_history("other-model", "a", "x0", NOW)
    assert await s.load_history("m", per_key=10, max_keys=10) == []  # buffered until a flush
    await s.flush()
    s.append_history("m", "c", "c0", NOW)  # the most recent key
    await s.close()

    s2 = await backend.open()
    everything = await s2.load_history("m", per_key=keep * 2, max_keys=10)
    assert len([t for k, t in everything if k == "a"]) == keep  # the oldest beyond HISTORY_KEEP were dropped
    assert [t for k, t in everything if k == "a"] == [f"a{i}" for i in range(5, keep + 5)]  # oldest first
    assert [k for k, _ in everything if k != "a"] == ["b", "c"]
    assert await s2.load_history("m", per_key=2, max_keys=10) == [
        ("b", "b0"), ("a", f"a{keep + 3}"), ("a", f"a{keep + 4}"), ("c", "c0")]
    # the keys written most recently: c, then a (its outputs came after b's)
    assert {k for k, _ in await s2.load_history("m", per_key=1, max_keys=2)} == {"c", "a"}
    assert await s2.load_history("other-model", per_key=5, max_keys=5) == [("a", "x0")]
    assert await s2.load_history("nobody", per_key=5, max_keys=5) == []
    await s2.close()


# -- SQLite only -----------------------------------------------------------------------------------


async def test_counts_stay_visible_while_a_flush_is_writing_them() -> None:
    """A flush takes the recorded counters before its write gets the lock; a read in between must still
    count them (they are in neither the pending counters nor the table), and after the write exactly once."""
    s = await opened(":memory:")
    s.stats.recorder("m").record_verification("k", "draft", 1, drafted=5, accepted=4, probe=False)
    drafted = key("m", "k", Series.DRAFTED, proposer="draft", bucket=1)

    async def total() -> float:
        return (await s.read_counters(since=NOW - 300, schema_key="k"))[drafted]

    with s._lock:  # the write waits for the connection, as it would behind a slow read
        flushing = asyncio.create_task(s.flush())
        await asyncio.sleep(0.05)  # the flush has taken the counters and is waiting on the lock
        assert not s.stats._pending
        assert s.stats.unflushed()[drafted] == 5  # what a read adds to the table's rows: still there
    assert await total() == 5  # whichever gets the lock first, the read or the write
    await flushing
    assert not s.stats.unflushed()
    assert await total() == 5  # in the table, counted once
    s.stats.recorder("m").record_verification("k", "draft", 1, drafted=1, accepted=1, probe=False)
    assert await total() == 6
    await s.close()


async def test_a_failed_flush_keeps_the_counters_for_the_next_one() -> None:
    s = await opened(":memory:")
    s.stats.recorder("m").record_request("k", 10, 10, 0, "stop", 5.0)
    conn = s._conn
    s._conn = None  # every statement now fails as on a lost connection
    with pytest.raises(StoreError):
        await s.flush()
    s._conn = conn
    assert (await s.read_counters(since=NOW - 60))[key("m", "k", Series.REQUESTS)] == 1
    await s.flush()
    assert not s.stats.unflushed()
    assert (await s.read_counters(since=NOW - 60))[key("m", "k", Series.REQUESTS)] == 1
    await s.close()


# -- migration -----------------------------------------------------------------------------------

_V1_DDL = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE schema_ids (schema_id TEXT PRIMARY KEY, last_version INTEGER NOT NULL)",
    """CREATE TABLE schema_versions (
        schema_id TEXT NOT NULL, version INTEGER NOT NULL, schema_json TEXT NOT NULL,
        sha256 TEXT NOT NULL, description TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        source TEXT NOT NULL, PRIMARY KEY (schema_id, version))""",
    "CREATE INDEX schema_versions_hash ON schema_versions (schema_id, sha256)",
    """CREATE TABLE acceptance (
        schema_key TEXT NOT NULL, proposer TEXT NOT NULL, batch_bucket INTEGER NOT NULL,
        bucket_start BIGINT NOT NULL, drafted BIGINT NOT NULL, accepted BIGINT NOT NULL,
        events BIGINT NOT NULL, PRIMARY KEY (schema_key, proposer, batch_bucket, bucket_start))""",
    "CREATE INDEX acceptance_time ON acceptance (bucket_start)",
)


def write_version_1(path: Path) -> int:
    """A store file as version 1 wrote it: per-minute acceptance rows, schema versions without an override."""
    hour = hour_of(NOW)
    conn = sqlite3.connect(path)
    for stmt in _V1_DDL:
        conn.execute(stmt)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.execute("INSERT INTO schema_ids VALUES ('inv', 2)")
    conn.executemany("INSERT INTO schema_versions VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [("inv", 1, '{"a":1}', "h1", "first", 10.0, "api"), ("inv", 2, '{"a":2}', "h2", "", 20.0, "builtin")])
    conn.executemany("INSERT INTO acceptance VALUES (?, ?, ?, ?, ?, ?, ?)", [
        ("inv@1", "ngram", 4, hour + 60, 10, 7, 3),  # two minutes of one hour: summed into it
        ("inv@1", "ngram", 4, hour + 3540, 6, 1, 2),
        ("inv@1", "ngram", 4, hour - 3600 + 120, 5, 5, 1),  # the hour before
        ("inv@1", "draft_model", 1, hour + 60, 8, 2, 4),
    ])
    conn.commit()
    conn.close()
    return hour


async def test_migration_from_version_1(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    hour = write_version_1(path)
    s = await opened(path)
    assert s._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("5",)  # type: ignore[union-attr]
    assert s._conn.execute("SELECT name FROM sqlite_master WHERE name = 'acceptance'").fetchone() is None  # type: ignore[union-attr]

    counters = await s.read_counters(since=0)
    assert {k.model for k in counters} == {UNKNOWN_MODEL}
    ngram = {(k.hour, k.series): v for k, v in counters.items() if k.proposer == "ngram"}
    assert ngram == {
        (hour, Series.DRAFTED): 16, (hour, Series.ACCEPTED): 8, (hour, Series.VERIFICATIONS): 5,
        (hour - 3600, Series.DRAFTED): 5, (hour - 3600, Series.ACCEPTED): 5, (hour - 3600, Series.VERIFICATIONS): 1,
    }
    assert all(k.batch_bucket == 4 and k.label == "" and k.schema_key == "inv@1" for k in counters if k.proposer == "ngram")
    assert counters[key(UNKNOWN_MODEL, "inv@1", Series.VERIFICATIONS, proposer="draft_model", bucket=1)] == 4

    # the schemas keep working, with the default override
    assert [(r.version, r.speculation, r.source) for r in await s.list_schemas("inv", all_versions=True)] == [
        (1, "auto", "api"), (2, "auto", "builtin")]
    again, created = await s.put_schema("inv", '{"a":1}', "h1", "", "api", 30.0)
    assert (again.version, created) == (1, False)
    v3, created = await s.put_schema("inv", '{"a":3}', "h3", "", "api", 30.0)
    assert (v3.version, created) == (3, True)
    assert (await s.set_schema_speculation("inv", 1, "off")).speculation == "off"  # type: ignore[union-attr]
    await s.close()

    s2 = await opened(path)  # opening a current file again migrates nothing
    assert await s2.read_counters(since=0) == counters
    assert (await s2.get_schema("inv", 1)).speculation == "off"  # type: ignore[union-attr]
    await s2.close()


async def test_a_newer_store_is_refused_and_leaves_the_store_closed(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    conn.commit()
    conn.close()
    s = SQLiteStore(path)
    for _ in range(2):  # a second open tries again rather than passing for open
        with pytest.raises(StoreError, match="newer structspec"):
            await s.open()
    with pytest.raises(StoreError, match="not open"):
        await s.get_schema("x")


async def test_a_flush_cancelled_mid_write_counts_once(tmp_path):
    """The server's stop cancels the flusher; a write already in its worker thread commits anyway. The rows it
    took must not also be put back (the final flush would write them twice)."""
    import asyncio
    import threading

    from structspec.store.sqlite import SQLiteStore

    path = tmp_path / "s.db"
    store = SQLiteStore(str(path))
    await store.open()
    store.stats.recorder("m").record_request("k@1", 10, 5, 0, "stop", 1.0)
    store._lock.acquire()  # the worker thread waits here, as on a slow disk
    threading.Timer(0.3, store._lock.release).start()
    flushing = asyncio.create_task(store.flush())
    await asyncio.sleep(0.1)
    flushing.cancel()
    await asyncio.gather(flushing, return_exceptions=True)
    await store.close()  # its own final flush
    again = SQLiteStore(str(path))
    await again.open()
    counted = await again.read_counters(since=0)
    await again.close()
    assert sum(v for k, v in counted.items() if k.series == "requests") == 1
