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
    def of(cls, parent: pb.ExtractResult | pb.CallToolResponse) -> "SpeculationReport | None":
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
    speculation: SpeculationReport | None = None  # None from servers that report no drafting decision
    model: str = ""  # the model that produced it
    draft_version: str = ""  # the draft model's version that served it ("" without one)

    @classmethod
    def from_pb(cls, r: pb.CallToolResponse) -> "ToolCallResult":
        calls = [ToolCall(c.name, json.loads(c.arguments_json) if c.arguments_json else {}, c.arguments_json) for c in r.tool_calls]
        return cls(
            r.request_id, calls, r.text if r.HasField("text") else None, _FINISH.get(r.finish_reason, ""),
            _OUTCOME.get(r.outcome, ""), r.truncated, Usage.from_pb(r.usage), Timings.from_pb(r.timings), r.raw_output, r.error,
            SpeculationReport.of(r), r.model, r.draft_version,
        )


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


@dataclass(frozen=True)
class ProposerStats:
    """Drafting of one proposer at one batch-size bucket over a window."""

    proposer: str
    batch_bucket: int
    drafted: int
    accepted: int
    events: int  # verifications that carried its draft
    acceptance_rate: float
    probe_verifications: int = 0  # of ``events``, those made by recovery probes
    reached: list[int] = field(default_factory=list)  # [i]: drafts whose position i+1 was examined
    accepted_at: list[int] = field(default_factory=list)  # [i]: of those, accepted at position i+1
    acceptance_by_position: list[float] = field(default_factory=list)  # [i]: accepted_at[i] / reached[i]

    @classmethod
    def from_pb(cls, p: pb.ProposerStats) -> "ProposerStats":
        return cls(p.proposer, p.batch_bucket, p.drafted, p.accepted, p.events, p.acceptance_rate, p.probe_verifications,
                   list(p.reached), list(p.accepted_at), list(p.acceptance_by_position))


@dataclass(frozen=True)
class DecisionCount:
    proposer: str  # "" for the request's own reason
    reason: str
    requests: int


@dataclass(frozen=True)
class HistogramBucket:
    upper_bound: float  # math.inf for the last
    count: int


@dataclass(frozen=True)
class StatsWindow:
    """The statistics of one (model, schema) over one window ending now (whole hours)."""

    window_seconds: int
    proposers: list[ProposerStats] = field(default_factory=list)
    requests: int = 0
    output_tokens: int = 0
    target_passes: int = 0
    forced_tokens: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)  # stop | length | cancelled | error -> requests
    output_tokens_p50: float = 0.0  # of the requests that finished with "stop"
    output_tokens_p95: float = 0.0
    latency_ms_p50: float = 0.0
    latency_ms_p99: float = 0.0
    latency_ms_mean: float = 0.0
    passes_per_token: float = 0.0
    decisions: list[DecisionCount] = field(default_factory=list)
    output_length: list[HistogramBucket] = field(default_factory=list)
    latency_ms: list[HistogramBucket] = field(default_factory=list)
    names: dict[str, int] = field(default_factory=dict)  # readable names callers gave an inline schema -> requests
    estimated_speedup: float = 0.0  # over the same requests without drafts; 0 without target passes
    speedup_costs_measured: bool = False  # every drafted pass priced with measured step times

    @classmethod
    def from_pb(cls, w: pb.StatsWindow) -> "StatsWindow":
        return cls(
            w.window_seconds, [ProposerStats.from_pb(p) for p in w.proposers], w.requests, w.output_tokens,
            w.target_passes, w.forced_tokens, dict(w.finish_reasons), w.output_tokens_p50, w.output_tokens_p95,
            w.latency_ms_p50, w.latency_ms_p99, w.latency_ms_mean, w.passes_per_token,
            [DecisionCount(d.proposer, d.reason, d.requests) for d in w.decisions],
            [HistogramBucket(b.upper_bound, b.count) for b in w.output_length],
            [HistogramBucket(b.upper_bound, b.count) for b in w.latency_ms], dict(w.names),
            w.estimated_speedup, w.speedup_costs_measured,
        )

    @property
    def output_tokens_mean(self) -> float:
        return self.output_tokens / self.requests if self.requests else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Output tokens per target forward pass (above 1: drafts and fast-forward paid off)."""
        return self.output_tokens / self.target_passes if self.target_passes else 0.0

    def finish_share(self, reason: str) -> float:
        """The share of requests that finished with ``reason`` (length: truncated, cancelled, error: failed)."""
        return self.finish_reasons.get(reason, 0) / self.requests if self.requests else 0.0


def _optional(message: Any, name: str) -> float | None:
    return getattr(message, name) if message.HasField(name) else None


@dataclass(frozen=True)
class ProposerPolicyState:
    """The drafting policy's state of one proposer for one schema (times in unix seconds)."""

    proposer: str
    state: str  # on | off
    reason: str
    since: float  # entered the current state
    changed_at: float
    last_switch_off: float | None
    last_switch_on: float | None
    acceptance: float | None  # what the policy read at the latest change
    threshold: float | None
    batch_bucket: int

    @classmethod
    def from_pb(cls, p: pb.ProposerPolicyState) -> "ProposerPolicyState":
        return cls(p.proposer, p.state, p.reason, p.since, p.changed_at, p.last_switch_off or None,
                   p.last_switch_on or None, _optional(p, "acceptance"), _optional(p, "threshold"), p.batch_bucket)


@dataclass(frozen=True)
class PolicyChange:
    proposer: str
    at: float
    state: str
    reason: str
    previous: str  # "" for the first decision
    batch_bucket: int
    acceptance: float | None
    threshold: float | None

    @property
    def is_switch(self) -> bool:
        return self.previous != self.state

    @classmethod
    def from_pb(cls, c: pb.PolicyChange) -> "PolicyChange":
        return cls(c.proposer, c.at, c.state, c.reason, c.previous, c.batch_bucket, _optional(c, "acceptance"),
                   _optional(c, "threshold"))


@dataclass(frozen=True)
class ProposerHour:
    proposer: str
    drafted: int
    accepted: int
    examined: int
    accepted_examined: int

    @property
    def acceptance(self) -> float | None:
        """Accepted per examined drafted token (the policy's measure); None when nothing was drafted."""
        if self.examined:
            return self.accepted_examined / self.examined
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True)
class HourStats:
    hour_start: int  # unix seconds
    requests: int
    output_tokens: int
    target_passes: int
    latency_ms_p50: float
    latency_ms_p99: float
    proposers: list[ProposerHour] = field(default_factory=list)

    @property
    def passes_per_token(self) -> float | None:
        return self.target_passes / self.output_tokens if self.output_tokens else None

    @classmethod
    def from_pb(cls, h: pb.HourStats) -> "HourStats":
        return cls(h.hour_start, h.requests, h.output_tokens, h.target_passes, h.latency_ms_p50, h.latency_ms_p99,
                   [ProposerHour(p.proposer, p.drafted, p.accepted, p.examined, p.accepted_examined)
                    for p in h.proposers])


@dataclass(frozen=True)
class SchemaStats:
    schema_key: str
    windows: dict[int, StatsWindow]  # window seconds -> its statistics, in the order asked for
    model: str = ""  # the model they were measured on
    policy: list[ProposerPolicyState] = field(default_factory=list)
    policy_changes: list[PolicyChange] = field(default_factory=list)  # with include_timeline, oldest first
    timeline: list[HourStats] = field(default_factory=list)  # with include_timeline, oldest first

    @classmethod
    def from_pb(cls, s: pb.SchemaStats) -> "SchemaStats":
        return cls(s.schema_key, {w.window_seconds: StatsWindow.from_pb(w) for w in s.windows}, s.model,
                   [ProposerPolicyState.from_pb(p) for p in s.policy],
                   [PolicyChange.from_pb(c) for c in s.policy_changes], [HourStats.from_pb(h) for h in s.timeline])


@dataclass(frozen=True)
class RejectedDraft:
    """A sampled draft the target refused: context, the drafted continuation, where and what the target chose."""

    model: str
    schema_key: str
    proposer: str
    created_at: float
    batch_bucket: int
    context_tokens: list[int]
    context_text: str
    draft_tokens: list[int]
    draft_text: str
    position: int  # 0-based; the drafted tokens before it were accepted
    rejected_token: int
    rejected_text: str
    target_token: int
    target_text: str
    grammatical: bool  # False: the grammar refused the drafted token

    @property
    def accepted_text_tokens(self) -> list[int]:
        return self.draft_tokens[: self.position]

    @classmethod
    def from_pb(cls, r: pb.RejectedDraft) -> "RejectedDraft":
        return cls(r.model, r.schema_key, r.proposer, r.created_at, r.batch_bucket, list(r.context_tokens),
                   r.context_text, list(r.draft_tokens), r.draft_text, r.position, r.rejected_token, r.rejected_text,
                   r.target_token, r.target_text, r.grammatical)
