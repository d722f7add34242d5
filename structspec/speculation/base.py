"""The proposer seam: ``propose(context, k) -> Draft`` (tokens, and probabilities or None)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from structspec.engine.speculator import Draft
from structspec.engine.types import SamplingParams
from structspec.grammar.base import Matcher
from structspec.grammar.json_text import JsonScan

__all__ = ["Draft", "DraftContext", "Proposer", "SequenceSpeculation"]


@dataclass
class SequenceSpeculation:
    """What speculation keeps per sequence (``EngineSequence.speculation``), dropped when it finishes."""

    prompt_text: str | None = None  # the prompt, decoded once (when it first drafts)
    accepted: dict[str, float] = field(default_factory=dict)  # proposer -> recent accepted tokens per draft
    draft_offset: int = 0  # the committed tokens the draft's sequence leaves out (``DraftModelProposer.context_tokens``)
    draft_seq_id: int | None = None  # the draft model's KV-cache sequence (in ``draft``'s executor), once it has drafted
    # The draft version serving it (the router's ``DraftVersion``), bound at admission and kept to its end: a draft
    # loaded meanwhile serves later sequences only, so no output is drafted by two models
    draft: Any = None
    draw: float | None = None  # the request's uniform draw for the drafting policy, drawn at its first decision
    probe_drafted: int = 0  # tokens this request drafted as a recovery probe (bounded by ``probe_max_tokens``)
    json_scan: JsonScan = field(default_factory=JsonScan)  # where the output stands, read as it grows


@dataclass
class DraftContext:
    """What a proposer may look at: the request's text so far and where the grammar stands."""

    history_key: str  # the schema history this request may draft from (the schema, within the caller's scope)
    schema: dict[str, Any] | None
    prompt_text: str
    output_text: str
    prompt_ids: list[int]
    output_ids: list[int]
    matcher: Matcher  # the sequence's grammar matcher: consume and roll back freely, but leave it as found
    seed: int
    sampling: SamplingParams
    state: SequenceSpeculation
    prose: bool = False  # the whole output is free text (a chat answer), not JSON


class Proposer(Protocol):
    name: str

    def propose(self, ctx: DraftContext, k: int) -> Draft | None:
        """At most ``k`` tokens continuing ``ctx``'s output, or None; leaves ``ctx.matcher`` as found."""
