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
- **A refused row holds back nothing**: a flush the database refuses for its rows (a data error,
  a constraint; not a lost connection) is written again in parts, each under a number of its
  own, until each refused row is alone; those are quarantined (``quarantine``: counted, logged),
  the others written. Callers' and the model's text goes through ``text.encode`` (PostgreSQL's
  text cannot hold NUL), so any text round-trips.
- **Reads count every row once**: ``read_counters`` and ``refresh_stats`` read the table in a
  snapshot taken, with a copy of this process's unwritten counters, under the lock a flush holds
  from its write to marking the rows committed (after a failed flush they first read the mark: a
  flush that landed is not counted again as unwritten); the read itself runs outside that lock,
  so flushes go on while a refresh reads a week of counters.
- **History**: shared and bounded: the newest ``HISTORY_KEEP`` outputs per (model, key), and
  none older than the retention (``prune``).
- **Samples** (rejected drafts and traffic): each process fills reservoirs of its own (its
  sampler's ``writer`` is part of a slot's key), so replicas, and a process restarted within
  the hour, never overwrite each other's samples; an hour keeps ``per_hour`` samples per key
  per process, and the store the newest ``KEEP_PER_KEY`` per key.
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
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from structspec.stats.book import Counters, Reload, StatsBook
from structspec.stats.counters import CounterKey, hour_of
from structspec.stats.policy_states import KEEP_PER_KEY as CHANGES_KEEP
from structspec.stats.policy_states import PolicyChange
from structspec.stats.samples import KEEP_PER_KEY as SAMPLES_KEEP
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import KEEP_PER_KEY as TRAFFIC_KEEP
from structspec.stats.traffic import TrafficSample
from structspec.store.base import (SPECULATION_MODES, Backlog, SchemaRecord, StoreError, StoreUnavailable, backlog_of,
                                   newest_samples, reload_book, sum_counters)
from structspec.store.history_buffer import HistoryBuffer, HistoryRow
from structspec.store.postgres_schema import migrate
from structspec.store.quarantine import Quarantine, halves, refused
from structspec.store.text import decode, encode

try:  # the ``postgres`` extra
    import psycopg
    from psycopg_pool import AsyncConnectionPool
except ImportError:  # pragma: no cover - reported by ``PostgresStore`` itself
    psycopg = None  # type: ignore[assignment]
    AsyncConnectionPool = None  # type: ignore[assignment,misc]

# what psycopg raises when the database refuses a statement's values (SQLSTATE classes 22 and 23), not when it
# cannot be reached or the statement itself is wrong
_REFUSALS: tuple[type[BaseException], ...] = (psycopg.DataError, psycopg.IntegrityError) if psycopg else ()

_COLS = "schema_id, version, schema_json, sha256, description, created_at, source, speculation"
_COUNTER_COLS = "model, schema_key, hour, series, proposer, batch_bucket, label"
_SAMPLE_COLS = ("model, schema_key, proposer, hour, slot, created_at, batch_bucket, context_tokens, context_text, "
                "draft_tokens, draft_text, position, rejected_token, rejected_text, target_token, target_text, grammatical, "
                "writer")
_CHANGE_COLS = "model, schema_key, proposer, at, state, reason, previous, batch_bucket, acceptance, threshold"
_TRAFFIC_COLS = "model, schema_key, hour, slot, created_at, prompt_tokens, output_tokens, finish, writer"
_SAMPLE_KEY = ("model", "schema_key", "proposer", "hour", "writer", "slot")  # rejected_drafts' primary key


def _record(row: tuple[Any, ...]) -> SchemaRecord:
    return SchemaRecord(row[0], int(row[1]), decode(row[2]), row[3], decode(row[4]), float(row[5]), row[6], row[7])


def _sample_row(r: RejectedDraft) -> tuple[Any, ...]:
    return (r.model, r.schema_key, r.proposer, r.hour, r.slot, r.created_at, r.batch_bucket, list(r.context_tokens),
            encode(r.context_text), list(r.draft_tokens), encode(r.draft_text), r.position, r.rejected_token,
            encode(r.rejected_text), r.target_token, encode(r.target_text), r.grammatical, r.writer)


def _sample(row: tuple[Any, ...]) -> RejectedDraft:
    return RejectedDraft(row[0], row[1], row[2], int(row[3]), int(row[4]), float(row[5]), int(row[6]),
                         tuple(row[7]), decode(row[8]), tuple(row[9]), decode(row[10]), int(row[11]), int(row[12]),
                         decode(row[13]), int(row[14]), decode(row[15]), bool(row[16]), row[17])


def _traffic_row(r: TrafficSample) -> tuple[Any, ...]:
    return (r.model, r.schema_key, r.hour, r.slot, r.created_at, list(r.prompt_tokens), list(r.output_tokens),
            r.finish, r.writer)


def _traffic(row: tuple[Any, ...]) -> TrafficSample:
    return TrafficSample(row[0], row[1], int(row[2]), int(row[3]), float(row[4]), tuple(row[5]), tuple(row[6]),
                         row[7], row[8])


def _change(row: tuple[Any, ...]) -> PolicyChange:
    return PolicyChange(row[0], row[1], row[2], float(row[3]), row[4], row[5], row[6], int(row[7]),
                        None if row[8] is None else float(row[8]), None if row[9] is None else float(row[9]))


def _counters(rows: list[tuple[Any, ...]]) -> list[tuple[CounterKey, float]]:
    return [(CounterKey(r[0], r[1], int(r[2]), r[3], r[4], int(r[5]), r[6]), float(r[7])) for r in rows]


def _matches(item: RejectedDraft | PolicyChange, model: str | None, schema_key: str | None) -> bool:
    return (model is None or item.model == model) and (schema_key is None or item.schema_key == schema_key)


def _where(filters: tuple[tuple[str, str | None], ...]) -> tuple[str, list[Any]]:
    """`` AND column = %s`` for each filter that is set, with its arguments."""
    sql, args = "", []
    for column, value in filters:
        if value is not None:
            sql += f" AND {column} = %s"
            args.append(value)
    return sql, args


_KINDS = {"counters": "counters", "history": "history", "samples": "samples", "changes": "policy_changes",
          "traffic": "traffic"}  # a batch's fields -> their backlog kinds


@dataclass
class _Batch:
    """One flush (or a part of one): what it took from the buffers, written in one transaction under its sequence
    number (``seq``: given when it is first written, kept for its retries)."""

    seq: int | None
    counters: Counters = field(default_factory=dict)
    history: list[HistoryRow] = field(default_factory=list)
    samples: list[RejectedDraft] = field(default_factory=list)
    changes: list[PolicyChange] = field(default_factory=list)
    traffic: list[TrafficSample] = field(default_factory=list)

    def size(self) -> int:
        return sum(len(getattr(self, name)) for name in _KINDS)

    def empty(self) -> bool:
        return self.size() == 0

    def parts(self) -> list["_Batch"]:
        """Smaller batches that make this one (of two rows or more) up: one per kind, or its one kind's halves."""
        kinds = [name for name in _KINDS if getattr(self, name)]
        if len(kinds) > 1:
            return [_Batch(None, **{name: getattr(self, name)}) for name in kinds]
        return [_Batch(None, **{kinds[0]: half}) for half in halves(getattr(self, kinds[0]))]

    def row(self) -> tuple[str, Any]:
        """A one-row batch's (backlog kind, row); a counter's row is its (key, value)."""
        name = next(name for name in _KINDS if getattr(self, name))
        rows = getattr(self, name)
        return _KINDS[name], next(iter(rows.items())) if isinstance(rows, dict) else rows[0]


class PostgresStore:
    """``Store`` on the PostgreSQL database at ``url`` (a libpq URL or ``key=value`` string).

    ``pool_size``: connections kept at most; ``timeout``: seconds to wait for a connection or a statement before
    ``StoreUnavailable``; ``history_limit``: unwritten history outputs kept while the store cannot be written."""

    HISTORY_KEEP = 64  # outputs kept per (model, key): the history proposer's own bound

    def __init__(self, url: str, stats: StatsBook | None = None, *, pool_size: int = 4, timeout: float = 5.0,
                 history_limit: int = 100_000):
        if pool_size < 1 or timeout <= 0:
            raise ValueError("pool_size must be >= 1 and timeout > 0")
        self.url = url
        self.stats = stats or StatsBook()
        self.pool_size = pool_size
        self.timeout = timeout
        self.replica = uuid.uuid4().hex  # this process's name in flush_marks
        self._pool: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._history = HistoryBuffer(history_limit)
        self._flush_lock = asyncio.Lock()
        self._seq = 0
        # taken, not yet written, in order: a flush that failed (written again first, the first under its number),
        # or the parts of one the database refused
        self._retry: list[_Batch] = []
        self.quarantine = Quarantine()  # rows the database refused

    @property
    def where(self) -> str:
        """The database, for messages (no password)."""
        from structspec.store import redact_url

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

    async def close(self) -> None:
        if self._pool is None:
            return
        try:
            await self.flush()
        finally:  # closed even when the last flush fails (its error still reaches the caller)
            pool, self._pool, self._loop = self._pool, None, None
            await pool.close()

    async def check(self) -> None:
        async with self._conn() as conn:
            await conn.execute("SELECT 1")

    # -- schema registry -------------------------------------------------------------------

    async def put_schema(self, schema_id: str, schema_json: str, sha256: str, description: str, source: str,
                         now: float) -> tuple[SchemaRecord, bool]:
        async with self._conn() as conn, conn.transaction():
            await conn.execute("INSERT INTO schema_ids (schema_id, last_version) VALUES (%s, 0) "
                               "ON CONFLICT (schema_id) DO NOTHING", (schema_id,))
            # the row lock serializes registrations of this id across every replica; each statement after it sees
            # what the one before committed
            await conn.execute("SELECT last_version FROM schema_ids WHERE schema_id = %s FOR UPDATE", (schema_id,))
            row = await (await conn.execute(
                f"SELECT {_COLS} FROM schema_versions WHERE schema_id = %s AND sha256 = %s ORDER BY version LIMIT 1",
                (schema_id, sha256))).fetchone()
            if row is not None:
                return _record(row), False
            (version,) = await (await conn.execute(
                "UPDATE schema_ids SET last_version = last_version + 1 WHERE schema_id = %s RETURNING last_version",
                (schema_id,))).fetchone()
            rec = SchemaRecord(schema_id, int(version), schema_json, sha256, description, now, source)
            await conn.execute(f"INSERT INTO schema_versions ({_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                               (rec.schema_id, rec.version, encode(rec.schema_json), rec.sha256, encode(rec.description),
                                rec.created_at, rec.source, rec.speculation))
            return rec, True

    async def get_schema(self, schema_id: str, version: int | None = None) -> SchemaRecord | None:
        if version is None:
            sql, args = (f"SELECT {_COLS} FROM schema_versions WHERE schema_id = %s ORDER BY version DESC LIMIT 1",
                         (schema_id,))
        else:
            sql, args = f"SELECT {_COLS} FROM schema_versions WHERE schema_id = %s AND version = %s", (schema_id, version)
        async with self._conn() as conn:
            row = await (await conn.execute(sql, args)).fetchone()
        return _record(row) if row else None

    async def list_schemas(self, schema_id: str | None = None, all_versions: bool = False) -> list[SchemaRecord]:
        where, args = ("WHERE v.schema_id = %s", [schema_id]) if schema_id else ("", [])
        if not all_versions:
            latest = "v.version = (SELECT MAX(w.version) FROM schema_versions w WHERE w.schema_id = v.schema_id)"
            where = f"{where} AND {latest}" if where else f"WHERE {latest}"
        cols = ", ".join(f"v.{c.strip()}" for c in _COLS.split(","))
        async with self._conn() as conn:
            rows = await (await conn.execute(
                f"SELECT {cols} FROM schema_versions v {where} ORDER BY v.schema_id, v.version", args)).fetchall()
        return [_record(r) for r in rows]

    async def delete_schema(self, schema_id: str, version: int | None = None) -> list[int]:
        cond, args = (("schema_id = %s", (schema_id,)) if version is None
                      else ("schema_id = %s AND version = %s", (schema_id, version)))
        async with self._conn() as conn:
            rows = await (await conn.execute(f"DELETE FROM schema_versions WHERE {cond} RETURNING version",
                                             args)).fetchall()
        return sorted(int(r[0]) for r in rows)

    async def set_schema_speculation(self, schema_id: str, version: int, mode: str) -> SchemaRecord | None:
        if mode not in SPECULATION_MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(SPECULATION_MODES)}, got {mode!r}")
        async with self._conn() as conn:
            row = await (await conn.execute(
                f"UPDATE schema_versions SET speculation = %s WHERE schema_id = %s AND version = %s RETURNING {_COLS}",
                (mode, schema_id, version))).fetchone()
        return _record(row) if row else None

    # -- statistics ----------------------------------------------------------------------------

    async def flush(self) -> None:
        async with self._flush_lock:
            await self._write_retry()  # raises while the store cannot be written: the batches stay, nothing is taken
            batch = _Batch(None, self.stats.take(), self._history.take(), self.stats.samples.take(),
                           self.stats.policy.take(), self.stats.traffic.take())
            if batch.empty():
                return
            self._retry.append(batch)
            await self._write_retry()

    async def _write_retry(self) -> None:
        """Write the batches waiting in ``_retry``, in order (under the flush lock). One the database refuses for its
        rows is replaced by its parts, down to single rows, which are quarantined; any other failure is raised,
        what is not written kept."""
        while self._retry:
            batch = self._retry[0]
            if batch.seq is None:
                self._seq += 1
                batch.seq = self._seq
            try:
                await self._write(batch)
            except Exception as exc:
                if not refused(exc, _REFUSALS):
                    raise
                self._retry.pop(0)  # refused: its transaction rolled back, nothing of it landed
                if batch.size() > 1:
                    parts = batch.parts()
                    self.stats.split(batch.counters, [p.counters for p in parts])
                    self._retry[0:0] = parts
                else:
                    self.quarantine.add(*batch.row(), exc)
                    self.stats.committed(batch.counters)  # not unwritten any more: quarantined
                continue
            self._landed(batch)

    def _landed(self, batch: _Batch) -> None:
        self.stats.committed(batch.counters)  # under the flush lock: no read counts them twice
        self._retry.remove(batch)

    async def _write(self, b: _Batch) -> None:
        async with self._conn() as conn, conn.transaction():
            mark = await (await conn.execute(
                "INSERT INTO flush_marks (replica, batch, at) VALUES (%s, %s, %s) ON CONFLICT (replica) DO UPDATE "
                "SET batch = excluded.batch, at = excluded.at WHERE flush_marks.batch < excluded.batch RETURNING batch",
                (self.replica, b.seq, self.stats.clock()))).fetchone()
            if mark is None:
                return  # this batch landed before; its commit was not acknowledged
            async with conn.cursor() as cur:
                if b.counters:
                    await cur.executemany(
                        f"INSERT INTO counters ({_COUNTER_COLS}, value) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                        f"ON CONFLICT ({_COUNTER_COLS}) DO UPDATE SET value = counters.value + excluded.value",
                        [(k.model, k.schema_key, k.hour, k.series, k.proposer, k.batch_bucket, k.label, v)
                         for k, v in sorted(b.counters.items())])
                if b.history:
                    history = [(m, encode(k), encode(t), at) for m, k, t, at in b.history]
                    await cur.executemany("INSERT INTO history (model, history_key, text, created_at) "
                                          "VALUES (%s, %s, %s, %s)", history)
                    for model, key in sorted({(m, k) for m, k, _, _ in history}):
                        await cur.execute(
                            "DELETE FROM history WHERE model = %s AND history_key = %s AND id NOT IN (SELECT id FROM "
                            "history WHERE model = %s AND history_key = %s ORDER BY id DESC LIMIT %s)",
                            (model, key, model, key, self.HISTORY_KEEP))
                if b.samples:
                    columns = [c.strip() for c in _SAMPLE_COLS.split(",")]
                    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in _SAMPLE_KEY)
                    await cur.executemany(
                        f"INSERT INTO rejected_drafts ({_SAMPLE_COLS}) VALUES ({', '.join(['%s'] * len(columns))}) "
                        f"ON CONFLICT ({', '.join(_SAMPLE_KEY)}) DO UPDATE SET {updates}",
                        [_sample_row(r) for r in sorted(b.samples, key=lambda r: r.key)])
                    for model, key, proposer in sorted({(r.model, r.schema_key, r.proposer) for r in b.samples}):
                        await cur.execute(
                            "DELETE FROM rejected_drafts WHERE model = %s AND schema_key = %s AND proposer = %s AND "
                            "(hour, writer, slot) NOT IN (SELECT hour, writer, slot FROM rejected_drafts WHERE "
                            "model = %s AND schema_key = %s AND proposer = %s ORDER BY hour DESC, created_at DESC "
                            "LIMIT %s)", (model, key, proposer, model, key, proposer, SAMPLES_KEEP))
                if b.traffic:
                    await cur.executemany(
                        f"INSERT INTO traffic_samples ({_TRAFFIC_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (model, schema_key, hour, writer, slot) DO UPDATE SET created_at = "
                        "excluded.created_at, prompt_tokens = excluded.prompt_tokens, output_tokens = "
                        "excluded.output_tokens, finish = excluded.finish",
                        [_traffic_row(r) for r in sorted(b.traffic, key=lambda r: r.key)])
                    for model, key in sorted({(r.model, r.schema_key) for r in b.traffic}):
                        await cur.execute(
                            "DELETE FROM traffic_samples WHERE model = %s AND schema_key = %s AND (hour, writer, slot) "
                            "NOT IN (SELECT hour, writer, slot FROM traffic_samples WHERE model = %s AND schema_key = %s "
                            "ORDER BY hour DESC, created_at DESC LIMIT %s)", (model, key, model, key, TRAFFIC_KEEP))
                if b.changes:
                    await cur.executemany(
                        f"INSERT INTO policy_changes ({_CHANGE_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        [(r.model, r.schema_key, r.proposer, r.at, r.state, r.reason, r.previous, r.batch_bucket,
                          r.acceptance, r.threshold) for r in b.changes])
                    for model, key, proposer in sorted({r.key for r in b.changes}):
                        await cur.execute(
                            "DELETE FROM policy_changes WHERE model = %s AND schema_key = %s AND proposer = %s AND id "
                            "NOT IN (SELECT id FROM policy_changes WHERE model = %s AND schema_key = %s AND "
                            "proposer = %s ORDER BY id DESC LIMIT %s)",
                            (model, key, proposer, model, key, proposer, CHANGES_KEEP))

    @staticmethod
    async def _select(conn: Any, since_hour: int, model: str | None, schema_key: str | None) -> list[tuple[Any, ...]]:
        """The counters' rows (``_counters`` makes them keys)."""
        cond, args = _where((("model", model), ("schema_key", schema_key)))
        return await (await conn.execute(f"SELECT {_COUNTER_COLS}, value FROM counters WHERE hour >= %s{cond}",
                                         [since_hour, *args])).fetchall()

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
            stored = _counters(await self._select(conn, hour_of(since), model, schema_key))
        pending = [(k, v) for k, v in reload.unflushed.items()
                   if (model is None or k.model == model) and (schema_key is None or k.schema_key == schema_key)]
        return sum_counters(stored + pending, since, until)

    async def refresh_stats(self) -> None:
        async with self._snapshot() as (conn, reload):
            stored = await self._select(conn, hour_of(self.stats.clock() - self.stats.horizon_seconds), None, None)
            latest = await (await conn.execute(
                f"SELECT DISTINCT ON (model, schema_key, proposer) {_CHANGE_COLS} FROM policy_changes "
                "ORDER BY model, schema_key, proposer, id DESC")).fetchall()
        # built outside every lock (and off the event loop: a week of counters), swapped in under the book's
        await reload_book(self.stats, lambda: _counters(stored), reload)
        self.stats.policy.seed([_change(r) for r in latest])  # a restarted server knows each proposer's state

    async def prune(self, before: float) -> int:
        cutoff = hour_of(before)
        async with self._conn() as conn, conn.transaction():
            n = 0
            for sql, arg in (("DELETE FROM counters WHERE hour < %s", cutoff),
                             ("DELETE FROM rejected_drafts WHERE hour < %s", cutoff),
                             ("DELETE FROM traffic_samples WHERE hour < %s", cutoff),
                             ("DELETE FROM history WHERE created_at < %s", before),
                             # past retention but each key's newest: a state unchanged since is still its state
                             ("DELETE FROM policy_changes WHERE at < %s AND id <> (SELECT MAX(q.id) FROM policy_changes q "
                              "WHERE q.model = policy_changes.model AND q.schema_key = policy_changes.schema_key "
                              "AND q.proposer = policy_changes.proposer)", before)):
                n += (await conn.execute(sql, (arg,))).rowcount
            # replicas that have not flushed since (stopped processes): their marks are not needed any more
            await conn.execute("DELETE FROM flush_marks WHERE at < %s", (before,))
        return n

    def backlog(self) -> Backlog:
        out = backlog_of(self.stats, self._history, self.quarantine.counts())
        for batch in list(self._retry):  # taken by a failed flush, still unwritten (counters: in the book's count)
            for name, kind in _KINDS.items():
                if name != "counters":
                    out.unwritten[kind] += len(getattr(batch, name))
        return out

    def _unwritten(self, name: str) -> list[Any]:
        """The taken, not yet written rows of one of a batch's fields."""
        return [r for batch in list(self._retry) for r in getattr(batch, name)]

    # -- rejected drafts and the policy's changes ---------------------------------------------------

    def _unwritten_samples(self) -> list[RejectedDraft]:
        return self._unwritten("samples") + self.stats.samples.pending()

    async def read_rejected_drafts(self, model: str | None = None, schema_key: str | None = None,
                                   proposer: str | None = None, limit: int = 100) -> list[RejectedDraft]:
        cond, args = _where((("model", model), ("schema_key", schema_key), ("proposer", proposer)))
        async with self._conn() as conn:
            rows = await (await conn.execute(
                f"SELECT {_SAMPLE_COLS} FROM rejected_drafts WHERE TRUE{cond} ORDER BY created_at DESC LIMIT %s",
                [*args, limit])).fetchall()
        merged = {r.key: r for r in map(_sample, rows)}
        # an unwritten sample replaces its slot's stored one
        merged.update({r.key: r for r in self._unwritten_samples()
                       if _matches(r, model, schema_key) and (proposer is None or r.proposer == proposer)})
        return sorted(merged.values(), key=lambda r: r.created_at, reverse=True)[:limit]

    async def read_traffic_samples(self, model: str | None = None, schema_key: str | None = None,
                                   limit: int = 1000) -> list[TrafficSample]:
        cond, args = _where((("model", model), ("schema_key", schema_key)))
        async with self._conn() as conn:
            rows = await (await conn.execute(
                f"SELECT {_TRAFFIC_COLS} FROM traffic_samples WHERE TRUE{cond} ORDER BY created_at DESC LIMIT %s",
                [*args, limit])).fetchall()
        unwritten = self._unwritten("traffic") + self.stats.traffic.pending()
        return newest_samples(map(_traffic, rows), unwritten, model, schema_key, limit)

    async def read_policy_changes(self, model: str | None = None, schema_key: str | None = None) -> list[PolicyChange]:
        cond, args = _where((("model", model), ("schema_key", schema_key)))
        async with self._conn() as conn:
            rows = await (await conn.execute(
                f"SELECT {_CHANGE_COLS} FROM policy_changes WHERE TRUE{cond} ORDER BY at, id", args)).fetchall()
        unwritten = self._unwritten("changes") + self.stats.policy.pending()
        return [_change(r) for r in rows] + [r for r in unwritten if _matches(r, model, schema_key)]

    # -- schema history ------------------------------------------------------------------------

    def append_history(self, model: str, history_key: str, text: str, now: float) -> None:
        self._history.append(model, history_key, text, now)

    async def load_history(self, model: str, per_key: int, max_keys: int) -> list[tuple[str, str]]:
        async with self._conn() as conn:
            rows = await (await conn.execute(
                "SELECT history_key, text FROM (SELECT id, history_key, text, row_number() OVER (PARTITION BY "
                "history_key ORDER BY id DESC) AS n FROM history WHERE model = %s AND history_key IN (SELECT "
                "history_key FROM history WHERE model = %s GROUP BY history_key ORDER BY MAX(id) DESC LIMIT %s)) "
                "recent WHERE n <= %s ORDER BY id", (model, model, max_keys, per_key))).fetchall()
        return [(decode(r[0]), decode(r[1])) for r in rows]
