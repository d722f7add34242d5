"""The stores' tables and statements, written once for SQLite and PostgreSQL (``?`` placeholders; ``dialect``).

``tables``: the DDL of the current schema version. ``writes``: what a flush runs for one kind of rows (the rows,
then each key's keep-newest delete: a table holds the newest ``KEEP`` rows per key). ``PRUNE``: what ``prune``
deletes. A store executes them through its own connection (``Dialect.sql`` for its placeholders).
"""

from __future__ import annotations

from typing import Any, Callable

from structspec.stats.book import Counters
from structspec.stats.policy_states import KEEP_PER_KEY as CHANGES_KEEP
from structspec.stats.samples import KEEP_PER_KEY as SAMPLES_KEEP
from structspec.stats.traffic import KEEP_PER_KEY as TRAFFIC_KEEP
from structspec.store import rows
from structspec.store.dialect import Dialect

SCHEMA_VERSION = 5  # of the tables below (``sqlite`` and ``postgres_schema`` migrate older ones)
HISTORY_KEEP = 64  # outputs kept per (model, key): the history proposer's own bound
SCHEMA_COLS = "schema_id, version, schema_json, sha256, description, created_at, source, speculation"
COUNTER_COLS = "model, schema_key, hour, series, proposer, batch_bucket, label"
SAMPLE_COLS = ("model, schema_key, proposer, hour, slot, created_at, batch_bucket, context_tokens, context_text, "
               "draft_tokens, draft_text, position, rejected_token, rejected_text, target_token, target_text, "
               "grammatical, writer")
CHANGE_COLS = "model, schema_key, proposer, at, state, reason, previous, batch_bucket, acceptance, threshold"
TRAFFIC_COLS = "model, schema_key, hour, slot, created_at, prompt_tokens, output_tokens, finish, writer"
HISTORY_COLS = "model, history_key, text, created_at"
ADD_VALUE = "value = counters.value + excluded.value"  # a counter's upsert: counters are sums


META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
READ_VERSION = "SELECT value FROM meta WHERE key = 'schema_version'"
WRITE_VERSION = ("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                 "ON CONFLICT (key) DO UPDATE SET value = excluded.value")


def tables(d: Dialect) -> tuple[str, ...]:
    """The tables and indexes of the current schema version (``meta`` apart)."""
    table, index = d.create.format("TABLE"), d.create.format("INDEX")
    return (
        # last_version survives deletes so version numbers are never reused
        f"{table} schema_ids (schema_id TEXT PRIMARY KEY, last_version INTEGER NOT NULL)",
        f"""{table} schema_versions (
        schema_id TEXT NOT NULL, version INTEGER NOT NULL, schema_json TEXT NOT NULL,
        sha256 TEXT NOT NULL, description TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        source TEXT NOT NULL, speculation TEXT NOT NULL DEFAULT 'auto', PRIMARY KEY (schema_id, version))""",
        f"{index} schema_versions_hash ON schema_versions (schema_id, sha256)",
        f"""{table} counters (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, hour BIGINT NOT NULL, series TEXT NOT NULL,
        proposer TEXT NOT NULL, batch_bucket INTEGER NOT NULL, label TEXT NOT NULL, value DOUBLE PRECISION NOT NULL,
        PRIMARY KEY ({COUNTER_COLS}))""",
        f"{index} counters_hour ON counters (hour)",
        f"""{table} history (id {d.id_column}, model TEXT NOT NULL, history_key TEXT NOT NULL,
        text TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
        f"{index} history_by_key ON history (model, history_key, id)",
        # a reservoir of rejected drafts per (model, schema, proposer, hour, writer)
        f"""{table} rejected_drafts (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, proposer TEXT NOT NULL, hour BIGINT NOT NULL,
        slot INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL, batch_bucket INTEGER NOT NULL,
        context_tokens {d.array_type} NOT NULL, context_text TEXT NOT NULL, draft_tokens {d.array_type} NOT NULL,
        draft_text TEXT NOT NULL, position INTEGER NOT NULL, rejected_token INTEGER NOT NULL,
        rejected_text TEXT NOT NULL, target_token INTEGER NOT NULL, target_text TEXT NOT NULL,
        grammatical {d.bool_type} NOT NULL, writer TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (model, schema_key, proposer, hour, writer, slot))""",
        f"""{table} policy_changes (
        id {d.id_column}, model TEXT NOT NULL, schema_key TEXT NOT NULL, proposer TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL, previous TEXT NOT NULL,
        batch_bucket INTEGER NOT NULL, acceptance DOUBLE PRECISION, threshold DOUBLE PRECISION)""",
        f"{index} policy_changes_by_key ON policy_changes (model, schema_key, proposer, at)",
        # a reservoir of completed requests per (model, schema, hour, writer)
        f"""{table} traffic_samples (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, hour BIGINT NOT NULL, slot INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, prompt_tokens {d.array_type} NOT NULL,
        output_tokens {d.array_type} NOT NULL, finish TEXT NOT NULL, writer TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (model, schema_key, hour, writer, slot))""",
    )


def select(cols: str, table: str, filters: tuple[tuple[str, Any], ...], tail: str = "") -> tuple[str, list[Any]]:
    """``SELECT cols FROM table`` under each filter (a condition with one ``?``) whose value is set, and its
    arguments; ``tail``: what follows (an ORDER BY, a LIMIT: its arguments are the caller's)."""
    conds = "".join(f" AND {cond}" for cond, value in filters if value is not None)
    return f"SELECT {cols} FROM {table} WHERE 1 = 1{conds} {tail}".rstrip(), [v for _, v in filters if v is not None]


def matching(model: str | None, schema_key: str | None, proposer: str | None = None) -> tuple[tuple[str, Any], ...]:
    """The filters of a read of one model's, schema's or proposer's rows (None: any)."""
    return (("model = ?", model), ("schema_key = ?", schema_key), ("proposer = ?", proposer))


def schema(where: str) -> str:
    return f"SELECT {SCHEMA_COLS} FROM schema_versions WHERE {where}"


LATEST_SCHEMA = schema("schema_id = ? ORDER BY version DESC LIMIT 1")
SCHEMA_AT_VERSION = schema("schema_id = ? AND version = ?")
SAME_CONTENT = schema("schema_id = ? AND sha256 = ? ORDER BY version LIMIT 1")
INSERT_SCHEMA = f"INSERT INTO schema_versions ({SCHEMA_COLS}) VALUES ({', '.join('?' * 8)})"


def list_schemas(schema_id: str | None, all_versions: bool) -> tuple[str, list[Any]]:
    where, args = ("WHERE v.schema_id = ?", [schema_id]) if schema_id else ("", [])
    if not all_versions:
        latest = "v.version = (SELECT MAX(w.version) FROM schema_versions w WHERE w.schema_id = v.schema_id)"
        where = f"{where} AND {latest}" if where else f"WHERE {latest}"
    cols = ", ".join(f"v.{c}" for c in SCHEMA_COLS.split(", "))
    return f"SELECT {cols} FROM schema_versions v {where} ORDER BY v.schema_id, v.version", args


def counters(since_hour: int, model: str | None, schema_key: str | None) -> tuple[str, list[Any]]:
    return select(f"{COUNTER_COLS}, value", "counters", (("hour >= ?", since_hour), *matching(model, schema_key)))


# The last ``per_key`` outputs of the ``max_keys`` keys written last, of one model, oldest first (a window
# function: SQLite 3.25 or later, as the upserts need 3.24).
LOAD_HISTORY = ("SELECT history_key, text FROM (SELECT id, history_key, text, row_number() OVER (PARTITION BY "
                "history_key ORDER BY id DESC) AS n FROM history WHERE model = ? AND history_key IN (SELECT "
                "history_key FROM history WHERE model = ? GROUP BY history_key ORDER BY MAX(id) DESC LIMIT ?)) "
                "recent WHERE n <= ? ORDER BY id")

# each (model, schema, proposer)'s latest policy change (a window function, as ``LOAD_HISTORY``)
LATEST_CHANGES = (f"SELECT {CHANGE_COLS} FROM (SELECT *, row_number() OVER (PARTITION BY model, schema_key, proposer "
                  "ORDER BY id DESC) AS n FROM policy_changes) latest WHERE n = 1 ORDER BY id")

# (statement, whether its argument is the cutoff hour rather than the time itself)
PRUNE = (("DELETE FROM counters WHERE hour < ?", True), ("DELETE FROM rejected_drafts WHERE hour < ?", True),
         ("DELETE FROM traffic_samples WHERE hour < ?", True), ("DELETE FROM history WHERE created_at < ?", False),
         # every change past retention but each key's newest: a state that has not changed since is still its state
         ("DELETE FROM policy_changes WHERE at < ? AND id <> (SELECT MAX(q.id) FROM policy_changes q WHERE q.model = "
          "policy_changes.model AND q.schema_key = policy_changes.schema_key AND q.proposer = policy_changes.proposer)",
          False))


def _keep_newest(table: str, key: str, row: str, order: str) -> str:
    """Delete a key's rows but its newest (arguments: the key's values twice, then how many are kept)."""
    cond = " AND ".join(f"{c} = ?" for c in key.split(", "))
    return (f"DELETE FROM {table} WHERE {cond} AND {row} NOT IN (SELECT {row.strip('()')} FROM {table} WHERE {cond} "
            f"ORDER BY {order} LIMIT ?)")


def _insert(d: Dialect, table: str, cols: str, key: str | None = None) -> str:
    """An insert of ``cols``; given the table's ``key``, one that overwrites the key's row."""
    values = f"VALUES ({', '.join('?' * len(cols.split(', ')))})"
    if key is None:
        return f"INSERT INTO {table} ({cols}) {values}"
    if d.replace_into:
        return f"INSERT OR REPLACE INTO {table} ({cols}) {values}"
    updates = ", ".join(f"{c} = excluded.{c}" for c in cols.split(", ") if c not in key.split(", "))
    return f"INSERT INTO {table} ({cols}) {values} ON CONFLICT ({key}) DO UPDATE SET {updates}"


# kind: (table, columns, the key a row overwrites (None: every row is new), the key each table keeps the newest
# rows of (the columns' first), a row's id, newest first, how many are kept, the row codec)
_KEPT: dict[str, tuple[str, str, str | None, str, str, str, int, Callable[[Dialect, Any], rows.Row]]] = {
    "history": ("history", HISTORY_COLS, None, "model, history_key", "id", "id DESC", HISTORY_KEEP,
                lambda d, r: rows.history_row(r)),
    "samples": ("rejected_drafts", SAMPLE_COLS, "model, schema_key, proposer, hour, writer, slot",
                "model, schema_key, proposer", "(hour, writer, slot)", "hour DESC, created_at DESC", SAMPLES_KEEP,
                rows.sample_row),
    "traffic": ("traffic_samples", TRAFFIC_COLS, "model, schema_key, hour, writer, slot", "model, schema_key",
                "(hour, writer, slot)", "hour DESC, created_at DESC", TRAFFIC_KEEP, rows.traffic_row),
    "policy_changes": ("policy_changes", CHANGE_COLS, None, "model, schema_key, proposer", "id", "id DESC",
                       CHANGES_KEEP, lambda d, r: rows.change_row(r)),
}


def writes(d: Dialect, kind: str, part: Any) -> list[tuple[str, list[rows.Row]]]:
    """What writing one kind's rows (a backlog kind; counters: ``Counters``) runs: each statement with its rows of
    arguments (for ``executemany``): the rows, then each key's keep-newest delete. History outputs and policy
    changes are written in their order (their ids); slots and counters in key order where ``d.key_order`` (two
    replicas' flushes cannot deadlock)."""
    if kind == "counters":
        counters: Counters = part
        return [(f"INSERT INTO counters ({COUNTER_COLS}, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
                 f"({COUNTER_COLS}) DO UPDATE SET {ADD_VALUE}",
                 [rows.counter_row(k, v) for k, v in (sorted(counters.items()) if d.key_order else counters.items())])]
    table, cols, slot, key, row_id, newest, kept, codec = _KEPT[kind]
    encoded = [codec(d, r) for r in (sorted(part, key=lambda r: r.key) if slot and d.key_order else part)]
    keys = sorted({r[:len(key.split(", "))] for r in encoded})
    return [(_insert(d, table, cols, slot), encoded),
            (_keep_newest(table, key, row_id, newest), [(*k, *k, kept) for k in keys])]


# -- a legacy model key's rows moved to the key that claims them (``stats.legacy_keys``) ---------------------
CLAIMED_TABLES = ("counters", "rejected_drafts", "traffic_samples", "policy_changes", "history")
STORED_MODELS = " UNION ".join(f"SELECT DISTINCT model FROM {t}" for t in CLAIMED_TABLES)


def _moved_into(table: str, cols: str, key: str, merge: str) -> str:
    """Copy the rows of one model (the second argument) under another (the first); a row the other holds already
    is kept (``merge`` "") or summed into (``merge``: the SET clause)."""
    rest = ", ".join(c for c in cols.split(", ") if c != "model")
    on_conflict = f"DO UPDATE SET {merge}" if merge else "DO NOTHING"
    return (f"INSERT INTO {table} ({cols}) SELECT CAST(? AS TEXT), {rest} FROM {table} WHERE model = ? "
            f"ON CONFLICT ({key}) {on_conflict}")


# each with the arguments (new, old), then ``DELETE_MODEL`` of the table with (old,); a sample's slot key is the
# one its writes overwrite (``_KEPT``)
MOVE_STATISTICS = (
    ("counters", _moved_into("counters", f"{COUNTER_COLS}, value", COUNTER_COLS, ADD_VALUE)),
    *((table, _moved_into(table, cols, slot, "")) for table, cols, slot, *_ in (_KEPT["samples"], _KEPT["traffic"])
      if slot is not None),
    ("policy_changes", "UPDATE policy_changes SET model = ? WHERE model = ?"),
)
DELETE_MODEL = "DELETE FROM {} WHERE model = ?"
# a claim first locks the old key's rows (``Dialect.lock_rows``): a replica claiming the same key at once waits, then
# finds them gone, instead of summing the counters into the new key a second time
LOCK_MODEL = "SELECT model FROM {} WHERE model = ?"
HISTORY_KEYS = "SELECT DISTINCT history_key FROM history WHERE model = ?"
MOVE_HISTORY = "UPDATE history SET model = ? WHERE model = ? AND history_key = ?"
