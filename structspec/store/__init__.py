"""Persistent state behind a ``Store`` protocol: the schema registry and speculation statistics."""

from __future__ import annotations

from pathlib import Path

from structspec.stats.book import StatsBook
from structspec.store.base import Backlog, SchemaRecord, Store, StoreError, StoreUnavailable, redact_url
from structspec.store.sqlite import SQLiteStore

__all__ = ["Backlog", "SchemaRecord", "Store", "StoreError", "StoreUnavailable", "open_store", "redact_url"]

DEFAULT_DB_NAME = "structspec.db"


def open_store(url: str, data_dir: str | Path | None = None, stats: StatsBook | None = None, *,
               pool_size: int = 4, timeout: float = 5.0, history_limit: int = 100_000) -> Store:
    """A (not yet opened) store for ``url``:

    - ``""``: SQLite file ``<data_dir>/structspec.db``
    - ``sqlite:///abs/path.db``, ``sqlite:rel/path.db``, ``sqlite://:memory:`` or a bare path
    - ``postgresql://[user[:password]@][host][:port]/dbname[?param=value...]`` (or ``postgres://``): a PostgreSQL
      database that several replicas share (``PostgresStore``; needs the ``postgres`` extra); ``pool_size`` and
      ``timeout`` apply to it

    ``history_limit``: unwritten history outputs kept while the store cannot be written.
    """
    if not url:
        if data_dir is None:
            raise ValueError("store url is empty and no data dir was given")
        return SQLiteStore(Path(data_dir) / DEFAULT_DB_NAME, stats, history_limit)
    if url.startswith(("postgres://", "postgresql://")):
        from structspec.store.postgres import PostgresStore  # imports psycopg (~50 ms): only for a PostgreSQL url

        return PostgresStore(url, stats, pool_size=pool_size, timeout=timeout, history_limit=history_limit)
    if url.startswith("sqlite://:memory:") or url == ":memory:":
        return SQLiteStore(":memory:", stats, history_limit)
    for prefix in ("sqlite:///", "sqlite://", "sqlite:"):
        if url.startswith(prefix):
            rest = url[len(prefix):]
            return SQLiteStore("/" + rest if prefix == "sqlite:///" else rest, stats, history_limit)
    if "://" in url:
        raise ValueError(f"unsupported store url scheme: {url.split('://', 1)[0]!r}")
    return SQLiteStore(url, stats, history_limit)
