"""Who may draft for a sequence, and how far: the drafting policy asked over the statistics book's evidence.

``Decider.decide`` turns one sequence's request (its schema, its caller's switch, the schema owner's override,
its draw) and the evidence of its schema and of the step costs, both under the model key of the draft version
that serves it, into a ``SpeculationReport``; it records the policy's state per proposer. Without a policy
(a fixed configuration) every proposer drafts up to the scheduler's limit.

The book is read at most once a second per model and schema (``EVIDENCE_TTL_SECONDS``: admissions come in
bursts), except right after a probe, whose outcome the next decision reads.
"""

from __future__ import annotations

import random
import time

from structspec.engine.config import PolicyConfig
from structspec.engine.sequence import EngineSequence
from structspec.engine.types import SpeculationReport
from structspec.models.step_profile import StepProfile
from structspec.speculation.base import SequenceSpeculation
from structspec.speculation.policy import DRAFT_MODEL, PolicyRequest, decide
from structspec.stats.book import Recorder
from structspec.stats.counters import HOUR, Reason, hour_of
from structspec.stats.evidence import CostEvidence, SchemaEvidence, cost_evidence, schema_evidence
from structspec.stats.policy_states import OFF

EVIDENCE_TTL_SECONDS = 1.0  # the policy's reading of the book is reused this long (admissions come in bursts)


class Decider:
    """``policy`` None: every proposer drafts up to ``max_draft`` (a fixed configuration). ``rng`` draws each
    request's number for the policy (``PolicyRequest.draw``), once, at its first decision."""

    def __init__(self, policy: PolicyConfig | None, rng: random.Random, max_draft: int,
                 step_profile: StepProfile | None = None):
        self.policy = policy
        self.step_profile = step_profile  # the executor's measured step costs (full output head: the dearer)
        self.rng = rng
        self.max_draft = max_draft
        self._evidence: dict[tuple[str, str], tuple[float, SchemaEvidence]] = {}  # (model, schema key)
        self._costs: dict[str, tuple[float, CostEvidence]] = {}  # model ->

    def decide(self, seq: EngineSequence, state: SequenceSpeculation, names: tuple[str, ...], batch_size: int,
               stats: Recorder | None) -> SpeculationReport:
        """Who of ``names`` (the proposers of ``seq``'s draft version) may draft at ``batch_size``, how far, and why;
        ``stats``: the statistics ``seq`` records into (the policy reads their model's evidence)."""
        if self.policy is None:
            if not seq.speculate or not names:
                reason = Reason.REQUEST_OFF if names else Reason.SERVER_OFF
                return SpeculationReport(False, reason, False, {}, {p: reason for p in names})
            return SpeculationReport(True, Reason.DRAFTED, False, {p: self.max_draft for p in names},
                                     {p: Reason.DRAFTED for p in names})
        now = stats.clock() if stats is not None else time.time()
        if state.draw is None:
            state.draw = self.rng.random()
        # A new draft version starts with no evidence and no state of its own: judged as a cold schema is
        before = seq.decision
        request = PolicyRequest(seq.schema_key, seq.schema, seq.speculate, seq.schema_speculation, state.draw,
                                standing_off(stats, seq.schema_key, names), before is not None,
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

    def wants_replay(self, stats: Recorder | None, schema_key: str, proposer: str) -> bool:
        """Whether ``proposer``'s replayed drafts for the schema are still thin (under ``min_evidence_tokens``
        examined tokens: what the acceptance is measured on, whatever the drafts' length): worth replaying on another
        finished output (``speculation.replay``)."""
        if self.policy is None or stats is None:
            return False
        evidence, _ = self._read(stats, schema_key, stats.clock())
        replayed = evidence.replayed.get(proposer)
        return replayed is None or sum(replayed.reached) < self.policy.min_evidence_tokens

    def forget(self, stats: Recorder, schema_key: str) -> None:
        """Read the schema's evidence afresh at its next decision (what was just recorded counts at once)."""
        self._evidence.pop((stats.model, schema_key), None)

    def _read(self, stats: Recorder | None, schema_key: str, now: float) -> tuple[SchemaEvidence, CostEvidence]:
        """The evidence of ``schema_key`` and the step costs, both of ``stats``' model (one draft version's)."""
        if stats is None:
            return SchemaEvidence(), self._with_profile(CostEvidence())
        if self.policy is None:
            raise RuntimeError("evidence is read for the policy only")
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
            measured = cost_evidence(book.rows_for(model, "", since), hour_of(now), half_life)
            costs = self._costs[model] = (now, self._with_profile(measured))
            if len(self._costs) > 64:  # models of retired drafts
                self._costs = {model: costs}
        return cached[1], costs[1]

    def _with_profile(self, costs: CostEvidence) -> CostEvidence:
        """``costs`` priced with this engine's own step profile (the one measured in this process), where it has one."""
        profile = self.step_profile
        return costs if profile is None else costs.with_profile(profile.full, profile.draft_token, profile.restricted)


def standing_off(stats: Recorder | None, schema_key: str, names: tuple[str, ...]) -> dict[str, str]:
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
