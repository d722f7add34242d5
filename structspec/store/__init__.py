"""Persistent state behind a ``Store`` protocol: the schema registry and speculation statistics."""

from __future__ import annotations

from pathlib import Path

from structspec.stats.book import StatsBook
from structspec.store.base import SchemaRecord, Store, StoreError

__all__ = ["SchemaRecord", "Store", "StoreError", "open_store"]

DEFAULT_DB_NAME = "structspec.db"


def open_store(url: str, data_dir: str | Path | None = None, stats: StatsBook | None = None) -> Store:
    """A (not yet opened) store for ``url``:

    - ``""``: SQLite file ``<data_dir>/structspec.db``
    - ``sqlite:///abs/path.db``, ``sqlite:rel/path.db``, ``sqlite://:memory:`` or a bare path
    - ``postgresql://...``: planned for multi-replica deployments; not implemented yet
    """
    from structspec.store.sqlite import SQLiteStore

    if not url:
        if data_dir is None:
            raise ValueError("store url is empty and no data dir was given")
        return SQLiteStore(Path(data_dir) / DEFAULT_DB_NAME, stats)
    if url.startswith(("postgres://", "postgresql://")):
        raise ValueError("PostgreSQL store is not implemented yet; use a sqlite: URL or leave store_url empty")
    if url.startswith("sqlite://:memory:") or url == ":memory:":
        return SQLiteStore(":memory:", stats)
    for prefix in ("sqlite:///", "sqlite://", "sqlite:"):
        if url.startswith(prefix):
            rest = url[len(prefix):]
            return SQLiteStore("/" + rest if prefix == "sqlite:///" else rest, stats)
    if "://" in url:
        raise ValueError(f"unsupported store url scheme: {url.split('://', 1)[0]!r}")
    return SQLiteStore(url, stats)
