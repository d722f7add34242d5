"""One request's decoding state inside the engine."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from structspec.engine.types import FinishReason, SamplingParams, Timings, Usage
from structspec.grammar.base import CompiledGrammar, Matcher

_KEYS = itertools.count()


@dataclass
class Sequence:
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
    output: list[int] = field(default_factory=list)
    uncached: list[int] = field(default_factory=list)
    seq_id: int | None = None  # executor sequence, once admitted
    finish: FinishReason | None = None
    error: str | None = None
    grammar_limit: str | None = None  # the grammar engine's resource limit that ended it (finish ERROR)
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    created: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    first_decode: float | None = None
    cancelled: bool = False
    # Tokens of the prompt already sent through the model (prefill progress).
    prefilled: int = 0
    prefix_checked: bool = False  # looked for a reusable cached prompt prefix (done once, before prefilling)
    # Reserved KV tokens (prompt + max_tokens + draft headroom): admission never over-commits.
    reserved: int = 0
    # The engine's own handle on this sequence. Request ids come from callers and may repeat (a retry
    # under the same id while the first attempt is still being cancelled): state is keyed by this.
    key: str = field(default_factory=lambda: f"s{next(_KEYS)}")

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt)

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output)

    def add_usage(self, name: str, drafted: int, accepted: int) -> None:
        self.usage.drafted[name] = self.usage.drafted.get(name, 0) + drafted
        self.usage.accepted[name] = self.usage.accepted.get(name, 0) + accepted
        self.usage.draft_steps[name] = self.usage.draft_steps.get(name, 0) + 1
