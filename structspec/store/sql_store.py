"""What the SQLite and the PostgreSQL stores do alike: ``SQLStore``, over ``statements`` and ``rows``.

Every ``Store`` method is written here once, as statements run on a connection (``Tx``). A subclass gives two
primitives: ``_session`` (run such a function on its connection, in one transaction or not) and ``_snapshot`` (run
it in a read transaction that holds exactly the flushes whose counters the book no longer holds as unwritten), and
does what truly differs: opening and migrating, when a flush writes what, and its own additions to a write or a prune.

The shared code is written as coroutines over ``Tx``: psycopg's statements are awaited on the event loop; SQLite's
never suspend, so the SQLite store runs the same coroutine to its end in its worker thread.

The writing of what a flush took (``Batch``): each batch in a transaction of its own; one the store refuses for its
rows is written again in parts, down to single rows, which are quarantined (``quarantine``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sequence, TypeVar

from structspec.stats.book import Counters, Reload, StatsBook
from structspec.stats.counters import CounterKey, hour_of
from structspec.stats.legacy_keys import Claim, is_tool_key
from structspec.stats.policy_states import PolicyChange
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import TrafficSample
from structspec.store import rows, statements
from structspec.store.base import (BACKLOG_KINDS, SPECULATION_MODES, Backlog, HistoryBuffer, HistoryRow, SchemaRecord,
                                   sum_counters)
from structspec.store.dialect import Dialect
from structspec.store.quarantine import Quarantine, halves, refused
from structspec.store.statements import CHANGE_COLS, SAMPLE_COLS, TRAFFIC_COLS, matching, select
from structspec.store.text import decode

R = TypeVar("R")
S = TypeVar("S", RejectedDraft, TrafficSample)


@dataclass
class Batch:
    """Rows taken from the buffers, written in one transaction: a flush's (or one kind's), or a part of one. Its
    fields are the backlog kinds; ``seq``: its sequence number, where the store numbers its flushes."""

    counters: Counters = field(default_factory=dict)
    history: list[HistoryRow] = field(default_factory=list)
    samples: list[RejectedDraft] = field(default_factory=list)
    traffic: list[TrafficSample] = field(default_factory=list)
    policy_changes: list[PolicyChange] = field(default_factory=list)
    seq: int | None = None

    def size(self) -> int:
        return sum(len(getattr(self, kind)) for kind in BACKLOG_KINDS)

    def parts(self) -> list[Batch]:
        """Smaller batches that make this one (of two rows or more) up: one per kind, or its one kind's halves."""
        kinds = [kind for kind in BACKLOG_KINDS if getattr(self, kind)]
        if len(kinds) > 1:
            return [Batch(**{kind: getattr(self, kind)}) for kind in kinds]
        return [Batch(**{kinds[0]: half}) for half in halves(getattr(self, kinds[0]))]

    def row(self) -> tuple[str, Any]:
        """A one-row batch's (backlog kind, row); a counter's row is its (key, value)."""
        kind = next(kind for kind in BACKLOG_KINDS if getattr(self, kind))
        rows = getattr(self, kind)
        return kind, next(iter(rows.items())) if isinstance(rows, dict) else rows[0]


class Tx(Protocol):
    """Statements (``?`` placeholders) run on one connection, in the transaction ``_session`` opened, if any:
    ``one`` answers the first row of the result (None: none), ``all`` every row, ``run`` the rows it changed;
    ``many`` runs the statement once per row of arguments."""

    async def one(self, sql: str, args: Sequence[Any] = ()) -> rows.Row | None: ...
    async def all(self, sql: str, args: Sequence[Any] = ()) -> list[rows.Row]: ...
    async def run(self, sql: str, args: Sequence[Any] = ()) -> int: ...
    async def many(self, sql: str, args: Iterable[Sequence[Any]]) -> None: ...


def _as_is(row: rows.Row) -> Any:
    return row


def matches(r: Any, model: str | None, schema_key: str | None, proposer: str | None = None) -> bool:
    """Whether a record (a counter key, a sample, a policy change) is of ``model``, ``schema_key`` and ``proposer``
    (None: any)."""
    return ((model is None or r.model == model) and (schema_key is None or r.schema_key == schema_key)
            and (proposer is None or r.proposer == proposer))


def _newest(stored: Iterable[S], unwritten: Iterable[S], model: str | None, schema_key: str | None, limit: int,
            proposer: str | None = None) -> list[S]:
    """The newest ``limit`` of the stored and the matching unwritten samples (an unwritten sample replaces its slot's
    stored one), newest first."""
    merged = {r.key: r for r in stored}
    merged.update({r.key: r for r in unwritten if matches(r, model, schema_key, proposer)})
    return sorted(merged.values(), key=lambda r: r.created_at, reverse=True)[:limit]


class SQLStore:
    """The ``Store`` methods both stores run alike (a subclass sets ``dialect`` and ``refusals``, and implements
    ``_session``, ``_snapshot``, ``flush``, ``open`` and what ``close`` releases)."""

    dialect: Dialect
    refusals: tuple[type[BaseException], ...]  # the driver's errors that say the store refuses a write's rows
    HISTORY_KEEP = statements.HISTORY_KEEP

    def __init__(self, stats: StatsBook | None, history_limit: int):
        self.stats = stats or StatsBook()
        self._history = HistoryBuffer(history_limit)  # appended, not yet written
        self.quarantine = Quarantine()  # rows the store refused

    def _opened(self) -> bool:
        """Whether ``open`` succeeded and ``close`` has not released the connections since."""
        raise NotImplementedError

    async def _release(self) -> None:
        """Close the connections (``close``, after its last flush)."""
        raise NotImplementedError

    async def flush(self) -> None:
        """``Store.flush``: the subclass's."""
        raise NotImplementedError

    async def close(self) -> None:
        if not self._opened():
            return
        try:
            await self.flush()
        finally:  # closed even when the last flush fails (its error still reaches the caller)
            await self._release()

    async def _session(self, fn: Callable[[Tx], Awaitable[R]], atomic: bool = True,
                       then: Callable[[], None] | None = None) -> R:
        """``fn`` run on a connection: in one transaction when ``atomic`` (committed when it returns, rolled back when
        it raises), else each statement alone; ``then`` once it committed, before any read of the counters can
        begin a snapshot. Raises ``StoreError`` (``StoreUnavailable`` when the store cannot be reached)."""
        raise NotImplementedError

    async def _snapshot(self, fn: Callable[[Tx], Awaitable[R]]) -> tuple[R, Reload]:
        """``fn`` run in a read transaction whose snapshot holds exactly the flushes that landed before the book's
        reload began (returned with it: its unwritten counters are exactly those the snapshot lacks). The caller
        ends the reload (``replace_persisted`` or ``cancel_reload``); it is ended here when ``fn`` fails."""
        raise NotImplementedError

    async def _fetch(self, sql: str, args: Sequence[Any] = (), row: Callable[[rows.Row], R] = _as_is) -> list[R]:
        """The rows of one statement run alone, each made a record by ``row``."""
        async def fetch(tx: Tx) -> list[R]:
            return [row(r) for r in await tx.all(sql, args)]

        return await self._session(fetch, atomic=False)

    async def _write(self, batch: Batch) -> None:
        """Write ``batch`` in one transaction, and mark its counters committed once it is."""
        await self._session(lambda tx: self._write_rows(tx, batch), then=lambda: self.stats.committed(batch.counters))

    async def _write_rows(self, tx: Tx, batch: Batch) -> None:
        """What writing ``batch`` runs in its transaction: each kind's statements (``statements.writes``)."""
        for kind in BACKLOG_KINDS:
            if getattr(batch, kind):
                for sql, args in statements.writes(self.dialect, kind, getattr(batch, kind)):
                    await tx.many(sql, args)

    def _unwritten(self, kind: str) -> list[Any]:
        """Rows of a backlog kind taken from their buffer, not yet written, that the store keeps itself."""
        return []

    async def _write_all(self, queue: list[Batch]) -> None:
        """Write ``queue``'s batches in order, each removed once written. One the store refuses for its rows is
        replaced by its parts, down to single rows, which are quarantined; any other failure is raised, the batches
        not written left in ``queue``."""
        while queue:
            batch = queue[0]
            try:
                await self._write(batch)
            except Exception as exc:
                if not refused(exc, self.refusals):
                    raise
                queue.pop(0)  # refused: its transaction rolled back, nothing of it landed
                if batch.size() > 1:
                    parts = batch.parts()
                    self.stats.split(batch.counters, [p.counters for p in parts])
                    queue[0:0] = parts
                else:
                    self.quarantine.add(*batch.row(), exc)
                    self.stats.committed(batch.counters)  # not unwritten any more: quarantined
                continue
            queue.pop(0)

    async def _reload(self, stored: Iterable[tuple[CounterKey, float]], reload: Reload) -> None:
        """``stats.replace_persisted(stored, reload)`` in a worker thread (a week of counters is not built on the
        event loop); the reload ends whatever happens, a cancellation included (the thread then runs to its end)."""
        def replace() -> None:
            try:
                self.stats.replace_persisted(stored, reload)
            finally:
                self.stats.cancel_reload(reload)  # ended already unless something failed

        await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(replace)))

    async def _stored_counters(self, tx: Tx, since_hour: int, model: str | None,
                               schema_key: str | None) -> Iterable[tuple[CounterKey, float]]:
        """The stored counters of ``model`` and ``schema_key`` (None: any) from ``since_hour`` on, made records as
        they are consumed (a week of counters is built where the book is rebuilt, off the event loop)."""
        return map(rows.counter, await tx.all(*statements.counters(since_hour, model, schema_key)))

    async def read_counters(self, since: float, until: float | None = None, model: str | None = None,
                            schema_key: str | None = None) -> Counters:
        stored, reload = await self._snapshot(lambda tx: self._stored_counters(tx, hour_of(since), model, schema_key))
        self.stats.cancel_reload(reload)  # only its unwritten counters are needed
        pending = [(k, v) for k, v in reload.unflushed.items() if matches(k, model, schema_key)]
        return sum_counters([*stored, *pending], since, until)

    async def refresh_stats(self) -> None:
        async def read(tx: Tx) -> tuple[Iterable[tuple[CounterKey, float]], list[rows.Row]]:
            since = hour_of(self.stats.clock() - self.stats.horizon_seconds)
            return await self._stored_counters(tx, since, None, None), await tx.all(statements.LATEST_CHANGES)

        (stored, latest), reload = await self._snapshot(read)
        # built outside every lock (and off the event loop), swapped in under the book's
        await self._reload(stored, reload)
        self.stats.policy.seed([rows.change(r) for r in latest])  # a restarted server knows each proposer's state

    async def prune(self, before: float) -> int:
        return await self._session(lambda tx: self._prune(tx, before))

    async def _prune(self, tx: Tx, before: float) -> int:
        """What ``prune`` runs in its transaction (``statements.PRUNE``); the rows removed."""
        cutoff, removed = hour_of(before), 0
        for sql, by_hour in statements.PRUNE:
            removed += await tx.run(sql, (cutoff if by_hour else before,))
        return removed

    def _buffers(self) -> dict[str, Any]:
        """Each backlog kind's buffer of what was recorded and not yet taken by a flush (counters: the book's)."""
        return {"counters": self.stats, "history": self._history, "samples": self.stats.samples,
                "traffic": self.stats.traffic, "policy_changes": self.stats.policy}

    def backlog(self) -> Backlog:
        buffers, quarantined = self._buffers(), self.quarantine.counts()
        # a kind's waiting rows and those taken, still unwritten (counters: the book counts both)
        unwritten = {kind: len(b.pending()) + len(self._unwritten(kind)) for kind, b in buffers.items()
                     if kind != "counters"}
        return Backlog({"counters": self.stats.unwritten_keys(), **unwritten},
                       {kind: b.dropped for kind, b in buffers.items()},
                       {kind: quarantined.get(kind, 0) for kind in BACKLOG_KINDS})

    async def check(self) -> None:
        await self._fetch("SELECT 1")

    # -- schema registry -------------------------------------------------------------------------

    async def get_schema(self, schema_id: str, version: int | None = None) -> SchemaRecord | None:
        sql, args = ((statements.LATEST_SCHEMA, (schema_id,)) if version is None
                     else (statements.SCHEMA_AT_VERSION, (schema_id, version)))
        found = await self._fetch(sql, args, rows.schema)
        return found[0] if found else None

    async def list_schemas(self, schema_id: str | None = None, all_versions: bool = False) -> list[SchemaRecord]:
        return await self._fetch(*statements.list_schemas(schema_id, all_versions), rows.schema)

    async def put_schema(self, schema_id: str, schema_json: str, sha256: str, description: str, source: str,
                         now: float) -> tuple[SchemaRecord, bool]:
        async def put(tx: Tx) -> tuple[SchemaRecord, bool]:
            await tx.run("INSERT INTO schema_ids (schema_id, last_version) VALUES (?, 0) "
                         "ON CONFLICT (schema_id) DO NOTHING", (schema_id,))
            # the id's row locked (SQLite: the whole file, by its write transaction) serializes registrations of this
            # id across every replica; each statement after it sees what the one before committed
            id_row = await tx.one(f"SELECT last_version FROM schema_ids WHERE schema_id = ?{self.dialect.lock_rows}",
                                  (schema_id,))
            if id_row is None:  # inserted just above when missing
                raise RuntimeError(f"schema id {schema_id!r} has no row in schema_ids")
            (last,) = id_row
            row = await tx.one(statements.SAME_CONTENT, (schema_id, sha256))
            if row is not None:
                return rows.schema(row), False
            rec = SchemaRecord(schema_id, int(last) + 1, schema_json, sha256, description, now, source)
            await tx.run("UPDATE schema_ids SET last_version = ? WHERE schema_id = ?", (rec.version, schema_id))
            await tx.run(statements.INSERT_SCHEMA, rows.schema_row(rec))
            return rec, True

        return await self._session(put)

    async def delete_schema(self, schema_id: str, version: int | None = None) -> list[int]:
        cond, args = (("schema_id = ?", (schema_id,)) if version is None
                      else ("schema_id = ? AND version = ?", (schema_id, version)))

        async def delete(tx: Tx) -> list[int]:
            # locked: of two deletes at once, one finds the versions the other deleted gone
            found = await tx.all(f"SELECT version FROM schema_versions WHERE {cond} ORDER BY version"
                                 f"{self.dialect.lock_rows}", args)
            await tx.run(f"DELETE FROM schema_versions WHERE {cond}", args)
            return [int(r[0]) for r in found]

        return await self._session(delete)

    async def set_schema_speculation(self, schema_id: str, version: int, mode: str) -> SchemaRecord | None:
        if mode not in SPECULATION_MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(SPECULATION_MODES)}, got {mode!r}")

        async def update(tx: Tx) -> SchemaRecord | None:
            await tx.run("UPDATE schema_versions SET speculation = ? WHERE schema_id = ? AND version = ?",
                         (mode, schema_id, version))
            row = await tx.one(statements.SCHEMA_AT_VERSION, (schema_id, version))
            return rows.schema(row) if row else None

        return await self._session(update)

    # -- what schema owners read beside the counters ------------------------------------------------

    async def read_rejected_drafts(self, model: str | None = None, schema_key: str | None = None,
                                   proposer: str | None = None, limit: int = 100) -> list[RejectedDraft]:
        sql, args = select(SAMPLE_COLS, "rejected_drafts", matching(model, schema_key, proposer),
                           "ORDER BY created_at DESC LIMIT ?")
        stored = await self._fetch(sql, [*args, limit], lambda r: rows.sample(self.dialect, r))
        unwritten = self._unwritten("samples") + self.stats.samples.pending()
        return _newest(stored, unwritten, model, schema_key, limit, proposer)

    async def read_traffic_samples(self, model: str | None = None, schema_key: str | None = None,
                                   limit: int = 1000) -> list[TrafficSample]:
        sql, args = select(TRAFFIC_COLS, "traffic_samples", matching(model, schema_key),
                           "ORDER BY created_at DESC LIMIT ?")
        stored = await self._fetch(sql, [*args, limit], lambda r: rows.traffic(self.dialect, r))
        unwritten = self._unwritten("traffic") + self.stats.traffic.pending()
        return _newest(stored, unwritten, model, schema_key, limit)

    async def read_policy_changes(self, model: str | None = None, schema_key: str | None = None) -> list[PolicyChange]:
        sql, args = select(CHANGE_COLS, "policy_changes", matching(model, schema_key), "ORDER BY at, id")
        stored = await self._fetch(sql, args, rows.change)
        unwritten = self._unwritten("policy_changes") + self.stats.policy.pending()
        return stored + [r for r in unwritten if matches(r, model, schema_key)]

    # -- schema history ------------------------------------------------------------------------

    def append_history(self, model: str, history_key: str, text: str, now: float) -> None:
        self._history.append(model, history_key, text, now)

    async def claim(self, found: Callable[[Iterable[str]], list[Claim]]) -> list[Claim]:
        async def move(tx: Tx) -> list[Claim]:
            done = found(r[0] for r in await tx.all(statements.STORED_MODELS))
            for c in done:
                for table in statements.CLAIMED_TABLES:
                    await tx.all(statements.LOCK_MODEL.format(table) + self.dialect.lock_rows, (c.old,))
                for table, sql in statements.MOVE_STATISTICS:
                    await tx.run(sql, (c.statistics, c.old))
                    await tx.run(statements.DELETE_MODEL.format(table), (c.old,))
                for (stored,) in await tx.all(statements.HISTORY_KEYS, (c.old,)):
                    await tx.run(statements.MOVE_HISTORY, (c.tool_history if is_tool_key(decode(stored)) else c.history,
                                                           c.old, stored))
            return done

        return await self._session(move)

    async def load_history(self, model: str, per_key: int, max_keys: int) -> list[tuple[str, str]]:
        return await self._fetch(statements.LOAD_HISTORY, (model, model, max_keys, per_key),
                                 lambda r: (decode(r[0]), decode(r[1])))
