"""The store tests' ``backend`` fixture: each test that takes it runs against SQLite and against a real PostgreSQL
server (the session's throwaway cluster, a fresh database per test; skipped with a reason where PostgreSQL is not
installed, a failure in CI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from structspec.stats.book import StatsBook
from structspec.store import Store, open_store


class Backend:
    """Opens stores of one kind; ``open(name)`` twice reaches the same data (a restart, or a second replica)."""

    def __init__(self, kind: str, tmp_path: Path, new_database: Callable[[], str] | None = None):
        self.kind = kind
        self._tmp = tmp_path
        self._new_database = new_database
        self._urls: dict[str, str] = {}
        self.opened: list[Store] = []

    def url(self, name: str = "db") -> str:
        if name not in self._urls:
            if self.kind == "sqlite":
                self._urls[name] = f"sqlite://{self._tmp / (name + '.sqlite')}"
            else:
                assert self._new_database is not None
                self._urls[name] = self._new_database()
        return self._urls[name]

    async def open(self, name: str = "db", clock: Callable[[], float] | None = None, **book: Any) -> Any:
        from tests.store.test_store import Clock

        store = open_store(self.url(name), stats=StatsBook(clock=clock or Clock(), **book))
        await store.open()
        self.opened.append(store)
        return store

    async def execute(self, name: str, sql: str) -> None:
        """Run ``sql`` on the data behind ``name`` from a connection of its own (to break a table under a store)."""
        url = self.url(name)
        if self.kind == "sqlite":
            import sqlite3

            with sqlite3.connect(url.removeprefix("sqlite://")) as conn:
                conn.execute(sql)
        else:
            import psycopg

            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(sql)


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path):
    new_database = request.getfixturevalue("postgres").new_database if request.param == "postgres" else None
    b = Backend(request.param, tmp_path, new_database)
    yield b
    for store in b.opened:  # what a test left open (a failing one): closed, errors ignored
        try:
            await store.close()
        except Exception:  # noqa: BLE001
            pass
