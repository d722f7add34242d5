from __future__ import annotations

import logging

import pytest

from structspec.front.call import Call, CallGuard
from structspec.front.errors import Code
from structspec.front.metrics import ServiceMetrics


def test_each_front_logs_its_calls_ends_under_its_own_logger(caplog: pytest.LogCaptureFixture) -> None:
    guard = CallGuard(ServiceMetrics(), logging.getLogger("structspec.service.http"))
    call = Call("POST /v1/chat/completions", "req-1", deadline=None)
    with caplog.at_level(logging.DEBUG):
        assert guard.cancelled(call) is Code.CANCELLED
        guard.finish(call, Code.CANCELLED)
    assert [r.name for r in caplog.records] == ["structspec.service.http"] * 2
    assert "req-1 cancelled" in caplog.records[0].getMessage()
