"""Plain result values the clients return (no protobuf types leak to callers)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from structspec.proto_gen.v1 import structspec_pb2 as pb

_FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_CANCELLED: "cancelled", pb.FINISH_REASON_ERROR: "error"}
_OUTCOME = {
    pb.OUTCOME_VALID: "valid",
    pb.OUTCOME_TRUNCATED: "truncated",
    pb.OUTCOME_SCHEMA_VIOLATION: "schema_violation",
    pb.OUTCOME_INTERNAL_ERROR: "internal_error",
    pb.OUTCOME_TEXT: "text",
    pb.OUTCOME_NOT_CHECKED: "not_checked",
}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    output_tokens: int = 0
    target_forward_passes: int = 0
    forced_tokens: int = 0
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    cached_prompt_tokens: int = 0

    @classmethod
    def from_pb(cls, u: pb.Usage) -> "Usage":
        return cls(u.prompt_tokens, u.output_tokens, u.target_forward_passes, u.forced_tokens, dict(u.drafted_tokens),
                   dict(u.accepted_tokens), u.cached_prompt_tokens)


@dataclass(frozen=True)
class Timings:
    queued_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    total_ms: float = 0.0

    @classmethod
    def from_pb(cls, t: pb.Timings) -> "Timings":
        return cls(t.queued_ms, t.prefill_ms, t.decode_ms, t.total_ms)


@dataclass(frozen=True)
class ExtractionResult:
    request_id: str
    json: str  # the output text (a prefix when truncated)
    value: Any  # parsed from ``json`` when complete, else None
    finish_reason: str  # "stop" | "length"
    outcome: str  # "valid" | "truncated" | "schema_violation"
    truncated: bool
    usage: Usage
    timings: Timings
    error: str = ""
    schema_key: str = ""

    @property
    def complete(self) -> bool:
        return self.outcome in ("valid", "schema_violation")

    @classmethod
    def from_pb(cls, r: pb.ExtractResult) -> "ExtractionResult":
        outcome = _OUTCOME.get(r.outcome, "")
        value = None
        if outcome in ("valid", "schema_violation"):
            try:
                value = json.loads(r.json)  # the text, not the Struct: exact integers
            except json.JSONDecodeError:
                value = None
        return cls(
            r.request_id, r.json, value, _FINISH.get(r.finish_reason, ""), outcome, r.truncated,
            Usage.from_pb(r.usage), Timings.from_pb(r.timings), r.error, r.schema_key,
        )


@dataclass(frozen=True)
class TextDelta:
    """A piece of streamed output text."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    arguments_json: str


@dataclass(frozen=True)
class ToolCallResult:
    request_id: str
    calls: list[ToolCall]
    text: str | None
    finish_reason: str
    outcome: str
    truncated: bool
    usage: Usage
    timings: Timings
    raw_output: str = ""
    error: str = ""

    @classmethod
    def from_pb(cls, r: pb.CallToolResponse) -> "ToolCallResult":
        calls = [ToolCall(c.name, json.loads(c.arguments_json) if c.arguments_json else {}, c.arguments_json) for c in r.tool_calls]
        return cls(
            r.request_id, calls, r.text if r.HasField("text") else None, _FINISH.get(r.finish_reason, ""),
            _OUTCOME.get(r.outcome, ""), r.truncated, Usage.from_pb(r.usage), Timings.from_pb(r.timings), r.raw_output, r.error,
        )


@dataclass(frozen=True)
class SchemaInfo:
    schema_id: str
    version: int
    schema: dict[str, Any] | None  # None when listed with omit_content
    sha256: str
    description: str
    created_at: dt.datetime
    source: str
    created: bool | None = None  # RegisterSchema only: False when the content already existed

    @property
    def key(self) -> str:
        return f"{self.schema_id}@{self.version}"

    @classmethod
    def from_pb(cls, s: pb.SchemaVersion, created: bool | None = None) -> "SchemaInfo":
        return cls(
            s.schema_id, s.version, json.loads(s.schema_json) if s.schema_json else None, s.sha256, s.description,
            s.created_at.ToDatetime(tzinfo=dt.timezone.utc), s.source, created,
        )


@dataclass(frozen=True)
class ProposerStats:
    proposer: str
    batch_bucket: int
    drafted: int
    accepted: int
    events: int
    acceptance_rate: float


@dataclass(frozen=True)
class SchemaStats:
    schema_key: str
    windows: dict[int, list[ProposerStats]]  # window seconds -> rows

    @classmethod
    def from_pb(cls, s: pb.SchemaStats) -> "SchemaStats":
        return cls(
            s.schema_key,
            {
                w.window_seconds: [ProposerStats(p.proposer, p.batch_bucket, p.drafted, p.accepted, p.events, p.acceptance_rate) for p in w.proposers]
                for w in s.windows
            },
        )
