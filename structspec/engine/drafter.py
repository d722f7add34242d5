"""A step's drafting, the engine's side of the speculation seam: who may draft, the draft, its grammar masks.

``Drafter`` stands between the decode loop and the ``Speculator``:

- *what serves* (``Serving``): the statistics, model key and draft version that sequences admitted now are bound
  to for their whole life (``bind``); ``install`` makes a newly loaded draft serve the later ones;
- *the decision*: asks the speculator who may draft for a sequence at a batch size (``decide``), and counts it;
- *the draft* (``draft``): for one plan that scores, asks the speculator for a draft (the matcher rolled back
  whatever the proposer does), walks it through the grammar with the mask of every drafted position, cuts it at
  the first token the grammar cannot take and back to where the target decides (``_decision_end``), and returns
  it as a ``StepDraft``, the step's own value;
- *the verdict* and *the end*: tells the speculator what verification made of its draft, and when a sequence ends.

Failures: a speculator that raises while deciding or proposing costs that request its drafts, never the request
(logged, ``draft_failures`` counted); a grammar that raises while masking raises (the core ends that request alone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from structspec.engine.scheduler import StepPlan
from structspec.engine.sequence import EngineSequence, Serving
from structspec.engine.speculator import Draft, DraftVerdict, Speculator
from structspec.engine.types import DraftsUnsupported, DraftUpdate, SpeculationReport
from structspec.engine.verify import Verdict
from structspec.grammar.base import Matcher, allocate_bitmask, decision_end, small_allowed_set, token_allowed
from structspec.models.end_of_turn import as_id_set
from structspec.models.executor import ForwardStep
from structspec.stats.book import Recorder
from structspec.stats.counters import Reason, batch_bucket, proposer_of

log = logging.getLogger(__name__)


@dataclass
class StepDraft:
    """What a plan that scores carries this step: its draft's grammatical part and the masks of the scored
    positions (the next token's and one per drafted token)."""

    draft: Draft | None  # the grammatical part of the proposer's draft (None: no draft)
    bitmask: torch.Tensor  # [len(draft)+1, W] grammar masks of the scored positions
    tail: tuple[int, torch.Tensor] | None = None  # a sampled draft's first token past it, with its q row
    drafted_tokens: list[int] = field(default_factory=list)  # the proposer's tokens before the cut (stats, samples)
    allowed: tuple[torch.Tensor | None, ...] | None = None  # per scored position, its allowed ids when few (or None)

    @property
    def tokens(self) -> list[int]:
        """The drafted tokens the forward carries (after the cut)."""
        return self.draft.tokens if self.draft is not None else []

    @property
    def drafted(self) -> int:
        """Tokens the proposer drafted before the grammatical cut."""
        return len(self.drafted_tokens)


class Drafter:
    """``end_of_turn``: the id (or ids) that end a turn (a draft never runs past one); ``speculator`` None: no
    drafting (every plan that scores gets its next position's mask alone)."""

    def __init__(self, executor: ForwardStep, end_of_turn: int | Iterable[int], speculator: Speculator | None = None,
                 serving: Serving = Serving()):
        self.executor = executor
        self.eos = as_id_set(end_of_turn)
        self.speculator = speculator
        self.serving = serving  # what serves the sequences admitted from now on (each keeps its own to the end)
        self.draft_failures = 0  # drafting attempts that raised (each turned drafting off for its request)
        self.propose_seconds = 0.0  # spent in the speculator's proposing since the core last reset it (a step's)

    # -- what serves a sequence ---------------------------------------------------------------------
    def bind(self, seq: EngineSequence) -> None:
        """Bind ``seq`` (at admission) to what serves now, for its whole life."""
        seq.serving = self.serving

    def install(self, update: DraftUpdate) -> None:
        """Serve the sequences admitted from now on with ``update``'s draft, their statistics under its model key;
        running ones keep theirs. On the engine thread between steps.
        Raises: DraftsUnsupported (the speculator takes no draft model)."""
        install = getattr(self.speculator, "install_draft", None)
        if install is None or not getattr(self.speculator, "drafts_enabled", False):
            raise DraftsUnsupported("the server's speculation configuration drafts without a draft model")
        stats = self.serving.stats.book.recorder(update.model_key) if self.serving.stats is not None else None
        install(update.proposer, update.version, stats)
        self.serving = Serving(stats, update.model_key, update.version)
        log.info("draft %s installed: requests admitted from now on are served by %s", update.version,
                 update.model_key)

    def stats_of(self, seq: EngineSequence) -> Recorder | None:
        """The statistics ``seq`` records into: those it was admitted under (a sequence never admitted: today's)."""
        served = seq.serving.stats if seq.serving is not None else None
        return served if served is not None else self.serving.stats

    # -- the decision --------------------------------------------------------------------------------
    def decide(self, seq: EngineSequence, batch_size: int) -> None:
        """Ask the speculator who may draft for ``seq`` at this batch size, and count the decision."""
        if self.speculator is None:
            seq.decision = SpeculationReport(False, Reason.SERVER_OFF)
        else:
            try:
                seq.decision = self.speculator.decide(seq, batch_size)
            except Exception:  # noqa: BLE001 - a policy bug costs speed, never the request
                log.exception("the drafting policy failed for request %s; it runs without drafts", seq.request_id)
                seq.decision = SpeculationReport(False, Reason.POLICY_ERROR)
        seq.decision_bucket = batch_bucket(batch_size)
        stats = self.stats_of(seq)
        if stats is not None:
            stats.record_decision(seq.schema_key, seq.decision.reason, seq.decision.reasons)

    # -- the draft and its masks ---------------------------------------------------------------------
    def draft(self, plan: StepPlan) -> StepDraft:
        """The draft of ``plan`` (one that scores) cut at its first ungrammatical token, with one mask per scored
        position; the matcher is left as found.

        A sampled draft's first token the grammar cannot take (or an end of turn) stays in the verification as
        ``StepDraft.tail``: a test at that position, not a silent trim (see ``verify``).
        """
        matcher = plan.seq.matcher
        first = self._first_mask(plan)
        draft = self._propose(plan, narrow=first is None or first[1] is not None)
        tokens = list(draft.tokens)[: plan.max_draft] if draft else []  # a proposer that drafts more than asked is cut
        bitmask = allocate_bitmask(len(tokens) + 1, self.executor.vocab_size)
        if first is not None:
            bitmask[0] = first[0]
        else:
            matcher.fill_mask(bitmask, 0)
        tail = None
        consumed = 0
        for i, tok in enumerate(tokens):
            # The mask at i comes from the state after x_0..x_{i-1}; an ungrammatical x_i ends the draft there.
            if tok in self.eos or not token_allowed(bitmask[i], tok) or not matcher.consume([tok]):
                if draft is not None and draft.q is not None:  # (tokens come from a draft)
                    tail = (tok, draft.q[i])
                break
            consumed += 1
            matcher.fill_mask(bitmask, i + 1)  # once the grammar is complete this row allows only EOS
            if matcher.is_stopped():
                break  # no draft continues past grammar termination
        matcher.rollback(consumed)
        kept, allowed = self._priced_cut(plan, draft, bitmask, consumed, (first[1],) if first is not None else ())
        kept = self._decision_end(plan, draft, bitmask, kept)
        allowed = allowed[: kept + 1] if allowed is not None else None
        if kept < consumed:  # cut for its price or at a decision: never verified, so it counts as not drafted
            tail, tokens = None, tokens[:kept]
            if kept == 0:
                draft = None
        if draft is not None and kept < len(draft.tokens):
            draft = Draft(draft.tokens[:kept], draft.q[:kept] if draft.q is not None else None, draft.proposer)
        return StepDraft(draft, bitmask[: kept + 1], tail, tokens, allowed)

    def _first_mask(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The next position's mask and its small allowed set (None: a wide one), looked up before proposing where
        a proposer holds a restricted cap: a position whose set is wide takes drafts at a proposer's cap alone, so
        a proposer with no cap there is not asked (its proposing and masks cost a step about 6% on Gemma's free
        text, to draft nothing). None where no restricted cap applies."""
        decision, limit = plan.seq.decision, self.executor.restricted_logits_max
        if decision is None or not limit or not decision.restricted_max_draft or self.speculator is None \
                or plan.max_draft <= 0:
            return None
        row = allocate_bitmask(1, self.executor.vocab_size)
        plan.seq.matcher.fill_mask(row, 0)
        return row[0], small_allowed_set(row[0], limit)

    def _priced_cut(self, plan: StepPlan, draft: Draft | None, bitmask: torch.Tensor, consumed: int,
                    known: tuple[torch.Tensor | None, ...]) -> tuple[int, tuple[torch.Tensor | None, ...] | None]:
        """How many of the draft's ``consumed`` grammatical tokens the forward carries, and the small allowed sets of
        its first scored positions as far as they were looked up (``known``: those of the first rows, already
        looked up; None where none were). Up to the proposer's cap (``SpeculationReport.max_draft``) all of
        them; past it, up to its restricted cap, only while every scored position's allowed set is small (the
        forward then skips the output layer: ``policy.restricted_draft_length``). Whether token i stays depends
        on the masks after it, so only a draft without draft probabilities (``Draft.q`` None: copy lookup, the
        history) is cut so: its tokens are a function of the context, and verification stays exact; a sampled
        draft is never given a restricted cap."""
        decision, limit = plan.seq.decision, self.executor.restricted_logits_max
        if draft is None or decision is None or draft.q is not None or not limit:
            return consumed, known or None
        cap = decision.max_draft.get(draft.proposer, 0)
        wide = decision.restricted_max_draft.get(draft.proposer, 0)
        if consumed <= cap or wide <= cap:
            return consumed, known or None
        allowed = list(known)
        for row in bitmask[len(allowed): min(consumed, wide) + 1]:  # rows 0..d carry a d-token draft
            allowed.append(small_allowed_set(row, limit))
            if allowed[-1] is None:
                break
        small = next((i for i, ids in enumerate(allowed) if ids is None), len(allowed))  # leading small rows
        kept = max(cap, min(consumed, wide, small - 1))
        return kept, tuple(allowed[: kept + 1])

    @staticmethod
    def _decision_end(plan: StepPlan, draft: Draft | None, bitmask: torch.Tensor, kept: int) -> int:
        """How many of the ``kept`` drafted tokens stay so that the draft ends where the target decides. A scored row
        at a position the grammar forces (one allowed token; the end of turn alone once the grammar is complete)
        decides nothing, and fast-forward commits such tokens unscored. So a draft whose last scored row (the one
        after its last token) is forced drops its trailing forced tokens and the decision before them: the step's
        own row samples that decision from the same distribution verification would have kept it with, and
        fast-forward commits what follows. The step commits the same tokens with fewer rows scored, and where the
        forced run ends the output it ends in the same step. (SmolLM2's short classify outputs on llama.cpp: a
        two-token draft on the last step, its tail forced to the end, cost 60-66 ms against 45-50 ms without it,
        and saved no pass.) Only with fast-forward on, and only for a draft without draft probabilities: its
        tokens are a function of the context, so cutting it by the grammar's masks keeps verification exact."""
        if draft is None or draft.q is not None or not plan.seq.fast_forward:
            return kept
        return decision_end(bitmask, kept)

    def allowed_ids(self, step: StepDraft) -> tuple[torch.Tensor | None, ...] | None:
        """Per scored position, its allowed ids when the executor scores small allowed sets alone (the rest would
        be masked out anyway), kept on ``step`` for the masking; None where it scores whole rows."""
        limit = self.executor.restricted_logits_max
        known = step.allowed or ()  # the first rows' sets, where drafting looked them up already
        if limit and len(known) < len(step.bitmask):
            step.allowed = (*known, *(small_allowed_set(row, limit) for row in step.bitmask[len(known):]))
        return step.allowed

    def _propose(self, plan: StepPlan, narrow: bool = True) -> Draft | None:
        """The speculator's draft, the matcher left as found.

        The speculator sees the matcher through a counter of what it consumed: a failure while drafting
        (a proposer's bug, the draft model out of memory) is rolled back and ends drafting for that
        request, never the request; a proposer that returns without rolling back is rolled back too.
        ``narrow``: the next position's allowed set is small (``_first_mask``; True where not looked up).
        """
        if self.speculator is None or plan.max_draft <= 0:
            return None
        seq, matcher = plan.seq, plan.seq.matcher
        if not narrow and seq.decision is not None and not any(seq.decision.max_draft.values()):
            return None  # only restricted caps, at a wide position: nobody drafts here
        seq.matcher = walked = _CountingMatcher(matcher)
        started = time.perf_counter()
        try:
            return self.speculator.propose(seq, plan.max_draft, narrow=narrow)
        except Exception:  # noqa: BLE001 - costs speed, not the request
            log.exception("drafting failed for request %s; it continues without drafts", seq.request_id)
            walked.failed = True
            self.draft_failures += 1
            seq.speculate = False
            return None
        finally:
            self.propose_seconds += time.perf_counter() - started
            seq.matcher = matcher
            if walked.consumed > 0:
                if not walked.failed:
                    log.error("a proposer left the matcher %d tokens on (request %s)", walked.consumed,
                              seq.request_id)
                matcher.rollback(walked.consumed)
            elif walked.consumed < 0:  # rolled back into the committed text: consume those tokens again
                log.error("a proposer rolled the matcher back %d committed tokens (request %s)", -walked.consumed,
                          seq.request_id)
                matcher.consume(seq.output[len(seq.output) + walked.consumed:])

    # -- the verdict and the end ---------------------------------------------------------------------
    def verified(self, plan: StepPlan, step: StepDraft, verdict: Verdict) -> None:
        """Count the verdict on ``step``'s draft in ``plan.seq``'s usage and tell the speculator."""
        if step.draft is None:
            return
        plan.seq.record_draft(proposer_of(step.draft.proposer), step.drafted, verdict.accepted)  # usage: who drafted
        decision = plan.seq.decision  # past the proposer's cap: carried on its restricted one (``_priced_cut``)
        narrow = decision is not None and len(step.tokens) > decision.max_draft.get(step.draft.proposer, 0)
        if self.speculator is not None:
            self.speculator.on_verified(plan.seq, DraftVerdict(step.draft.proposer, step.drafted, verdict.accepted,
                                                               plan.batch_size, tuple(step.drafted_tokens),
                                                               len(step.tokens), verdict.token, narrow))

    def release(self, seq: EngineSequence) -> None:
        """Tell the speculator ``seq`` ended (any reason). Raises: Never (a speculator's bug is logged)."""
        if self.speculator is None:
            return
        try:
            self.speculator.on_finish(seq)
        except Exception:  # noqa: BLE001 - a speculator's bug must not keep the request from being answered
            log.exception("the speculator failed to release request %s", seq.request_id)


class _CountingMatcher:
    """A matcher that counts the tokens consumed through it (net of rollbacks); everything else passes through."""

    def __init__(self, inner: Matcher) -> None:
        self._inner = inner
        self.consumed = 0
        self.failed = False  # set while unwinding from a proposer's exception (the rollback is expected)

    def consume(self, tokens: Sequence[int]) -> bool:
        ok = self._inner.consume(tokens)
        if ok:
            self.consumed += len(tokens)
        return ok

    def rollback(self, n: int) -> None:
        self._inner.rollback(n)
        self.consumed -= n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
