"""The front's side of structspec's drafting inside vLLM: a plan per request, its verdicts into the statistics.

``DraftingFront.plan`` asks the per-schema policy (``speculation.decisions.Decider``, the own engine's, over the
same statistics book) who may draft for a request and how far, at the batch size vLLM runs when it is admitted,
and writes the answer as the request's ``DraftingPlan`` (``drafting``), with a snapshot of its schema's history
(the persisted, tenant-scoped history the own engine drafts from). ``DraftingFront.record`` writes the journal the
worker kept (``proposer.StructspecProposer.drain``) as the own engine's records: each verification per schema,
proposer, batch bucket and draft position, the forced tokens, the request's usage; ``finished`` replays on the
output the drafts a priced-out proposer would have made (``speculation.replay``) and adds a complete output to the
history.

The decision is made once, at admission (the own engine decides again at each step): vLLM's proposer reads the
plan the request carries and cannot ask the front mid-request.
"""

from __future__ import annotations

import random
from typing import Any

from structspec.engine.config import PolicyConfig
from structspec.engine.sequence import EngineSequence
from structspec.engine.types import FinishReason, SpeculationReport, Usage
from structspec.speculation.base import Proposer, SequenceSpeculation
from structspec.speculation.decisions import Decider
from structspec.speculation.history import HistoryProposer, SchemaHistory, history_key
from structspec.speculation.ngram import NgramProposer
from structspec.speculation.replay import replay_priced_out
from structspec.stats.counters import Reason, batch_bucket, proposer_of
from structspec.vllm_engine.drafting import DraftingPlan, Journal

HISTORY_SENT = 32  # the schema history's newest outputs a request carries to the workers
# Sampled requests draft forced tokens only: with vLLM 0.32's CPU build, sampled outputs with the proposers'
# drafts were measured far from plain constrained sampling (tests/vllm_engine/test_structspec_method.py, xfail),
# while greedy outputs are exact. Forced tokens are the grammar's only choice, so drafting them cannot bias.
SAMPLED_EXACT = False


class DraftingFront:
    """``names``: the proposers on (``ngram``, ``history``); ``max_draft``: vLLM's K; ``policy`` None: every
    proposer drafts up to K (a fixed configuration); ``stats``: the engine's ``Recorder`` (None: nothing recorded,
    the policy sees no evidence); ``history``: the schema history (the store's, persisted)."""

    def __init__(self, names: tuple[str, ...], max_draft: int, policy: PolicyConfig | None, stats: Any,
                 history: SchemaHistory, end_of_turn: tuple[int, ...], rng: random.Random | None = None,
                 tokenizer: Any = None, vocab_size: int = 0):
        self.names = names
        self._tokenizer, self._vocab = tokenizer, vocab_size
        # the proposers replayed on finished outputs while priced out (none without a tokenizer)
        self._replayers: tuple[Proposer, ...] = () if tokenizer is None else tuple(
            p for p in (NgramProposer(tokenizer) if "ngram" in names else None,
                        HistoryProposer(tokenizer, history) if "history" in names else None) if p is not None)
        self.max_draft = max_draft
        self.stats = stats
        self.history = history
        self.end_of_turn = end_of_turn
        self.decider = Decider(policy, rng or random.Random(), max_draft)

    def plan(self, seq: EngineSequence, batch_size: int) -> DraftingPlan:
        """``seq``'s plan at ``batch_size``; sets ``seq.decision`` and records it."""
        report = self.decider.decide(seq, SequenceSpeculation(), self.names, batch_size, self.stats)
        if report.max_draft and seq.params.temperature > 0 and not SAMPLED_EXACT:
            report = SpeculationReport(False, Reason.SAMPLED_ON_VLLM, False, {},
                                       {p: Reason.SAMPLED_ON_VLLM for p in report.reasons})
        seq.decision, seq.decision_bucket = report, batch_bucket(batch_size)
        if self.stats is not None:
            self.stats.record_decision(seq.schema_key, report.reason, report.reasons)
        policy = self.decider.policy
        probe = policy.probe_max_tokens if report.probe and policy is not None else None
        key = history_key(seq)
        history = tuple(self.history.outputs(key)[-HISTORY_SENT:]) if "history" in report.max_draft else ()
        return DraftingPlan(seq.key, seq.schema_key, key, dict(report.max_draft), forced=seq.fast_forward,
                            probe_budget=probe, schema=seq.schema, prose=seq.prose, end_of_turn=self.end_of_turn,
                            history=history)

    def record(self, seq: EngineSequence, journal: Journal, usage: Usage) -> int:
        """Write ``journal`` (``seq``'s drafting) to the statistics and ``usage``; the tokens accepted in all
        (forced ones included)."""
        report: SpeculationReport | None = seq.decision
        total = journal.forced_accepted
        usage.forced_tokens += journal.forced_accepted
        for v in journal.verifications:
            total += v.accepted
            who = proposer_of(v.proposer)  # usage: the proposer that drafted (its drafts' key in the statistics)
            usage.drafted[who] = usage.drafted.get(who, 0) + v.drafted
            usage.accepted[who] = usage.accepted.get(who, 0) + v.accepted
            usage.draft_steps[who] = usage.draft_steps.get(who, 0) + 1
            if self.stats is not None:
                probe = report is not None and report.reasons.get(v.proposer) == Reason.PROBE
                self.stats.record_verification(seq.schema_key, v.proposer, v.batch_size, v.drafted, v.accepted,
                                               probe)
        return total

    def finished(self, seq: EngineSequence, output: list[int], text: str, finish: FinishReason) -> None:
        """The drafts a priced-out proposer would have made, replayed on ``output`` (``speculation.replay``, with
        ``tokenizer``); a complete output then joins its schema's history (the own engine's rules)."""
        if self._replayers and finish in (FinishReason.STOP, FinishReason.LENGTH):
            replay_priced_out(seq, output, self._replayers, self.decider, self.stats, self._vocab, self._decode,
                              ends_at_decisions=False)  # forced tokens are drafted here
        if finish is FinishReason.STOP and text and "history" in self.names:
            self.history.add(history_key(seq), text)

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
