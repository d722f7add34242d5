"""When a deadline has passed (``front.deadlines``), and the codes the call guard and the result check give for it."""

from __future__ import annotations

import time

import pytest

from structspec.engine.types import FinishReason, GenerationResult, Outcome, Timings, Usage
from structspec.front.call import cancelled_code
from structspec.front.deadlines import DEADLINE_TOLERANCE_S, deadline_passed
from structspec.front.errors import Code, FrontError
from structspec.front.failures import check_result


def test_a_deadline_passes_within_the_tolerance_before_it() -> None:
    assert not deadline_passed(None, 1e12)
    assert deadline_passed(10.0, 10.0) and deadline_passed(10.0, 11.0)
    assert deadline_passed(10.0, 10.0 - DEADLINE_TOLERANCE_S / 2)
    assert not deadline_passed(10.0, 10.0 - 2 * DEADLINE_TOLERANCE_S)
    assert deadline_passed(time.monotonic()) and not deadline_passed(time.monotonic() + 60)


def test_the_guard_and_the_result_check_agree_on_a_passed_deadline() -> None:
    cancelled = GenerationResult("r", "{", [], FinishReason.CANCELLED, Outcome.NOT_CHECKED, Usage(), Timings())
    for deadline, code in ((time.monotonic() - 1, Code.DEADLINE_EXCEEDED), (time.monotonic() + 60, Code.CANCELLED),
                           (None, Code.CANCELLED)):
        assert cancelled_code(deadline) is code
        with pytest.raises(FrontError) as err:
            check_result(cancelled, deadline)
        assert err.value.code is code
