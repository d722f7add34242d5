"""Typed client exceptions: one per gRPC status the service uses, plus output errors
(a truncated or schema-violating output is a successful RPC the caller still cannot use).

``FieldViolation`` and the details' metadata key are the server's own (``front.errors``)."""

from __future__ import annotations

from typing import Any

import grpc

from structspec.front.errors import DETAILS_KEY, FieldViolation
from structspec.proto_gen.v1 import structspec_pb2 as pb


class StructSpecError(Exception):
    """A failed RPC: ``code`` (grpc.StatusCode), the server's ``message``, and where the server
    sent them, a ``reason`` ("INVALID_SCHEMA", "QUEUE_FULL", ...), ``request_id`` and ``field_violations``."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        request_id: str = "",
        field_violations: tuple[FieldViolation, ...] = (),
    ):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.request_id = request_id
        self.field_violations = field_violations


class InvalidArgumentError(StructSpecError):
    """Bad request: invalid or unsupported schema, bad sampling parameters, prompt too long, message too large."""


class NotFoundError(StructSpecError):
    """Unknown schema id or version."""


class ResourceExhaustedError(StructSpecError):
    """The server's queue is full (retry later, with backoff)."""


class DeadlineExceededError(StructSpecError):
    """The request's timeout passed."""


class RequestCancelledError(StructSpecError):
    """The request was cancelled (by the caller or by a server shutdown)."""


class UnavailableError(StructSpecError):
    """Server unreachable, loading its model, or shutting down (retried automatically)."""


class UnauthenticatedError(StructSpecError):
    """Missing or wrong token."""


class PermissionDeniedError(StructSpecError):
    """Valid token without the right (registry writes need the admin token)."""


class FailedPreconditionError(StructSpecError):
    """The server is not in a state to do this (e.g. loading a draft into a server that drafts without one)."""


class InternalError(StructSpecError):
    """Model or server failure; the server logged it with ``request_id``."""


_BY_CODE: dict[grpc.StatusCode, type[StructSpecError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: RequestCancelledError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.INTERNAL: InternalError,
}


def _details(metadata: Any) -> pb.ErrorDetails | None:
    for item in metadata or ():
        key, value = item[0], item[1]
        if key == DETAILS_KEY and isinstance(value, bytes):
            details = pb.ErrorDetails()
            try:
                details.ParseFromString(value)
            except Exception:  # a malformed detail must not hide the status
                return None
            return details
    return None


def error_from_rpc(exc: grpc.RpcError) -> StructSpecError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
    details = _details(exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None)
    cls = _BY_CODE.get(code, StructSpecError)
    if details is None:
        return cls(code, message)
    violations = tuple(FieldViolation(v.field, v.description, v.json_pointer, v.keyword) for v in details.field_violations)
    return cls(code, message, details.reason, details.request_id, violations)


class OutputError(Exception):
    """The RPC succeeded but its output is not a complete, valid instance."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


class TruncatedOutputError(OutputError):
    """max_tokens was reached: ``partial_text`` is a prefix of the JSON, not a complete object."""

    def __init__(self, result: Any):
        text = getattr(result, "json", "") or getattr(result, "raw_output", "")
        super().__init__(f"output truncated at max_tokens after {result.usage.output_tokens} tokens; raise max_tokens", result)
        self.partial_text = text


class SchemaViolationError(OutputError):
    """Complete JSON that fails a keyword the grammar could only check afterwards."""

    def __init__(self, result: Any):
        super().__init__(f"output violates the schema: {result.error}", result)
        self.text = getattr(result, "json", "") or getattr(result, "raw_output", "")
        self.value = getattr(result, "value", None)
        self.error = result.error


class ModelValidationError(OutputError):
    """The output is valid against the JSON Schema but the pydantic model rejected it
    (a constraint the schema does not express, e.g. a custom validator)."""


# UNAVAILABLE reasons the server gives when it refused a request before starting it.
NOT_STARTED_REASONS = frozenset({"MODEL_LOADING", "DRAINING"})
_CONNECT_FAILURES = ("failed to connect", "connection refused", "dns resolution", "name resolution", "no route",
                     "connection reset", "socket closed", "end of tcp stream")


def may_have_started(exc: grpc.RpcError) -> bool:
    """Whether an UNAVAILABLE may have cut a request the server had started (a draining server cancels what is
    still running after its grace period): a retry then runs it again."""
    details = _details(exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None)
    if details is not None and details.reason in NOT_STARTED_REASONS:
        return False
    message = ((exc.details() if hasattr(exc, "details") else "") or "").lower()
    return not any(text in message for text in _CONNECT_FAILURES)
