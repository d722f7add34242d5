"""The default ``Store``: one SQLite file in the data directory.

One connection guarded by a lock; blocking calls run in a worker thread so the event loop
never waits on disk. WAL mode lets the engine (or a CLI) open the same file concurrently.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from structspec.store.base import (
    AcceptanceBuffer,
    AcceptanceTotals,
    SchemaRecord,
    StoreError,
    stats_bucket,
    sum_totals,
)

T = TypeVar("T")

_SCHEMA_VERSION = 1
_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # last_version survives deletes so version numbers are never reused
    "CREATE TABLE IF NOT EXISTS schema_ids (schema_id TEXT PRIMARY KEY, last_version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS schema_versions (
        schema_id TEXT NOT NULL, version INTEGER NOT NULL, schema_json TEXT NOT NULL,
        sha256 TEXT NOT NULL, description TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        source TEXT NOT NULL, PRIMARY KEY (schema_id, version))""",
    "CREATE INDEX IF NOT EXISTS schema_versions_hash ON schema_versions (schema_id, sha256)",
    """CREATE TABLE IF NOT EXISTS acceptance (
        schema_key TEXT NOT NULL, proposer TEXT NOT NULL, batch_bucket INTEGER NOT NULL,
        bucket_start BIGINT NOT NULL, drafted BIGINT NOT NULL, accepted BIGINT NOT NULL,
        events BIGINT NOT NULL, PRIMARY KEY (schema_key, proposer, batch_bucket, bucket_start))""",
    "CREATE INDEX IF NOT EXISTS acceptance_time ON acceptance (bucket_start)",
)
_COLS = "schema_id, version, schema_json, sha256, description, created_at, source"


def _record(row: tuple[Any, ...]) -> SchemaRecord:
    return SchemaRecord(row[0], int(row[1]), row[2], row[3], row[4], float(row[5]), row[6])


class SQLiteStore:
    """``Store`` on a SQLite file (``":memory:"`` for a throwaway one)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._buffer = AcceptanceBuffer()

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

        return await asyncio.to_thread(call)

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
                for stmt in _DDL:
                    c.execute(stmt)
                row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is not None and int(row[0]) > _SCHEMA_VERSION:
                    raise StoreError(f"store {self.path} was written by a newer structspec (schema {row[0]})")
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) ON CONFLICT (key) DO NOTHING",
                    (str(_SCHEMA_VERSION),),
                )
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self._run(migrate)

    async def close(self) -> None:
        if self._conn is None:
            return
        await self.flush()
        with self._lock:
            conn, self._conn = self._conn, None
        conn.close()

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
                    f"INSERT INTO schema_versions ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (rec.schema_id, rec.version, rec.schema_json, rec.sha256, rec.description, rec.created_at, rec.source),
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

    # -- speculation statistics ----------------------------------------------------------------

    def record_acceptance(
        self, schema_key: str, proposer: str, batch_bucket: int, drafted: int, accepted: int, ts: float
    ) -> None:
        self._buffer.add(schema_key, proposer, batch_bucket, drafted, accepted, ts)

    async def flush(self) -> None:
        rows = self._buffer.take()
        if not rows:
            return

        def write(c: sqlite3.Connection) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany(
                    "INSERT INTO acceptance (schema_key, proposer, batch_bucket, bucket_start, drafted, accepted, events) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (schema_key, proposer, batch_bucket, bucket_start) DO UPDATE SET "
                    "drafted = acceptance.drafted + excluded.drafted, accepted = acceptance.accepted + excluded.accepted, "
                    "events = acceptance.events + excluded.events",
                    [(*k, *v) for k, v in rows.items()],
                )
                c.execute("COMMIT")
                self._buffer.committed(rows)  # still under the connection lock: no reader sees them twice
            except BaseException:
                c.execute("ROLLBACK")
                raise

        try:
            await self._run(write)
        except BaseException:
            self._buffer.restore(rows)
            raise

    async def acceptance_totals(
        self, since: float, until: float | None = None, schema_key: str | None = None
    ) -> list[AcceptanceTotals]:
        lo = stats_bucket(since)

        def read(c: sqlite3.Connection) -> list[tuple[Any, ...]]:
            sql = "SELECT schema_key, proposer, batch_bucket, bucket_start, drafted, accepted, events FROM acceptance WHERE bucket_start >= ?"
            args: tuple[Any, ...] = (lo,)
            if schema_key is not None:
                sql, args = sql + " AND schema_key = ?", (*args, schema_key)
            # the unwritten counts are read under the same lock as the table (a flush commits and
            # marks its rows committed inside it), so every count is seen exactly once
            pending = self._buffer.snapshot()
            return c.execute(sql, args).fetchall() + [(*k, *v) for k, v in pending.items()
                                                      if schema_key is None or k[0] == schema_key]

        rows = list(await self._run(read))
        return sum_totals(rows, since, until)

    async def prune_acceptance(self, before: float) -> int:
        cutoff = stats_bucket(before)

        def prune(c: sqlite3.Connection) -> int:
            return c.execute("DELETE FROM acceptance WHERE bucket_start < ?", (cutoff,)).rowcount

        return await self._run(prune)
