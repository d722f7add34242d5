"""The shared ``Store``: one PostgreSQL database behind every replica of a deployment.

Built on psycopg 3 (its asyncio connections and ``psycopg_pool``). Chosen over asyncpg because
it is libpq's own protocol implementation (every libpq connection option, ``PG*`` environment
variable, ``.pgpass`` and TLS mode works as in ``psql``), ships a binary wheel with libpq inside,
has a maintained connection pool with reconnection, and runs ``executemany`` in pipeline mode
(one round trip for a flush's thousands of upserts), with the DB-API shape the SQLite store
already uses; asyncpg's speed edge matters little for a flush a second.

What replicas sharing the database can rely on:

- **Schema**: created or migrated in ``open`` under an advisory lock (``postgres_schema``), so
  replicas starting together take turns. A store written by a newer structspec is refused.
- **Registry**: ``put_schema`` locks the id's ``schema_ids`` row (``SELECT ... FOR UPDATE``)
  before it looks for the content and allocates a version, so concurrent registrations of one
  id, from any replicas, are serialized: distinct contents get distinct versions, none lost;
  the same content gets one version (one caller sees ``created``).
- **Counters add up exactly**: a flush adds this process's deltas
  (``value = counters.value + excluded.value``), never a total, and writes its counters, history
  outputs, samples and policy changes in one transaction together with this process's flush
  mark (``flush_marks``: the batch's sequence number). A flush that fails is kept and retried
  first, with the same number; if its commit had landed and only the acknowledgement was lost,
  the mark shows it and the retry writes nothing. Rows are written in key order, so two
  replicas' flushes cannot deadlock on the counters.
- **A refused row holds back nothing**: a flush the database refuses for its rows is written
  again in parts (``SQLStore._write_all``), each under a number of its own.
- **Reads count every row once**: ``read_counters`` and ``refresh_stats`` read the table in a
  snapshot taken, with a copy of this process's unwritten counters, under the lock a flush holds
  from its write to marking the rows committed (after a failed flush they first read the mark: a
  flush that landed is not counted again as unwritten); the read itself runs outside that lock,
  so flushes go on while a refresh reads a week of counters.
- **History**: shared and bounded: the newest ``HISTORY_KEEP`` outputs per (model, key), and
  none older than the retention (``prune``).
- **Samples** (rejected drafts and traffic): each process fills reservoirs of its own (a slot's
  key holds its ``writer``), so replicas never overwrite each other's samples.
- **Outage**: every failure to reach the database raises ``StoreUnavailable`` (within
  ``timeout`` seconds); nothing recorded is lost while the bounds hold (``backlog``), and the
  pool reconnects by itself when the database is back.

The store must be reachable at ``open`` (the schema is checked there). Every method may be
called from another event loop than the one that opened the store (the engine loads the
history from its loading thread): such a call uses a connection of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from typing import Any, AsyncIterator, Callable, Sequence, TypeVar

from structspec.stats.book import Counters, Reload, StatsBook
from structspec.stats.counters import hour_of
from structspec.store import rows, statements
from structspec.store.base import (BACKLOG_KINDS, SPECULATION_MODES, SchemaRecord, StoreError, StoreUnavailable,
                                   redact_url)
from structspec.store.dialect import POSTGRES
from structspec.store.postgres_schema import migrate
from structspec.store.sql_store import Batch, SQLStore, _as_is
from structspec.store.statements import CHANGE_COLS, SCHEMA_COLS

try:  # the ``postgres`` extra
    import psycopg
    from psycopg_pool import AsyncConnectionPool
except ImportError:  # pragma: no cover - reported by ``PostgresStore`` itself
    psycopg = None  # type: ignore[assignment]
    AsyncConnectionPool = None  # type: ignore[assignment,misc]

R = TypeVar("R")
_sql = POSTGRES.sql
# what psycopg raises when the database refuses a statement's values (SQLSTATE classes 22 and 23), not when it
# cannot be reached or the statement itself is wrong
_REFUSALS: tuple[type[BaseException], ...] = (psycopg.DataError, psycopg.IntegrityError) if psycopg else ()
# each key's latest policy change
_LATEST_CHANGES = (f"SELECT DISTINCT ON (model, schema_key, proposer) {CHANGE_COLS} FROM policy_changes "
                   "ORDER BY model, schema_key, proposer, id DESC")


class PostgresStore(SQLStore):
    """``Store`` on the PostgreSQL database at ``url`` (a libpq URL or ``key=value`` string).

    ``pool_size``: connections kept at most; ``timeout``: seconds to wait for a connection or a statement before
    ``StoreUnavailable``; ``history_limit``: unwritten history outputs kept while the store cannot be written."""

    dialect = POSTGRES
    refusals = _REFUSALS

    def __init__(self, url: str, stats: StatsBook | None = None, *, pool_size: int = 4, timeout: float = 5.0,
                 history_limit: int = 100_000):
        if pool_size < 1 or timeout <= 0:
            raise ValueError("pool_size must be >= 1 and timeout > 0")
        super().__init__(stats, history_limit)
        self.url = url
        self.pool_size = pool_size
        self.timeout = timeout
        self.replica = uuid.uuid4().hex  # this process's name in flush_marks
        self._pool: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_lock = asyncio.Lock()
        self._seq = 0
        # taken, not yet written, in order: a flush that failed (written again first, the first under its number),
        # or the parts of one the database refused
        self._retry: list[Batch] = []

    @property
    def where(self) -> str:
        """The database, for messages (no password)."""
        return redact_url(self.url)

    # -- plumbing ----------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        return {"autocommit": True, "connect_timeout": max(1, math.ceil(self.timeout)),
                "application_name": "structspec"}

    async def _configure(self, conn: Any) -> None:
        await conn.execute("SELECT set_config('statement_timeout', %s, false)", (str(int(self.timeout * 1000)),))

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        """A connection (autocommit; ``conn.transaction()`` for a transaction); psycopg's errors mapped to
        ``StoreUnavailable`` (could not reach it) and ``StoreError`` (anything else)."""
        if self._pool is None:
            raise StoreError("store is not open")
        try:
            if asyncio.get_running_loop() is self._loop:
                async with self._pool.connection(timeout=self.timeout) as conn:
                    yield conn
            else:  # another loop than the pool's: a connection of its own
                conn = await psycopg.AsyncConnection.connect(self.url, **self._connect_kwargs())
                async with conn:
                    await self._configure(conn)
                    yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
            raise StoreUnavailable(f"PostgreSQL store {self.where} is unreachable: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL store {self.where}: {exc}") from exc

    async def _fetch(self, sql: str, args: Sequence[Any] = (), row: Callable[[rows.Row], R] = _as_is) -> list[R]:
        async with self._conn() as conn:
            found = await (await conn.execute(_sql(sql), args)).fetchall()
        return [row(r) for r in found]

    async def open(self) -> None:
        if self._pool is not None:
            return
        if psycopg is None:
            raise StoreError("the PostgreSQL store needs psycopg: pip install 'structspec[postgres]'")
        pool = AsyncConnectionPool(
            self.url, min_size=1, max_size=self.pool_size, open=False, timeout=self.timeout,
            reconnect_timeout=max(5.0, self.timeout), check=AsyncConnectionPool.check_connection,
            kwargs=self._connect_kwargs(), configure=self._configure, name="structspec-store")
        try:
            await pool.open(wait=True, timeout=self.timeout)
        except psycopg.OperationalError as exc:  # PoolTimeout: not one connection in time
            await pool.close()
            raise StoreUnavailable(f"PostgreSQL store {self.where} is unreachable: {exc}") from exc
        self._pool, self._loop = pool, asyncio.get_running_loop()
        try:
            async with self._conn() as conn:
                await migrate(conn, self.where)
        except BaseException:
            self._pool, self._loop = None, None  # a store that failed to open must not look open
            await pool.close()
            raise

    def _opened(self) -> bool:
        return self._pool is not None

    async def _release(self) -> None:
        pool, self._pool, self._loop = self._pool, None, None
        await pool.close()

    # -- schema registry -------------------------------------------------------------------

    async def put_schema(self, schema_id: str, schema_json: str, sha256: str, description: str, source: str,
                         now: float) -> tuple[SchemaRecord, bool]:
        async with self._conn() as conn, conn.transaction():
            await conn.execute("INSERT INTO schema_ids (schema_id, last_version) VALUES (%s, 0) "
                               "ON CONFLICT (schema_id) DO NOTHING", (schema_id,))
            # the row lock serializes registrations of this id across every replica; each statement after it sees
            # what the one before committed
            await conn.execute("SELECT last_version FROM schema_ids WHERE schema_id = %s FOR UPDATE", (schema_id,))
            row = await (await conn.execute(_sql(statements.SAME_CONTENT), (schema_id, sha256))).fetchone()
            if row is not None:
                return rows.schema(row), False
            (version,) = await (await conn.execute(
                "UPDATE schema_ids SET last_version = last_version + 1 WHERE schema_id = %s RETURNING last_version",
                (schema_id,))).fetchone()
            rec = SchemaRecord(schema_id, int(version), schema_json, sha256, description, now, source)
            await conn.execute(_sql(statements.INSERT_SCHEMA), rows.schema_row(rec))
            return rec, True

    async def delete_schema(self, schema_id: str, version: int | None = None) -> list[int]:
        cond, args = statements.versions(schema_id, version)
        found = await self._fetch(f"DELETE FROM schema_versions WHERE {cond} RETURNING version", args)
        return sorted(int(r[0]) for r in found)

    async def set_schema_speculation(self, schema_id: str, version: int, mode: str) -> SchemaRecord | None:
        if mode not in SPECULATION_MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(SPECULATION_MODES)}, got {mode!r}")
        found = await self._fetch(f"UPDATE schema_versions SET speculation = ? WHERE schema_id = ? AND version = ? "
                                  f"RETURNING {SCHEMA_COLS}", (mode, schema_id, version), rows.schema)
        return found[0] if found else None

    # -- statistics ----------------------------------------------------------------------------

    async def flush(self) -> None:
        async with self._flush_lock:
            await self._write_all(self._retry)  # raises while the store cannot be written: nothing new is taken
            batch = Batch(self.stats.take(), self._history.take(), self.stats.samples.take(),
                          self.stats.traffic.take(), self.stats.policy.take())
            if batch.size() == 0:
                return
            self._retry.append(batch)  # written again first, under its number, while it fails
            await self._write_all(self._retry)

    def _landed(self, batch: Batch) -> None:
        self.stats.committed(batch.counters)  # under the flush lock: no read counts them twice
        self._retry.remove(batch)

    async def _write(self, b: Batch) -> None:
        if b.seq is None:
            self._seq += 1
            b.seq = self._seq
        async with self._conn() as conn, conn.transaction():
            mark = await (await conn.execute(
                "INSERT INTO flush_marks (replica, batch, at) VALUES (%s, %s, %s) ON CONFLICT (replica) DO UPDATE "
                "SET batch = excluded.batch, at = excluded.at WHERE flush_marks.batch < excluded.batch RETURNING batch",
                (self.replica, b.seq, self.stats.clock()))).fetchone()
            if mark is not None:  # None: this batch landed before; its commit was not acknowledged
                async with conn.cursor() as cur:
                    for kind in BACKLOG_KINDS:
                        if getattr(b, kind):
                            for sql, args in statements.writes(POSTGRES, kind, getattr(b, kind)):
                                await cur.executemany(_sql(sql), args)
        self.stats.committed(b.counters)  # under the flush lock: no read counts them twice

    def _unwritten(self, kind: str) -> list[Any]:
        return [r for batch in list(self._retry) for r in getattr(batch, kind)]

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[tuple[Any, Reload]]:
        """A connection in a read-only transaction whose snapshot holds every flush of this process that landed, and
        the book's reload begun at that moment (its unwritten counters are exactly those the snapshot lacks). Taken
        under the flush lock (no flush commits in between), read outside it. The caller ends the reload."""
        reload: Reload | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with self._flush_lock:  # the lock, then a connection: in a flush's order
                    conn = await stack.enter_async_context(self._conn())
                    await stack.enter_async_context(conn.transaction())
                    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    # the transaction's first read takes its snapshot; a failed flush may have landed (only its
                    # acknowledgement lost): the mark tells, and then its rows are committed rather than unwritten
                    mark = await (await conn.execute("SELECT batch FROM flush_marks WHERE replica = %s",
                                                     (self.replica,))).fetchone()
                    head = self._retry[0] if self._retry else None
                    if head is not None and head.seq is not None and mark is not None and int(mark[0]) >= head.seq:
                        self._landed(head)
                    reload = self.stats.begin_reload()
                yield conn, reload
        except BaseException:
            if reload is not None:
                self.stats.cancel_reload(reload)
            raise

    async def read_counters(self, since: float, until: float | None = None, model: str | None = None,
                            schema_key: str | None = None) -> Counters:
        async with self._snapshot() as (conn, reload):
            self.stats.cancel_reload(reload)  # only its unwritten counters are needed
            stored = await (await conn.execute(*_counters(hour_of(since), model, schema_key))).fetchall()
        return self._counted([rows.counter(r) for r in stored], reload, since, until, model, schema_key)

    async def refresh_stats(self) -> None:
        async with self._snapshot() as (conn, reload):
            since = hour_of(self.stats.clock() - self.stats.horizon_seconds)
            stored = await (await conn.execute(*_counters(since, None, None))).fetchall()
            latest = await (await conn.execute(_LATEST_CHANGES)).fetchall()
        # built outside every lock (and off the event loop: a week of counters), swapped in under the book's
        await self._reload(lambda: [rows.counter(r) for r in stored], reload)
        self.stats.policy.seed([rows.change(r) for r in latest])  # a restarted server knows each proposer's state

    async def prune(self, before: float) -> int:
        cutoff = hour_of(before)
        async with self._conn() as conn, conn.transaction():
            n = 0
            for sql, by_hour in statements.PRUNE:
                n += (await conn.execute(_sql(sql), (cutoff if by_hour else before,))).rowcount
            # replicas that have not flushed since (stopped processes): their marks are not needed any more
            await conn.execute("DELETE FROM flush_marks WHERE at < %s", (before,))
        return n


def _counters(since_hour: int, model: str | None, schema_key: str | None) -> tuple[str, list[Any]]:
    sql, args = statements.counters(since_hour, model, schema_key)
    return _sql(sql), args
