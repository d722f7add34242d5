"""The default ``Store``: one SQLite file in the data directory.

One connection guarded by a lock; blocking calls run in a worker thread so the event loop
never waits on disk. WAL mode lets the engine (or a CLI) open the same file concurrently, and
lets the statistics' long reads (``refresh_stats``, ``read_counters``) run on a second
connection (``_reader``) in a snapshot, so a flush never waits on them.
The tables, statements, row codecs and every method but opening, flushing and the snapshot are the
PostgreSQL store's (``statements``, ``rows``, ``SQLStore``), so a row means the same in both. Each kind of
statistics is written in a transaction of its own; rows the file refuses (``quarantine``) hold back neither the
other kinds nor the rows behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Iterator, Sequence, TypeVar

from structspec.stats.book import Reload, StatsBook
from structspec.stats.counters import CounterKey, Series
from structspec.store import rows, statements
from structspec.store.base import StoreError
from structspec.store.dialect import SQLITE
from structspec.store.sql_store import Batch, SQLStore, Tx
from structspec.store.statements import COUNTER_COLS, SCHEMA_VERSION
from structspec.store.text import ENCODED_COLUMNS, MARK

T = TypeVar("T")

_TABLES = statements.tables(SQLITE)
_RESERVOIRS = {table: next(d for d in _TABLES if f"TABLE IF NOT EXISTS {table} " in d)
               for table in ("rejected_drafts", "traffic_samples")}  # their DDL
UNKNOWN_MODEL = "unknown"  # statistics written before they were keyed by model


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


class _Tx:
    """``Tx`` on a sqlite3 connection: its statements never suspend (``_complete`` runs them in the worker thread)."""

    def __init__(self, c: sqlite3.Connection):
        self.c = c

    async def one(self, sql: str, args: Sequence[Any] = ()) -> rows.Row | None:
        return self.c.execute(sql, args).fetchone()

    async def all(self, sql: str, args: Sequence[Any] = ()) -> list[rows.Row]:
        return self.c.execute(sql, args).fetchall()

    async def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.c.execute(sql, args).rowcount

    async def many(self, sql: str, args: Iterable[Sequence[Any]]) -> None:
        self.c.executemany(sql, args)


def _complete(c: sqlite3.Connection, fn: Callable[[Tx], Awaitable[T]]) -> T:
    """``fn`` run on ``c`` to its end, here (its awaits are ``_Tx``'s, which never suspend)."""
    work = fn(_Tx(c)).__await__()
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise RuntimeError("a SQLite store's statements suspended")


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
            task = asyncio.current_task()
            assert task is not None  # (a coroutine runs in a task)
            task.cancel()  # written: the cancellation lands at the caller's next await
            return work.result()

    async def _session(self, fn: Callable[[Tx], Awaitable[T]], atomic: bool = True,
                       then: Callable[[], None] | None = None) -> T:
        def call(c: sqlite3.Connection) -> T:
            with _transaction(c) if atomic else contextlib.nullcontext():
                out = _complete(c, fn)
            if then is not None:
                then()  # under the connection lock, where a snapshot of the counters begins
            return out

        return await self._run(call)

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

    # -- statistics ----------------------------------------------------------------------------

    async def flush(self) -> None:
        """Each kind in a transaction of its own: a failed write of one does not hold the others back (the last
        error is raised); what a failed write did not write is put back in its buffer."""
        error: BaseException | None = None
        for kind, buffer in sorted(self._buffers().items(), key=lambda kb: kb[0] == "counters"):  # counters last
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

    async def _stored_counters(self, tx: Tx, since_hour: int, model: str | None,
                               schema_key: str | None) -> Iterable[tuple[CounterKey, float]]:
        assert isinstance(tx, _Tx)  # the one this store's sessions hand out
        return self._select(tx.c, since_hour, model, schema_key)

    def _select(self, c: sqlite3.Connection, since_hour: int, model: str | None,
                schema_key: str | None) -> list[tuple[CounterKey, float]]:
        """The stored counters as records, built in the worker thread."""
        return [rows.counter(r) for r in c.execute(*statements.counters(since_hour, model, schema_key)).fetchall()]

    async def _snapshot(self, fn: Callable[[Tx], Awaitable[T]]) -> tuple[T, Reload]:
        """The snapshot and the reload are taken together under the connection lock, where a flush commits and marks
        its rows committed; ``fn`` runs on the reader connection, outside that lock, for a file; under it for
        ":memory:"."""
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
                            return _complete(r, fn), reload
                        except BaseException:
                            self.stats.cancel_reload(reload)
                            raise
                    finally:
                        r.execute("ROLLBACK")  # read only: nothing to commit
                except sqlite3.Error as exc:
                    raise StoreError(f"sqlite: {exc}") from exc

        if self._reader is None:
            return await self._run(lambda c: (_complete(c, fn), self.stats.begin_reload()))
        work = asyncio.ensure_future(asyncio.to_thread(on_reader))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:  # the read runs on in its thread: its reload ends when it does
            def cancel_reload(w: asyncio.Future[Any]) -> None:
                if not w.cancelled() and w.exception() is None:
                    self.stats.cancel_reload(w.result()[1])

            work.add_done_callback(cancel_reload)
            raise
