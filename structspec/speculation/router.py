"""Per step, pick who drafts: the draft model inside free-text strings, copy/history elsewhere.

Forced tokens never reach a proposer's turn: the engine fast-forwards them before asking
for a draft. The router implements the engine's ``Speculator`` seam: it keeps each
sequence's speculation state on the sequence (``EngineSequence.speculation``), is told
every verdict (and records it in the acceptance statistics), and feeds the schema history
with finished outputs.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from structspec.engine.sequence import EngineSequence
from structspec.engine.speculator import DraftVerdict
from structspec.engine.types import FinishReason
from structspec.grammar.json_text import scan
from structspec.speculation.base import Draft, DraftContext, Proposer, SequenceSpeculation
from structspec.speculation.configs import ProposerSet
from structspec.speculation.draft_model import DraftModelProposer
from structspec.speculation.history import HistoryProposer, SchemaHistory
from structspec.speculation.json_position import is_free_text
from structspec.speculation.ngram import NgramProposer
from structspec.store.base import batch_bucket


class AcceptanceSink(Protocol):
    """Where per-step acceptance counts go (the store's buffered, non-blocking recorder)."""

    def record_acceptance(self, schema_key: str, proposer: str, batch_bucket: int, drafted: int, accepted: int,
                          ts: float) -> None: ...


def history_key(seq: EngineSequence) -> str:
    """Outputs are shared as drafts only within a scope (e.g. one auth token): another caller's acceptance,
    and so latency, must not reveal whether my outputs matched theirs."""
    return f"{seq.history_scope}|{seq.schema_key}" if seq.history_scope else seq.schema_key


class Router:
    def __init__(self, tokenizer, proposers: ProposerSet, vocab_size: int, history: SchemaHistory | None = None,
                 draft: DraftModelProposer | None = None, stats: AcceptanceSink | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.history = history or SchemaHistory()
        self.ngram = NgramProposer(tokenizer) if proposers.ngram else None
        self.history_proposer = HistoryProposer(tokenizer, self.history) if proposers.history else None
        self.draft = draft if proposers.draft else None
        self.stats = stats

    def _context(self, seq: EngineSequence) -> DraftContext:
        state = seq.speculation
        if state is None:
            state = seq.speculation = SequenceSpeculation(self._decode(seq.prompt))
        return DraftContext(history_key(seq), seq.schema, state.prompt_text, self._decode(seq.output),
                            seq.prompt, seq.output, seq.matcher, seq.seed, seq.params, state)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def order(self, ctx: DraftContext) -> list[Proposer]:
        """Free-text string values: the draft model (copy lookup where there is none); elsewhere
        history first (key order, enum values seen before), then copy lookup."""
        free = is_free_text(ctx.schema, scan(ctx.output_text))
        order = [self.draft, self.ngram, self.history_proposer] if free else [self.history_proposer, self.ngram]
        return [p for p in order if p is not None]

    def propose(self, seq: EngineSequence, max_tokens: int) -> Draft | None:
        ctx = self._context(seq)
        for proposer in self.order(ctx):
            draft = proposer.propose(ctx, self._draft_len(ctx.state, proposer.name, max_tokens))
            if draft is not None and draft.tokens:
                return self._fit_q(draft)
        return None

    @staticmethod
    def _draft_len(state: SequenceSpeculation, proposer: str, max_tokens: int) -> int:
        """Draft about what this proposer got accepted lately in this request (+2), so a proposer that keeps
        being rejected early does not pay for long verifications; starts at the maximum."""
        mean = state.accepted.get(proposer)
        return max_tokens if mean is None else min(max_tokens, max(2, int(mean + 2.5)))

    def _fit_q(self, draft: Draft) -> Draft:
        """The verifier indexes q by the target's vocabulary width."""
        if draft.q is None or draft.q.shape[-1] == self.vocab_size:
            return draft
        q = torch.zeros((draft.q.shape[0], self.vocab_size))
        n = min(self.vocab_size, draft.q.shape[-1])
        q[:, :n] = draft.q[:, :n]
        return Draft(draft.tokens, q, draft.proposer)

    def on_verified(self, seq: EngineSequence, verdict: DraftVerdict) -> None:
        if seq.speculation is not None:
            recent = seq.speculation.accepted
            prev = recent.get(verdict.proposer)
            recent[verdict.proposer] = verdict.accepted if prev is None else 0.5 * prev + 0.5 * verdict.accepted
        if self.stats is not None:
            self.stats.record_acceptance(seq.schema_key, verdict.proposer, batch_bucket(verdict.batch_size),
                                         verdict.drafted, verdict.accepted, time.time())

    def on_finish(self, seq: EngineSequence) -> None:
        if seq.speculation is not None and self.draft is not None:
            self.draft.release(seq.speculation)
        seq.speculation = None
        if seq.finish is FinishReason.STOP and seq.output:
            self.history.add(history_key(seq), self._decode(seq.output))
