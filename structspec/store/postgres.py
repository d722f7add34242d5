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
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Sequence, TypeVar

from structspec.stats.book import Reload, StatsBook
from structspec.store import rows
from structspec.store.base import StoreError, StoreUnavailable, redact_url
from structspec.store.dialect import POSTGRES
from structspec.store.postgres_schema import migrate
from structspec.store.sql_store import Batch, SQLStore, Tx

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
# the batch's number as this replica's flush mark, unless a mark as high is there (the batch landed before)
_MARK = ("INSERT INTO flush_marks (replica, batch, at) VALUES (?, ?, ?) ON CONFLICT (replica) DO UPDATE "
         "SET batch = excluded.batch, at = excluded.at WHERE flush_marks.batch < excluded.batch RETURNING batch")


class _Tx:
    """``Tx`` on a psycopg ``AsyncConnection``."""

    def __init__(self, conn: Any):
        self.conn = conn

    async def one(self, sql: str, args: Sequence[Any] = ()) -> rows.Row | None:
        return await (await self.conn.execute(_sql(sql), args)).fetchone()

    async def all(self, sql: str, args: Sequence[Any] = ()) -> list[rows.Row]:
        return await (await self.conn.execute(_sql(sql), args)).fetchall()

    async def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        return (await self.conn.execute(_sql(sql), args)).rowcount

    async def many(self, sql: str, args: Iterable[Sequence[Any]]) -> None:
        async with self.conn.cursor() as cur:
            await cur.executemany(_sql(sql), args)  # in pipeline mode: one round trip


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

    async def _session(self, fn: Callable[[Tx], Awaitable[R]], atomic: bool = True,
                       then: Callable[[], None] | None = None) -> R:
        async with self._conn() as conn, conn.transaction() if atomic else contextlib.nullcontext():
            out = await fn(_Tx(conn))
        if then is not None:
            then()  # a write's: under the flush lock, where a snapshot of the counters begins
        return out

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

    # -- statistics ----------------------------------------------------------------------------

    async def flush(self) -> None:
        async with self._flush_lock:
            await self._write_all(self._retry)  # raises while the store cannot be written: nothing new is taken
            batch = Batch(**{kind: buffer.take() for kind, buffer in self._buffers().items()})
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
        await super()._write(b)

    async def _write_rows(self, tx: Tx, b: Batch) -> None:
        if await tx.one(_MARK, (self.replica, b.seq, self.stats.clock())) is not None:  # None: this batch landed
            await super()._write_rows(tx, b)  # before; its commit was not acknowledged

    def _unwritten(self, kind: str) -> list[Any]:
        return [r for batch in list(self._retry) for r in getattr(batch, kind)]

    async def _snapshot(self, fn: Callable[[Tx], Awaitable[R]]) -> tuple[R, Reload]:
        """A read-only transaction; its snapshot and the reload are taken under the flush lock (no flush commits in
        between), ``fn`` reads outside it."""
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
                return await fn(_Tx(conn)), reload
        except BaseException:
            if reload is not None:
                self.stats.cancel_reload(reload)
            raise

    async def _prune(self, tx: Tx, before: float) -> int:
        removed = await super()._prune(tx, before)
        # replicas that have not flushed since (stopped processes): their marks are not needed any more
        await tx.run("DELETE FROM flush_marks WHERE at < ?", (before,))
        return removed
