"""The engine's ``Speculator``: per request, who may draft; per step, which proposer drafts, and what it learns.

``Router`` is the seam's implementation and composes the rooms that do the work:

- ``draft_versions``: the draft model serving each sequence, bound at admission, and the release of a replaced
  one (``install_draft``, on the engine thread between steps, makes a newly loaded draft serve later sequences);
- ``decisions``: the drafting policy over the statistics book's evidence (``decide``);
- ``proposing``: the order proposers are asked in at a position, the draft's length, its q made fit to verify;
- ``verdicts``: each verdict recorded by draft position, with a sample of the rejected drafts;
- ``history``: finished outputs fed to the schema history, within the caller's scope;
- ``replay``: on a finished output, the drafts a priced-out cheap proposer would have made, and what
  verification would have kept of them: evidence for a cold proposer that drafting cannot gather.

Each sequence's speculation state lives on the sequence (``EngineSequence.speculation``); its statistics are
those it was admitted under (``EngineSequence.serving``, set by the engine), so the policy reads each draft
version's own evidence.
"""

from __future__ import annotations

import random
import time
from typing import Any, cast

from structspec.engine.config import PolicyConfig
from structspec.engine.sequence import EngineSequence
from structspec.engine.speculator import DraftVerdict
from structspec.engine.types import FinishReason, SpeculationReport
from structspec.models.step_profile import StepProfile
from structspec.speculation.base import Draft, DraftContext, Proposer, SequenceSpeculation
from structspec.speculation.configs import ProposerSet
from structspec.speculation.decisions import Decider
from structspec.speculation.draft_model import DraftModelProposer
from structspec.speculation.draft_versions import DraftVersion, DraftVersions
from structspec.speculation.history import HistoryProposer, SchemaHistory, history_key
from structspec.speculation.ngram import NgramProposer
from structspec.speculation.proposing import cut_to_key, fit_q, key_lengths, proposer_order, remember_acceptance
from structspec.speculation.replay import replay_priced_out
from structspec.speculation.verdicts import record_verdict
from structspec.stats.book import Recorder
from structspec.stats.counters import draft_keys


class Router:
    """``policy`` None: every proposer drafts up to the scheduler's limit (a fixed configuration).
    ``draft_version``: the version of ``draft`` (``weights_version``). ``rng`` draws each request's number for the
    policy (``PolicyRequest.draw``), once, at its first decision. ``step_profile``: the executor's measured step
    costs, which price a draft before serving has measured any (``models.step_profile``)."""

    def __init__(self, tokenizer: Any, proposers: ProposerSet, vocab_size: int, history: SchemaHistory | None = None,
                 draft: DraftModelProposer | None = None, stats: Recorder | None = None,
                 policy: PolicyConfig | None = None, rng: random.Random | None = None, max_draft: int = 8,
                 draft_version: str = "", step_profile: StepProfile | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.history = history or SchemaHistory()
        self.ngram = NgramProposer(tokenizer) if proposers.ngram else None
        self.history_proposer = HistoryProposer(tokenizer, self.history) if proposers.history else None
        self.drafts_enabled = proposers.draft  # a draft model may serve (``install_draft``)
        self.versions = DraftVersions(DraftVersion(draft if proposers.draft else None,
                                                   draft_version if draft is not None else ""))
        self.stats = stats  # the current statistics (a sequence records into its own, ``EngineSequence.serving``)
        self.decider = Decider(policy, rng or random.Random(), max_draft, step_profile)

    @property
    def draft(self) -> DraftModelProposer | None:
        """The draft model serving sequences admitted now."""
        return self.versions.current.proposer

    @property
    def draft_version(self) -> str:
        return self.versions.current.version

    @property
    def names(self) -> tuple[str, ...]:
        """The proposers a sequence admitted now drafts with."""
        return self._names(self.versions.current)

    def _names(self, draft: DraftVersion | None) -> tuple[str, ...]:
        model = draft.proposer if draft is not None else None
        return tuple(k for p in (model, self.ngram, self.history_proposer) if p is not None for k in draft_keys(p.name))

    # -- draft versions --------------------------------------------------------------------------
    def install_draft(self, proposer: DraftModelProposer, version: str, stats: Recorder | None) -> None:
        """Serve the sequences admitted from now on with ``proposer`` (version ``version``), recording into
        ``stats``; running sequences keep their draft, and the one replaced is released after its last.
        On the engine thread, between steps. Raises: ValueError (this configuration drafts without a model)."""
        if not self.drafts_enabled:
            raise ValueError("this speculation configuration drafts without a draft model")
        self.versions.install(proposer, version)
        self.stats = stats

    def live_drafts(self) -> dict[str, int]:
        """Draft version -> running sequences bound to it, for every version still loaded (the current one too)."""
        return self.versions.live()

    def _bind(self, seq: EngineSequence) -> SequenceSpeculation:
        """``seq``'s speculation state, bound to the current draft the first time (at admission)."""
        state: SequenceSpeculation | None = seq.speculation
        if state is None:
            state = seq.speculation = SequenceSpeculation()
        self.versions.bind(state)
        return state

    def _stats(self, seq: EngineSequence) -> Recorder | None:
        """Where ``seq``'s records go: the statistics it was admitted under."""
        served = seq.serving.stats if seq.serving is not None else None
        return served if served is not None else self.stats

    # -- the seam --------------------------------------------------------------------------------
    def decide(self, seq: EngineSequence, batch_size: int) -> SpeculationReport:
        state = self._bind(seq)
        names = self._names(state.draft)  # bound first: whatever follows, the sequence has its draft
        return self.decider.decide(seq, state, names, batch_size, self._stats(seq))

    def order(self, ctx: DraftContext) -> list[Proposer]:
        """The proposers in the order they are asked at ``ctx``'s position (``proposing.proposer_order``)."""
        draft = ctx.state.draft.proposer if ctx.state.draft is not None else None  # the sequence's own version
        return proposer_order(ctx, self.ngram, draft, self.history_proposer)

    def propose(self, seq: EngineSequence, max_tokens: int, narrow: bool = True) -> Draft | None:
        """The first draft a proposer the policy allows here makes, or None. Its lookup is timed from the start of
        this call: the context (the output decoded, its JSON position) is the cost of asking at all, paid by the
        first proposer asked (on the demo target's 4.9 ms steps it was 0.2 ms a step, unpriced while only the
        proposer's own call was timed)."""
        started = time.perf_counter()
        decision = seq.decision
        caps = (decision.caps() if narrow else {p: k for p, k in decision.max_draft.items() if k > 0}) \
            if decision is not None else {}
        if not any(caps.values()):
            return None  # nobody may draft: nothing to build
        probe = decision is not None and decision.probe
        if probe:  # a probe buys a bounded amount of evidence, not a whole request's drafting
            policy = self.decider.policy
            budget = (policy.probe_max_tokens if policy is not None else max_tokens) - self._bind(seq).probe_drafted
            if budget <= 0:
                return None
            max_tokens = min(max_tokens, budget)
        ctx = self._context(seq)
        for proposer in self.order(ctx):
            lengths = key_lengths(ctx.state, proposer.name, caps, max_tokens)
            if not lengths:
                continue  # the policy switched it off for this request
            k = max(lengths.values())
            draft = cut_to_key(proposer.propose(ctx, k), lengths)
            stats = self._stats(seq)
            made = draft is not None and bool(draft.tokens)
            asked, started = started, time.perf_counter()
            if stats is not None:
                stats.record_proposal(proposer.name, k, started - asked, made)
            if draft is not None and made:
                if probe:
                    ctx.state.probe_drafted += len(draft.tokens)
                return fit_q(draft, self.vocab_size)
        return None

    def on_verified(self, seq: EngineSequence, verdict: DraftVerdict) -> None:
        if seq.speculation is not None:
            remember_acceptance(seq.speculation, verdict.proposer, verdict.accepted)
        stats = self._stats(seq)
        if stats is not None:
            record_verdict(stats, seq, verdict, lambda ids: self._decode(list(ids)))

    def on_finish(self, seq: EngineSequence) -> None:
        state = seq.speculation
        seq.speculation = None
        if state is not None:
            self.versions.unbind(state)
        if seq.finish in (FinishReason.STOP, FinishReason.LENGTH) and seq.output:
            # (before the output joins the history: it must not draft itself)
            replay_priced_out(seq, seq.output, (self.ngram, self.history_proposer), self.decider, self._stats(seq),
                              self.vocab_size, self._decode)
        if seq.finish is FinishReason.STOP and seq.output:
            self.history.add(history_key(seq), seq.output_text())

    def _context(self, seq: EngineSequence) -> DraftContext:
        state = self._bind(seq)
        if state.prompt_text is None:
            state.prompt_text = self._decode(seq.prompt)
        return DraftContext(history_key(seq), seq.schema, state.prompt_text, seq.output_text(),
                            seq.prompt, seq.output, seq.matcher, seq.seed, seq.params, state, seq.prose)

    def _decode(self, ids: list[int]) -> str:
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
