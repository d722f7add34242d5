"""The scheduler on a model-free executor: admission under the KV budget, prefix reuse, chunked prefill."""

from __future__ import annotations

import pytest

from structspec.engine.config import SchedulerLimits
from structspec.engine.core import EngineCore, run_until_idle
from structspec.engine.sequence import SequenceStatus
from structspec.engine.types import FinishReason, OverBudget, QueueFull
from tests.engine.fakes import EOS, TableExecutor, ToyTokenizer, free_slots, make_seq

CYCLE = {t: t % 15 + 1 for t in range(16)}  # 1 -> 2 -> ... -> 15 -> 1: greedy output is predictable


def drain(core: EngineCore, seqs) -> None:
    """Step until these (already submitted) sequences finish."""
    while any(s.finish is None for s in seqs):
        core.step()


def core_with(**limits) -> tuple[EngineCore, TableExecutor]:
    executor = TableExecutor(CYCLE)
    return EngineCore(executor, ToyTokenizer(), EOS, SchedulerLimits(**limits)), executor


def test_admission_waits_for_kv_budget_and_fifo_order():
    core, executor = core_with(kv_budget_tokens=2 * (4 + 6 + 8 + 1), max_draft=8)
    seqs = [make_seq([i, 2, 3, 4], free_slots(6), max_tokens=6) for i in (1, 2, 3)]
    for s in seqs:
        core.submit(s)
    core.step()
    sched = core.scheduler
    assert [s.status for s in seqs] == [SequenceStatus.DECODING, SequenceStatus.DECODING, SequenceStatus.WAITING]
    assert sched.reserved == 2 * 19 and list(sched.waiting) == [seqs[2]]
    drain(core, seqs)
    assert all(s.finish is FinishReason.STOP for s in seqs) and sched.reserved == 0
    assert seqs[2].admitted >= max(seqs[0].admitted, seqs[1].admitted)
    assert [s.output for s in seqs] == [[5, 6, 7, 8, 9, 10]] * 3  # the cycle after the prompt's last token 4


def test_max_batch_bounds_the_running_set():
    core, _ = core_with(max_batch=2)
    seqs = [make_seq([1, 2], free_slots(5)) for _ in range(5)]
    for s in seqs:
        core.submit(s)
    widths = []
    while any(s.finish is None for s in seqs):
        core.step()
        widths.append(len(core.scheduler.running))
    assert max(widths) == 2 and all(s.finish is FinishReason.STOP for s in seqs)


def test_submit_refuses_what_can_never_fit_and_a_full_queue():
    core, _ = core_with(kv_budget_tokens=40, max_queue=2, max_draft=8)
    with pytest.raises(OverBudget):
        core.submit(make_seq([1] * 10, free_slots(3), max_tokens=30))  # 10 + 30 + 9 > 40
    core.submit(make_seq([1], free_slots(2), max_tokens=2))
    core.submit(make_seq([1], free_slots(2), max_tokens=2))
    with pytest.raises(QueueFull):
        core.submit(make_seq([1], free_slots(2), max_tokens=2))


def test_chunked_prefill_shares_the_step_budget_after_decodes():
    core, executor = core_with(prefill_chunk=4, step_tokens=5, prefix_cache_tokens=0)
    short = make_seq([1], free_slots(8), max_tokens=8)
    core.submit(short)
    core.step()  # short's prompt; it decodes from now on
    long = make_seq(list(range(1, 11)), free_slots(2), max_tokens=2)
    core.submit(long)
    executor.steps.clear()
    while long.status is not SequenceStatus.DECODING:
        core.step()
    fed = [{inp.seq_id: len(inp.tokens) for inp in step} for step in executor.steps]
    # the decode always gets its token in first; the prompt gets at most what is left of 5, in chunks of <= 4
    assert [f[short.seq_id] for f in fed] == [1] * len(fed)
    assert [f[long.seq_id] for f in fed] == [4, 4, 2]
    assert long.prefilled == len(long.prompt) and long.first_decode is not None  # the last chunk scored
    drain(core, [short, long])
    assert long.output == [11, 12] and short.output == [2, 3, 4, 5, 6, 7, 8, 9]


def test_prefix_reuse_copies_a_finished_prompt_and_keeps_outputs():
    prompt_a = [t % 15 + 1 for t in range(20)]
    prompt_b = prompt_a[:18] + [9]
    core, executor = core_with(prefix_cache_tokens=64)
    a = make_seq(prompt_a, free_slots(3), max_tokens=3)
    run_until_idle(core, [a])
    assert len(core.scheduler.prefix) == 1  # a's prompt is retained
    executor.steps.clear()
    b = make_seq(prompt_b, free_slots(3), max_tokens=3)
    run_until_idle(core, [b])
    assert b.usage.cached_prompt_tokens == 18 and len(executor.steps[0][0].tokens) == 1  # only token 9 computed
    plain, _ = core_with(prefix_cache_tokens=0)
    ref = make_seq(prompt_b, free_slots(3), max_tokens=3)
    run_until_idle(plain, [ref])
    assert b.output == ref.output == [10, 11, 12]


def test_a_failed_prefix_copy_prefills_the_whole_prompt_and_fails_no_one():
    prompt_a = [t % 15 + 1 for t in range(20)]
    core, executor = core_with(prefix_cache_tokens=64)
    run_until_idle(core, [make_seq(prompt_a, free_slots(3), max_tokens=3)])

    def half_then_fail(seq_id: int, source_id: int, n: int) -> None:
        executor.cache[seq_id] = list(executor.cache[source_id][: n // 2])  # a copy broken off midway
        raise RuntimeError("copy failed")

    executor.copy_prefix = half_then_fail  # type: ignore[method-assign]
    b = make_seq(prompt_a[:18] + [9], free_slots(3), max_tokens=3)
    other = make_seq([3, 4, 5], free_slots(3), max_tokens=3)
    run_until_idle(core, [b, other])
    assert b.finish is FinishReason.STOP and b.usage.cached_prompt_tokens == 0 and b.output == [10, 11, 12]
    assert other.finish is FinishReason.STOP and other.output == [6, 7, 8]


def test_requests_arriving_together_wait_for_the_prefix_in_flight():
    core, executor = core_with(prefix_cache_tokens=64, prefill_chunk=8)
    prompt = [t % 15 + 1 for t in range(20)]
    first, second = make_seq(prompt, free_slots(2), max_tokens=2), make_seq(prompt + [3], free_slots(2), max_tokens=2)
    core.submit(first)
    core.submit(second)
    core.step()
    assert [i.seq_id for i in executor.steps[0]] == [first.seq_id]  # the second waits instead of recomputing
    drain(core, [first, second])
    assert second.usage.cached_prompt_tokens == 20 and first.usage.cached_prompt_tokens == 0
    assert second.output == [4, 5] and first.output == [6, 7]


def test_retained_prompts_are_evicted_before_anyone_waits():
    core, executor = core_with(prefix_cache_tokens=1000, kv_budget_tokens=30, max_draft=0)
    a = make_seq([1] * 16, free_slots(2), max_tokens=2)
    run_until_idle(core, [a])
    assert core.scheduler.prefix.tokens == 17  # its prompt and the output token that was fed (the last never is)
    b = make_seq([2] * 20, free_slots(2), max_tokens=2)  # 20 + 2 + 1 fits 30 only without a's 17
    run_until_idle(core, [b])
    assert b.finish is FinishReason.STOP and a.seq_id not in executor.cache


def test_a_failed_slot_allocation_ends_that_request_and_releases_nothing_else():
    core, executor = core_with()
    real = executor.new_sequence
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError("no room")
        return real()

    executor.new_sequence = flaky
    seqs = [make_seq([1, 2], free_slots(3)) for _ in range(3)]
    run_until_idle(core, seqs)
    assert [s.finish for s in seqs] == [FinishReason.STOP, FinishReason.ERROR, FinishReason.STOP]
    assert "no KV-cache slot" in seqs[1].error and core.scheduler.reserved == 0


def test_a_sequence_is_submitted_once():
    core, _ = core_with()
    seq = make_seq([1, 2], free_slots(3))
    core.submit(seq)
    with pytest.raises(ValueError, match="already submitted"):
        core.submit(seq)  # it would be queued twice and reserve its KV memory twice
    drain(core, [seq])
    assert seq.finish is FinishReason.STOP and core.scheduler.reserved == 0


class DenseExecutor(TableExecutor):
    """A fake with a dense cache's footprint: every live sequence at the longest one's length."""

    def footprint(self, sequences: int, longest: int) -> int:
        return sequences * longest


def test_the_kv_budget_bounds_the_dense_footprint_retained_prompts_first():
    # A dense cache holds every live sequence at the longest one's length. Reservations alone would admit the
    # long request and all five short ones (58 + 5 x 5 <= 200); the footprint admits two short ones beside it
    # (3 x 58 = 174), after evicting the retained prompts, and the rest wait for it to finish.
    executor = DenseExecutor(CYCLE)
    core = EngineCore(executor, ToyTokenizer(), EOS, SchedulerLimits(kv_budget_tokens=200, max_draft=0,
                                                                     prefix_cache_tokens=1000))
    for i in (3, 4):
        run_until_idle(core, [make_seq([i] * 16, free_slots(2), max_tokens=2)])
    sched = core.scheduler
    assert len(sched.prefix) == 2
    long = make_seq([1] * 40, free_slots(17), max_tokens=17)  # 40 + 17 + 1
    short = [make_seq([i, 2], free_slots(2), max_tokens=2) for i in range(5, 10)]
    for s in [long, *short]:
        core.submit(s)
    core.step()
    assert len(sched.running) == 3 and len(sched.prefix) == 0 and sched.reserved == 58 + 2 * 5
    drain(core, [long, *short])
    assert all(s.finish is FinishReason.STOP for s in [long, *short])
    # Without the footprint (a cache that holds only what is reserved) all six run at once.
    plain, _ = core_with(kv_budget_tokens=200, max_draft=0)
    seqs = [make_seq([1] * 40, free_slots(17), max_tokens=17),
            *[make_seq([i, 2], free_slots(2), max_tokens=2) for i in range(5, 10)]]
    for s in seqs:
        plain.submit(s)
    plain.step()
    assert len(plain.scheduler.running) == 6
