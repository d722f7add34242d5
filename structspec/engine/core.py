"""The decode loop: one step of continuous batching over grammar-constrained (and speculative) sequences.

``EngineCore`` is synchronous and single-threaded: the async ``Engine`` runs ``step()`` on a
dedicated thread and talks to it through ``submit``/``abort``, which only touch a locked
inbox. ``step()`` reads as its stages:

  0. run the calls queued for the engine thread (``call_between_steps``: a draft swap);
  1. take in new requests and aborts; cancel expired deadlines; admit (the ``Scheduler``), each
     sequence bound to what serves it now (``Drafter.bind``: statistics, model key, draft version)
     for its whole life;
  2. schedule: plan each running sequence's feed (the ``Scheduler``: ``StepPlan``);
  3. draft: for each plan that scores, the ``Drafter``'s draft, cut at the first ungrammatical
     token, with the grammar mask of every scored position (``StepDraft``);
  4. run: one target forward over the whole batch;
  5. postprocess, per sequence: verify (k = 0 is plain decoding), roll the KV cache back over
     rejected draft tokens, commit accepted + recovered/bonus tokens, fast-forward the tokens the
     grammar forces, and finish on stop / length. A turn stops at any of its end-of-turn ids
     (``end_of_turn``: one id or several, e.g. Llama 3's ``<|eot_id|>`` and ``<|eom_id|>``), which never
     join the output.

Failures: what goes wrong with one sequence (its grammar, its draft, its step input, the rows
the executor scores for it: ``InputError``) ends that request alone with ERROR, the reason in
its result, and the rest of the batch goes on as if it had never been there (the forward runs
again without it). A forward that fails otherwise is the model's failure and ends every
request of its batch, each error saying so; the engine keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from structspec.engine.config import SchedulerLimits
from structspec.engine.detok import OutputText
from structspec.engine.drafter import Drafter, StepDraft
from structspec.engine.scheduler import Scheduler, StepPlan
from structspec.engine.sequence import EngineSequence, SequenceStatus, Serving
from structspec.engine.speculator import Speculator
from structspec.engine.stop import cut_at_stop
from structspec.engine.types import DraftUpdate, FinishReason, OverBudget, QueueFull
from structspec.engine.verify import Verdict, verify
from structspec.grammar.base import apply_token_bitmask, token_allowed
from structspec.models.end_of_turn import as_id_set
from structspec.models.executor import ForwardStep, InputError, StepInput
from structspec.stats.counters import batch_bucket

log = logging.getLogger(__name__)


@dataclass
class _Inbox:
    lock: threading.Lock = field(default_factory=threading.Lock)
    new: list[EngineSequence] = field(default_factory=list)
    aborts: set[str] = field(default_factory=set)
    calls: list[tuple[Callable[[], Any], Future[Any]]] = field(default_factory=list)


# One plan of the step with its draft and masks (None: the plan does not score)
Planned = tuple[StepPlan, StepDraft | None]


class EngineCore:
    """``end_of_turn``: the id (or ids) any of which ends a turn; ``serving``: what serves the sequences admitted
    first (its model key defaults to its statistics' model). Raises: ValueError (no end-of-turn id)."""

    def __init__(self, executor: ForwardStep, tokenizer: Any, end_of_turn: int | Iterable[int],
                 limits: SchedulerLimits = SchedulerLimits(), speculator: Speculator | None = None,
                 serving: Serving = Serving()):
        self.executor = executor
        self.tokenizer = tokenizer
        self.eos = as_id_set(end_of_turn)
        self.limits = limits
        if not serving.model_key and serving.stats is not None:
            serving = Serving(serving.stats, serving.stats.model, serving.draft_version)
        self.scheduler = Scheduler(executor, limits)
        self.drafter = Drafter(executor, self.eos, speculator, serving)
        self._inbox = _Inbox()
        self.wakeup = threading.Event()

    @property
    def speculator(self) -> Speculator | None:
        """What the drafter asks for drafts (None: no drafting)."""
        return self.drafter.speculator

    @speculator.setter
    def speculator(self, speculator: Speculator | None) -> None:
        self.drafter.speculator = speculator

    @property
    def serving(self) -> Serving:
        """What serves the sequences admitted from now on (``install_draft`` changes it)."""
        return self.drafter.serving

    @property
    def draft_failures(self) -> int:
        """Drafting attempts that raised (each turned drafting off for its request)."""
        return self.drafter.draft_failures

    # -- called from any thread ------------------------------------------------------------------
    def submit(self, seq: EngineSequence) -> None:
        """Queue ``seq``. Raises: OverBudget, QueueFull; ValueError for a sequence submitted before."""
        if seq.submitted:
            raise ValueError(f"sequence {seq.key} (request {seq.request_id}) was already submitted")
        need = self.scheduler.kv_need(len(seq.prompt), seq.params.max_tokens)
        if need > self.limits.kv_budget_tokens:
            raise OverBudget(f"request needs {need} KV-cache tokens; the server's budget is "
                             f"{self.limits.kv_budget_tokens}", field="max_tokens")
        with self._inbox.lock:
            if len(self.scheduler.waiting) + len(self._inbox.new) >= self.limits.max_queue:
                raise QueueFull(f"queue full ({self.limits.max_queue} requests waiting); retry later")
            seq.submitted = True
            self._inbox.new.append(seq)
        self.wakeup.set()

    def abort(self, key: str) -> None:
        """Cancel the sequence whose ``EngineSequence.key`` is ``key`` (request ids are not unique)."""
        with self._inbox.lock:
            self._inbox.aborts.add(key)
        self.wakeup.set()

    def call_between_steps(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn()`` on the engine thread before the next step takes in and admits requests (engine state
        changes there only, never under a running step); the future holds its result or its exception."""
        future: Future[Any] = Future()
        with self._inbox.lock:
            self._inbox.calls.append((fn, future))
        self.wakeup.set()
        return future

    def fail_calls(self, error: BaseException) -> None:
        """Fail the calls still queued (the engine thread stopped before running them)."""
        with self._inbox.lock:
            calls, self._inbox.calls = self._inbox.calls, []
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def queue_depth(self) -> int:
        return len(self.scheduler.waiting) + len(self._inbox.new)

    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting or self._inbox.new or self._inbox.aborts
                    or self._inbox.calls)

    # -- the engine thread ------------------------------------------------------------------------
    def install_draft(self, update: DraftUpdate) -> None:
        """Serve the sequences admitted from now on with ``update``'s draft, their statistics under its model key;
        running ones keep theirs. Call it on the engine thread between steps (``call_between_steps``).
        Raises: DraftsUnsupported (the speculator takes no draft model)."""
        self.drafter.install(update)

    def step(self) -> None:
        self._run_calls()
        self._take_inbox()
        self._admit()
        self._redecide()
        plans = self.scheduler.schedule()
        started, self.drafter.propose_seconds = time.perf_counter(), 0.0
        planned = self._draft(plans)
        if not planned:
            return
        decode_only = all(p.seq.status is SequenceStatus.DECODING for p, _ in planned)
        ran, outputs = self._forward(planned)
        with torch.inference_mode():  # the step's logits are inference tensors, masked in place
            for (plan, step), logits in zip(ran, outputs):
                self._postprocess(plan, step, logits)
        if decode_only and len(ran) == len(planned):
            self._record_step(ran, time.perf_counter() - started - self.drafter.propose_seconds)

    def fail_running(self, error: str) -> None:
        """End every running request with ERROR (after an unexpected failure of a whole step)."""
        for seq in list(self.scheduler.running):
            self._finish(seq, FinishReason.ERROR, error)

    # -- 0. calls for the engine thread ----------------------------------------------------------------
    def _run_calls(self) -> None:
        with self._inbox.lock:
            calls, self._inbox.calls = self._inbox.calls, []
        for fn, future in calls:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - the caller's to handle, never the engine's
                future.set_exception(exc)

    # -- 1. intake and admission -------------------------------------------------------------------
    def _take_inbox(self) -> None:
        with self._inbox.lock:
            new, aborts = self._inbox.new, self._inbox.aborts
            self._inbox.new, self._inbox.aborts = [], set()
        self.scheduler.enqueue(new)
        now = time.monotonic()
        for seq in self.scheduler.sequences():
            if seq.key in aborts:
                self._finish(seq, FinishReason.CANCELLED, "cancelled by the caller")
            elif seq.deadline is not None and now >= seq.deadline:
                self._finish(seq, FinishReason.CANCELLED, "deadline exceeded")

    def _admit(self) -> None:
        admitted, failed = self.scheduler.admit(lambda: OutputText(self.tokenizer))
        for seq, error in failed:
            self._finish(seq, FinishReason.ERROR, error)
        for seq in admitted:
            self.drafter.bind(seq)
            self.drafter.decide(seq, len(self.scheduler.running))
            self._alone(seq, "starting its grammar", self._start, seq)

    def _start(self, seq: EngineSequence) -> None:
        self._fast_forward(seq)  # the opening forced tokens ride along with the prompt
        self._check_done(seq)

    def _redecide(self) -> None:
        """Decide again for the sequences admitted at another batch-size bucket than the batch's now."""
        batch = len(self.scheduler.running)
        bucket = batch_bucket(batch)
        for seq in self.scheduler.running:
            if seq.decision_bucket != bucket and seq.speculate:
                self.drafter.decide(seq, batch)

    # -- 3. draft and grammar masks ----------------------------------------------------------------
    def _draft(self, plans: list[StepPlan]) -> list[Planned]:
        """Each plan with its draft and masks where it scores; a plan whose drafting or masking fails ends its
        request alone and leaves the step."""
        planned: list[Planned] = []
        for plan in plans:
            if not plan.scores:
                planned.append((plan, None))
                continue
            try:
                planned.append((plan, self.drafter.draft(plan)))
            except Exception as exc:  # noqa: BLE001 - that request's grammar or draft, not the batch's
                self._failed_alone(plan.seq, "drafting and masking", exc)
        return planned

    # -- 4. one forward ------------------------------------------------------------------------------
    def _record_step(self, planned: list[Planned], seconds: float) -> None:
        """Time a step of decodes only (no prompt chunk), run as planned, for the policy's cost model: its masks,
        forward, verification and commits, but not its proposing (priced apart, per proposer). A step where a
        sequence ended is not timed: its ending's work (the replays, the history) is no step's cost. Nor is a step
        that fed forced tokens: they are fed but not scored, so such a step is neither a plain step (SmolLM2 on
        llama.cpp: 17 ms against 10) nor the step profile's k-row step, which scores every row (on an executor whose
        output layer is most of a row's cost, far dearer); timed as either, it made drafts look cheap. A step is
        timed by its longest draft."""
        stats = self.serving.stats
        if stats is None or any(plan.seq.finish is not None or len(plan.feed) > 1 for plan, _ in planned):
            return
        longest = max((len(step.tokens) if step is not None else 0) for _, step in planned)
        stats.record_step(len(self.scheduler.running), longest, seconds, restricted=_restricted(planned))

    def _forward(self, planned: list[Planned]) -> tuple[list[Planned], list[torch.Tensor]]:
        """One forward over ``planned``: the plans that ran and their logits.

        A plan whose input cannot be built, or whose input the executor refuses (``InputError``: the executor is
        left as before the step), ends its request alone, and the forward runs again without it. Any other
        failure of the forward is the model's: every request of the batch ends with ERROR, and none ran."""
        batch: list[tuple[Planned, StepInput]] = []
        for p in planned:
            try:
                batch.append((p, self._step_input(*p)))
            except Exception as exc:  # noqa: BLE001 - that request's input, not the batch's
                self._failed_alone(p[0].seq, "building its step input", exc)
        while batch:
            try:
                return [p for p, _ in batch], self.executor.step([x for _, x in batch])
            except InputError as exc:
                at_fault = [p for (p, _), x in batch if x.seq_id in exc.reasons]
                if not at_fault:  # it names none of them: the model's failure after all
                    return self._batch_failed(batch, exc)
                log.warning("the model refused the inputs of requests %s: %s",
                            [p.seq.request_id for p in at_fault], exc)
                for fault in at_fault:
                    self._finish(fault.seq, FinishReason.ERROR, f"model input refused: {exc.reasons[fault.seq.seq_id]}")
                batch = [(p, x) for p, x in batch if x.seq_id not in exc.reasons]
            except Exception as exc:  # noqa: BLE001 - a model failure ends this batch's requests, not the engine
                return self._batch_failed(batch, exc)
        return [], []

    def _batch_failed(self, batch: list[tuple[Planned, StepInput]], exc: Exception) -> tuple[list[Planned], list[torch.Tensor]]:
        log.error("the forward pass failed for the whole batch, requests %s",
                  [p.seq.request_id for (p, _), _ in batch], exc_info=exc)
        for (p, _), _ in batch:
            self._finish(p.seq, FinishReason.ERROR, f"model failure (the forward pass of its whole batch of "
                                                    f"{len(batch)}): {type(exc).__name__}: {exc}")
        return [], []

    def _step_input(self, plan: StepPlan, step: StepDraft | None) -> StepInput:
        if step is None:
            return StepInput(plan.seq.seq_id, plan.feed, logits_at=())
        first = len(plan.feed) - 1
        return StepInput(plan.seq.seq_id, plan.feed + step.tokens,
                         logits_at=tuple(range(first, first + len(step.tokens) + 1)),
                         allowed=self.drafter.allowed_ids(step))

    # -- 5. verify, roll back, commit, fast-forward ------------------------------------------------
    def _postprocess(self, plan: StepPlan, step: StepDraft | None, logits: torch.Tensor) -> None:
        plan.seq.usage.target_forward_passes += 1
        self._alone(plan.seq, "committing the step", self._settle, plan, step, logits)

    def _settle(self, plan: StepPlan, step: StepDraft | None, logits: torch.Tensor) -> None:
        seq = plan.seq
        seq.fed(len(plan.feed))
        if step is None:
            return
        seq.scored()
        verdict = self._verify(plan, step, logits)
        if verdict is None:
            return
        rejected = len(step.tokens) - verdict.accepted
        if rejected:  # forget the rejected draft tokens' KV (the accepted ones stay cached)
            self.executor.rollback(seq.seq_id, rejected)
        self._commit(seq, step.tokens[: verdict.accepted], verdict.token)
        if seq.finish is None:
            self._fast_forward(seq)
        self._check_done(seq)

    def _verify(self, plan: StepPlan, step: StepDraft, logits: torch.Tensor) -> Verdict | None:
        """The verdict on the draft (and the next token); None when the grammar allows nothing (the request ends)."""
        seq = plan.seq
        draft = step.tokens
        if not step.bitmask[0].numpy().any():
            self.executor.rollback(seq.seq_id, len(draft))
            self._grammar_failed(seq, "grammar allows no token here (dead end)")
            return None
        # [k+1, V]; this step's logits are ours. Rows whose allowed set was listed for the executor are masked
        # from that list (the same ids as the bitmask's), not by unpacking the whole bitmask.
        rows = apply_token_bitmask(logits, step.bitmask, inplace=True, allowed=step.allowed)
        q = step.draft.q if step.draft else None
        verdict = verify(rows, draft, q, seq.params, seq.seed, len(seq.output), step.tail)
        if verdict.accepted and not token_allowed(step.bitmask[verdict.accepted], verdict.token):
            # the accepted draft led into a dead end: its row is -inf everywhere, the verdict's token (its argmax,
            # id 0) no choice; on any other row the verdict's token is one the mask allows (O(1) to check)
            self.executor.rollback(seq.seq_id, len(draft))
            self._grammar_failed(seq, "grammar allows no token here (dead end)")
            return None
        self.drafter.verified(plan, step, verdict)
        return verdict

    def _commit(self, seq: EngineSequence, accepted: list[int], token: int) -> None:
        """Accepted draft tokens are already cached; the new token becomes pending (uncached)."""
        if token in self.eos:  # the end of turn: the grammar allowed it, and it is not text
            self._consume(seq, accepted)
            if seq.finish is None and seq.matcher.error:  # a broken matcher allows EOS alone: not an end
                self._grammar_failed(seq, "grammar error")
            if seq.finish is None:
                self._finish(seq, FinishReason.STOP)
            return
        self._consume(seq, accepted + [token])
        seq.uncached.append(token)

    def _consume(self, seq: EngineSequence, tokens: list[int]) -> None:
        if tokens and not seq.matcher.consume(tokens):
            self._grammar_failed(seq, "grammar rejected a committed token")
            return
        seq.output.extend(tokens)

    def _fast_forward(self, seq: EngineSequence) -> None:
        if not seq.fast_forward or seq.matcher.is_stopped():
            return
        forced = seq.matcher.forced_tokens()[: max(0, seq.remaining)]
        if forced:
            self._consume(seq, forced)
            seq.uncached.extend(forced)
            seq.usage.forced_tokens += len(forced)

    def _check_done(self, seq: EngineSequence) -> None:
        if seq.finish is not None:
            return
        if seq.matcher.error:
            self._grammar_failed(seq, "grammar error")
        elif seq.matcher.is_stopped() or (seq.stop and self._stop_string_seen(seq)):
            self._finish(seq, FinishReason.STOP)
        elif seq.remaining <= 0:
            self._finish(seq, FinishReason.LENGTH)
        else:
            self._emit(seq)

    def _stop_string_seen(self, seq: EngineSequence) -> bool:
        """A stop string in the output (the engine cuts the text there). The text is decoded once per commit
        already (``seq.text``); the search is linear in it."""
        return cut_at_stop(seq.output_text(), seq.stop)[1]

    # -- finishing -----------------------------------------------------------------------------------
    def _alone(self, seq: EngineSequence, stage: str, fn: Callable[..., None], *args: Any) -> bool:
        """``fn(*args)``, work on ``seq`` alone: an exception ends that request (never its batch). True if it ran."""
        try:
            fn(*args)
            return True
        except Exception as exc:  # noqa: BLE001 - a bug ends this request with ERROR, never a hang
            self._failed_alone(seq, stage, exc)
            return False

    def _failed_alone(self, seq: EngineSequence, stage: str, exc: Exception) -> None:
        log.error("%s failed for request %s", stage, seq.request_id, exc_info=exc)
        self._finish(seq, FinishReason.ERROR, f"internal error while {stage}: {type(exc).__name__}: {exc}")

    def _emit(self, seq: EngineSequence, final: bool = False) -> None:
        if seq.detok is not None and seq.deltas:
            text = seq.detok.delta(seq.output, final=final)
            if text:
                seq.on_event("delta", text)

    def _grammar_failed(self, seq: EngineSequence, what: str) -> None:
        """End with ERROR, telling a grammar engine's resource limit (the schema's) from a bug."""
        limit = seq.matcher.limit_exceeded
        if limit is not None:
            seq.grammar_limit = limit
            self._finish(seq, FinishReason.ERROR, f"the schema's grammar exceeded the grammar engine's limit "
                                                  f"{limit} while decoding: {seq.matcher.error}")
        else:
            self._finish(seq, FinishReason.ERROR, f"{what}: {seq.matcher.error}" if seq.matcher.error else what)

    def _finish(self, seq: EngineSequence, reason: FinishReason, error: str | None = None) -> None:
        if seq.status is SequenceStatus.FINISHED:
            return
        self.scheduler.remove(seq, retain=reason in (FinishReason.STOP, FinishReason.LENGTH))
        if reason is not FinishReason.CANCELLED:
            try:
                self._emit(seq, final=True)
            except Exception:  # noqa: BLE001 - the result still carries the whole text; the request must end
                log.exception("the last text delta of request %s failed", seq.request_id)
        seq.end(reason, error, time.monotonic())
        self.drafter.release(seq)
        stats = self.drafter.stats_of(seq)
        if stats is not None:
            decision = seq.decision
            stats.record_request(seq.schema_key, len(seq.output), seq.usage.target_forward_passes,
                                 seq.usage.forced_tokens, reason.value, seq.timings.total_ms,
                                 decision.arm if decision is not None else "", seq.timings.decode_ms,
                                 seq.decision_bucket)
            stats.record_traffic(seq.schema_key, seq.prompt, seq.output, reason.value)
        seq.on_event("done", None)


def _restricted(planned: list[Planned]) -> bool:
    """Whether a forward scored small allowed sets alone (``Drafter.allowed_ids``: every scored row of every plan
    had one, so the executor skipped its output layer), priced apart from one that ran it (``CostEvidence``)."""
    scored = [step for _, step in planned if step is not None]
    return bool(scored) and all(step.allowed is not None and all(a is not None for a in step.allowed)
                                for step in scored)


def run_until_idle(core: EngineCore, seqs: Iterable[EngineSequence]) -> None:
    """Submit and step synchronously until these sequences finish (tests, benchmarks, offline use)."""
    seqs = list(seqs)
    for seq in seqs:
        core.submit(seq)
    while any(s.finish is None for s in seqs):
        core.step()
