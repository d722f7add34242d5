"""Per request, ask the policy who may draft; per step, pick who drafts: the draft model inside
free-text strings, copy/history elsewhere.

Forced tokens never reach a proposer's turn: the engine fast-forwards them before asking
for a draft. The router implements the engine's ``Speculator`` seam: it decides with the
drafting policy (``policy.decide``) over the schema's evidence in the statistics book, keeps
each sequence's speculation state on the sequence (``EngineSequence.speculation``), is told
every verdict (and records it, by draft position, in the statistics, with a sample of the
rejected drafts), records the policy's state per proposer, and feeds the schema history with
finished outputs.
"""

from __future__ import annotations

import random
import time

import torch

from structspec.engine.config import PolicyConfig
from structspec.engine.sequence import EngineSequence
from structspec.engine.speculator import DraftVerdict
from structspec.engine.types import FinishReason, SpeculationReport
from structspec.grammar.json_text import scan
from structspec.speculation.base import Draft, DraftContext, Proposer, SequenceSpeculation
from structspec.speculation.configs import ProposerSet
from structspec.speculation.draft_model import DraftModelProposer
from structspec.speculation.history import HistoryProposer, SchemaHistory
from structspec.speculation.json_position import is_free_text
from structspec.speculation.ngram import NgramProposer
from structspec.speculation.policy import DRAFT_MODEL, PolicyRequest, decide
from structspec.stats.book import Recorder
from structspec.stats.counters import Reason, hour_of
from structspec.stats.samples import CONTEXT_TOKENS
from structspec.stats.evidence import CostEvidence, SchemaEvidence, cost_evidence, schema_evidence

EVIDENCE_TTL_SECONDS = 1.0  # the policy's reading of the book is reused this long (admissions come in bursts)
EVIDENCE_HORIZON_SECONDS = 48 * 3600  # older statistics say little about today's traffic


def history_key(seq: EngineSequence) -> str:
    """Outputs are shared as drafts only within a scope (e.g. one auth token): another caller's acceptance,
    and so latency, must not reveal whether my outputs matched theirs."""
    return f"{seq.history_scope}|{seq.schema_key}" if seq.history_scope else seq.schema_key


class Router:
    """``policy`` None: every proposer drafts up to the scheduler's limit (a fixed configuration)."""

    def __init__(self, tokenizer, proposers: ProposerSet, vocab_size: int, history: SchemaHistory | None = None,
                 draft: DraftModelProposer | None = None, stats: Recorder | None = None,
                 policy: PolicyConfig | None = None, rng: random.Random | None = None, max_draft: int = 8):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.history = history or SchemaHistory()
        self.ngram = NgramProposer(tokenizer) if proposers.ngram else None
        self.history_proposer = HistoryProposer(tokenizer, self.history) if proposers.history else None
        self.draft = draft if proposers.draft else None
        self.stats = stats
        self.policy = policy
        self.rng = rng or random.Random()
        self.max_draft = max_draft  # the cap of a fixed configuration (the scheduler's limit)
        self.names = tuple(p.name for p in (self.draft, self.ngram, self.history_proposer) if p is not None)
        self._evidence: dict[str, tuple[float, SchemaEvidence]] = {}
        self._costs: tuple[float, CostEvidence] | None = None
        self._probed: dict[str, dict[str, int]] = {}  # schema key -> proposer -> hour of its last probe

    # -- the policy ------------------------------------------------------------------------------
    def decide(self, seq: EngineSequence, batch_size: int) -> SpeculationReport:
        if self.policy is None:
            if not seq.speculate or not self.names:
                reason = Reason.REQUEST_OFF if self.names else Reason.SERVER_OFF
                return SpeculationReport(False, reason, False, {}, {p: reason for p in self.names})
            return SpeculationReport(True, Reason.DRAFTED, False, {p: self.max_draft for p in self.names},
                                     {p: Reason.DRAFTED for p in self.names})
        now = self.stats.clock() if self.stats is not None else time.time()
        hour = hour_of(now)
        probed = self._probed.get(seq.schema_key, {})
        request = PolicyRequest(seq.schema_key, seq.schema, seq.speculate, seq.schema_speculation,
                                frozenset(p for p, h in probed.items() if h == hour),
                                seq.decision.arm if seq.decision is not None else "",
                                seq.decision.reasons.get(DRAFT_MODEL, "") if seq.decision is not None else "")
        evidence, costs = self._read(seq.schema_key, now)
        report = decide(evidence, costs, request, batch_size, self.rng, self.policy, self.names)
        if report.probe:
            self._probed.setdefault(seq.schema_key, {}).update(
                {p: hour for p, r in report.reasons.items() if r == Reason.PROBE})
        if self.stats is not None:
            acceptance = {}
            for p in report.reasons:
                ev = evidence.at_bucket(p, batch_size, self.policy.min_evidence_tokens)
                acceptance[p] = ev.acceptance if ev is not None and ev.drafted > 0 else None
            self.stats.record_policy(seq.schema_key, report.reasons, batch_size, acceptance,
                                     self.policy.acceptance_threshold)
        return report

    def _read(self, schema_key: str, now: float) -> tuple[SchemaEvidence, CostEvidence]:
        if self.stats is None:
            return SchemaEvidence(), CostEvidence()
        book, model, half_life = self.stats.book, self.stats.model, self.policy.half_life_hours
        since = hour_of(now - EVIDENCE_HORIZON_SECONDS)
        cached = self._evidence.get(schema_key)
        if cached is None or now - cached[0] > EVIDENCE_TTL_SECONDS or now < cached[0]:
            cached = (now, schema_evidence(book.rows_for(model, schema_key, since), hour_of(now), half_life,
                                           self.policy.evidence_window_tokens, self.policy.evidence_max_age_hours))
            self._evidence[schema_key] = cached
            if len(self._evidence) > 4096:  # a bound, not an LRU: the next reads rebuild what they need
                self._evidence.clear()
        if self._costs is None or now - self._costs[0] > EVIDENCE_TTL_SECONDS or now < self._costs[0]:
            self._costs = (now, cost_evidence(book.rows_for(model, "", since), hour_of(now), half_life))
        return cached[1], self._costs[1]

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
        caps = seq.decision.max_draft if seq.decision is not None else {}
        for proposer in self.order(ctx):
            if proposer.name not in caps:
                continue  # the policy switched it off for this request
            k = self._draft_len(ctx.state, proposer.name, min(max_tokens, caps[proposer.name]))
            started = time.perf_counter()
            draft = proposer.propose(ctx, k)
            if self.stats is not None:
                self.stats.record_proposal(proposer.name, k, time.perf_counter() - started)
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
            probe = seq.decision is not None and seq.decision.reasons.get(verdict.proposer) == Reason.PROBE
            self.stats.record_verification(seq.schema_key, verdict.proposer, verdict.batch_size, verdict.drafted,
                                           verdict.accepted, probe)
            if verdict.accepted < len(verdict.tokens):
                context = seq.output[-CONTEXT_TOKENS:]
                if len(context) < CONTEXT_TOKENS:
                    context = seq.prompt[len(context) - CONTEXT_TOKENS:] + context
                self.stats.record_rejection(seq.schema_key, verdict.proposer, verdict.batch_size, context,
                                            verdict.tokens, verdict.accepted, verdict.target_token,
                                            verdict.accepted < verdict.grammatical, lambda ids: self._decode(list(ids)))

    def on_finish(self, seq: EngineSequence) -> None:
        if seq.speculation is not None and self.draft is not None:
            self.draft.release(seq.speculation)
        seq.speculation = None
        if seq.finish is FinishReason.STOP and seq.output:
            self.history.add(history_key(seq), self._decode(seq.output))
