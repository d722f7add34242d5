"""Exceptions -> gRPC status codes, readable messages and field details (pure functions).

Details travel as a serialized ``structspec.v1.ErrorDetails`` in the trailing metadata key
``structspec-error-details-bin`` (chosen over ``google.rpc.BadRequest`` so the server needs
no extra dependency; the Python client decodes it).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import grpc

from structspec.engine.types import (
    ContextTooLong,
    DraftLoadError,
    DraftsUnsupported,
    EngineError,
    EngineStopped,
    FinishReason,
    GenerationResult,
    InvalidRequest,
    Outcome,
    OverBudget,
    QueueFull,
)
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.store.base import StoreError, StoreUnavailable

DETAILS_KEY = "structspec-error-details-bin"
SAMPLING_FIELDS = frozenset({"temperature", "top_p", "top_k", "seed", "max_tokens"})
_PROTO_FIELDS = {"tool_choice": "tool_choice.tool_name"}  # engine field -> proto field, where they differ


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str
    json_pointer: str = ""
    keyword: str = ""


class ServiceError(Exception):
    """An error with its status code already decided."""

    def __init__(
        self, code: grpc.StatusCode, message: str, reason: str, violations: Sequence[FieldViolation] = ()
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.violations = tuple(violations)


def invalid(field: str, message: str, reason: str = "INVALID_ARGUMENT") -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", reason, [FieldViolation(field, message)])


def schema_too_deep(field: str, exc: Any) -> ServiceError:
    """A schema (or tool parameters) nesting past a documented limit (``grammar.json_text``)."""
    message = f"schema {exc}"
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", "SCHEMA_TOO_DEEP",
                        [FieldViolation(field, message, getattr(exc, "pointer", ""))])


def not_found(message: str, reason: str = "SCHEMA_NOT_FOUND", field: str = "schema_id") -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, message, reason, [FieldViolation(field, message)])


def _schema_error_type() -> type | None:
    # The grammar layer imports torch; only look for its error class if it is already loaded
    # (if it is not, nothing can have raised it), so the service imports stay light.
    module = sys.modules.get("structspec.grammar.base")
    return getattr(module, "SchemaError", None)


def schema_error(exc: Exception, field: str) -> ServiceError:
    """A grammar-layer ``SchemaError`` -> INVALID_ARGUMENT naming each pointer and keyword."""
    kind = getattr(exc, "kind", "invalid_schema")
    issues = list(getattr(exc, "issues", ()))
    violations = [FieldViolation(field, i.message, i.pointer, i.keyword) for i in issues]
    where = "; ".join(f"at {i.pointer or '/'} ({i.keyword}): {i.message}" for i in issues[:5])
    more = f" (+{len(issues) - 5} more)" if len(issues) > 5 else ""
    label = "unsupported schema" if kind == "unsupported" else "invalid schema"
    reason = "UNSUPPORTED_SCHEMA" if kind == "unsupported" else ("INVALID_SCHEMA" if kind in ("invalid_schema", "metaschema") else f"SCHEMA_{kind.upper()}")
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {label}: {where or exc}{more}", reason, violations)


def _request_field(exc: EngineError) -> str:
    """The request field an engine error names (sampling parameters live under ``sampling.``)."""
    if exc.field in SAMPLING_FIELDS:
        return f"sampling.{exc.field}"
    return _PROTO_FIELDS.get(exc.field, exc.field) or "request"


def from_exception(exc: BaseException, schema_field: str = "json_schema") -> ServiceError | None:
    """Map a known exception; None for anything unexpected (the caller logs it as INTERNAL)."""
    if isinstance(exc, ServiceError):
        return exc
    schema_error_type = _schema_error_type()
    if schema_error_type is not None and isinstance(exc, schema_error_type):
        return schema_error(exc, schema_field)  # type: ignore[arg-type]
    if isinstance(exc, DraftLoadError):
        return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"path: {exc}", "INVALID_DRAFT",
                            [FieldViolation("path", str(exc))])
    if isinstance(exc, DraftsUnsupported):
        return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, str(exc), "DRAFT_UNSUPPORTED")
    if isinstance(exc, ContextTooLong):
        field = exc.field or "text"
        return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {exc}", "CONTEXT_TOO_LONG", [FieldViolation(field, str(exc))])
    if isinstance(exc, InvalidRequest):
        field = _request_field(exc)
        reason = "INVALID_SAMPLING" if exc.field in SAMPLING_FIELDS else "INVALID_ARGUMENT"
        return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {exc}", reason, [FieldViolation(field, str(exc))])
    if isinstance(exc, QueueFull):
        return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"server is at capacity: {exc}", "QUEUE_FULL")
    if isinstance(exc, OverBudget):  # the request alone exceeds the server's KV budget: retrying will not help
        field = _request_field(exc)
        return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{field}: {exc}", "KV_BUDGET",
                            [FieldViolation(field, str(exc))])
    if isinstance(exc, EngineStopped):
        return ServiceError(grpc.StatusCode.UNAVAILABLE, f"engine stopped: {exc}", "ENGINE_STOPPED")
    if isinstance(exc, EngineError):
        return ServiceError(grpc.StatusCode.INTERNAL, f"model failure: {exc}", "MODEL_FAILURE")
    if isinstance(exc, StoreUnavailable):  # before StoreError, its base
        return ServiceError(grpc.StatusCode.UNAVAILABLE, "the schema store is unreachable: registry writes and "
                            "statistics reads fail until it is back (extraction and tool calls keep serving); retry "
                            "later", "STORE_UNAVAILABLE")
    if isinstance(exc, StoreError):
        return ServiceError(grpc.StatusCode.INTERNAL, "schema store failure", "STORE_FAILURE")
    return None


def check_result(result: GenerationResult, deadline: float | None, now: float | None = None,
                 schema_field: str = "json_schema") -> None:
    """Raise for results that must not be returned as a success: cancelled (deadline or
    shutdown), errored, or failing the post-check for an unexpected reason. LENGTH and
    SCHEMA_VIOLATION are successes with their finish reason/outcome."""
    now = time.monotonic() if now is None else now
    if result.finish_reason is FinishReason.CANCELLED:
        if deadline is not None and now >= deadline - 0.005:
            raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded during decoding", "DEADLINE_EXCEEDED")
        raise ServiceError(grpc.StatusCode.CANCELLED, result.error or "decoding was cancelled", "CANCELLED")
    if result.finish_reason is FinishReason.ERROR and result.grammar_limit:  # the schema's, not the model's
        message = f"{schema_field}: {result.error or 'grammar engine limit ' + result.grammar_limit}"
        raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, message, "GRAMMAR_LIMIT",
                           [FieldViolation(schema_field, message, keyword=result.grammar_limit)])
    if result.finish_reason is FinishReason.ERROR:
        error = result.error or "unknown error"
        message = error if error.startswith("model failure") else f"model failure: {error}"  # said once
        raise ServiceError(grpc.StatusCode.INTERNAL, message, "MODEL_FAILURE")
    if result.outcome is Outcome.INTERNAL_ERROR:
        raise ServiceError(grpc.StatusCode.INTERNAL, f"output failed validation: {result.error or 'unknown'}", "OUTPUT_CHECK_FAILED")


def details_metadata(err: ServiceError, request_id: str) -> tuple[tuple[str, bytes], ...]:
    details = pb.ErrorDetails(
        reason=err.reason,
        request_id=request_id,
        field_violations=[
            pb.FieldViolation(field=v.field, description=v.description, json_pointer=v.json_pointer, keyword=v.keyword)
            for v in err.violations
        ],
    )
    return ((DETAILS_KEY, details.SerializeToString()),)
