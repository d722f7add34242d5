"""Per step, pick who drafts: the draft model inside free-text strings, copy/history elsewhere.

Forced tokens never reach a proposer's turn: the engine fast-forwards them
before asking for a draft. The router implements the engine's ``Speculator``
seam and owns the per-request text views and the schema history it feeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from structspec.engine.sequence import Sequence
from structspec.engine.types import FinishReason
from structspec.spec.base import Draft, DraftContext, Proposer
from structspec.spec.draft_model import DraftModelProposer
from structspec.spec.history import HistoryProposer, SchemaHistory
from structspec.spec.json_position import is_free_text, scan
from structspec.spec.ngram import NgramProposer


@dataclass(frozen=True)
class ProposerSet:
    """Which proposers are on: the benchmark's configurations are named after these."""

    ngram: bool = True
    history: bool = True
    draft: bool = True

    @classmethod
    def parse(cls, name: str) -> "ProposerSet | None":
        """``off``/``ff`` -> None (no drafting); ``ff+ngram``, ``ff+ngram+history``, ``all``."""
        table = {"off": None, "ff": None, "ff+ngram": cls(True, False, False),
                 "ff+ngram+history": cls(True, True, False), "all": cls(True, True, True)}
        if name not in table:
            raise ValueError(f"unknown proposer configuration {name!r}; one of {', '.join(table)}")
        return table[name]


class Router:
    def __init__(self, tokenizer, proposers: ProposerSet, vocab_size: int, history: SchemaHistory | None = None,
                 draft: DraftModelProposer | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.history = history or SchemaHistory()
        self.ngram = NgramProposer(tokenizer) if proposers.ngram else None
        self.history_proposer = HistoryProposer(tokenizer, self.history) if proposers.history else None
        self.draft = draft if proposers.draft else None
        self._prompt_text: dict[str, str] = {}
        self._last: dict[str, tuple[str, int, int]] = {}  # request -> (proposer, output length, drafted)
        self._accepted: dict[tuple[str, str], float] = {}  # (request, proposer) -> recent accepted per draft

    def _context(self, seq: Sequence) -> DraftContext:
        prompt_text = self._prompt_text.get(seq.key)
        if prompt_text is None:
            prompt_text = self._prompt_text[seq.key] = self._decode(seq.prompt)
        return DraftContext(seq.key, seq.schema_key, seq.schema, prompt_text, self._decode(seq.output),
                            seq.prompt, seq.output, seq.matcher, seq.seed, seq.params)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def order(self, ctx: DraftContext) -> list[Proposer]:
        """Free-text string values: the draft model (copy lookup where there is none); elsewhere
        history first (key order, enum values seen before), then copy lookup."""
        free = is_free_text(ctx.schema, scan(ctx.output_text))
        order = [self.draft, self.ngram, self.history_proposer] if free else [self.history_proposer, self.ngram]
        return [p for p in order if p is not None]

    def propose(self, seq: Sequence, max_tokens: int) -> Draft | None:
        ctx = self._context(seq)
        for proposer in self.order(ctx):
            k = self._draft_len(seq.key, proposer.name, max_tokens)
            draft = proposer.propose(ctx, k)
            if draft is not None and draft.tokens:
                self._last[seq.key] = (proposer.name, len(seq.output), len(draft.tokens))
                return self._fit_q(draft)
        return None

    def _draft_len(self, seq_key: str, proposer: str, max_tokens: int) -> int:
        """Draft about what this proposer got accepted lately in this request (+2), so a proposer that keeps
        being rejected early does not pay for long verifications; starts at the maximum."""
        mean = self._accepted.get((seq_key, proposer))
        return max_tokens if mean is None else min(max_tokens, max(2, int(mean + 2.5)))

    def _learn(self, seq: Sequence) -> None:
        last = self._last.pop(seq.key, None)
        if last is None:
            return
        name, start, drafted = last
        accepted = min(drafted, max(0, len(seq.output) - start - 1))  # committed since the draft, minus the new token
        key = (seq.key, name)
        prev = self._accepted.get(key)
        self._accepted[key] = accepted if prev is None else 0.5 * prev + 0.5 * accepted

    def _fit_q(self, draft: Draft) -> Draft:
        """The verifier indexes q by the target's vocabulary width."""
        if draft.q is None or draft.q.shape[-1] == self.vocab_size:
            return draft
        q = torch.zeros((draft.q.shape[0], self.vocab_size))
        n = min(self.vocab_size, draft.q.shape[-1])
        q[:, :n] = draft.q[:, :n]
        return Draft(draft.tokens, q, draft.proposer)

    def on_commit(self, seq: Sequence, tokens: list[int]) -> None:
        self._learn(seq)  # the first commit after a draft: accepted tokens + the new token

    def on_finish(self, seq: Sequence) -> None:
        self._prompt_text.pop(seq.key, None)
        self._last.pop(seq.key, None)
        for key in [k for k in self._accepted if k[0] == seq.key]:
            del self._accepted[key]
        if self.draft is not None:
            self.draft.release(seq.key)
        if seq.finish is FinishReason.STOP and seq.output:
            self.history.add(seq.schema_key, self._decode(seq.output))
