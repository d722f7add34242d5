"""The engine's and the store's exceptions and results -> ``FrontError``s (pure functions).

``from_exception`` maps an exception a call raised (None for anything unexpected: the call guard
answers it INTERNAL and logs it); ``check_result`` raises for an engine result that must not be
returned as a success. Field names are the request's as the gRPC messages name them (sampling
parameters under ``sampling.``); the HTTP front renames them to its body's fields.
"""

from __future__ import annotations

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
from structspec.front.deadlines import deadline_passed
from structspec.front.errors import Code, FieldViolation, FrontError, deadline_exceeded
from structspec.grammar.base import SchemaError
from structspec.store.base import StoreError, StoreUnavailable

SAMPLING_FIELDS = frozenset({"temperature", "top_p", "top_k", "seed", "max_tokens"})
_REQUEST_FIELDS = {"tool_choice": "tool_choice.tool_name"}  # engine field -> request field, where they differ


def schema_error(exc: SchemaError, field: str) -> FrontError:
    """A grammar-layer ``SchemaError`` -> INVALID_ARGUMENT naming each pointer and keyword."""
    kind = exc.kind
    issues = list(exc.issues)
    violations = [FieldViolation(field, i.message, i.pointer, i.keyword) for i in issues]
    where = "; ".join(f"at {i.pointer or '/'} ({i.keyword}): {i.message}" for i in issues[:5])
    more = f" (+{len(issues) - 5} more)" if len(issues) > 5 else ""
    label = "unsupported schema" if kind == "unsupported" else "invalid schema"
    reason = "UNSUPPORTED_SCHEMA" if kind == "unsupported" else ("INVALID_SCHEMA" if kind in ("invalid_schema", "metaschema") else f"SCHEMA_{kind.upper()}")
    return FrontError(Code.INVALID_ARGUMENT, f"{field}: {label}: {where or exc}{more}", reason, violations)


def _request_field(exc: EngineError) -> str:
    """The request field an engine error names (sampling parameters live under ``sampling.``)."""
    if exc.field in SAMPLING_FIELDS:
        return f"sampling.{exc.field}"
    return _REQUEST_FIELDS.get(exc.field, exc.field) or "request"


def from_exception(exc: BaseException, schema_field: str = "json_schema") -> FrontError | None:
    """Map a known exception; None for anything unexpected (the caller logs it as INTERNAL)."""
    if isinstance(exc, FrontError):
        return exc
    if isinstance(exc, SchemaError):
        return schema_error(exc, schema_field)
    if isinstance(exc, DraftLoadError):
        return FrontError(Code.INVALID_ARGUMENT, f"path: {exc}", "INVALID_DRAFT", [FieldViolation("path", str(exc))])
    if isinstance(exc, DraftsUnsupported):
        return FrontError(Code.FAILED_PRECONDITION, str(exc), "DRAFT_UNSUPPORTED")
    if isinstance(exc, ContextTooLong):
        field = exc.field or "text"
        return FrontError(Code.INVALID_ARGUMENT, f"{field}: {exc}", "CONTEXT_TOO_LONG", [FieldViolation(field, str(exc))])
    if isinstance(exc, InvalidRequest):
        field = _request_field(exc)
        reason = "INVALID_SAMPLING" if exc.field in SAMPLING_FIELDS else "INVALID_ARGUMENT"
        return FrontError(Code.INVALID_ARGUMENT, f"{field}: {exc}", reason, [FieldViolation(field, str(exc))])
    if isinstance(exc, QueueFull):
        return FrontError(Code.RESOURCE_EXHAUSTED, f"server is at capacity: {exc}", "QUEUE_FULL")
    if isinstance(exc, OverBudget):  # the request alone exceeds the server's KV budget: retrying will not help
        field = _request_field(exc)
        return FrontError(Code.RESOURCE_EXHAUSTED, f"{field}: {exc}", "KV_BUDGET", [FieldViolation(field, str(exc))])
    if isinstance(exc, EngineStopped):
        return FrontError(Code.UNAVAILABLE, f"engine stopped: {exc}", "ENGINE_STOPPED")
    if isinstance(exc, EngineError):
        return FrontError(Code.INTERNAL, f"model failure: {exc}", "MODEL_FAILURE")
    if isinstance(exc, StoreUnavailable):  # before StoreError, its base
        return FrontError(Code.UNAVAILABLE, "the schema store is unreachable: registry writes and statistics reads "
                          "fail until it is back (extraction and tool calls keep serving); retry later",
                          "STORE_UNAVAILABLE")
    if isinstance(exc, StoreError):
        return FrontError(Code.INTERNAL, "schema store failure", "STORE_FAILURE")
    return None


def check_result(result: GenerationResult, deadline: float | None, now: float | None = None,
                 schema_field: str = "json_schema") -> None:
    """Raise for results that must not be returned as a success: cancelled (deadline or
    shutdown), errored, or failing the post-check for an unexpected reason. LENGTH and
    SCHEMA_VIOLATION are successes with their finish reason/outcome."""
    if result.finish_reason is FinishReason.CANCELLED:
        if deadline_passed(deadline, now):
            raise deadline_exceeded()
        raise FrontError(Code.CANCELLED, result.error or "decoding was cancelled", "CANCELLED")
    if result.finish_reason is FinishReason.ERROR and result.grammar_limit:  # the schema's, not the model's
        message = f"{schema_field}: {result.error or 'grammar engine limit ' + result.grammar_limit}"
        raise FrontError(Code.RESOURCE_EXHAUSTED, message, "GRAMMAR_LIMIT",
                         [FieldViolation(schema_field, message, keyword=result.grammar_limit)])
    if result.finish_reason is FinishReason.ERROR:
        error = result.error or "unknown error"
        message = error if error.startswith("model failure") else f"model failure: {error}"  # said once
        raise FrontError(Code.INTERNAL, message, "MODEL_FAILURE")
    if result.outcome is Outcome.INTERNAL_ERROR:
        raise FrontError(Code.INTERNAL, f"output failed validation: {result.error or 'unknown'}", "OUTPUT_CHECK_FAILED")
