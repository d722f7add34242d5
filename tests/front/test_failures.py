"""Exceptions and engine results -> the front's errors (codes, reasons, fields)."""

from __future__ import annotations

import pytest

from structspec.engine.types import (
    ContextTooLong,
    FinishReason,
    GenerationResult,
    InvalidRequest,
    Outcome,
    QueueFull,
    Timings,
    Usage,
)
from structspec.front.errors import Code, FrontError
from structspec.front.failures import check_result, from_exception
from structspec.grammar.base import SchemaError, SchemaIssue


def test_exception_mapping() -> None:
    schema_err = SchemaError([SchemaIssue("/properties/a", "pattern", "lookahead not supported")], kind="unsupported")
    e = from_exception(schema_err, "schema_ref")
    assert e is not None and e.code is Code.INVALID_ARGUMENT and e.reason == "UNSUPPORTED_SCHEMA"
    assert e.violations[0].json_pointer == "/properties/a" and "pattern" in e.message and e.message.startswith("schema_ref")
    assert from_exception(SchemaError([], kind="too_large")).reason == "SCHEMA_TOO_LARGE"  # type: ignore[union-attr]
    assert from_exception(ContextTooLong("too long")).code is Code.INVALID_ARGUMENT  # type: ignore[union-attr]
    assert from_exception(InvalidRequest("bad", field="top_k")).violations[0].field == "sampling.top_k"  # type: ignore[union-attr]
    assert from_exception(QueueFull("full")).code is Code.RESOURCE_EXHAUSTED  # type: ignore[union-attr]
    assert from_exception(KeyError("x")) is None


def test_deadline_ending_inside_engine_maps_to_deadline_exceeded() -> None:
    r = GenerationResult("r", "{", [], FinishReason.CANCELLED, Outcome.NOT_CHECKED, Usage(), Timings())
    with pytest.raises(FrontError) as err:
        check_result(r, deadline=10.0, now=10.0)
    assert err.value.code is Code.DEADLINE_EXCEEDED
    with pytest.raises(FrontError) as err:
        check_result(r, deadline=None, now=10.0)
    assert err.value.code is Code.CANCELLED


def test_an_errored_result_says_model_failure_once() -> None:
    for error in ("model failure (the forward pass of its whole batch of 4): RuntimeError: oom",
                  "internal error while masking: ValueError: bad"):
        r = GenerationResult("r", "{", [], FinishReason.ERROR, Outcome.NOT_CHECKED, Usage(), Timings(), error=error)
        with pytest.raises(FrontError) as err:
            check_result(r, deadline=None)
        assert err.value.reason == "MODEL_FAILURE" and err.value.message.count("model failure") == 1
        assert err.value.message.endswith(error)
