"""The default ``Store``: one SQLite file in the data directory.

One connection guarded by a lock; blocking calls run in a worker thread so the event loop
never waits on disk. WAL mode lets the engine (or a CLI) open the same file concurrently, and
lets the statistics' long reads (``refresh_stats``, ``read_counters``) run on a second
connection (``_reader``) in a snapshot, so a flush never waits on them.
Callers' and the model's text goes through ``text.encode``/``decode`` as in the PostgreSQL store,
so a row means the same in both. Each kind of statistics is written in a transaction of its own;
rows the file refuses (``quarantine``) hold back neither the other kinds nor the rows behind them.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from structspec.stats.book import Counters, Reload, StatsBook
from structspec.stats.counters import CounterKey, Series, hour_of
from structspec.stats.policy_states import KEEP_PER_KEY as CHANGES_KEEP
from structspec.stats.policy_states import PolicyChange
from structspec.stats.samples import KEEP_PER_KEY as SAMPLES_KEEP
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import KEEP_PER_KEY as TRAFFIC_KEEP
from structspec.stats.traffic import TrafficSample
from structspec.store.base import (SPECULATION_MODES, Backlog, SchemaRecord, StoreError, backlog_of, newest_samples,
                                   reload_book, sum_counters)
from structspec.store.history_buffer import HistoryBuffer, HistoryRow
from structspec.store.quarantine import Quarantine, halves, refused
from structspec.store.text import ENCODED_COLUMNS, MARK, decode, encode

T = TypeVar("T")
P = TypeVar("P", list, dict)

# what sqlite3 raises when it refuses a statement's values (not when the file cannot be written)
_REFUSALS = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError)
_SCHEMA_VERSION = 5
_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # last_version survives deletes so version numbers are never reused
    "CREATE TABLE IF NOT EXISTS schema_ids (schema_id TEXT PRIMARY KEY, last_version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS schema_versions (
        schema_id TEXT NOT NULL, version INTEGER NOT NULL, schema_json TEXT NOT NULL,
        sha256 TEXT NOT NULL, description TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        source TEXT NOT NULL, speculation TEXT NOT NULL DEFAULT 'auto', PRIMARY KEY (schema_id, version))""",
    "CREATE INDEX IF NOT EXISTS schema_versions_hash ON schema_versions (schema_id, sha256)",
    """CREATE TABLE IF NOT EXISTS counters (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, hour BIGINT NOT NULL, series TEXT NOT NULL,
        proposer TEXT NOT NULL, batch_bucket INTEGER NOT NULL, label TEXT NOT NULL, value DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (model, schema_key, hour, series, proposer, batch_bucket, label))""",
    "CREATE INDEX IF NOT EXISTS counters_hour ON counters (hour)",
    """CREATE TABLE IF NOT EXISTS history (
        id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL, history_key TEXT NOT NULL,
        text TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS history_by_key ON history (model, history_key, id)",
    # a reservoir of rejected drafts per (model, schema, proposer, hour, writer); token lists as JSON arrays
    """CREATE TABLE IF NOT EXISTS rejected_drafts (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, proposer TEXT NOT NULL, hour BIGINT NOT NULL,
        slot INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL, batch_bucket INTEGER NOT NULL,
        context_tokens TEXT NOT NULL, context_text TEXT NOT NULL, draft_tokens TEXT NOT NULL, draft_text TEXT NOT NULL,
        position INTEGER NOT NULL, rejected_token INTEGER NOT NULL, rejected_text TEXT NOT NULL,
        target_token INTEGER NOT NULL, target_text TEXT NOT NULL, grammatical INTEGER NOT NULL,
        writer TEXT NOT NULL DEFAULT '', PRIMARY KEY (model, schema_key, proposer, hour, writer, slot))""",
    """CREATE TABLE IF NOT EXISTS policy_changes (
        id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL, schema_key TEXT NOT NULL, proposer TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL, previous TEXT NOT NULL,
        batch_bucket INTEGER NOT NULL, acceptance DOUBLE PRECISION, threshold DOUBLE PRECISION)""",
    "CREATE INDEX IF NOT EXISTS policy_changes_by_key ON policy_changes (model, schema_key, proposer, at)",
    # a reservoir of completed requests per (model, schema, hour, writer): prompt and output ids as JSON arrays
    """CREATE TABLE IF NOT EXISTS traffic_samples (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, hour BIGINT NOT NULL, slot INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, prompt_tokens TEXT NOT NULL, output_tokens TEXT NOT NULL,
        finish TEXT NOT NULL, writer TEXT NOT NULL DEFAULT '', PRIMARY KEY (model, schema_key, hour, writer, slot))""",
)
_RESERVOIRS = {table: next(d for d in _DDL if f"TABLE IF NOT EXISTS {table} " in d)
               for table in ("rejected_drafts", "traffic_samples")}  # their DDL
_COLS = "schema_id, version, schema_json, sha256, description, created_at, source, speculation"
_COUNTER_COLS = "model, schema_key, hour, series, proposer, batch_bucket, label"
UNKNOWN_MODEL = "unknown"  # statistics written before they were keyed by model


def _migrate_from_1(c: sqlite3.Connection) -> None:
    """Version 1 kept per-minute drafting counts per (schema, proposer, batch bucket), not keyed by model:
    they become hourly counters of model ``unknown``; schema versions get the drafting override."""
    c.execute("ALTER TABLE schema_versions ADD COLUMN speculation TEXT NOT NULL DEFAULT 'auto'")
    if c.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'acceptance'").fetchone():
        for series, column in ((Series.DRAFTED, "drafted"), (Series.ACCEPTED, "accepted"),
                               (Series.VERIFICATIONS, "events")):
            c.execute(
                f"INSERT INTO counters ({_COUNTER_COLS}, value) SELECT ?, schema_key, (bucket_start / 3600) * 3600, ?, "
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
        c.execute(f"UPDATE {table} SET {column} = char(?) || json_quote({column}) WHERE substr({column}, 1, 1) = char(?)",
                  (ord(MARK), ord(MARK)))


_SAMPLE_COLS = ("model, schema_key, proposer, hour, slot, created_at, batch_bucket, context_tokens, context_text, "
                "draft_tokens, draft_text, position, rejected_token, rejected_text, target_token, target_text, grammatical, "
                "writer")
_CHANGE_COLS = "model, schema_key, proposer, at, state, reason, previous, batch_bucket, acceptance, threshold"
_TRAFFIC_COLS = "model, schema_key, hour, slot, created_at, prompt_tokens, output_tokens, finish, writer"


def _sample_row(r: RejectedDraft) -> tuple[Any, ...]:
    return (r.model, r.schema_key, r.proposer, r.hour, r.slot, r.created_at, r.batch_bucket, json.dumps(r.context_tokens),
            encode(r.context_text), json.dumps(r.draft_tokens), encode(r.draft_text), r.position, r.rejected_token,
            encode(r.rejected_text), r.target_token, encode(r.target_text), int(r.grammatical), r.writer)


def _sample(row: tuple[Any, ...]) -> RejectedDraft:
    return RejectedDraft(row[0], row[1], row[2], int(row[3]), int(row[4]), float(row[5]), int(row[6]),
                         tuple(json.loads(row[7])), decode(row[8]), tuple(json.loads(row[9])), decode(row[10]),
                         int(row[11]), int(row[12]), decode(row[13]), int(row[14]), decode(row[15]), bool(row[16]),
                         row[17])


def _traffic_row(r: TrafficSample) -> tuple[Any, ...]:
    return (r.model, r.schema_key, r.hour, r.slot, r.created_at, json.dumps(r.prompt_tokens),
            json.dumps(r.output_tokens), r.finish, r.writer)


def _traffic(row: tuple[Any, ...]) -> TrafficSample:
    return TrafficSample(row[0], row[1], int(row[2]), int(row[3]), float(row[4]), tuple(json.loads(row[5])),
                         tuple(json.loads(row[6])), row[7], row[8])


def _change(row: tuple[Any, ...]) -> PolicyChange:
    return PolicyChange(row[0], row[1], row[2], float(row[3]), row[4], row[5], row[6], int(row[7]),
                        None if row[8] is None else float(row[8]), None if row[9] is None else float(row[9]))


def _matches(item: RejectedDraft | PolicyChange, model: str | None, schema_key: str | None) -> bool:
    return (model is None or item.model == model) and (schema_key is None or item.schema_key == schema_key)


def _record(row: tuple[Any, ...]) -> SchemaRecord:
    return SchemaRecord(row[0], int(row[1]), decode(row[2]), row[3], decode(row[4]), float(row[5]), row[6], row[7])


class SQLiteStore:
    """``Store`` on a SQLite file (``":memory:"`` for a throwaway one)."""

    def __init__(self, path: str | Path, stats: StatsBook | None = None, history_limit: int = 100_000):
        self.path = str(path)
        self.stats = stats or StatsBook()
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._history = HistoryBuffer(history_limit)  # appended, not yet written
        self._reader: sqlite3.Connection | None = None  # a file's second connection, for the long reads
        self._reader_lock = threading.Lock()
        self.quarantine = Quarantine()  # rows the file refused

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
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute(_DDL[0])
                row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                found = int(row[0]) if row is not None else None
                if found is not None and found > _SCHEMA_VERSION:
                    raise StoreError(f"store {self.path} was written by a newer structspec (schema {found})")
                for stmt in _DDL[1:]:
                    c.execute(stmt)
                if found == 1:
                    _migrate_from_1(c)
                if found is not None and found < 5:
                    _migrate_to_5(c)
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(_SCHEMA_VERSION),),
                )
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

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

    async def close(self) -> None:
        if self._conn is None:
            return
        try:
            await self.flush()
        finally:  # closed even when the last flush fails (its error still reaches the caller)
            with self._lock:
                conn, self._conn = self._conn, None
            with self._reader_lock:
                reader, self._reader = self._reader, None
            for c in (conn, reader):
                if c is not None:
                    c.close()

    async def check(self) -> None:
        await self._run(lambda c: c.execute("SELECT 1").fetchone())

    # -- schema registry -----------------------------------------------------------------------

    async def put_schema(
        self, schema_id: str, schema_json: str, sha256: str, description: str, source: str, now: float
    ) -> tuple[SchemaRecord, bool]:
        def put(c: sqlite3.Connection) -> tuple[SchemaRecord, bool]:
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute(
                    f"SELECT {_COLS} FROM schema_versions WHERE schema_id = ? AND sha256 = ? ORDER BY version LIMIT 1",
                    (schema_id, sha256),
                ).fetchone()
                if row is not None:
                    c.execute("COMMIT")
                    return _record(row), False
                c.execute(
                    "INSERT INTO schema_ids (schema_id, last_version) VALUES (?, 1) "
                    "ON CONFLICT (schema_id) DO UPDATE SET last_version = schema_ids.last_version + 1",
                    (schema_id,),
                )
                (version,) = c.execute("SELECT last_version FROM schema_ids WHERE schema_id = ?", (schema_id,)).fetchone()
                rec = SchemaRecord(schema_id, int(version), schema_json, sha256, description, now, source)
                c.execute(
                    f"INSERT INTO schema_versions ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (rec.schema_id, rec.version, encode(rec.schema_json), rec.sha256, encode(rec.description),
                     rec.created_at, rec.source, rec.speculation),
                )
                c.execute("COMMIT")
                return rec, True
            except BaseException:
                c.execute("ROLLBACK")
                raise

        return await self._run(put)

    async def get_schema(self, schema_id: str, version: int | None = None) -> SchemaRecord | None:
        def get(c: sqlite3.Connection) -> SchemaRecord | None:
            if version is None:
                sql, args = f"SELECT {_COLS} FROM schema_versions WHERE schema_id = ? ORDER BY version DESC LIMIT 1", (schema_id,)
            else:
                sql, args = f"SELECT {_COLS} FROM schema_versions WHERE schema_id = ? AND version = ?", (schema_id, version)
            row = c.execute(sql, args).fetchone()
            return _record(row) if row else None

        return await self._run(get)

    async def list_schemas(self, schema_id: str | None = None, all_versions: bool = False) -> list[SchemaRecord]:
        def list_(c: sqlite3.Connection) -> list[SchemaRecord]:
            where, args = ("WHERE v.schema_id = ?", (schema_id,)) if schema_id else ("", ())
            if not all_versions:
                latest = "v.version = (SELECT MAX(w.version) FROM schema_versions w WHERE w.schema_id = v.schema_id)"
                where = f"{where} AND {latest}" if where else f"WHERE {latest}"
            cols = ", ".join(f"v.{c.strip()}" for c in _COLS.split(","))
            rows = c.execute(f"SELECT {cols} FROM schema_versions v {where} ORDER BY v.schema_id, v.version", args)
            return [_record(r) for r in rows.fetchall()]

        return await self._run(list_)

    async def delete_schema(self, schema_id: str, version: int | None = None) -> list[int]:
        def delete(c: sqlite3.Connection) -> list[int]:
            c.execute("BEGIN IMMEDIATE")
            try:
                cond, args = ("schema_id = ?", (schema_id,)) if version is None else ("schema_id = ? AND version = ?", (schema_id, version))
                versions = [int(r[0]) for r in c.execute(f"SELECT version FROM schema_versions WHERE {cond} ORDER BY version", args)]
                c.execute(f"DELETE FROM schema_versions WHERE {cond}", args)
                c.execute("COMMIT")
                return versions
            except BaseException:
                c.execute("ROLLBACK")
                raise

        return await self._run(delete)

    async def set_schema_speculation(self, schema_id: str, version: int, mode: str) -> SchemaRecord | None:
        if mode not in SPECULATION_MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(SPECULATION_MODES)}, got {mode!r}")

        def update(c: sqlite3.Connection) -> SchemaRecord | None:
            c.execute("UPDATE schema_versions SET speculation = ? WHERE schema_id = ? AND version = ?",
                      (mode, schema_id, version))
            row = c.execute(f"SELECT {_COLS} FROM schema_versions WHERE schema_id = ? AND version = ?",
                            (schema_id, version)).fetchone()
            return _record(row) if row else None

        return await self._run(update)

    # -- statistics ----------------------------------------------------------------------------

    async def flush(self) -> None:
        # a failed write of one kind does not hold the others back (the first error is raised)
        try:
            await self._flush_history()
        finally:
            try:
                await self._flush_samples()
            finally:
                try:
                    await self._flush_traffic()
                finally:
                    try:
                        await self._flush_changes()
                    finally:
                        await self._flush_counters()

    async def _write_parts(self, kind: str, rows: P, write: Callable[[sqlite3.Connection, P], None],
                           restore: Callable[[P], None], split: Callable[[P, tuple[P, P]], None] = lambda p, h: None,
                           refuse: Callable[[P], None] = lambda p: None) -> None:
        """Write ``rows`` (taken from their buffer) with ``write``, one transaction a call. A write the file refuses
        for its rows is written again in halves (``split`` told) until each refused row is alone: that one is
        quarantined (``refuse`` told), the others written. When the file cannot be written, what is not written yet
        is ``restore``d and the error raised."""
        pending = [rows]
        try:
            while pending:
                part = pending[0]
                try:
                    await self._run(lambda c, part=part: write(c, part))
                except Exception as exc:
                    if not refused(exc, _REFUSALS):
                        raise
                    pending.pop(0)
                    if len(part) > 1:
                        pending[0:0] = halves(part)
                        split(part, (pending[0], pending[1]))
                    else:
                        self.quarantine.add(kind, next(iter(part.items())) if isinstance(part, dict) else part[0], exc)
                        refuse(part)
                    continue
                pending.pop(0)
        except BaseException:
            if isinstance(rows, dict):
                for part in pending:
                    restore(part)
            elif pending:
                restore([r for part in pending for r in part])  # one call: they keep their order
            raise

    async def _flush_counters(self) -> None:
        rows = self.stats.take()
        if not rows:
            return

        def write(c: sqlite3.Connection, part: Counters) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany(
                    f"INSERT INTO counters ({_COUNTER_COLS}, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    f"ON CONFLICT ({_COUNTER_COLS}) DO UPDATE SET value = counters.value + excluded.value",
                    [(k.model, k.schema_key, k.hour, k.series, k.proposer, k.batch_bucket, k.label, v)
                     for k, v in part.items()],
                )
                c.execute("COMMIT")
                self.stats.committed(part)  # still under the connection lock: no reader sees them twice
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self._write_parts("counters", rows, write, self.stats.restore, self.stats.split, self.stats.committed)

    def _select(self, c: sqlite3.Connection, since_hour: int, model: str | None,
                schema_key: str | None) -> list[tuple[CounterKey, float]]:
        sql, args = f"SELECT {_COUNTER_COLS}, value FROM counters WHERE hour >= ?", [since_hour]
        for column, value in (("model", model), ("schema_key", schema_key)):
            if value is not None:
                sql += f" AND {column} = ?"
                args.append(value)
        return [(CounterKey(r[0], r[1], int(r[2]), r[3], r[4], int(r[5]), r[6]), float(r[7]))
                for r in c.execute(sql, args).fetchall()]

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
        pending = [(k, v) for k, v in reload.unflushed.items()
                   if (model is None or k.model == model) and (schema_key is None or k.schema_key == schema_key)]
        return sum_counters(stored + pending, since, until)

    async def refresh_stats(self) -> None:
        def read(c: sqlite3.Connection) -> tuple[list[tuple[CounterKey, float]], list[PolicyChange]]:
            latest = c.execute(
                f"SELECT {_CHANGE_COLS} FROM policy_changes p WHERE id = (SELECT MAX(id) FROM policy_changes q WHERE "
                "q.model = p.model AND q.schema_key = p.schema_key AND q.proposer = p.proposer)").fetchall()
            stored = self._select(c, hour_of(self.stats.clock() - self.stats.horizon_seconds), None, None)
            return stored, [_change(r) for r in latest]

        (stored, latest), reload = await self._snapshot(read)
        # built outside every lock (and off the event loop), swapped in under the book's
        await reload_book(self.stats, lambda: stored, reload)
        self.stats.policy.seed(latest)  # a restarted server knows each proposer's state

    async def prune(self, before: float) -> int:
        cutoff = hour_of(before)

        def prune(c: sqlite3.Connection) -> int:
            n = c.execute("DELETE FROM counters WHERE hour < ?", (cutoff,)).rowcount
            n += c.execute("DELETE FROM rejected_drafts WHERE hour < ?", (cutoff,)).rowcount
            n += c.execute("DELETE FROM traffic_samples WHERE hour < ?", (cutoff,)).rowcount
            n += c.execute("DELETE FROM history WHERE created_at < ?", (before,)).rowcount
            # every change past retention but each key's newest: a state that has not changed since is still its state
            return n + c.execute("DELETE FROM policy_changes WHERE at < ? AND id <> (SELECT MAX(q.id) FROM policy_changes q "
                                 "WHERE q.model = policy_changes.model AND q.schema_key = policy_changes.schema_key "
                                 "AND q.proposer = policy_changes.proposer)", (before,)).rowcount

        return await self._run(prune)

    # -- rejected drafts and the policy's changes ---------------------------------------------------

    async def _flush_samples(self) -> None:
        rows = self.stats.samples.take()
        if not rows:
            return

        def write(c: sqlite3.Connection, part: list[RejectedDraft]) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                marks = ", ".join("?" * len(_sample_row(part[0])))
                c.executemany(f"INSERT OR REPLACE INTO rejected_drafts ({_SAMPLE_COLS}) VALUES ({marks})",
                              [_sample_row(r) for r in part])
                for model, key, proposer in {(r.model, r.schema_key, r.proposer) for r in part}:
                    c.execute("DELETE FROM rejected_drafts WHERE model = ? AND schema_key = ? AND proposer = ? AND "
                              "(hour, writer, slot) NOT IN (SELECT hour, writer, slot FROM rejected_drafts WHERE "
                              "model = ? AND schema_key = ? AND proposer = ? ORDER BY hour DESC, created_at DESC LIMIT ?)",
                              (model, key, proposer, model, key, proposer, SAMPLES_KEEP))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self._write_parts("samples", rows, write, self.stats.samples.restore)

    async def _flush_traffic(self) -> None:
        rows = self.stats.traffic.take()
        if not rows:
            return

        def write(c: sqlite3.Connection, part: list[TrafficSample]) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany(f"INSERT OR REPLACE INTO traffic_samples ({_TRAFFIC_COLS}) VALUES "
                              "(?, ?, ?, ?, ?, ?, ?, ?, ?)", [_traffic_row(r) for r in part])
                for model, key in {(r.model, r.schema_key) for r in part}:
                    c.execute("DELETE FROM traffic_samples WHERE model = ? AND schema_key = ? AND (hour, writer, slot) "
                              "NOT IN (SELECT hour, writer, slot FROM traffic_samples WHERE model = ? AND schema_key = ? "
                              "ORDER BY hour DESC, created_at DESC LIMIT ?)", (model, key, model, key, TRAFFIC_KEEP))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self._write_parts("traffic", rows, write, self.stats.traffic.restore)

    async def read_traffic_samples(self, model: str | None = None, schema_key: str | None = None,
                                   limit: int = 1000) -> list[TrafficSample]:
        def read(c: sqlite3.Connection) -> list[TrafficSample]:
            sql, args = f"SELECT {_TRAFFIC_COLS} FROM traffic_samples WHERE 1 = 1", []
            for column, value in (("model", model), ("schema_key", schema_key)):
                if value is not None:
                    sql += f" AND {column} = ?"
                    args.append(value)
            rows = c.execute(sql + " ORDER BY created_at DESC LIMIT ?", [*args, limit]).fetchall()
            return [_traffic(r) for r in rows]

        return newest_samples(await self._run(read), self.stats.traffic.pending(), model, schema_key, limit)

    async def _flush_changes(self) -> None:
        rows = self.stats.policy.take()
        if not rows:
            return

        def write(c: sqlite3.Connection, part: list[PolicyChange]) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany(f"INSERT INTO policy_changes ({_CHANGE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              [(r.model, r.schema_key, r.proposer, r.at, r.state, r.reason, r.previous, r.batch_bucket,
                                r.acceptance, r.threshold) for r in part])
                for model, key, proposer in {r.key for r in part}:
                    c.execute("DELETE FROM policy_changes WHERE model = ? AND schema_key = ? AND proposer = ? AND id "
                              "NOT IN (SELECT id FROM policy_changes WHERE model = ? AND schema_key = ? AND proposer = ? "
                              "ORDER BY id DESC LIMIT ?)", (model, key, proposer, model, key, proposer, CHANGES_KEEP))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self._write_parts("policy_changes", rows, write, self.stats.policy.restore)

    async def read_rejected_drafts(self, model: str | None = None, schema_key: str | None = None,
                                   proposer: str | None = None, limit: int = 100) -> list[RejectedDraft]:
        def read(c: sqlite3.Connection) -> list[RejectedDraft]:
            sql, args = f"SELECT {_SAMPLE_COLS} FROM rejected_drafts WHERE 1 = 1", []
            for column, value in (("model", model), ("schema_key", schema_key), ("proposer", proposer)):
                if value is not None:
                    sql += f" AND {column} = ?"
                    args.append(value)
            rows = c.execute(sql + " ORDER BY created_at DESC LIMIT ?", [*args, limit]).fetchall()
            return [_sample(r) for r in rows]

        stored = await self._run(read)
        pending = [r for r in self.stats.samples.pending()
                   if _matches(r, model, schema_key) and (proposer is None or r.proposer == proposer)]
        merged = {r.key: r for r in stored}
        merged.update({r.key: r for r in pending})  # an unwritten sample replaces its slot's stored one
        return sorted(merged.values(), key=lambda r: r.created_at, reverse=True)[:limit]

    async def read_policy_changes(self, model: str | None = None, schema_key: str | None = None) -> list[PolicyChange]:
        def read(c: sqlite3.Connection) -> list[PolicyChange]:
            sql, args = f"SELECT {_CHANGE_COLS} FROM policy_changes WHERE 1 = 1", []
            for column, value in (("model", model), ("schema_key", schema_key)):
                if value is not None:
                    sql += f" AND {column} = ?"
                    args.append(value)
            return [_change(r) for r in c.execute(sql + " ORDER BY at, id", args).fetchall()]

        stored = await self._run(read)
        return stored + [r for r in self.stats.policy.pending() if _matches(r, model, schema_key)]

    # -- schema history ------------------------------------------------------------------------

    HISTORY_KEEP = 64  # outputs kept per (model, key): the history proposer's own bound

    def append_history(self, model: str, history_key: str, text: str, now: float) -> None:
        self._history.append(model, history_key, text, now)

    def backlog(self) -> Backlog:
        return backlog_of(self.stats, self._history, self.quarantine.counts())

    async def _flush_history(self) -> None:
        rows = self._history.take()
        if not rows:
            return

        def write(c: sqlite3.Connection, part: list[HistoryRow]) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                encoded = [(m, encode(k), encode(t), at) for m, k, t, at in part]
                c.executemany("INSERT INTO history (model, history_key, text, created_at) VALUES (?, ?, ?, ?)", encoded)
                for model, key in {(m, k) for m, k, _, _ in encoded}:
                    c.execute("DELETE FROM history WHERE model = ? AND history_key = ? AND id NOT IN (SELECT id FROM "
                              "history WHERE model = ? AND history_key = ? ORDER BY id DESC LIMIT ?)",
                              (model, key, model, key, self.HISTORY_KEEP))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self._write_parts("history", rows, write, self._history.restore)

    async def load_history(self, model: str, per_key: int, max_keys: int) -> list[tuple[str, str]]:
        def read(c: sqlite3.Connection) -> list[tuple[str, str]]:
            keys = [r[0] for r in c.execute(
                "SELECT history_key FROM history WHERE model = ? GROUP BY history_key ORDER BY MAX(id) DESC LIMIT ?",
                (model, max_keys))]
            out: list[tuple[int, str, str]] = []
            for key in keys:
                out += [(int(r[0]), key, r[1]) for r in c.execute(
                    "SELECT id, text FROM history WHERE model = ? AND history_key = ? ORDER BY id DESC LIMIT ?",
                    (model, key, per_key))]
            return [(decode(key), decode(text)) for _, key, text in sorted(out)]

        return await self._run(read)
