"""The statistics views: what a schema's owner reads about drafting, as plain values.

One ``SchemaStats`` per (model, schema key): a ``StatsWindow`` per window asked for (requests,
output tokens, target passes, finish reasons, quantiles, histograms, the estimated speedup and
a ``ProposerStats`` per proposer and batch bucket), the drafting policy's state per proposer
(``ProposerPolicyState``) and, on request, its changes (``PolicyChange``) and the hourly timeline
(``HourStats``), and per proposer the cost model's pricing of its draft lengths (``DraftPricing``: why it drafts
as far as it does). A ``RejectedDraft`` is one sampled draft the target refused.

``structspec.front.stats`` builds them from a store; the gRPC front sends them
(``structspec.service.stats_convert``), the client decodes them back into these same classes,
``structspec stats`` prints them and ``structspec.report`` renders them. Times are unix seconds.
This module imports only the standard library and ``stats.counters`` (itself standard library only): the client
imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from structspec.stats.counters import acceptance_of


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


@dataclass(frozen=True)
class ProposerPolicyState:
    """The drafting policy's state of one proposer for one schema."""

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


@dataclass(frozen=True)
class ProposerHour:
    proposer: str
    drafted: int
    accepted: int
    examined: int
    accepted_examined: int

    @property
    def acceptance(self) -> float | None:
        """Accepted per examined drafted token (the policy's measure; ``counters.acceptance_of``)."""
        return acceptance_of(self.accepted_examined, self.examined, self.accepted, self.drafted)


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


@dataclass(frozen=True)
class DraftPrice:
    """One draft length k as the drafting policy's cost model prices it: (step + drafting) / (1 + E[accepted])."""

    k: int  # 0: the plain step
    step_seconds: float | None  # the target step carrying a k-token draft at the batch bucket (None: no cost known)
    propose_seconds: float  # the proposer's own drafting time per k-token draft made (empty lookups included)
    expected_accepted: float  # E[accepted drafted tokens | a k-token draft] at the priced acceptance
    seconds_per_token: float | None  # per committed token (k = 0: the plain step)
    step_source: str = ""  # served (measured while serving) | profile (measured at start) | interpolated | ""

    @property
    def tokens_per_step(self) -> float:
        """Committed tokens a step: the target's own plus the accepted drafted ones."""
        return 1.0 + self.expected_accepted


@dataclass(frozen=True)
class DraftPricing:
    """Why a proposer drafts as far as it does for one schema at one batch bucket: the schema's drafting evidence,
    the acceptance it is priced at (cold: a prior added to thin evidence), each draft length's price and the length
    the cost model chose (0: none beats the plain step by ``gain_margin``). The guard, the owner's override, short
    outputs and probes are the policy's decision (``SchemaStats.policy``), not priced here."""

    proposer: str
    batch_bucket: int
    evidence_tokens: float  # the schema's drafted tokens the policy reads (its window, age-limited)
    min_evidence_tokens: int  # under this the proposer is cold
    acceptance: float | None  # measured, per examined drafted token (None: nothing drafted)
    cold: bool  # priced at the prior acceptance, its thin evidence added
    chosen: int  # the draft length the cost model picks (0: none pays)
    gain_margin: float  # a draft length must beat the plain step's time per token by this share
    prices: list[DraftPrice] = field(default_factory=list)  # k = 0 .. the longest draft
    reason: str = ""  # the policy's latest reason for the proposer (its state's, else its latest decisions'); "" none
    replayed_tokens: float = 0.0  # drafts replayed on finished outputs it did not draft in (read while cold)
    replayed_acceptance: float | None = None  # theirs, per examined token (None: none replayed)
    restricted_chosen: int = 0  # the longer length drafted where every scored position's allowed set is small

    @property
    def plain(self) -> DraftPrice | None:
        """The plain step (k = 0)."""
        return next((p for p in self.prices if p.k == 0), None)

    @property
    def best(self) -> DraftPrice | None:
        """The chosen length's price; where none was chosen, the cheapest priced draft (the one that came closest)."""
        if self.chosen:
            return next((p for p in self.prices if p.k == self.chosen), None)
        drafts = [p for p in self.prices if p.k > 0 and p.seconds_per_token is not None]
        return min(drafts, key=lambda p: (p.seconds_per_token or 0.0, p.k)) if drafts else None

    @property
    def priced_acceptance(self) -> float | None:
        """The acceptance at a draft's first position the prices were computed at (E[accepted | k = 1])."""
        return next((p.expected_accepted for p in self.prices if p.k == 1), None)


@dataclass(frozen=True)
class SchemaStats:
    schema_key: str
    windows: dict[int, StatsWindow]  # window seconds -> its statistics, in the order asked for
    model: str = ""  # the model they were measured on
    policy: list[ProposerPolicyState] = field(default_factory=list)
    policy_changes: list[PolicyChange] = field(default_factory=list)  # with include_timeline, oldest first
    timeline: list[HourStats] = field(default_factory=list)  # with include_timeline, oldest first
    pricing: list[DraftPricing] = field(default_factory=list)  # per proposer: the cost model's view, by proposer


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
