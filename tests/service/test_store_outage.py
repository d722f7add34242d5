"""A store that cannot be reached, on a real server with the fake engine (fast; the same with two `structspec serve`
processes and a real PostgreSQL stopped under them is in ``test_replicas.py``): extraction by a registered schema
keeps serving from what the registry remembers, registry writes and statistics reads answer UNAVAILABLE
``STORE_UNAVAILABLE``, the ``structspec.store`` health entry says NOT_SERVING while the server's own stays SERVING,
the statistics wait in memory (a metric shows them, drops past the bound are counted and logged), and everything
lands once the store answers again."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from structspec.client import NO_RETRY, Client, UnavailableError
from structspec.stats.book import StatsBook
from structspec.stats.counters import Series
from structspec.store import StoreError, StoreUnavailable
from structspec.store.sqlite import SQLiteStore
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

INVOICE = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}


class CutOffStore:
    """A SQLite store that can be cut off: while ``down``, every call that would do I/O raises ``StoreUnavailable``,
    as the PostgreSQL store does when its database cannot be reached."""

    def __init__(self, inner: SQLiteStore):
        self.inner = inner
        self.stats = inner.stats
        self.down = False
        self.refusing = False  # while set, a flush fails as on a broken table (not StoreUnavailable)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailable("store cut off by the test")
            if self.refusing and name == "flush":
                raise StoreError("sqlite: no such table: counters")
            return await attr(*args, **kwargs)

        return call


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


def metric(st: ServerThread, name: str, **labels: str) -> float | None:
    return st.server.metrics.registry.get_sample_value(name, labels)  # type: ignore[union-attr]


def requests_stored(store: SQLiteStore, key: str) -> float:
    async def read() -> float:
        return sum(v for k, v in (await store.read_counters(since=0, schema_key=key)).items()
                   if k.series == Series.REQUESTS)

    return asyncio.run(read())


@pytest.fixture
def cut_off(tmp_path: Path):
    inner = SQLiteStore(tmp_path / "s.db", StatsBook(max_unwritten=40), history_limit=3)
    store = CutOffStore(inner)
    settings = settings_for(tmp_path, stats_flush_interval_seconds=0.1, stats_buffer_limit=40)
    with ServerThread(settings, FakeEngine(store=store), store=store) as st:
        yield st, store
    asyncio.run(inner.close())


def test_an_unreachable_store_keeps_extraction_serving_and_refuses_registry_writes(cut_off) -> None:
    st, store = cut_off
    with Client(st.target, retry=NO_RETRY, timeout=20) as c:
        c.register_schema("inv", INVOICE)
        assert c.extract("INVOICE 7", schema_id="inv")["number"]
        store.down = True
        wait_for(lambda: c.health("structspec.store") == "NOT_SERVING")
        assert c.health() == "SERVING" and metric(st, "structspec_store_up") == 0

        for _ in range(3):  # resolved from what the registry remembers
            assert c.extract("INVOICE 7", schema_id="inv")["number"]
        assert {"inv", "invoice"} <= {s.schema_id for s in c.list_schemas()}  # the built-ins are known too
        assert c.get_schema("inv").version == 1
        for write in (lambda: c.register_schema("other", INVOICE), lambda: c.delete_schema("inv"),
                      lambda: c.set_schema_speculation("inv", "off"), lambda: c.get_schema_stats("inv")):
            with pytest.raises(UnavailableError) as err:
                write()
            assert err.value.reason == "STORE_UNAVAILABLE" and "unreachable" in err.value.message
        with pytest.raises(UnavailableError, match="unreachable"):  # never seen: nothing to answer from
            c.extract("x", schema_id="unknown")
        assert metric(st, "structspec_stats_unwritten", kind="counters") > 0

        store.down = False
        wait_for(lambda: c.health("structspec.store") == "SERVING")
        assert metric(st, "structspec_store_up") == 1
        wait_for(lambda: metric(st, "structspec_stats_unwritten", kind="counters") == 0)
        assert requests_stored(store.inner, "inv@1") == 4  # the three of the outage landed, once
        assert c.get_schema_stats("inv").windows[3600].requests == 4
        assert c.register_schema("other", INVOICE).version == 1


def test_statistics_past_the_bound_are_dropped_counted_and_logged(cut_off, caplog) -> None:
    st, store = cut_off
    caplog.set_level(logging.INFO, logger="structspec")
    with Client(st.target, retry=NO_RETRY, timeout=20) as c:
        store.down = True
        wait_for(lambda: c.health("structspec.store") == "NOT_SERVING")
        schemas = [{**INVOICE, "title": f"s{i}"} for i in range(8)]  # inline schemas: new keys each
        for schema in schemas:
            c.extract("INVOICE 7", schema=schema)
        wait_for(lambda: (metric(st, "structspec_stats_dropped_total", kind="counters") or 0) > 0)
        assert metric(st, "structspec_stats_unwritten", kind="counters") == 40  # the bound
        wait_for(lambda: "statistics dropped" in caplog.text)
        store.down = False
        wait_for(lambda: metric(st, "structspec_stats_unwritten", kind="counters") == 0)
    assert "store unreachable" in caplog.text and "store reachable again" in caplog.text


def test_flushes_that_keep_failing_mark_the_store_not_serving_until_one_lands(cut_off, caplog) -> None:
    """A flush failing for another reason than an unreachable store (a broken table) each interval: the
    ``structspec.store`` entry and ``structspec_store_up`` say so, and the log does, until a flush lands."""
    st, store = cut_off
    caplog.set_level(logging.INFO, logger="structspec")
    with Client(st.target, retry=NO_RETRY, timeout=20) as c:
        store.refusing = True
        wait_for(lambda: c.health("structspec.store") == "NOT_SERVING")
        assert c.health() == "SERVING" and metric(st, "structspec_store_up") == 0
        store.refusing = False
        wait_for(lambda: c.health("structspec.store") == "SERVING")
        assert metric(st, "structspec_store_up") == 1
    assert "store cannot be written (writing statistics failed: sqlite: no such table" in caplog.text


def test_quarantined_rows_are_counted_by_kind(cut_off) -> None:
    st, store = cut_off
    store.inner.quarantine.add("samples", "a row", ValueError("refused"))
    assert metric(st, "structspec_stats_quarantined_total", kind="samples") == 1
    assert metric(st, "structspec_stats_quarantined_total", kind="history") == 0
