"""Per request, ask the policy who may draft; per step, pick who drafts: the draft model inside
free-text strings, copy/history elsewhere.

Forced tokens never reach a proposer's turn: the engine fast-forwards them before asking
for a draft. The router implements the engine's ``Speculator`` seam: it decides with the
drafting policy (``policy.decide``) over the schema's evidence in the statistics book, keeps
each sequence's speculation state on the sequence (``EngineSequence.speculation``), is told
every verdict (and records it, by draft position, in the statistics, with a sample of the
rejected drafts), records the policy's state per proposer, and feeds the schema history with
finished outputs.

Draft versions: a sequence is bound at admission to the draft model serving then (``DraftVersion``)
and drafts with it to its end, its statistics under that version's model key (``EngineSequence.stats``,
set by the engine), so the policy reads each version's own evidence. ``install_draft`` (on the
engine thread, between steps) makes a newly loaded draft serve the sequences admitted afterwards;
the one it replaces is released when its last sequence finishes.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

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
from structspec.stats.counters import HOUR, Reason, hour_of
from structspec.stats.policy_states import OFF
from structspec.stats.samples import CONTEXT_TOKENS
from structspec.stats.evidence import CostEvidence, SchemaEvidence, cost_evidence, schema_evidence

log = logging.getLogger(__name__)

EVIDENCE_TTL_SECONDS = 1.0  # the policy's reading of the book is reused this long (admissions come in bursts)


def history_key(seq: EngineSequence) -> str:
    """Outputs are shared as drafts only within a scope (e.g. one auth token): another caller's acceptance,
    and so latency, must not reveal whether my outputs matched theirs."""
    return f"{seq.history_scope}|{seq.schema_key}" if seq.history_scope else seq.schema_key


@dataclass(eq=False)
class DraftVersion:
    """A draft model and the sequences bound to it (admitted while it was the current one)."""

    proposer: DraftModelProposer | None  # None: no draft model (or released)
    version: str = ""
    sequences: int = 0  # running sequences bound to it
    retired: bool = False  # another draft serves new sequences: released when ``sequences`` reaches 0


class Router:
    """``policy`` None: every proposer drafts up to the scheduler's limit (a fixed configuration).
    ``draft_version``: the version of ``draft`` (``weights_version``). ``rng`` draws each request's number for the
    policy (``PolicyRequest.draw``), once, at its first decision."""

    def __init__(self, tokenizer, proposers: ProposerSet, vocab_size: int, history: SchemaHistory | None = None,
                 draft: DraftModelProposer | None = None, stats: Recorder | None = None,
                 policy: PolicyConfig | None = None, rng: random.Random | None = None, max_draft: int = 8,
                 draft_version: str = ""):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.history = history or SchemaHistory()
        self.ngram = NgramProposer(tokenizer) if proposers.ngram else None
        self.history_proposer = HistoryProposer(tokenizer, self.history) if proposers.history else None
        self.drafts_enabled = proposers.draft  # a draft model may serve (``install_draft``)
        self.current = DraftVersion(draft if proposers.draft else None, draft_version if draft is not None else "")
        self.stats = stats  # the current statistics (a sequence records into its own, ``EngineSequence.stats``)
        self.policy = policy
        self.rng = rng or random.Random()
        self.max_draft = max_draft  # the cap of a fixed configuration (the scheduler's limit)
        self._live: set[DraftVersion] = set()  # retired versions that still serve sequences
        self._evidence: dict[tuple[str, str], tuple[float, SchemaEvidence]] = {}  # (model, schema key)
        self._costs: dict[str, tuple[float, CostEvidence]] = {}  # model ->

    @property
    def draft(self) -> DraftModelProposer | None:
        """The draft model serving sequences admitted now."""
        return self.current.proposer

    @property
    def draft_version(self) -> str:
        return self.current.version

    @property
    def names(self) -> tuple[str, ...]:
        """The proposers a sequence admitted now drafts with."""
        return self._names(self.current)

    def _names(self, draft: DraftVersion | None) -> tuple[str, ...]:
        model = draft.proposer if draft is not None else None
        return tuple(p.name for p in (model, self.ngram, self.history_proposer) if p is not None)

    # -- draft versions --------------------------------------------------------------------------
    def install_draft(self, proposer: DraftModelProposer, version: str, stats: Recorder | None) -> None:
        """Serve the sequences admitted from now on with ``proposer`` (version ``version``), recording into
        ``stats``; running sequences keep their draft, and the one replaced is released after its last.
        On the engine thread, between steps. Raises: ValueError (this configuration drafts without a model)."""
        if not self.drafts_enabled:
            raise ValueError("this speculation configuration drafts without a draft model")
        old = self.current
        old.retired = True
        self._live.add(old)
        self.current = DraftVersion(proposer, version)
        self.stats = stats
        self._release_if_done(old)

    def live_drafts(self) -> dict[str, int]:
        """Draft version -> running sequences bound to it, for every version still loaded (the current one too)."""
        out = {d.version: d.sequences for d in self._live if d.proposer is not None}
        if self.current.proposer is not None:
            out[self.current.version] = out.get(self.current.version, 0) + self.current.sequences
        return out

    def _bind(self, seq: EngineSequence) -> SequenceSpeculation:
        """``seq``'s speculation state, bound to the current draft the first time (at admission)."""
        state = seq.speculation
        if state is None:
            state = seq.speculation = SequenceSpeculation()
        if state.draft is None:
            state.draft = self.current
            self.current.sequences += 1
        return state

    def _release_if_done(self, draft: DraftVersion) -> None:
        if not draft.retired or draft.sequences > 0:
            return
        self._live.discard(draft)
        if draft.proposer is not None:
            draft.proposer.close()
            draft.proposer = None
            log.info("draft %s released (its last request finished)", draft.version)

    def _stats(self, seq: EngineSequence) -> Recorder | None:
        """Where ``seq``'s records go: the statistics it was admitted under."""
        return seq.stats if seq.stats is not None else self.stats

    # -- the policy ------------------------------------------------------------------------------
    def decide(self, seq: EngineSequence, batch_size: int) -> SpeculationReport:
        state = self._bind(seq)
        names = self._names(state.draft)  # bound first: whatever follows, the sequence has its draft
        if self.policy is None:
            if not seq.speculate or not names:
                reason = Reason.REQUEST_OFF if names else Reason.SERVER_OFF
                return SpeculationReport(False, reason, False, {}, {p: reason for p in names})
            return SpeculationReport(True, Reason.DRAFTED, False, {p: self.max_draft for p in names},
                                     {p: Reason.DRAFTED for p in names})
        stats = self._stats(seq)
        now = stats.clock() if stats is not None else time.time()
        if state.draw is None:
            state.draw = self.rng.random()
        # A new draft version starts with no evidence and no state of its own: judged as a cold schema is
        before = seq.decision
        request = PolicyRequest(seq.schema_key, seq.schema, seq.speculate, seq.schema_speculation, state.draw,
                                self._standing_off(stats, seq.schema_key, names), before is not None,
                                before is not None and before.probe, before.arm if before is not None else "",
                                before.reasons.get(DRAFT_MODEL, "") if before is not None else "")
        evidence, costs = self._read(stats, seq.schema_key, now)
        report = decide(evidence, costs, request, batch_size, self.policy, names)
        if report.probe and stats is not None:  # the next decision reads this probe (the engine records it first)
            self._evidence.pop((stats.model, seq.schema_key), None)
        if stats is not None:
            acceptance = {}
            for p in report.reasons:
                ev = evidence.at_bucket(p, batch_size, self.policy.min_evidence_tokens)
                acceptance[p] = ev.acceptance if ev is not None and ev.drafted > 0 else None
            stats.record_policy(seq.schema_key, report.reasons, batch_size, acceptance,
                                self.policy.acceptance_threshold)
        return report

    @staticmethod
    def _standing_off(stats: Recorder | None, schema_key: str, names: tuple[str, ...]) -> dict[str, str]:
        """The proposers whose latest state for the schema (this process's decisions, or the store's) is off for
        acceptance or cost, with that reason."""
        if stats is None:
            return {}
        out = {}
        for p in names:
            change = stats.book.policy.get(stats.model, schema_key, p)
            if change is not None and change.state == OFF and change.reason in (Reason.LOW_ACCEPTANCE, Reason.NO_GAIN):
                out[p] = change.reason
        return out

    def _read(self, stats: Recorder | None, schema_key: str, now: float) -> tuple[SchemaEvidence, CostEvidence]:
        """The evidence of ``schema_key`` and the step costs, both of ``stats``' model (one draft version's)."""
        if stats is None:
            return SchemaEvidence(), CostEvidence()
        book, model, half_life = stats.book, stats.model, self.policy.half_life_hours
        since = hour_of(now - self.policy.evidence_max_age_hours * HOUR)
        cached = self._evidence.get((model, schema_key))
        if cached is None or now - cached[0] > EVIDENCE_TTL_SECONDS or now < cached[0]:
            cached = (now, schema_evidence(book.rows_for(model, schema_key, since), hour_of(now), half_life,
                                           self.policy.evidence_window_tokens, self.policy.evidence_max_age_hours))
            self._evidence[(model, schema_key)] = cached
            if len(self._evidence) > 4096:  # a bound, not an LRU: the next reads rebuild what they need
                self._evidence.clear()
        costs = self._costs.get(model)
        if costs is None or now - costs[0] > EVIDENCE_TTL_SECONDS or now < costs[0]:
            costs = self._costs[model] = (now, cost_evidence(book.rows_for(model, "", since), hour_of(now), half_life))
            if len(self._costs) > 64:  # models of retired drafts
                self._costs = {model: costs}
        return cached[1], costs[1]

    def _context(self, seq: EngineSequence) -> DraftContext:
        state = self._bind(seq)
        if state.prompt_text is None:
            state.prompt_text = self._decode(seq.prompt)
        return DraftContext(history_key(seq), seq.schema, state.prompt_text, self._decode(seq.output),
                            seq.prompt, seq.output, seq.matcher, seq.seed, seq.params, state)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def order(self, ctx: DraftContext) -> list[Proposer]:
        """Free-text string values: copy lookup and the draft model, the one with the longer recent accepted
        drafts in this request first (one without a record yet counts as longest; each falls back on the other),
        then history; elsewhere history first (key order, enum values seen before), then copy lookup.

        Why both orders: a value copied from the document (a summary quoting it) is drafted whole by copy
        lookup (Gemma's free text: 4.1 tokens a verification, the draft model 2.3), prose of the model's own
        by the draft model (demo summaries: copy lookup 0.26 acceptance, the draft 0.68)."""
        free = is_free_text(ctx.schema, scan(ctx.output_text))
        draft = ctx.state.draft.proposer if ctx.state.draft is not None else None  # the sequence's own version
        if not free:
            order = [self.history_proposer, self.ngram]
        else:
            recent = ctx.state.accepted
            first = [self.ngram, draft]
            if self.ngram is not None and draft is not None and \
                    recent.get(draft.name, float("inf")) > recent.get(self.ngram.name, float("inf")):
                first = [draft, self.ngram]
            order = first + [self.history_proposer]
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
            stats = self._stats(seq)
            if stats is not None:
                stats.record_proposal(proposer.name, k, time.perf_counter() - started)
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
        stats = self._stats(seq)
        if stats is not None:
            probe = seq.decision is not None and seq.decision.reasons.get(verdict.proposer) == Reason.PROBE
            stats.record_verification(seq.schema_key, verdict.proposer, verdict.batch_size, verdict.drafted,
                                           verdict.accepted, probe)
            if verdict.accepted < len(verdict.tokens):
                context = seq.output[-CONTEXT_TOKENS:]
                if len(context) < CONTEXT_TOKENS:
                    context = seq.prompt[len(context) - CONTEXT_TOKENS:] + context
                stats.record_rejection(seq.schema_key, verdict.proposer, verdict.batch_size, context,
                                            verdict.tokens, verdict.accepted, verdict.target_token,
                                            verdict.accepted < verdict.grammatical, lambda ids: self._decode(list(ids)))

    def on_finish(self, seq: EngineSequence) -> None:
        state = seq.speculation
        seq.speculation = None
        if state is not None and state.draft is not None:
            bound = state.draft
            try:
                if bound.proposer is not None:
                    bound.proposer.release(state)
            finally:  # counted off whatever the release did, so a replaced draft is still freed
                bound.sequences -= 1
                self._release_if_done(bound)
        if seq.finish is FinishReason.STOP and seq.output:
            self.history.add(history_key(seq), self._decode(seq.output))
