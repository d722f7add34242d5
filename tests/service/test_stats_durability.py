"""Statistics survive the process: `structspec serve --profile demo` (the real engine and recording path) under
traffic, then SIGKILL (at most one flush interval lost) or SIGTERM (nothing lost); the store's totals are compared
with what the client saw. Flushes keep their interval while a refresh reads slowly, and the decode path does not
wait on the refresh."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from structspec.client import NO_RETRY, Client, StructSpecError
from structspec.stats.book import StatsBook
from structspec.stats.counters import CounterKey, Series, hour_of
from structspec.store.sqlite import SQLiteStore
from tests.service.harness import ServerThread, settings_for
from tests.service.test_sigterm import REPO, free_port, wait_serving

FLUSH_SECONDS = 1.0  # the default flush interval: what SIGKILL may lose
DOCS = ["INVOICE INV-2025-0001\nFrom: Acme Tools Ltd\nBill to: Birch & Co\nDate: 2025-03-04\n1 x Hammer @ 12.50 EUR\n"
        "Total: 12.50 EUR", "Invoice no. INV-2026-0420 | Orbit Consulting | to Nord Foods | 2026-01-09 | "
        "3 x Audit day at 900.00 USD | total 2700.00 USD"]


def serve(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRUCTSPEC_")}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "structspec.cli_serve", "serve", "--profile", "demo", "--port", str(port),
           "--metrics-port", "-1", "--http-port", "-1", "--data-dir", str(tmp_path / "data")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=(tmp_path / "server.log").open("w"),
                            stderr=subprocess.STDOUT, text=True)
    return proc, f"127.0.0.1:{port}"


class Traffic:
    """Two client threads extracting until stopped; every completed response with the time it arrived."""

    def __init__(self, target: str):
        self.target = target
        self.done: list[tuple[float, int, int, int]] = []  # (arrival, output tokens, passes, drafted)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(2)]

    def _run(self, i: int) -> None:
        with Client(self.target, retry=NO_RETRY) as client:
            n = 0
            while not self.stop.is_set():
                try:
                    r = client.extract_result(DOCS[(i + n) % 2], schema_id="invoice", max_tokens=48, timeout=60)
                except StructSpecError:
                    return  # the server went away (killed, or draining refuses new calls)
                with self.lock:
                    self.done.append((time.time(), r.usage.output_tokens, r.usage.target_forward_passes,
                                      sum(r.usage.drafted.values())))
                n += 1

    def start(self) -> "Traffic":
        for t in self.threads:
            t.start()
        return self

    def wait_for(self, n: int, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while len(self.done) < n:
            assert time.monotonic() < end, f"only {len(self.done)} responses"
            time.sleep(0.05)


def stored(data_dir: Path) -> dict[str, float]:
    async def read() -> dict[str, float]:
        store = SQLiteStore(data_dir / "structspec.db")
        await store.open()
        try:
            totals: dict[str, float] = {}
            for key, value in (await store.read_counters(since=0)).items():
                if key.schema_key == "invoice@1" and key.series in (Series.REQUESTS, Series.OUTPUT_TOKENS,
                                                                    Series.TARGET_PASSES, Series.DRAFTED):
                    totals[key.series] = totals.get(key.series, 0.0) + value
            return totals
        finally:
            await store.close()

    return asyncio.run(read())


def sums(rows) -> dict[str, float]:
    return {Series.REQUESTS: len(rows), Series.OUTPUT_TOKENS: sum(r[1] for r in rows),
            Series.TARGET_PASSES: sum(r[2] for r in rows), Series.DRAFTED: sum(r[3] for r in rows)}


@pytest.mark.slow
def test_sigkill_under_traffic_loses_at_most_one_flush_interval(tmp_path: Path) -> None:
    proc, target = serve(tmp_path)
    try:
        wait_serving(target, proc, timeout=120)
        traffic = Traffic(target).start()
        traffic.wait_for(12)
        time.sleep(3 * FLUSH_SECONDS)  # traffic goes on: responses older than one interval must be stored
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        traffic.stop.set()
    finally:
        if proc.poll() is None:
            proc.kill()
    got = stored(tmp_path / "data")
    with traffic.lock:
        seen = list(traffic.done)
    # a response that arrived over one interval (plus the write's own time) before the kill was flushed
    settled = sums([r for r in seen if r[0] < killed_at - FLUSH_SECONDS - 0.5])
    everything = sums(seen)
    assert settled[Series.REQUESTS] >= 8  # the check has something to check
    for series in settled:
        # in-flight requests (two at most) may have been recorded before their response arrived
        slack = 2 if series == Series.REQUESTS else 2 * 48 + 16
        assert settled[series] <= got.get(series, 0) <= everything[series] + slack, (series, settled, got, everything)


@pytest.mark.slow
def test_sigterm_under_traffic_loses_nothing(tmp_path: Path) -> None:
    proc, target = serve(tmp_path)
    try:
        wait_serving(target, proc, timeout=120)
        traffic = Traffic(target).start()
        traffic.wait_for(8)
        proc.send_signal(signal.SIGTERM)  # drains: the requests in flight finish, new ones are refused
        assert proc.wait(timeout=120) == 0
        traffic.stop.set()
        for t in traffic.threads:
            t.join(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = stored(tmp_path / "data")
    assert got == pytest.approx(sums(traffic.done)), (got, sums(traffic.done))


class SlowRefresh(SQLiteStore):
    """A store whose refresh reads a week of counters slowly: ``seconds`` in the read, and ``extra`` counters more
    (another model's) for the book to be rebuilt from. Records when each flush ended."""

    def __init__(self, path: Path, seconds: float = 3.0, extra: int = 150_000):
        super().__init__(path, StatsBook())
        self.seconds, self.extra = seconds, extra
        self.slow = threading.Event()  # set: refreshes are slow
        self.refreshing = threading.Event()  # set while a slow refresh runs
        self.flushed: list[float] = []

    async def flush(self) -> None:
        await super().flush()
        self.flushed.append(time.monotonic())

    async def refresh_stats(self) -> None:
        slow = self.slow.is_set()
        if slow:
            self.refreshing.set()
        try:
            await super().refresh_stats()
        finally:
            if slow:
                self.refreshing.clear()
                self.slow.clear()

    def _select(self, c, since_hour, model, schema_key):
        rows = super()._select(c, since_hour, model, schema_key)
        if self.refreshing.is_set():
            time.sleep(self.seconds)
            hour = hour_of(time.time())
            rows += [(CounterKey("other", f"s{i}", hour, Series.REQUESTS), 1.0) for i in range(self.extra)]
        return rows


def test_flushes_keep_their_interval_and_records_never_wait_while_a_refresh_reads_slowly(tmp_path: Path) -> None:
    store = SlowRefresh(tmp_path / "s.db")
    settings = settings_for(tmp_path, stats_flush_interval_seconds=0.1, stats_refresh_seconds=0.3)
    rec = store.stats.recorder("m")
    with ServerThread(settings, store=store):
        store.slow.set()  # the next refresh (start() ran the first one)
        assert wait_until(store.refreshing.is_set, 10)
        began, worst, recorded = time.monotonic(), 0.0, 0
        gc.disable()  # a collection pauses every thread, whatever the refresh holds: measured is waiting on it
        try:
            while store.refreshing.is_set():  # the decode path records while the refresh reads and rebuilds the book
                started = time.perf_counter()
                rec.record_request("inv@1", 3, 3, 0, "stop", 5.0)
                worst, recorded = max(worst, time.perf_counter() - started), recorded + 1
                time.sleep(0.002)
        finally:
            gc.enable()
        ended = time.monotonic()
        assert wait_until(lambda: not store.stats.unflushed(), 5)  # every record written
    flushes = [t for t in store.flushed if began <= t <= ended]
    assert ended - began >= store.seconds
    # one flush every 0.1 s; with a refresh blocking them, none while it ran
    assert len(flushes) >= (ended - began) / 0.1 / 2, (len(flushes), ended - began)
    assert worst < 0.1, worst
    assert recorded > 100


def wait_until(condition, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True
