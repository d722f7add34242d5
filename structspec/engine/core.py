"""The decode loop: continuous batching of grammar-constrained (and speculative) steps.

``EngineCore`` is synchronous and single-threaded: the async ``Engine`` runs
``step()`` on a dedicated thread and talks to it through ``submit``/``abort``,
which only touch a locked inbox. One step:

  1. take in new requests and aborts; cancel expired deadlines;
  2. admit waiting requests while the batch and the KV budget allow (a request
     reserves prompt + max_tokens up front, so running ones are never starved
     of cache memory);
  3. plan each running sequence's feed: its uncached committed tokens (a prompt
     chunk while prefilling; else the pending token and the forced tokens after
     it) plus, when a proposer drafts, the draft; fill the grammar mask for every
     scored position (consume the draft, then roll it back);
  4. one target forward over the whole batch;
  5. per sequence: verify (k = 0 is plain decoding), roll the KV cache back over
     rejected draft tokens, commit accepted + recovered/bonus tokens, then
     fast-forward the tokens the grammar forces; finish on stop / length.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence as Seq

import torch

from structspec.engine.detok import IncrementalDetokenizer
from structspec.engine.prefix_cache import PrefixCache
from structspec.engine.sequence import Sequence
from structspec.engine.types import FinishReason, OverBudget, QueueFull
from structspec.engine.verify import verify
from structspec.grammar.base import allocate_bitmask, apply_token_bitmask, small_allowed_set
from structspec.models.executor import ForwardStep, StepInput
from structspec.spec.base import Draft
from structspec.store.base import batch_bucket

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CoreLimits:
    max_batch: int = 16  # sequences decoded together
    max_queue: int = 64  # waiting requests; one more is refused (backpressure, not an unbounded wait)
    kv_budget_tokens: int = 65536  # KV-cache tokens all running sequences may reserve
    prefill_chunk: int = 256  # prompt tokens one sequence feeds per step
    step_tokens: int = 512  # tokens one forward may carry in all (decodes first, prefill fills the rest)
    max_draft: int = 8  # drafted tokens per sequence per step (KV headroom reserved for them)
    max_spec_batch: int = 8  # no drafting while more sequences than this run (verification stops paying)
    prefix_cache_tokens: int = 8192  # prompt KV kept after requests finish, for reuse (0: no prefix caching)


class AcceptanceSink(Protocol):
    """Where per-step acceptance counts go (the store's buffered, non-blocking recorder)."""

    def record_acceptance(self, schema_key: str, proposer: str, batch_bucket: int, drafted: int, accepted: int,
                          ts: float) -> None: ...


class Speculator(Protocol):
    """Proposes drafts for a sequence; told what was committed so it can keep its own state."""

    def propose(self, seq: Sequence, max_tokens: int) -> Draft | None: ...

    def on_commit(self, seq: Sequence, tokens: list[int]) -> None: ...

    def on_finish(self, seq: Sequence) -> None: ...


@dataclass
class _Plan:
    seq: Sequence
    feed: list[int]  # uncached tokens sent this step (excluding the draft)
    draft: Draft | None = None
    drafted: int = 0  # proposer tokens before the grammatical trim (stats)
    bitmask: torch.Tensor | None = None  # [k+1, W] when logits are wanted

    @property
    def scores(self) -> bool:
        return self.bitmask is not None


@dataclass
class _Inbox:
    lock: threading.Lock = field(default_factory=threading.Lock)
    new: list[Sequence] = field(default_factory=list)
    aborts: set[str] = field(default_factory=set)


class EngineCore:
    def __init__(self, executor: ForwardStep, tokenizer, eos_token_id: int, limits: CoreLimits = CoreLimits(),
                 speculator: Speculator | None = None, stats: AcceptanceSink | None = None):
        self.executor = executor
        self.tokenizer = tokenizer
        self.eos = eos_token_id
        self.limits = limits
        self.speculator = speculator
        self.stats = stats
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.reserved = 0
        self.prefix = PrefixCache(limits.prefix_cache_tokens) if limits.prefix_cache_tokens > 0 else None
        self._inbox = _Inbox()
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self.wakeup = threading.Event()

    # -- called from any thread ------------------------------------------------------------------
    def kv_need(self, prompt_len: int, max_tokens: int) -> int:
        return prompt_len + max_tokens + self.limits.max_draft + 1

    def submit(self, seq: Sequence) -> None:
        need = self.kv_need(len(seq.prompt), seq.params.max_tokens)
        if need > self.limits.kv_budget_tokens:
            raise OverBudget(f"request needs {need} KV-cache tokens; the server's budget is "
                             f"{self.limits.kv_budget_tokens}", field="max_tokens")
        with self._inbox.lock:
            if len(self.waiting) + len(self._inbox.new) >= self.limits.max_queue:
                raise QueueFull(f"queue full ({self.limits.max_queue} requests waiting); retry later")
            self._inbox.new.append(seq)
        self.wakeup.set()

    def abort(self, key: str) -> None:
        """Cancel the sequence whose ``Sequence.key`` is ``key`` (request ids are not unique)."""
        with self._inbox.lock:
            self._inbox.aborts.add(key)
        self.wakeup.set()

    def queue_depth(self) -> int:
        return len(self.waiting) + len(self._inbox.new)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._inbox.new or self._inbox.aborts)

    # -- the engine thread ------------------------------------------------------------------------
    def step(self) -> None:
        self._take_inbox()
        self._expire(time.monotonic())
        self._admit()
        if not self.running:
            return
        plans = self._plan()
        try:
            outs = self.executor.step([self._step_input(p) for p in plans])
        except Exception as exc:  # noqa: BLE001 - a model failure ends this batch's requests, not the engine
            log.exception("forward pass failed for requests %s", [p.seq.request_id for p in plans])
            for p in plans:
                self._finish(p.seq, FinishReason.ERROR, f"model failure: {type(exc).__name__}: {exc}")
            return
        with torch.inference_mode():  # the step's logits are inference tensors, masked in place
            for plan, logits in zip(plans, outs):
                plan.seq.usage.target_forward_passes += 1
                try:
                    self.executor_rollback_and_commit(plan, logits)
                except Exception as exc:  # noqa: BLE001 - a bug ends this request with ERROR, never a hang
                    log.exception("committing the step failed for request %s", plan.seq.request_id)
                    self._finish(plan.seq, FinishReason.ERROR, f"internal error: {type(exc).__name__}: {exc}")

    def fail_running(self, error: str) -> None:
        """End every running request with ERROR (after an unexpected failure of a whole step)."""
        for seq in list(self.running):
            self._finish(seq, FinishReason.ERROR, error)

    def _take_inbox(self) -> None:
        with self._inbox.lock:
            new, aborts = self._inbox.new, self._inbox.aborts
            self._inbox.new, self._inbox.aborts = [], set()
        self.waiting.extend(new)
        if aborts:
            for seq in [s for s in (*self.running, *self.waiting) if s.key in aborts]:
                self._finish(seq, FinishReason.CANCELLED, "cancelled by the caller")

    def _expire(self, now: float) -> None:
        for seq in [s for s in (*self.running, *self.waiting) if s.deadline is not None and now >= s.deadline]:
            self._finish(seq, FinishReason.CANCELLED, "deadline exceeded")

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.limits.max_batch:
            seq = self.waiting[0]
            need = self.kv_need(len(seq.prompt), seq.params.max_tokens)
            while (self.prefix is not None and len(self.prefix)
                   and self.reserved + need + self.prefix.tokens > self.limits.kv_budget_tokens):
                self.executor.free(self.prefix.evict())  # retained prompts are a cache: they never make anyone wait
            if self.reserved + need > self.limits.kv_budget_tokens:
                break  # FIFO: the head waits for memory rather than being overtaken forever
            try:  # allocating a slot may grow the cache (out of memory): that request fails, nothing leaks
                seq_id = self.executor.new_sequence()
            except Exception as exc:  # noqa: BLE001
                log.exception("no KV-cache slot for request %s", seq.request_id)
                self._finish(seq, FinishReason.ERROR, f"model failure: no KV-cache slot: {type(exc).__name__}: {exc}")
                break  # the running requests may free memory before the next one tries
            self.waiting.popleft()
            seq.reserved = need
            self.reserved += need
            seq.seq_id = seq_id
            seq.admitted = time.monotonic()
            seq.timings.queued_ms = (seq.admitted - seq.created) * 1000
            seq.uncached = list(seq.prompt)
            seq.usage.prompt_tokens = len(seq.prompt)
            self._detok[seq.key] = IncrementalDetokenizer(self.tokenizer)
            self.running.append(seq)
            self._fast_forward(seq)  # the opening forced tokens ride along with the prompt
            self._check_done(seq)

    def _plan(self) -> list[_Plan]:
        budget = self.limits.step_tokens
        plans = []
        # Decoding sequences first (a few tokens each), then prompt chunks in admission order.
        for seq in sorted(self.running, key=lambda s: (s.prefilling, s.admitted)):
            if seq.prefilling and not seq.prefix_checked and not self._reuse_prefix(seq):
                continue  # its prefix is being prefilled by another sequence this very moment: copy it when done
            if seq.prefilling:  # prompt chunks share what the decodes left of the step's budget
                n = min(len(seq.uncached), self.limits.prefill_chunk, budget)
            else:  # a decoding sequence always gets its pending (+ forced) tokens in
                n = min(len(seq.uncached), self.limits.prefill_chunk)
            if n <= 0:
                continue
            budget -= n
            plan = _Plan(seq, seq.uncached[:n])
            if n == len(seq.uncached):  # this feed completes the committed text: score the next position(s)
                self._attach_draft_and_masks(plan)
            plans.append(plan)
        return plans

    def _reuse_prefix(self, seq: Sequence) -> bool:
        """Copy the longest cached prefix of ``seq``'s prompt; False while it should wait for one in flight."""
        if self.prefix is None:
            seq.prefix_checked = True
            return True
        sources = [(s.seq_id, s.prompt, s.prefilled) for s in self.running if s is not seq and s.prefix_checked]
        hit = self.prefix.lookup(seq.prompt, sources)
        if hit is not None and hit.ready < hit.tokens:
            return False  # a running sequence is prefilling this prefix; computing it twice would waste the step
        seq.prefix_checked = True
        if hit is not None:
            self.executor.copy_prefix(seq.seq_id, hit.source_id, hit.tokens)
            seq.uncached = seq.uncached[hit.tokens:]
            seq.prefilled = hit.tokens
            seq.usage.cached_prompt_tokens = hit.tokens
        return True

    def _release(self, seq: Sequence, retain: bool) -> None:
        """Free a finished sequence's cache, or keep its prompt for prefix reuse."""
        if self.prefix is None or not retain or seq.prefilling:
            self.executor.free(seq.seq_id)
            return
        self.executor.rollback(seq.seq_id, self.executor.seq_len(seq.seq_id) - len(seq.prompt))
        for sid in self.prefix.retain(seq.seq_id, seq.prompt):
            self.executor.free(sid)

    def _attach_draft_and_masks(self, plan: _Plan) -> None:
        seq, matcher = plan.seq, plan.seq.matcher
        draft, k = None, min(self.limits.max_draft, seq.remaining - 1)  # k drafted + 1 new token fit max_tokens
        if (self.speculator is not None and seq.speculate and seq.remaining > 1
                and len(self.running) <= self.limits.max_spec_batch):
            draft = self.speculator.propose(seq, k)
        tokens = list(draft.tokens)[:k] if draft else []  # a proposer that drafts more than asked is cut
        plan.drafted = len(tokens)
        vocab = self.executor.vocab_size
        bitmask = allocate_bitmask(len(tokens) + 1, vocab)
        matcher.fill_mask(bitmask, 0)
        consumed = 0
        for i, tok in enumerate(tokens):
            # The mask at i comes from the state after x_0..x_{i-1}; an ungrammatical x_i ends the draft there.
            if tok == self.eos or not _allowed(bitmask[i], tok) or not matcher.consume([tok]):
                break
            consumed += 1
            matcher.fill_mask(bitmask, i + 1)  # once the grammar is complete this row allows only EOS
            if matcher.is_stopped():
                break  # no draft continues past grammar termination
        matcher.rollback(consumed)
        if draft is not None and consumed < len(draft.tokens):
            draft = Draft(draft.tokens[:consumed], draft.q[:consumed] if draft.q is not None else None, draft.proposer)
        plan.draft = draft
        plan.bitmask = bitmask[: consumed + 1]

    def _step_input(self, plan: _Plan) -> StepInput:
        draft = plan.draft.tokens if plan.draft else []
        tokens = plan.feed + draft
        if not plan.scores:
            return StepInput(plan.seq.seq_id, tokens, logits_at=())
        first = len(plan.feed) - 1
        allowed = None
        limit = self.executor.restricted_logits_max
        if limit:  # let the executor score a small allowed set alone (the rest would be masked out anyway)
            allowed = tuple(small_allowed_set(row, limit) for row in plan.bitmask)
        return StepInput(plan.seq.seq_id, tokens, logits_at=tuple(range(first, first + len(draft) + 1)),
                         allowed=allowed)

    def executor_rollback_and_commit(self, plan: _Plan, logits: torch.Tensor) -> None:
        seq = plan.seq
        seq.uncached = seq.uncached[len(plan.feed):]
        if seq.prefilling:
            seq.prefilled = min(len(seq.prompt), seq.prefilled + len(plan.feed))
        if not plan.scores:
            return
        seq.prefilled = len(seq.prompt)
        if seq.first_decode is None:
            seq.first_decode = time.monotonic()
            seq.timings.prefill_ms = (seq.first_decode - (seq.admitted or seq.created)) * 1000
        draft = plan.draft.tokens if plan.draft else []
        if not bool(plan.bitmask[0].any()):
            self.executor.rollback(seq.seq_id, len(draft))
            self._grammar_failed(seq, "grammar allows no token here (dead end)")
            return
        rows = apply_token_bitmask(logits, plan.bitmask, inplace=True)  # [k+1, V]; this step's logits are ours
        q = plan.draft.q if plan.draft else None
        verdict = verify(rows, draft, q, seq.params, seq.seed, len(seq.output))
        if plan.draft is not None:
            seq.add_usage(plan.draft.proposer, plan.drafted, verdict.accepted)
            if self.stats is not None:
                self.stats.record_acceptance(seq.schema_key, plan.draft.proposer, batch_bucket(len(self.running)),
                                             plan.drafted, verdict.accepted, time.time())
        rejected = len(draft) - verdict.accepted
        if rejected:
            self.executor.rollback(seq.seq_id, rejected)
        self._commit(seq, draft[: verdict.accepted], verdict.token)
        if seq.finish is None:
            self._fast_forward(seq)
        self._check_done(seq)

    def _commit(self, seq: Sequence, accepted: list[int], token: int) -> None:
        """Accepted draft tokens are already cached; the new token becomes pending (uncached)."""
        if token == self.eos:
            self._consume(seq, accepted)
            if seq.finish is None and seq.matcher.error:  # a broken matcher allows EOS alone: not an end
                self._grammar_failed(seq, "grammar error")
            if seq.finish is None:
                self._finish(seq, FinishReason.STOP)
            return
        self._consume(seq, accepted + [token])
        seq.uncached.append(token)

    def _consume(self, seq: Sequence, tokens: list[int]) -> None:
        if not tokens:
            return
        if not seq.matcher.consume(tokens):
            self._grammar_failed(seq, "grammar rejected a committed token")
            return
        seq.output.extend(tokens)
        if self.speculator is not None:
            self.speculator.on_commit(seq, tokens)

    def _fast_forward(self, seq: Sequence) -> None:
        if not seq.fast_forward or seq.matcher.is_stopped():
            return
        forced = seq.matcher.forced_tokens()[: max(0, seq.remaining)]
        if forced:
            self._consume(seq, forced)
            seq.uncached.extend(forced)
            seq.usage.forced_tokens += len(forced)

    def _check_done(self, seq: Sequence) -> None:
        if seq.finish is not None:
            return
        if seq.matcher.error:
            self._grammar_failed(seq, "grammar error")
        elif seq.matcher.is_stopped():
            self._finish(seq, FinishReason.STOP)
        elif seq.remaining <= 0:
            self._finish(seq, FinishReason.LENGTH)
        else:
            self._emit(seq)

    def _emit(self, seq: Sequence, final: bool = False) -> None:
        detok = self._detok.get(seq.key)
        if detok is not None:
            text = detok.delta(seq.output, final=final)
            if text:
                seq.on_event("delta", text)

    def _grammar_failed(self, seq: Sequence, what: str) -> None:
        """End with ERROR, telling a grammar engine's resource limit (the schema's) from a bug."""
        limit = seq.matcher.limit_exceeded
        if limit is not None:
            seq.grammar_limit = limit
            self._finish(seq, FinishReason.ERROR, f"the schema's grammar exceeded the grammar engine's limit "
                                                  f"{limit} while decoding: {seq.matcher.error}")
        else:
            self._finish(seq, FinishReason.ERROR, f"{what}: {seq.matcher.error}" if seq.matcher.error else what)

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        if seq.finish is not None:
            return
        seq.finish, seq.error = reason, error
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq, retain=reason in (FinishReason.STOP, FinishReason.LENGTH))
            self.reserved -= seq.reserved
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if reason is not FinishReason.CANCELLED:
            self._emit(seq, final=True)
        self._detok.pop(seq.key, None)
        if self.speculator is not None:
            self.speculator.on_finish(seq)
        seq.usage.output_tokens = len(seq.output)
        seq.timings.total_ms = (time.monotonic() - seq.created) * 1000
        if seq.first_decode is not None:
            seq.timings.decode_ms = (time.monotonic() - seq.first_decode) * 1000
        seq.on_event("done", None)


def _allowed(bitmask_row: torch.Tensor, token: int) -> bool:
    word = int(bitmask_row[token // 32]) if token // 32 < bitmask_row.shape[0] else 0
    return bool((word >> (token % 32)) & 1)


def run_until_idle(core: EngineCore, seqs: Seq[Sequence]) -> None:
    """Submit and step synchronously until these sequences finish (tests, benchmarks, offline use)."""
    for seq in seqs:
        core.submit(seq)
    while any(s.finish is None for s in seqs):
        core.step()
