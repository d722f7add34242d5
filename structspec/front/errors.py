"""The one error vocabulary of both fronts: a ``Code``, a ``FrontError`` and the small constructors.

A ``FrontError`` is a failure whose status is already decided: a ``Code`` (the gRPC status names, which
the gRPC front sends as they are and the HTTP front maps to HTTP statuses), a readable ``message``, a
machine-readable ``reason`` ("INVALID_SCHEMA", "QUEUE_FULL", ...) and the ``violations``, one
``FieldViolation`` per request field at fault (with the JSON pointer and keyword inside a schema).

``DETAILS_KEY`` is the gRPC trailing-metadata key under which the reason, request id and violations
travel (a serialized ``structspec.v1.ErrorDetails``); it lives here, beside the values it carries, so
that the server (which writes it) and the client (which reads it) name it once without the client
importing the server. This module imports only the standard library: the client imports it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

DETAILS_KEY = "structspec-error-details-bin"


class Code(enum.Enum):
    """A call's status: the gRPC status names (the HTTP front maps each to an HTTP status)."""

    OK = "OK"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"


@dataclass(frozen=True)
class FieldViolation:
    """One request field at fault; inside a schema, the JSON pointer and keyword of the offending part."""

    field: str
    description: str
    json_pointer: str = ""
    keyword: str = ""


class FrontError(Exception):
    """An error with its status code already decided."""

    def __init__(self, code: Code, message: str, reason: str, violations: Sequence[FieldViolation] = ()):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.violations = tuple(violations)


def invalid(field: str, message: str, reason: str = "INVALID_ARGUMENT") -> FrontError:
    return FrontError(Code.INVALID_ARGUMENT, f"{field}: {message}", reason, [FieldViolation(field, message)])


def schema_too_deep(field: str, exc: Any) -> FrontError:
    """A schema (or tool parameters) nesting past a documented limit (``grammar.json_text``)."""
    message = f"schema {exc}"
    return FrontError(Code.INVALID_ARGUMENT, f"{field}: {message}", "SCHEMA_TOO_DEEP",
                      [FieldViolation(field, message, getattr(exc, "pointer", ""))])


def deadline_exceeded() -> FrontError:
    """A call whose deadline passed while the engine decoded it."""
    return FrontError(Code.DEADLINE_EXCEEDED, "deadline exceeded during decoding", "DEADLINE_EXCEEDED")


def not_found(message: str, reason: str = "SCHEMA_NOT_FOUND", field: str = "schema_id") -> FrontError:
    return FrontError(Code.NOT_FOUND, message, reason, [FieldViolation(field, message)])


def message_too_large(size: int, limit: int, exact: bool = True) -> FrontError:
    """A request over the server's ``max_message_bytes`` (``exact``: ``size`` is its size, else a bound it passed)."""
    text = f"request is {'' if exact else 'over '}{size} bytes; the limit is {limit}"
    return FrontError(Code.INVALID_ARGUMENT, text, "MESSAGE_TOO_LARGE", [FieldViolation("request", "message too large")])
