"""Who runs this step, and what each sequence feeds: admission, the KV budget, prefix reuse, the step plan.

Admission is FIFO under two limits: ``max_batch`` running sequences and a KV budget
(``kv_budget_tokens``) from which each admitted request reserves prompt + max_tokens +
draft headroom up front, so a running request is never starved of cache memory. The same
budget bounds the cache's real footprint (``ForwardStep.footprint``: a dense cache holds
every live sequence, retained ones included, at the longest one's length), so memory
is bounded by configuration: about ``kv_budget_tokens`` x bytes per token, or one request
alone if it needs more. Retained sequences (the prefix cache: a finished request's prompt and
output, as far as they are cached) are evicted before anyone waits for memory.

The plan: decoding sequences first (their pending token and the forced tokens after it,
always in full), then prompt chunks (``prefill_chunk`` each) in admission order within what
is left of ``step_tokens``. A plan whose feed completes the committed text *scores*: the
forward returns logits for the next position(s), and it may carry a draft of up to
``max_draft`` tokens (and no more than its drafting decision allows, ``EngineSequence.draft_cap``)
while no more than ``max_spec_batch`` sequences run.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

from structspec.engine.config import SchedulerLimits
from structspec.engine.detok import OutputText
from structspec.engine.prefix_cache import PrefixCache
from structspec.engine.sequence import EngineSequence, SequenceStatus
from structspec.models.executor import ForwardStep

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepPlan:
    """What one sequence feeds this step (its draft and masks are the ``Drafter``'s, ``StepDraft``)."""

    seq: EngineSequence
    feed: list[int]  # uncached committed tokens sent this step (excluding the draft)
    scores: bool  # the feed completes the committed text: logits for the next position(s) are wanted
    max_draft: int = 0  # drafted tokens this plan may carry (0: no drafting this step)
    batch_size: int = 0  # sequences running when the step was planned


class Scheduler:
    """Owns the waiting queue, the running batch and their KV memory (slots, reservations, the prefix cache)."""

    def __init__(self, executor: ForwardStep, limits: SchedulerLimits):
        self.executor = executor  # for KV slots only: allocate, copy a prefix, roll back, free
        self.limits = limits
        self.waiting: deque[EngineSequence] = deque()
        self.running: list[EngineSequence] = []
        self.reserved = 0  # KV tokens reserved by running sequences
        self.prefix = PrefixCache(limits.prefix_cache_tokens) if limits.prefix_cache_tokens > 0 else None
        self._prefix_unchecked: set[str] = set()  # admitted sequences that have not looked for a cached prefix

    def kv_need(self, prompt_len: int, max_tokens: int) -> int:
        return prompt_len + max_tokens + self.limits.max_draft + 1

    def sequences(self) -> Iterator[EngineSequence]:
        """Running then waiting (a snapshot: safe to finish sequences while iterating)."""
        return iter([*self.running, *self.waiting])

    def enqueue(self, seqs: list[EngineSequence]) -> None:
        self.waiting.extend(seqs)

    # -- admission -------------------------------------------------------------------------------
    def admit(self, make_text: Callable[[], OutputText]
              ) -> tuple[list[EngineSequence], list[tuple[EngineSequence, str]]]:
        """Admit waiting sequences in order while the batch and the KV budget allow.

        Returns (admitted, failed): a failed one could not get a KV slot (its error says why) and is
        no longer waiting; the caller finishes it. Admission stops at the first failure (the running
        requests may free memory before the next one tries).
        """
        admitted: list[EngineSequence] = []
        while self.waiting and len(self.running) < self.limits.max_batch:
            seq = self.waiting[0]
            need = self.kv_need(len(seq.prompt), seq.params.max_tokens)
            while (self.prefix is not None and len(self.prefix)
                   and (self.reserved + need + self.prefix.tokens > self.limits.kv_budget_tokens
                        or self._footprint(need) > self.limits.kv_budget_tokens)):
                self.executor.free(self.prefix.evict())  # retained prompts are a cache: they never make anyone wait
            if self.reserved + need > self.limits.kv_budget_tokens or (
                    self.running and self._footprint(need) > self.limits.kv_budget_tokens):
                break  # FIFO: the head waits for memory rather than being overtaken forever
            try:  # allocating a slot may grow the cache (out of memory): that request fails, nothing leaks
                seq_id = self.executor.new_sequence()
            except Exception as exc:  # noqa: BLE001
                log.exception("no KV-cache slot for request %s", seq.request_id)
                self.waiting.popleft()
                return admitted, [(seq, f"model failure: no KV-cache slot: {type(exc).__name__}: {exc}")]
            self.waiting.popleft()
            self.reserved += need
            seq.admit(seq_id, need, make_text(), time.monotonic())
            self.running.append(seq)
            self._prefix_unchecked.add(seq.key)
            admitted.append(seq)
        return admitted, []

    def _footprint(self, need: int) -> int:
        """The cache's footprint with one more sequence of ``need`` tokens beside the running and retained ones."""
        live = len(self.running) + (len(self.prefix) if self.prefix is not None else 0) + 1
        longest = max([need, *(s.reserved for s in self.running),
                       self.prefix.longest() if self.prefix is not None else 0])
        return self.executor.footprint(live, longest)

    # -- the step plan ---------------------------------------------------------------------------
    def schedule(self) -> list[StepPlan]:
        budget = self.limits.step_tokens
        batch = len(self.running)
        max_draft = self.limits.max_draft if batch <= self.limits.max_spec_batch else 0
        plans = []
        # Decoding sequences first (a few tokens each), then prompt chunks in admission order.
        for seq in sorted(self.running, key=lambda s: (s.status is SequenceStatus.PREFILLING, s.admitted)):
            if seq.key in self._prefix_unchecked and not self._reuse_prefix(seq):
                continue  # its prefix is being prefilled by another sequence this very moment: copy it when done
            if seq.status is SequenceStatus.PREFILLING:  # prompt chunks share what the decodes left of the budget
                n = min(len(seq.uncached), self.limits.prefill_chunk, budget)
            else:  # a decoding sequence always gets its pending (+ forced) tokens in
                n = min(len(seq.uncached), self.limits.prefill_chunk)
            if n <= 0:
                continue
            budget -= n
            scores = n == len(seq.uncached)
            # k drafted + 1 new token must fit max_tokens
            k = min(max_draft, seq.draft_cap, seq.remaining - 1) if scores else 0
            plans.append(StepPlan(seq, seq.uncached[:n], scores, max(0, k), batch))
        return plans

    def _reuse_prefix(self, seq: EngineSequence) -> bool:
        """Copy the longest cached prefix of ``seq``'s prompt; False while it should wait for one in flight."""
        if self.prefix is None:
            self._prefix_unchecked.discard(seq.key)
            return True
        sources = [(s.seq_id, s.prompt, s.prefilled, s.prompt_owner) for s in self.running
                   if s is not seq and s.key not in self._prefix_unchecked]
        hit = self.prefix.lookup(seq.prompt, sources, seq.tenant)
        if hit is not None and hit.ready < hit.tokens:
            return False  # a running sequence is prefilling this prefix; computing it twice would waste the step
        self._prefix_unchecked.discard(seq.key)
        if hit is not None and self._copy_prefix(seq, hit.source_id, hit.tokens):
            seq.reuse_prefix(hit.tokens)
        return True

    def _copy_prefix(self, seq: EngineSequence, source_id: int, tokens: int) -> bool:
        """Copy a cached prefix into ``seq``'s empty slot; False (logged) when the copy fails: the reuse is an
        optimisation, so ``seq`` then prefills its whole prompt like a miss and its batch never sees the failure.
        Raises the clearing's exception only when the slot cannot even be emptied again."""
        try:
            self.executor.copy_prefix(seq.seq_id, source_id, tokens)
            return True
        except Exception:  # noqa: BLE001 - one request's cache copy must not fail the step of every request
            log.warning("prefix copy failed for request %s: prefilling its whole prompt", seq.request_id,
                        exc_info=True)
            self.executor.rollback(seq.seq_id, self.executor.seq_len(seq.seq_id))  # whatever part was copied
            return False

    # -- leaving -----------------------------------------------------------------------------------
    def remove(self, seq: EngineSequence, retain: bool) -> None:
        """Take ``seq`` out of the queue or the batch; free its cache, or keep what it committed for prefix reuse."""
        if seq.running:
            self.running.remove(seq)
            self._prefix_unchecked.discard(seq.key)
            self.reserved -= seq.reserved
            self._release(seq, retain)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _release(self, seq: EngineSequence, retain: bool) -> None:
        """Retain the committed tokens whose KV is cached (``EngineSequence.cached_committed``: the prompt and the
        output but its pending tail), so a conversation's next turn, which repeats them, reuses all of them."""
        if self.prefix is None or not retain or seq.status is SequenceStatus.PREFILLING:
            self.executor.free(seq.seq_id)
            return
        kept, cached = seq.cached_committed(), self.executor.seq_len(seq.seq_id)
        if cached < len(kept):  # the cache lacks committed tokens: retaining would claim KV it does not hold
            log.warning("request %s holds %d cached tokens, not its %d committed ones: its cache is freed",
                        seq.request_id, cached, len(kept))
            self.executor.free(seq.seq_id)
            return
        self.executor.rollback(seq.seq_id, cached - len(kept))
        for sid in self.prefix.retain(seq.seq_id, kept, seq.prompt_owner):
            self.executor.free(sid)
