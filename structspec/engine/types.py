"""Values that cross the engine's boundary, both ways: sampling parameters and switches, results and deltas out,
typed errors.

The rule between the two boundary modules: this one holds values; ``api`` holds the seam (``EngineAPI``) and the
requests a caller sends.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class FinishReason(str, enum.Enum):
    STOP = "stop"  # the grammar completed (or was accepting and the model chose EOS)
    LENGTH = "length"  # max_tokens reached: the text is a truncated prefix, never a complete object
    CANCELLED = "cancelled"  # the caller cancelled or its deadline passed
    ERROR = "error"  # model or grammar failure; ``error`` says which


class Outcome(str, enum.Enum):
    """What the post-check concluded about a finished output."""

    VALID = "valid"  # parsed and validated against the request's schema
    TRUNCATED = "truncated"  # finish reason length: not checked, not complete
    SCHEMA_VIOLATION = "schema_violation"  # failed a keyword the grammar only post-checks (declared up front)
    INTERNAL_ERROR = "internal_error"  # failed anything else: a bug, logged and counted
    TEXT = "text"  # a plain-text answer allowed by tool_choice (not JSON)
    NOT_CHECKED = "not_checked"  # cancelled or errored before completion


class SpeculationMode(str, enum.Enum):
    AUTO = "auto"  # the policy decides per schema / batch size
    OFF = "off"  # no drafting (fast-forward stays: it never changes the output)


class SchemaSpeculation(str, enum.Enum):
    """A schema owner's override of the drafting policy, kept with the schema version."""

    AUTO = "auto"  # the policy decides from the schema's statistics
    OFF = "off"  # never draft (fast-forward stays)
    ON = "on"  # always draft with every proposer the server has (the policy's switches bypassed)


@dataclass(frozen=True)
class SpeculationReport:
    """Whether a request drafted and, if not, why (``structspec.stats.counters.Reason`` labels)."""

    drafted: bool  # the policy let at least one proposer draft (whether or not any draft was made)
    reason: str  # the request's reason: drafted, cold, probe, request_off, short_output, low_acceptance, ...
    probe: bool = False  # a recovery probe: drafted with proposers the policy had switched off
    max_draft: dict[str, int] = field(default_factory=dict)  # proposer -> draft-length cap (the ones allowed)
    reasons: dict[str, str] = field(default_factory=dict)  # proposer -> its own reason
    arm: str = ""  # with or without the draft model, where the policy compares the two ("": no comparison)
    # proposer -> a longer cap for drafts whose every scored position has a small allowed set (the executor scores
    # them without its output layer, so they cost less): drafted past ``max_draft`` only there (``Drafter.draft``)
    restricted_max_draft: dict[str, int] = field(default_factory=dict)

    def caps(self) -> dict[str, int]:
        """proposer -> the longest draft it may make: its cap, or its restricted cap where that is longer."""
        return {p: max(self.max_draft.get(p, 0), self.restricted_max_draft.get(p, 0))
                for p in (*self.max_draft, *self.restricted_max_draft)}


class EngineError(Exception):
    """Base of errors the service maps to status codes; ``field`` names the offending request field."""

    code = "internal"

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class InvalidRequest(EngineError):
    code = "invalid_argument"


class ContextTooLong(InvalidRequest):
    """Prompt + max_tokens exceed the model's context window."""


class QueueFull(EngineError):
    code = "resource_exhausted"


class OverBudget(EngineError):
    """The request alone needs more KV-cache memory than the server's whole budget."""

    code = "resource_exhausted"


class EngineStopped(EngineError):
    code = "unavailable"


class DraftLoadError(InvalidRequest):
    """A draft folder that cannot serve this target: missing, not a model folder, another tokenizer."""

    def __init__(self, message: str):
        super().__init__(message, field="path")


class DraftsUnsupported(EngineError):
    """The engine takes no draft model: its speculation configuration drafts without one (or not at all)."""

    code = "failed_precondition"


@dataclass(frozen=True)
class DraftUpdate:
    """A loaded draft model, ready to be installed: the speculator's proposer (opaque to the engine), its
    version (``weights_version``) and the model key its statistics go under."""

    proposer: Any
    version: str
    model_key: str


@dataclass(frozen=True)
class DraftSwap:
    """What a draft load did: the version serving requests admitted from now on, and the one before."""

    draft_version: str
    model_key: str
    previous_draft_version: str
    previous_model_key: str
    loaded: bool  # False: that version was serving already, nothing changed


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when ``temperature == 0``. A seeded request is reproducible for the same configuration."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    max_tokens: int = 256

    def validate(self) -> None:
        checks = [
            (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 10.0, "temperature", "must be in [0, 10]"),
            (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= 0, "top_k", "must be >= 0"),
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (self.seed is None or 0 <= self.seed < 2**63, "seed", "must be in [0, 2^63)"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise InvalidRequest(f"{name} {why}", field=name)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Usage:
    prompt_tokens: int = 0
    output_tokens: int = 0
    target_forward_passes: int = 0
    forced_tokens: int = 0  # fast-forwarded: chosen by the grammar, no model decision
    drafted: dict[str, int] = field(default_factory=dict)  # per proposer
    accepted: dict[str, int] = field(default_factory=dict)  # per proposer
    draft_steps: dict[str, int] = field(default_factory=dict)  # verification steps that carried a draft, per proposer
    cached_prompt_tokens: int = 0  # prompt tokens whose KV was copied from a cached prefix, not recomputed


@dataclass
class Timings:
    queued_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    total_ms: float = 0.0


@dataclass
class GenerationResult:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    outcome: Outcome
    usage: Usage
    timings: Timings
    value: Any = None  # the parsed JSON when outcome is VALID or SCHEMA_VIOLATION
    error: str | None = None  # what went wrong (finish ERROR, SCHEMA_VIOLATION, INTERNAL_ERROR)
    # finish ERROR because the schema's grammar passed one of the grammar engine's resource limits
    # (a property of the schema, not a model failure): the limit's name
    grammar_limit: str | None = None
    speculation: SpeculationReport | None = None  # the drafting decision (None from engines without a policy)
    # What served it, fixed when it was admitted (a draft loaded meanwhile serves later requests only): the model
    # its statistics are kept under and the draft model's version ("" without one, or from engines that do not say)
    model_key: str = ""
    draft_version: str = ""

    @property
    def truncated(self) -> bool:
        return self.finish_reason is FinishReason.LENGTH


@dataclass(frozen=True)
class TextDelta:
    """Newly committed text, cut only on UTF-8 character boundaries."""

    request_id: str
    text: str


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallResult:
    result: GenerationResult
    calls: list[ToolCall] = field(default_factory=list)
    text: str | None = None  # a plain-text answer, where tool_choice allowed one
