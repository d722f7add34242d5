"""Plain result values the clients return (no protobuf types leak to callers); the statistics RPCs return the
statistics views (``structspec.front.views``, decoded by ``structspec.client.stats_decode``)."""

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


_SCHEMA_SPECULATION = {pb.SCHEMA_SPECULATION_AUTO: "auto", pb.SCHEMA_SPECULATION_OFF: "off", pb.SCHEMA_SPECULATION_ON: "on"}


@dataclass(frozen=True)
class SpeculationReport:
    """Whether a request drafted and why (reasons: drafted, cold, probe, explore, request_off, schema_off,
    schema_on, server_off, short_output, low_acceptance, no_gain, batch_size, policy_error)."""

    drafted: bool  # the policy let at least one proposer draft
    reason: str  # the request's reason
    probe: bool = False  # a recovery probe: drafted with proposers the policy had switched off
    max_draft: dict[str, int] = field(default_factory=dict)  # proposer -> longest draft it may make
    reasons: dict[str, str] = field(default_factory=dict)  # proposer -> its own reason
    arm: str = ""  # "draft" / "no_draft" where the policy compares the two for the schema

    @classmethod
    def from_pb(cls, r: pb.SpeculationReport) -> "SpeculationReport":
        return cls(r.drafted, r.reason, r.probe, dict(r.max_draft), dict(r.proposer_reasons), r.arm)

    @classmethod
    def of(cls, parent: pb.ExtractResult | pb.CallToolResponse | pb.ChatResult) -> "SpeculationReport | None":
        """The report of a result message; None when the server sent none."""
        return cls.from_pb(parent.speculation) if parent.HasField("speculation") else None


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
    speculation: SpeculationReport | None = None  # None from servers that report no drafting decision
    model: str = ""  # the model that produced it (the one its statistics are kept under)
    draft_version: str = ""  # the draft model's version that served it ("" without one)

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
            Usage.from_pb(r.usage), Timings.from_pb(r.timings), r.error, r.schema_key, SpeculationReport.of(r), r.model,
            r.draft_version,
        )


@dataclass(frozen=True)
class TextDelta:
    """A piece of streamed output text."""

    text: str


@dataclass(frozen=True)
class ChatResult:
    """A free-text answer (``Client.chat``): ``finish_reason`` "stop" (the model ended its turn, or wrote a stop
    string, left out of ``text``) or "length" (``max_tokens`` reached: ``truncated``)."""

    request_id: str
    text: str
    finish_reason: str  # "stop" | "length"
    truncated: bool
    usage: Usage
    timings: Timings
    outcome: str = "text"  # "text" | "truncated"
    speculation: SpeculationReport | None = None
    model: str = ""
    draft_version: str = ""

    @classmethod
    def from_pb(cls, r: pb.ChatResult) -> "ChatResult":
        return cls(r.request_id, r.text, _FINISH.get(r.finish_reason, ""), r.truncated, Usage.from_pb(r.usage),
                   Timings.from_pb(r.timings), _OUTCOME.get(r.outcome, ""), SpeculationReport.of(r), r.model,
                   r.draft_version)


@dataclass(frozen=True)
class ToolCall:
    """A call the model made; ``id`` names it when its result goes back (a tool turn's ``tool_call_id``)."""

    name: str
    arguments: dict[str, Any]
    arguments_json: str
    id: str = ""


@dataclass(frozen=True)
class ToolCallResult:
    """Tool calls, or a text answer (``text``, where ``tool_choice`` allowed one; JSON valid against the
    ``answer_schema`` where one was sent: ``answer``), or both where the model wrote text before its calls."""

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
    speculation: SpeculationReport | None = None  # None from servers that report no drafting decision
    model: str = ""  # the model that produced it
    draft_version: str = ""  # the draft model's version that served it ("" without one)

    @classmethod
    def from_pb(cls, r: pb.CallToolResponse) -> "ToolCallResult":
        calls = [ToolCall(c.name, json.loads(c.arguments_json) if c.arguments_json else {}, c.arguments_json, c.id)
                 for c in r.tool_calls]
        return cls(
            r.request_id, calls, r.text if r.HasField("text") else None, _FINISH.get(r.finish_reason, ""),
            _OUTCOME.get(r.outcome, ""), r.truncated, Usage.from_pb(r.usage), Timings.from_pb(r.timings), r.raw_output, r.error,
            SpeculationReport.of(r), r.model, r.draft_version,
        )

    @property
    def answer(self) -> Any:
        """The text answer parsed as JSON (an ``answer_schema`` answer); None without a text answer."""
        return None if self.text is None else json.loads(self.text)

    def assistant_message(self) -> dict[str, Any]:
        """This answer as the assistant turn to send back with the tools' results (``call_tool``'s messages)."""
        return {"role": "assistant", "content": self.text or "",
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments_json} for c in self.calls]}


@dataclass(frozen=True)
class DraftLoad:
    """What LoadDraft did: the draft version (and model key) serving requests from now on, and the one before."""

    draft_version: str
    model: str
    loaded: bool  # False: that version was serving already (nothing changed)
    previous_draft_version: str = ""
    previous_model: str = ""

    @classmethod
    def from_pb(cls, r: pb.LoadDraftResponse) -> "DraftLoad":
        return cls(r.draft_version, r.model, r.loaded, r.previous_draft_version, r.previous_model)


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
    speculation: str = "auto"  # the owner's drafting override: auto | off | on

    @property
    def key(self) -> str:
        return f"{self.schema_id}@{self.version}"

    @classmethod
    def from_pb(cls, s: pb.SchemaVersion, created: bool | None = None) -> "SchemaInfo":
        return cls(
            s.schema_id, s.version, json.loads(s.schema_json) if s.schema_json else None, s.sha256, s.description,
            s.created_at.ToDatetime(tzinfo=dt.timezone.utc), s.source, created,
            _SCHEMA_SPECULATION.get(s.speculation, "auto"),
        )
