"""One request's decoding state inside the engine, with an explicit status.

    WAITING --admit--> PREFILLING --prompt cached--> DECODING --stop/length/cancel/error--> FINISHED
    (WAITING or PREFILLING may also go straight to FINISHED)

The scheduler moves a sequence between statuses; the bookkeeping of each move (timings,
usage) happens in the method that makes it, not in the decode logic.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from structspec.engine.detok import IncrementalDetokenizer, OutputText
from structspec.engine.prefix_cache import PromptOwner
from structspec.engine.types import FinishReason, SamplingParams, SchemaSpeculation, SpeculationReport, Timings, Usage
from structspec.grammar.base import CompiledGrammar, Matcher
from structspec.stats.book import Recorder

_KEYS = itertools.count()


@dataclass(frozen=True)
class Serving:
    """What serves a sequence, bound at admission and kept to its end (a draft loaded meanwhile serves later
    sequences only): the statistics its records go to, the model key they are kept under, the draft's version."""

    stats: Recorder | None = None  # in-memory counters (no I/O); None: nothing recorded
    model_key: str = ""
    draft_version: str = ""  # "" without a draft model


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no KV cache
    PREFILLING = "prefilling"  # admitted: KV reserved, the prompt is entering the cache
    DECODING = "decoding"  # the prompt is cached; each step scores the next position(s)
    FINISHED = "finished"  # ``finish`` says why; its cache is freed or retained as a prefix (``cached_committed``)


@dataclass(eq=False)  # identity: two sequences are never "equal"
class EngineSequence:
    """Committed tokens are ``prompt + output``; those not yet in the KV cache are ``uncached``.

    ``uncached`` starts as the prompt plus the grammar's opening forced tokens, and
    after each step holds the new token (``pending``) plus the forced tokens that
    followed it: they enter the cache in the next forward, which also scores the
    next free position.
    """

    request_id: str
    prompt: list[int]
    grammar: CompiledGrammar
    matcher: Matcher
    params: SamplingParams
    seed: int
    deadline: float | None
    fast_forward: bool
    speculate: bool
    schema_key: str
    schema: dict[str, Any] | None  # the JSON Schema being decoded (None for tool calls)
    on_event: Callable[[str, Any], None]  # ("delta", text) / ("done", None), called from the engine thread
    deltas: bool = True  # text deltas wanted (a stream): without, the output is detokenized once at the end
    status: SequenceStatus = SequenceStatus.WAITING
    submitted: bool = False  # handed to an engine (once: a second submit would double its reservation)
    history_scope: str = ""  # whose earlier outputs of this schema speculation may draft from ("": everyone's)
    tenant: str = ""  # whose request: other tenants' cached prompts are reused only as far as their public part
    public_prefix: int = 0  # leading prompt tokens that are no caller's data (any tenant may reuse their cache)
    schema_speculation: SchemaSpeculation = SchemaSpeculation.AUTO  # the schema owner's override
    stop: tuple[str, ...] = ()  # text that ends the output where it first appears (``engine.stop``)
    prose: bool = False  # a free-text answer: the draft model drafts everywhere in it, not only in JSON strings
    decision: SpeculationReport | None = None  # the drafting policy's latest decision (from admission on)
    decision_bucket: int = 0  # the running batch's bucket when it was made
    output: list[int] = field(default_factory=list)
    uncached: list[int] = field(default_factory=list)
    seq_id: int = -1  # the executor's sequence (its KV cache) while admitted
    prefilled: int = 0  # prompt tokens in the KV cache (prefill progress)
    reserved: int = 0  # KV tokens reserved at admission (prompt + max_tokens + draft headroom)
    finish: FinishReason | None = None
    error: str | None = None
    grammar_limit: str | None = None  # the grammar engine's resource limit that ended it (finish ERROR)
    text: OutputText | None = None  # the output as text, decoded once per commit (from admission on)
    detok: IncrementalDetokenizer | None = None  # the text deltas handed out (while admitted)
    speculation: Any = None  # the speculator's per-sequence state (opaque to the engine)
    serving: Serving | None = None  # what serves it, bound at admission (``Drafter.bind``); None before
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    created: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    first_decode: float | None = None
    # The engine's own handle on this sequence. Request ids come from callers and may repeat (a retry
    # under the same id while the first attempt is still being cancelled): state is keyed by this.
    key: str = field(default_factory=lambda: f"s{next(_KEYS)}")

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output)

    @property
    def draft_cap(self) -> int:
        """The longest draft the policy allows now (0: none); the scheduler's limits apply on top."""
        if not self.speculate or self.decision is None:
            return 0
        return max(self.decision.caps().values(), default=0)

    def output_text(self) -> str:
        """``output`` as text (decoded once per commit; "" before admission, when nothing is committed).
        Raises: what the tokenizer's decode raises."""
        return self.text(self.output) if self.text is not None else ""

    def cached_committed(self) -> list[int]:
        """The committed tokens whose KV is in the cache: ``prompt + output`` but the ``uncached`` tail (the last
        token sampled and the forced ones after it were never fed; rejected draft tokens were rolled back)."""
        committed = self.prompt + self.output
        return committed[: len(committed) - len(self.uncached)]

    @property
    def prompt_owner(self) -> PromptOwner:
        return PromptOwner(self.tenant, self.public_prefix)

    @property
    def running(self) -> bool:
        return self.status in (SequenceStatus.PREFILLING, SequenceStatus.DECODING)

    # -- status moves, each with its bookkeeping --------------------------------------------------
    def admit(self, seq_id: int, reserved: int, text: OutputText, now: float) -> None:
        self.status = SequenceStatus.PREFILLING
        self.seq_id, self.reserved = seq_id, reserved
        self.text, self.detok = text, IncrementalDetokenizer(text)
        self.admitted = now
        self.timings.queued_ms = (now - self.created) * 1000
        self.uncached = list(self.prompt)
        self.usage.prompt_tokens = len(self.prompt)

    def reuse_prefix(self, tokens: int) -> None:
        """The first ``tokens`` prompt tokens were copied into the cache from another sequence."""
        self.uncached = self.uncached[tokens:]
        self.usage.cached_prompt_tokens = tokens
        self._prefilled(tokens)

    def fed(self, n: int) -> None:
        """The first ``n`` uncached tokens entered the cache."""
        self.uncached = self.uncached[n:]
        if self.status is SequenceStatus.PREFILLING:
            self._prefilled(self.prefilled + n)

    def scored(self) -> None:
        """A step scored the position after the committed text (the prompt is all cached)."""
        self._prefilled(len(self.prompt))
        if self.first_decode is None:
            now = self.first_decode = time.monotonic()
            self.timings.prefill_ms = (now - (self.admitted or self.created)) * 1000

    def _prefilled(self, n: int) -> None:
        self.prefilled = min(len(self.prompt), n)
        if self.prefilled == len(self.prompt):
            self.status = SequenceStatus.DECODING

    def record_draft(self, proposer: str, drafted: int, accepted: int) -> None:
        for counts, n in ((self.usage.drafted, drafted), (self.usage.accepted, accepted), (self.usage.draft_steps, 1)):
            counts[proposer] = counts.get(proposer, 0) + n

    def end(self, reason: FinishReason, error: str | None, now: float) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish, self.error = reason, error
        self.detok = None
        self.usage.output_tokens = len(self.output)
        self.timings.total_ms = (now - self.created) * 1000
        if self.first_decode is not None:
            self.timings.decode_ms = (now - self.first_decode) * 1000
