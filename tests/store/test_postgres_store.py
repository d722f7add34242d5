"""What only the PostgreSQL store has: replicas starting together (the schema created and migrated under the advisory
lock), registrations racing across stores, a flush that lands exactly once when its acknowledgement is lost, the
database stopped and started again under a store (bounded buffers, drops counted), and calls from another event
loop. The Store protocol itself runs on both backends in ``test_store.py``. Every test takes the ``postgres`` cluster
(skipped with a reason where PostgreSQL is not installed, a failure in CI)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from structspec.stats.book import StatsBook
from structspec.stats.counters import Series
from structspec.store import StoreError, StoreUnavailable
from structspec.store import postgres_schema
from structspec.store.postgres import PostgresStore
from tests.store.test_store import NOW, Clock, key


async def store(url: str, **kwargs) -> PostgresStore:
    s = PostgresStore(url, StatsBook(clock=Clock(), **kwargs.pop("book", {})), **kwargs)
    await s.open()
    return s


async def scalar(url: str, sql: str, *args):
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute(sql, args)).fetchone()
    return None if row is None else row[0]


async def test_replicas_starting_together_create_the_schema_once(postgres) -> None:
    url = postgres.new_database()
    stores = await asyncio.gather(*(store(url, pool_size=1) for _ in range(6)))  # six replicas at once, fresh database
    assert await scalar(url, "SELECT value FROM meta WHERE key = 'schema_version'") == str(postgres_schema.SCHEMA_VERSION)
    assert await scalar(url, "SELECT COUNT(*) FROM pg_tables WHERE tablename = 'counters'") == 1
    await asyncio.gather(*(s.close() for s in stores))


async def test_a_migration_runs_once_when_replicas_start_together(postgres, monkeypatch) -> None:
    url = postgres.new_database()
    await (await store(url)).close()  # a database of the current version
    v = postgres_schema.SCHEMA_VERSION
    # a next version: a column added (a second ALTER would fail: only the lock and the version check prevent it)
    monkeypatch.setattr(postgres_schema, "SCHEMA_VERSION", v + 1)
    monkeypatch.setattr(postgres_schema, "MIGRATIONS",
                        {**postgres_schema.MIGRATIONS, v: ("ALTER TABLE counters ADD COLUMN note TEXT",)})
    stores = await asyncio.gather(*(store(url, pool_size=1) for _ in range(5)))
    assert await scalar(url, "SELECT value FROM meta WHERE key = 'schema_version'") == str(v + 1)
    assert await scalar(url, "SELECT COUNT(*) FROM information_schema.columns WHERE table_name = 'counters' AND "
                             "column_name = 'note'") == 1
    await asyncio.gather(*(s.close() for s in stores))
    monkeypatch.setattr(postgres_schema, "SCHEMA_VERSION", v + 2)  # no step from v + 1: refused, nothing changed
    with pytest.raises(StoreError, match="cannot migrate"):
        await store(url)
    assert await scalar(url, "SELECT value FROM meta WHERE key = 'schema_version'") == str(v + 1)


async def test_a_newer_store_is_refused_and_leaves_the_store_closed(postgres) -> None:
    url = postgres.new_database()
    await (await store(url)).close()
    await scalar(url, "UPDATE meta SET value = '99' WHERE key = 'schema_version' RETURNING value")
    s = PostgresStore(url)
    for _ in range(2):  # a second open tries again rather than passing for open
        with pytest.raises(StoreError, match="newer structspec"):
            await s.open()
    with pytest.raises(StoreError, match="not open"):
        await s.get_schema("x")


async def test_an_unreachable_database_at_open_is_unavailable(postgres, tmp_path) -> None:
    s = PostgresStore(f"postgresql://nobody@/x?host={tmp_path}", timeout=1.0)  # no server on that socket
    with pytest.raises(StoreUnavailable, match="unreachable"):
        await s.open()


async def test_two_replicas_registering_one_id_at_once(postgres) -> None:
    url = postgres.new_database()
    a, b = await store(url), await store(url)
    distinct = await asyncio.gather(*(s.put_schema("race", f'{{"i":{i}}}', f"h{i}", "", "api", 1.0)
                                      for i, s in enumerate([a, b] * 10)))
    assert sorted(r.version for r, created in distinct if created) == list(range(1, 21))  # distinct, none lost
    assert [r.version for r in await b.list_schemas("race", all_versions=True)] == list(range(1, 21))
    same = await asyncio.gather(*(s.put_schema("same", "{}", "h", "", "api", 1.0) for s in [a, b] * 5))
    assert {r.version for r, _ in same} == {1} and sum(created for _, created in same) == 1
    await a.close()
    await b.close()


async def test_a_flush_whose_acknowledgement_was_lost_lands_once(postgres, monkeypatch) -> None:
    url = postgres.new_database()
    s = await store(url)
    s.stats.recorder("m").record_verification("k", "ngram", 1, drafted=7, accepted=5, probe=False)
    s.append_history("m", "k", '{"a":1}', NOW)
    drafted = key("m", "k", Series.DRAFTED, proposer="ngram", bucket=1)
    real_write = PostgresStore._write

    async def committed_then_lost(self, batch):
        await real_write(self, batch)  # the transaction commits...
        raise StoreUnavailable("connection lost before the commit was acknowledged")  # ...its answer does not arrive

    monkeypatch.setattr(PostgresStore, "_write", committed_then_lost)
    with pytest.raises(StoreUnavailable):
        await s.flush()
    monkeypatch.setattr(PostgresStore, "_write", real_write)
    assert s._retry  # kept for the retry
    assert (await s.read_counters(since=NOW - 60))[drafted] == 7  # the mark says it landed: not counted twice
    s.stats.recorder("m").record_verification("k", "ngram", 1, drafted=1, accepted=1, probe=False)
    await s.flush()
    await s.close()
    assert await scalar(url, "SELECT value FROM counters WHERE series = 'drafted'") == 8
    assert await scalar(url, "SELECT COUNT(*) FROM history") == 1


async def test_a_failed_flush_is_retried_with_its_own_number(postgres, monkeypatch) -> None:
    url = postgres.new_database()
    s = await store(url)
    s.stats.recorder("m").record_request("k", 10, 10, 0, "stop", 5.0)

    async def refused(self, batch):
        raise StoreUnavailable("down")

    real_write = PostgresStore._write
    monkeypatch.setattr(PostgresStore, "_write", refused)
    for _ in range(3):
        with pytest.raises(StoreUnavailable):
            await s.flush()
    monkeypatch.setattr(PostgresStore, "_write", real_write)
    s.stats.recorder("m").record_request("k", 5, 5, 0, "stop", 5.0)  # recorded during the outage: the next batch
    await s.flush()  # the kept batch, then the new one
    assert await scalar(url, "SELECT batch FROM flush_marks WHERE replica = %s", s.replica) == 2
    assert (await s.read_counters(since=NOW - 60))[key("m", "k", Series.REQUESTS)] == 2
    assert not s.stats.unflushed() and not s._retry
    await s.close()


async def test_the_database_stopped_and_started_under_a_store(postgres) -> None:
    """Stop PostgreSQL: writes and reads fail fast as unavailable, what is recorded waits within its bounds (drops
    counted), the registry's idle connections are replaced; start it: everything kept lands, exactly."""
    url = postgres.new_database()
    s = await store(url, timeout=1.5, history_limit=2, book={"max_unwritten": 8})
    await s.put_schema("inv", "{}", "h", "", "api", 1.0)
    rec = s.stats.recorder("m")
    rec.record_request("k", 10, 10, 0, "stop", 5.0)  # 8 counter keys: as many as may wait
    await s.flush()
    requests = key("m", "k", Series.REQUESTS)
    try:
        postgres.stop()
        with pytest.raises(StoreUnavailable):
            await s.put_schema("inv", '{"a":1}', "h2", "", "api", 2.0)
        with pytest.raises(StoreUnavailable):
            await s.read_counters(since=NOW - 60)
        rec.record_request("k", 10, 10, 0, "stop", 5.0)  # the same keys: added to what waits, nothing dropped
        rec.record_request("k", 10, 10, 0, "stop", 5.0)
        for i in range(3):
            s.append_history("m", "k", f"out{i}", NOW + i)  # the history buffer keeps 2: out0 is dropped
        with pytest.raises(StoreUnavailable):
            await s.flush()
        rec.record_decision("k", "drafted", {})  # a new key while 8 wait (the kept batch's): dropped, counted
        backlog = s.backlog()
        assert backlog.dropped == {"counters": 1, "history": 1, "samples": 0, "traffic": 0, "policy_changes": 0}, backlog
        assert backlog.unwritten["counters"] == 8 and backlog.unwritten["history"] == 2
    finally:
        postgres.start()
    for _ in range(20):  # the pool reconnects by itself
        try:
            await s.flush()
            break
        except StoreUnavailable:
            await asyncio.sleep(0.5)
    assert (await s.read_counters(since=NOW - 60))[requests] == 3  # the two recorded in the outage landed, once
    assert await scalar(url, "SELECT value FROM counters WHERE series = 'requests'") == 3
    assert key("m", "k", Series.DECISION, label="drafted") not in await s.read_counters(since=NOW - 60)
    assert [t for _, t in await s.load_history("m", 10, 10)] == ["out1", "out2"]
    assert (await s.get_schema("inv")).version == 1  # type: ignore[union-attr]
    await s.close()


async def test_calls_from_another_event_loop_use_their_own_connection(postgres) -> None:
    """The engine loads the history from its loading thread (``asyncio.run`` there), not the server's loop."""
    s = await store(postgres.new_database())
    s.append_history("m", "k", '{"a":1}', NOW)
    await s.flush()
    got: list = []
    thread = threading.Thread(target=lambda: got.append(asyncio.run(s.load_history("m", 8, 8))))
    thread.start()
    thread.join(30)
    assert got == [[("k", '{"a":1}')]]
    await s.close()


@pytest.mark.parametrize("when", ["before the commit", "after the commit"])
async def test_a_flush_cancelled_mid_write_counts_once(postgres, monkeypatch, when: str) -> None:
    """The server's stop cancels the flusher wherever it is; the final flush (close) writes the kept batch, or sees
    by the mark that it had landed."""
    url = postgres.new_database()
    s = await store(url)
    s.stats.recorder("m").record_request("k@1", 10, 5, 0, "stop", 1.0)
    real_write = PostgresStore._write

    async def slow_write(self, batch):
        if when == "before the commit":
            await asyncio.sleep(5)
        await real_write(self, batch)
        await asyncio.sleep(5)

    monkeypatch.setattr(PostgresStore, "_write", slow_write)
    flushing = asyncio.create_task(s.flush())
    await asyncio.sleep(0.3)
    flushing.cancel()
    await asyncio.gather(flushing, return_exceptions=True)
    monkeypatch.setattr(PostgresStore, "_write", real_write)
    await s.close()
    assert await scalar(url, "SELECT value FROM counters WHERE series = 'requests'") == 1


def test_structspec_stats_reads_a_postgres_store(postgres) -> None:
    """`structspec stats --store-url postgresql://...`: what schema owners read, from the shared database."""
    import json

    from typer.testing import CliRunner

    from structspec.cli import app

    url = postgres.new_database()

    async def record() -> None:
        s = PostgresStore(url)  # the real clock: the CLI reads the last day
        await s.open()
        await s.put_schema("inv", "{}", "h", "", "api", 1.0)
        s.stats.recorder("m").record_request("inv@1", 30, 12, 4, "stop", 250.0)
        await s.close()

    asyncio.run(record())
    result = CliRunner().invoke(app, ["stats", "inv", "--store-url", url, "--model", "m", "--json"])
    assert result.exit_code == 0, result.output
    (stats,) = json.loads(result.output)
    assert stats["schema_key"] == "inv@1" and next(iter(stats["windows"].values()))["requests"] == 1
    missing = CliRunner().invoke(app, ["stats", "nope", "--store-url", url.replace("postgres@", "postgres:pw@")])
    assert missing.exit_code != 0 and "pw" not in missing.output and "***" in missing.output
