"""The load-test helper against the fake engine (bounded, loopback only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from structspec.bench.loadtest import LoadTestError, check_loopback, percentile, run_load
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for


def test_run_load_reports_every_request(tmp_path: Path) -> None:
    engine = FakeEngine(token_delay=0.001, max_running=4, max_queue=4)
    with ServerThread(settings_for(tmp_path), engine) as st:
        report = run_load(st.target, concurrency_levels=(1, 4, 16), requests_per_level=24, schema_id="contact")
    assert [lv.concurrency for lv in report.levels] == [1, 4, 16]
    for lv in report.levels:
        assert lv.ok + lv.failed == lv.requests == 24
        assert lv.requests_per_second > 0 and 0 < lv.p50_ms <= lv.p99_ms <= lv.max_ms
    assert report.levels[0].failures == {}  # no queueing at concurrency 1
    # at 16 concurrent requests the fake's queue (4 running + 4 waiting) overflows: counted, not lost
    assert set(report.levels[2].failures) <= {"RESOURCE_EXHAUSTED"}
    assert "req/s" in report.table()


def test_failures_are_counted_by_status(tmp_path: Path) -> None:
    with ServerThread(settings_for(tmp_path), FakeEngine()) as st:
        report = run_load(st.target, concurrency_levels=(2,), requests_per_level=4, schema_id="missing")
    assert report.levels[0].failures == {"NOT_FOUND": 4} and report.levels[0].ok == 0


def test_loopback_only_and_bounds() -> None:
    check_loopback("127.0.0.1:50051")
    check_loopback("localhost:1")
    with pytest.raises(ValueError, match="loopback"):
        check_loopback("10.1.2.3:50051")
    with pytest.raises(ValueError):
        run_load("127.0.0.1:1", concurrency_levels=(1000,), requests_per_level=1)
    assert issubclass(LoadTestError, AssertionError)


def test_percentile() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([], 99) == 0.0 and percentile([7.0], 99) == 7.0
