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

    def _context(self, seq: Sequence) -> DraftContext:
        prompt_text = self._prompt_text.get(seq.request_id)
        if prompt_text is None:
            prompt_text = self._prompt_text[seq.request_id] = self._decode(seq.prompt)
        return DraftContext(seq.request_id, seq.schema_key, seq.schema, prompt_text, self._decode(seq.output),
                            seq.prompt, seq.output, seq.matcher, seq.seed, seq.params)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def order(self, ctx: DraftContext) -> list[Proposer]:
        free = is_free_text(ctx.schema, scan(ctx.output_text))
        order = [self.ngram, self.draft, self.history_proposer] if free else [self.history_proposer, self.ngram]
        return [p for p in order if p is not None]

    def propose(self, seq: Sequence, max_tokens: int) -> Draft | None:
        ctx = self._context(seq)
        for proposer in self.order(ctx):
            draft = proposer.propose(ctx, max_tokens)
            if draft is not None and draft.tokens:
                return self._fit_q(draft)
        return None

    def _fit_q(self, draft: Draft) -> Draft:
        """The verifier indexes q by the target's vocabulary width."""
        if draft.q is None or draft.q.shape[-1] == self.vocab_size:
            return draft
        q = torch.zeros((draft.q.shape[0], self.vocab_size))
        n = min(self.vocab_size, draft.q.shape[-1])
        q[:, :n] = draft.q[:, :n]
        return Draft(draft.tokens, q, draft.proposer)

    def on_commit(self, seq: Sequence, tokens: list[int]) -> None:
        return None  # proposers read the committed text from the sequence when asked

    def on_finish(self, seq: Sequence) -> None:
        self._prompt_text.pop(seq.request_id, None)
        if self.draft is not None:
            self.draft.release(seq.request_id)
        if seq.finish is FinishReason.STOP and seq.output:
            self.history.add(seq.schema_key, self._decode(seq.output))
