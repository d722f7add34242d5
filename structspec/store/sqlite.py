"""The default ``Store``: one SQLite file in the data directory.

One connection guarded by a lock; blocking calls run in a worker thread so the event loop
never waits on disk. WAL mode lets the engine (or a CLI) open the same file concurrently, and
lets the statistics' long reads (``refresh_stats``, ``read_counters``) run on a second
connection (``_reader``) in a snapshot, so a flush never waits on them.
The tables, statements and row codecs are the PostgreSQL store's (``statements``, ``rows``), so a
row means the same in both. Each kind of statistics is written in a transaction of its own; rows
the file refuses (``quarantine``) hold back neither the other kinds nor the rows behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from structspec.stats.book import Counters, Reload, StatsBook
from structspec.stats.counters import CounterKey, Series, hour_of
from structspec.stats.policy_states import PolicyChange
from structspec.store import rows, statements
from structspec.store.base import BACKLOG_KINDS, SPECULATION_MODES, SchemaRecord, StoreError
from structspec.store.dialect import SQLITE
from structspec.store.sql_store import Batch, SQLStore, _as_is
from structspec.store.statements import CHANGE_COLS, COUNTER_COLS, SCHEMA_VERSION
from structspec.store.text import ENCODED_COLUMNS, MARK

T = TypeVar("T")

_TABLES = statements.tables(SQLITE)
_RESERVOIRS = {table: next(d for d in _TABLES if f"TABLE IF NOT EXISTS {table} " in d)
               for table in ("rejected_drafts", "traffic_samples")}  # their DDL
UNKNOWN_MODEL = "unknown"  # statistics written before they were keyed by model
# each key's latest policy change
_LATEST_CHANGES = (f"SELECT {CHANGE_COLS} FROM policy_changes p WHERE id = (SELECT MAX(id) FROM policy_changes q "
                   "WHERE q.model = p.model AND q.schema_key = p.schema_key AND q.proposer = p.proposer)")


def _migrate_from_1(c: sqlite3.Connection) -> None:
    """Version 1 kept per-minute drafting counts per (schema, proposer, batch bucket), not keyed by model:
    they become hourly counters of model ``unknown``; schema versions get the drafting override."""
    c.execute("ALTER TABLE schema_versions ADD COLUMN speculation TEXT NOT NULL DEFAULT 'auto'")
    if c.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'acceptance'").fetchone():
        for series, column in ((Series.DRAFTED, "drafted"), (Series.ACCEPTED, "accepted"),
                               (Series.VERIFICATIONS, "events")):
            c.execute(
                f"INSERT INTO counters ({COUNTER_COLS}, value) SELECT ?, schema_key, (bucket_start / 3600) * 3600, ?, "
                f"proposer, batch_bucket, '', SUM({column}) FROM acceptance "
                "GROUP BY schema_key, (bucket_start / 3600) * 3600, proposer, batch_bucket",
                (UNKNOWN_MODEL, series),
            )
        c.execute("DROP TABLE acceptance")


# Version 2 -> 3 adds the rejected-draft samples and the policy's changes: new tables (the DDL creates them), no
# row of version 2 changes.
# Version 3 -> 4 adds the traffic samples: a new table, no row of version 3 changes.


def _migrate_to_5(c: sqlite3.Connection) -> None:
    """Version 5 keys each reservoir slot by its writer too (rows written before: writer ''), and stores callers'
    text through ``text.encode``: a stored value that starts with ``MARK`` is encoded now, so it reads back as
    it was."""
    for table, ddl in _RESERVOIRS.items():
        if "writer" not in {r[1] for r in c.execute(f"PRAGMA table_info({table})")}:
            cols = [r[1] for r in c.execute(f"PRAGMA table_info({table})")]
            c.execute(f"ALTER TABLE {table} RENAME TO {table}_v4")
            c.execute(ddl)
            c.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM {table}_v4")
            c.execute(f"DROP TABLE {table}_v4")
    for table, column in ENCODED_COLUMNS:
        c.execute(f"UPDATE {table} SET {column} = char(?) || json_quote({column}) "
                  f"WHERE substr({column}, 1, 1) = char(?)", (ord(MARK), ord(MARK)))


@contextlib.contextmanager
def _transaction(c: sqlite3.Connection) -> Iterator[None]:
    """A write transaction (``BEGIN IMMEDIATE``): committed when the block ends, rolled back when it raises."""
    c.execute("BEGIN IMMEDIATE")
    try:
        yield
        c.execute("COMMIT")
    except BaseException:
        c.execute("ROLLBACK")
        raise


class SQLiteStore(SQLStore):
    """``Store`` on a SQLite file (``":memory:"`` for a throwaway one)."""

    dialect = SQLITE
    # what sqlite3 raises when it refuses a statement's values (not when the file cannot be written)
    refusals = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError)

    def __init__(self, path: str | Path, stats: StatsBook | None = None, history_limit: int = 100_000):
        super().__init__(stats, history_limit)
        self.path = str(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None  # a file's second connection, for the long reads
        self._reader_lock = threading.Lock()

    # -- plumbing ----------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                if self._conn is None:
                    raise StoreError("store is not open")
                try:
                    return fn(self._conn)
                except sqlite3.Error as exc:
                    raise StoreError(f"sqlite: {exc}") from exc

        work = asyncio.ensure_future(asyncio.to_thread(call))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            # A thread cannot be stopped: the call runs on and may commit. Wait for its outcome, so a caller
            # that puts back what it took when a write fails (a flush) does so only when nothing was written.
            while not work.done():
                try:
                    await asyncio.shield(work)
                except asyncio.CancelledError:
                    continue
                except BaseException:  # noqa: BLE001 - its outcome is read below
                    break
            if work.exception() is not None:
                raise
            asyncio.current_task().cancel()  # written: the cancellation lands at the caller's next await
            return work.result()

    async def _fetch(self, sql: str, args: Sequence[Any] = (), row: Callable[[rows.Row], T] = _as_is) -> list[T]:
        return await self._run(lambda c: [row(r) for r in c.execute(sql, args).fetchall()])

    async def open(self) -> None:
        if self._conn is not None:
            return
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._conn = conn

        def migrate(c: sqlite3.Connection) -> None:
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
            with _transaction(c):
                c.execute(statements.META)
                row = c.execute(statements.READ_VERSION).fetchone()
                found = int(row[0]) if row is not None else None
                if found is not None and found > SCHEMA_VERSION:
                    raise StoreError(f"store {self.path} was written by a newer structspec (schema {found})")
                for stmt in _TABLES:
                    c.execute(stmt)
                if found == 1:
                    _migrate_from_1(c)
                if found is not None and found < 5:
                    _migrate_to_5(c)
                c.execute(statements.WRITE_VERSION, (str(SCHEMA_VERSION),))

        try:
            await self._run(migrate)
        except BaseException:
            # a store that failed to open must not look open (the next ``open`` would return at once)
            with self._lock:
                self._conn = None
            conn.close()
            raise
        if self.path != ":memory:":  # a second connection to ":memory:" would be another database
            self._reader = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)

    def _opened(self) -> bool:
        return self._conn is not None

    async def _release(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        with self._reader_lock:
            reader, self._reader = self._reader, None
        for c in (conn, reader):
            if c is not None:
                c.close()

    # -- schema registry -----------------------------------------------------------------------

    async def put_schema(
        self, schema_id: str, schema_json: str, sha256: str, description: str, source: str, now: float
    ) -> tuple[SchemaRecord, bool]:
        def put(c: sqlite3.Connection) -> tuple[SchemaRecord, bool]:
            with _transaction(c):
                row = c.execute(statements.SAME_CONTENT, (schema_id, sha256)).fetchone()
                if row is not None:
                    return rows.schema(row), False
                c.execute("INSERT INTO schema_ids (schema_id, last_version) VALUES (?, 1) ON CONFLICT (schema_id) "
                          "DO UPDATE SET last_version = schema_ids.last_version + 1", (schema_id,))
                (version,) = c.execute("SELECT last_version FROM schema_ids WHERE schema_id = ?",
                                       (schema_id,)).fetchone()
                rec = SchemaRecord(schema_id, int(version), schema_json, sha256, description, now, source)
                c.execute(statements.INSERT_SCHEMA, rows.schema_row(rec))
                return rec, True

        return await self._run(put)

    async def delete_schema(self, schema_id: str, version: int | None = None) -> list[int]:
        def delete(c: sqlite3.Connection) -> list[int]:
            with _transaction(c):
                cond, args = statements.versions(schema_id, version)
                found = c.execute(f"SELECT version FROM schema_versions WHERE {cond} ORDER BY version", args)
                versions = [int(r[0]) for r in found]
                c.execute(f"DELETE FROM schema_versions WHERE {cond}", args)
                return versions

        return await self._run(delete)

    async def set_schema_speculation(self, schema_id: str, version: int, mode: str) -> SchemaRecord | None:
        if mode not in SPECULATION_MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(SPECULATION_MODES)}, got {mode!r}")

        def update(c: sqlite3.Connection) -> SchemaRecord | None:
            c.execute("UPDATE schema_versions SET speculation = ? WHERE schema_id = ? AND version = ?",
                      (mode, schema_id, version))
            row = c.execute(statements.SCHEMA_AT_VERSION, (schema_id, version)).fetchone()
            return rows.schema(row) if row else None

        return await self._run(update)

    # -- statistics ----------------------------------------------------------------------------

    async def flush(self) -> None:
        """Each kind in a transaction of its own: a failed write of one does not hold the others back (the last
        error is raised); what a failed write did not write is put back in its buffer."""
        error: BaseException | None = None
        for kind, buffer in (("history", self._history), ("samples", self.stats.samples),
                             ("traffic", self.stats.traffic), ("policy_changes", self.stats.policy),
                             ("counters", self.stats)):
            taken = buffer.take()
            queue = [Batch(**{kind: taken})] if taken else []
            try:
                await self._write_all(queue)
            except BaseException as exc:  # noqa: BLE001 - raised below
                error = exc
                if kind == "counters":
                    for batch in queue:  # each part is in flight on its own
                        self.stats.restore(batch.counters)
                elif queue:
                    buffer.restore([r for batch in queue for r in getattr(batch, kind)])  # one call: in order
        if error is not None:
            raise error

    async def _write(self, batch: Batch) -> None:
        def write(c: sqlite3.Connection) -> None:
            with _transaction(c):
                for kind in BACKLOG_KINDS:
                    if getattr(batch, kind):
                        for sql, args in statements.writes(SQLITE, kind, getattr(batch, kind)):
                            c.executemany(sql, args)
            self.stats.committed(batch.counters)  # under the connection lock: no reader counts them twice

        await self._run(write)

    def _select(self, c: sqlite3.Connection, since_hour: int, model: str | None,
                schema_key: str | None) -> list[tuple[CounterKey, float]]:
        return [rows.counter(r) for r in c.execute(*statements.counters(since_hour, model, schema_key)).fetchall()]

    async def _snapshot(self, fn: Callable[[sqlite3.Connection], T]) -> tuple[T, Reload]:
        """``fn`` run in a read transaction whose snapshot holds exactly the flushes committed before the book's
        reload began (taken together under the connection lock, where a flush commits and marks its rows
        committed): on the reader connection, outside that lock, for a file; under it for ":memory:". The caller
        ends the reload (``replace_persisted`` or ``cancel_reload``)."""
        def on_reader() -> tuple[T, Reload]:
            with self._reader_lock:
                r = self._reader
                if r is None:
                    raise StoreError("store is not open")
                try:
                    r.execute("BEGIN")
                    try:
                        with self._lock:
                            r.execute("SELECT 1 FROM meta LIMIT 1").fetchall()  # the first read takes the snapshot
                            reload = self.stats.begin_reload()
                        try:
                            return fn(r), reload
                        except BaseException:
                            self.stats.cancel_reload(reload)
                            raise
                    finally:
                        r.execute("ROLLBACK")  # read only: nothing to commit
                except sqlite3.Error as exc:
                    raise StoreError(f"sqlite: {exc}") from exc

        if self._reader is None:
            return await self._run(lambda c: (fn(c), self.stats.begin_reload()))
        work = asyncio.ensure_future(asyncio.to_thread(on_reader))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:  # the read runs on in its thread: its reload ends when it does
            work.add_done_callback(
                lambda w: w.cancelled() or w.exception() is not None or self.stats.cancel_reload(w.result()[1]))
            raise

    async def read_counters(self, since: float, until: float | None = None, model: str | None = None,
                            schema_key: str | None = None) -> Counters:
        stored, reload = await self._snapshot(lambda c: self._select(c, hour_of(since), model, schema_key))
        self.stats.cancel_reload(reload)  # only its unwritten counters are needed
        return self._counted(stored, reload, since, until, model, schema_key)

    async def refresh_stats(self) -> None:
        def read(c: sqlite3.Connection) -> tuple[list[tuple[CounterKey, float]], list[PolicyChange]]:
            stored = self._select(c, hour_of(self.stats.clock() - self.stats.horizon_seconds), None, None)
            return stored, [rows.change(r) for r in c.execute(_LATEST_CHANGES).fetchall()]

        (stored, latest), reload = await self._snapshot(read)
        # built outside every lock (and off the event loop), swapped in under the book's
        await self._reload(lambda: stored, reload)
        self.stats.policy.seed(latest)  # a restarted server knows each proposer's state

    async def prune(self, before: float) -> int:
        cutoff = hour_of(before)
        return await self._run(lambda c: sum(c.execute(sql, (cutoff if by_hour else before,)).rowcount
                                             for sql, by_hour in statements.PRUNE))
