"""The PostgreSQL store's tables' creation and migration at start, under an advisory lock.

Several replicas may start at once against one database. ``migrate`` runs in one transaction
that first takes a transaction-scoped advisory lock (``pg_advisory_xact_lock``), so the replicas
take turns: the first creates the tables (or migrates them) and commits, the others then find
the schema current and change nothing. DDL is transactional in PostgreSQL, so a replica that
dies midway leaves the schema as it was.

The tables are ``statements.tables`` and ``flush_marks``. Version numbers are the SQLite store's
(``sqlite.py``): version 3 holds the same tables (the registry, hourly counters, the schema
history, rejected-draft samples, the policy's changes) plus ``flush_marks``, which makes a flush
land exactly once; version 4 adds the traffic samples; version 5 keys each reservoir slot by its
writer too and stores callers' text through ``text.encode`` (a value stored before that starts
with ``text.MARK`` is encoded by the migration).
A later version adds its statements to ``MIGRATIONS`` under the version it migrates from, and
raises ``SCHEMA_VERSION``.
"""

from __future__ import annotations

from typing import Any

from structspec.store import statements
from structspec.store.base import StoreError
from structspec.store.dialect import POSTGRES
from structspec.store.text import ENCODED_COLUMNS, MARK

SCHEMA_VERSION = statements.SCHEMA_VERSION
# The advisory lock's key: any constant 64-bit integer that no other application on the database uses for its own
# lock ('stsp' in ASCII).
MIGRATION_LOCK = 0x73747370

TRAFFIC_DDL_4 = """CREATE TABLE traffic_samples (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, hour BIGINT NOT NULL, slot INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, prompt_tokens INTEGER[] NOT NULL, output_tokens INTEGER[] NOT NULL,
        finish TEXT NOT NULL, PRIMARY KEY (model, schema_key, hour, slot))"""
DDL = (
    *statements.tables(POSTGRES),
    # per replica process: the sequence number of its latest flush that landed (a retried flush whose number is
    # not above it had landed already: its commit was not acknowledged)
    "CREATE TABLE flush_marks (replica TEXT PRIMARY KEY, batch BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL)",
)
_MARK_SQL = f"chr({ord(MARK)})"


def _writer_in_key(table: str, key: str) -> tuple[str, ...]:
    """Version 4 -> 5 of one reservoir table: its rows written before are writer ''."""
    return (f"ALTER TABLE {table} ADD COLUMN writer TEXT NOT NULL DEFAULT ''",
            f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey",
            f"ALTER TABLE {table} ADD PRIMARY KEY ({key}, hour, writer, slot)")


# version -> the statements that migrate a store of that version to the next one
MIGRATIONS: dict[int, tuple[str, ...]] = {
    3: (TRAFFIC_DDL_4,),
    4: (*_writer_in_key("rejected_drafts", "model, schema_key, proposer"),
        *_writer_in_key("traffic_samples", "model, schema_key"),
        *(f"UPDATE {table} SET {column} = {_MARK_SQL} || to_json({column})::text WHERE left({column}, 1) = {_MARK_SQL}"
          for table, column in ENCODED_COLUMNS)),
}


async def migrate(conn: Any, where: str) -> tuple[int | None, int]:
    """Create or migrate the tables on ``conn`` (a psycopg ``AsyncConnection`` in autocommit mode), under the
    migration lock; (the version found, None for an empty database; the version now). ``where`` names the database
    in errors. Raises ``StoreError`` for a store written by a newer structspec (nothing is changed)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(statements.META)
        row = await (await conn.execute(statements.READ_VERSION)).fetchone()
        found = int(row[0]) if row is not None else None
        if found is not None and found > SCHEMA_VERSION:
            raise StoreError(f"store {where} was written by a newer structspec (schema {found}; this one knows "
                             f"{SCHEMA_VERSION})")
        if found == SCHEMA_VERSION:
            return found, found
        if found is None:
            steps: tuple[str, ...] = DDL
        else:
            missing = [v for v in range(found, SCHEMA_VERSION) if v not in MIGRATIONS]
            if missing:
                raise StoreError(f"store {where} is at schema {found}, which this structspec cannot migrate")
            steps = tuple(stmt for v in range(found, SCHEMA_VERSION) for stmt in MIGRATIONS[v])
        for stmt in steps:
            await conn.execute(stmt)
        await conn.execute(POSTGRES.sql(statements.WRITE_VERSION), (str(SCHEMA_VERSION),))
        return found, SCHEMA_VERSION
