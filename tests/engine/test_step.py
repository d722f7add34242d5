"""The step on a model-free executor: draft -> forward -> verify -> roll back -> commit -> fast-forward -> finish."""

from __future__ import annotations

import time

from structspec.engine.config import SchedulerLimits
from structspec.engine.core import EngineCore, run_until_idle
from structspec.engine.sequence import SequenceStatus
from structspec.engine.speculator import Draft, DraftVerdict
from structspec.engine.types import FinishReason
from tests.engine.fakes import AlwaysDrafts, EOS, TableExecutor, ToyTokenizer, free_slots, make_seq

CYCLE = {t: t % 15 + 1 for t in range(16)}


class ScriptedSpeculator(AlwaysDrafts):
    """Drafts ``script(seq)`` tokens; records every verdict and finish it is told."""

    def __init__(self, script):
        self.script = script
        self.verdicts: list[DraftVerdict] = []
        self.finished: list[str] = []

    def propose(self, seq, max_tokens):
        tokens = self.script(seq)
        return Draft(tokens, None, "scripted") if tokens else None

    def on_verified(self, seq, verdict):
        self.verdicts.append(verdict)

    def on_finish(self, seq):
        self.finished.append(seq.key)


def run(seqs, speculator=None, executor=None, **limits):
    executor = executor or TableExecutor(CYCLE)
    core = EngineCore(executor, ToyTokenizer(), EOS, SchedulerLimits(**limits), speculator)
    run_until_idle(core, seqs)
    return core, executor


def cached_matches_committed(executor, seq):
    """Everything committed but the pending tokens is in the cache, and nothing else."""
    committed = seq.prompt + seq.output
    return executor.cache[seq.seq_id] == committed[: len(committed) - len(seq.uncached)]


def test_rejected_draft_is_rolled_back_and_the_output_is_plain_greedy():
    plain = make_seq([1, 2], free_slots(8), max_tokens=8)
    run([plain])
    # Draft the right next token, then a wrong one, then more: one accepted, one recovered, the rest gone.
    spec = ScriptedSpeculator(lambda seq: [(seq.prompt + seq.output)[-1] % 15 + 1, 9, 9])
    seq = make_seq([1, 2], free_slots(8), max_tokens=8)
    executor = TableExecutor(CYCLE)
    core = EngineCore(executor, ToyTokenizer(), EOS, SchedulerLimits(prefix_cache_tokens=0), spec)
    core.submit(seq)
    while seq.finish is None:
        core.step()
        if seq.finish is None:
            assert cached_matches_committed(executor, seq)
    assert seq.output == plain.output == [3, 4, 5, 6, 7, 8, 9, 10]
    assert {(v.drafted, v.accepted) for v in spec.verdicts} <= {(3, 1), (2, 1), (1, 1), (3, 2)}
    assert all(v.proposer == "scripted" and v.batch_size == 1 for v in spec.verdicts)
    assert seq.usage.accepted["scripted"] == sum(v.accepted for v in spec.verdicts)
    assert seq.usage.target_forward_passes < plain.usage.target_forward_passes
    assert spec.finished == [seq.key]


def test_a_draft_is_cut_at_its_first_ungrammatical_token_and_at_max_tokens():
    slots = [frozenset({3, 4})] + free_slots(5)
    spec = ScriptedSpeculator(lambda seq: [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] if not seq.output else [])
    seq = make_seq([1, 2], slots, max_tokens=4)
    run([seq], spec, prefix_cache_tokens=0)
    first = spec.verdicts[0]
    assert first.drafted == 3  # max_tokens 4: at most 3 drafted + the new token
    assert seq.output == [3, 4, 5, 6] and seq.finish is FinishReason.LENGTH
    bad = ScriptedSpeculator(lambda seq: [5, 6] if not seq.output else [])  # 5 is not allowed at position 0
    seq2 = make_seq([1, 2], slots, max_tokens=4)
    run([seq2], bad, prefix_cache_tokens=0)
    assert bad.verdicts[0].drafted == 2 and bad.verdicts[0].accepted == 0 and seq2.output == [3, 4, 5, 6]


def test_forced_tokens_are_committed_without_a_decision_and_fed_next_step():
    slots = free_slots(1) + [frozenset({7}), frozenset({8})] + free_slots(2)
    seq = make_seq([1, 2], slots)
    _, executor = run([seq], prefix_cache_tokens=0)
    assert seq.output == [3, 7, 8, 9, 10] and seq.usage.forced_tokens == 2
    # step 2 feeds the pending 3 plus the forced 7, 8 in one forward and scores once
    assert [list(i.tokens) for i in executor.steps[1]] == [[3, 7, 8]]
    assert seq.usage.target_forward_passes == 3 and seq.finish is FinishReason.STOP
    off = make_seq([1, 2], slots, fast_forward=False)
    run([off], prefix_cache_tokens=0)
    assert off.output == seq.output and off.usage.forced_tokens == 0 and off.usage.target_forward_passes == 5


def test_opening_forced_tokens_ride_with_the_prompt():
    seq = make_seq([1, 2], [frozenset({5}), frozenset({6})] + free_slots(1))
    _, executor = run([seq], prefix_cache_tokens=0)
    assert list(executor.steps[0][0].tokens) == [1, 2, 5, 6] and seq.output == [5, 6, 7]


def test_statuses_and_bookkeeping_through_a_request():
    events = []
    seq = make_seq([1, 2], free_slots(2), events=events)
    executor = TableExecutor(CYCLE)
    core = EngineCore(executor, ToyTokenizer(), EOS, SchedulerLimits(prefix_cache_tokens=0))
    assert seq.status is SequenceStatus.WAITING
    core.submit(seq)
    seen = []
    while seq.finish is None:
        core.step()
        seen.append(seq.status)
    assert seen == [SequenceStatus.DECODING, SequenceStatus.FINISHED]
    assert seq.usage.prompt_tokens == 2 and seq.usage.output_tokens == 2 and seq.timings.total_ms > 0
    assert events == [("delta", "c"), ("delta", "d"), ("done", None)]
    assert seq.detok is None and seq.seq_id not in executor.cache


def test_every_finish_reason():
    stop = make_seq([1], free_slots(2))
    length = make_seq([2], free_slots(5), max_tokens=3)
    run([stop, length])
    assert (stop.finish, stop.output) == (FinishReason.STOP, [2, 3])
    assert (length.finish, length.output) == (FinishReason.LENGTH, [3, 4, 5])

    dead = make_seq([1], [frozenset()])  # nothing allowed: a dead end is an error, never a hang
    run([dead])
    assert dead.finish is FinishReason.ERROR and "dead end" in dead.error

    core = EngineCore(TableExecutor(CYCLE), ToyTokenizer(), EOS, SchedulerLimits())
    gone, late = make_seq([1], free_slots(50)), make_seq([2], free_slots(50), deadline=time.monotonic() - 1)
    core.submit(gone)
    core.submit(late)
    core.step()
    core.abort(gone.key)
    core.step()
    assert (gone.finish, gone.error) == (FinishReason.CANCELLED, "cancelled by the caller")
    assert (late.finish, late.error) == (FinishReason.CANCELLED, "deadline exceeded")
    assert not core.scheduler.running and core.scheduler.reserved == 0


def test_a_model_failure_ends_that_batch_not_the_engine():
    executor = TableExecutor(CYCLE)
    real = executor.step
    executor.step = lambda inputs: (_ for _ in ()).throw(RuntimeError("out of memory"))
    core = EngineCore(executor, ToyTokenizer(), EOS, SchedulerLimits())
    failed = make_seq([1], free_slots(3))
    run_until_idle(core, [failed])
    assert failed.finish is FinishReason.ERROR and "model failure" in failed.error
    assert not executor.cache  # its slot was freed
    executor.step = real
    ok = make_seq([1], free_slots(3))
    run_until_idle(core, [ok])
    assert ok.finish is FinishReason.STOP and ok.output == [2, 3, 4]


def test_drafting_stops_above_the_speculation_batch_limit():
    spec = ScriptedSpeculator(lambda seq: [(seq.prompt + seq.output)[-1] % 15 + 1])
    seqs = [make_seq([i], free_slots(n)) for i, n in ((1, 2), (2, 6), (3, 10))]
    run(seqs, spec, max_spec_batch=2, prefix_cache_tokens=0)
    assert spec.verdicts and all(v.batch_size <= 2 for v in spec.verdicts)  # resumed once the first finished
    assert seqs[0].usage.draft_steps == {}  # it only ever ran beside two others
    assert [s.output for s in seqs] == [[2, 3], [3, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]


def test_a_proposer_that_raises_ends_that_requests_drafting_not_the_request():
    """The draft model running out of memory (or a bug) mid-draft: rolled back, counted, and the request (and
    its batch) carry on with plain decoding and the same output."""
    calls = {"n": 0}

    def flaky(seq):
        calls["n"] += 1
        if seq.prompt == [1] and calls["n"] >= 3:
            seq.matcher.consume([(seq.prompt + seq.output)[-1] % 15 + 1])  # walked the matcher, then failed
            raise MemoryError("draft model out of memory")
        return [(seq.prompt + seq.output)[-1] % 15 + 1]

    spec = ScriptedSpeculator(flaky)
    hit, neighbour = make_seq([1], free_slots(8)), make_seq([5], free_slots(8))
    core, _ = run([hit, neighbour], spec, prefix_cache_tokens=0)
    assert core.draft_failures == 1 and not hit.speculate and neighbour.speculate
    assert (hit.finish, hit.output) == (FinishReason.STOP, [2, 3, 4, 5, 6, 7, 8, 9])  # the matcher was rolled back
    assert (neighbour.finish, neighbour.output) == (FinishReason.STOP, [6, 7, 8, 9, 10, 11, 12, 13])
    assert neighbour.usage.draft_steps["scripted"] > hit.usage.draft_steps.get("scripted", 0)


def test_a_proposer_that_leaves_the_matcher_moved_is_rolled_back():
    def sloppy(seq):
        nxt = (seq.prompt + seq.output)[-1] % 15 + 1
        seq.matcher.consume([nxt])  # forgets to roll back
        return [nxt]

    seq = make_seq([1], free_slots(6))
    run([seq], ScriptedSpeculator(sloppy), prefix_cache_tokens=0)
    assert (seq.finish, seq.output) == (FinishReason.STOP, [2, 3, 4, 5, 6, 7])


def test_a_proposer_that_rolls_the_matcher_back_too_far_is_undone():
    def overeager(seq):
        if len(seq.output) >= 2:
            seq.matcher.rollback(2)  # undoes two committed tokens
        return [(seq.prompt + seq.output)[-1] % 15 + 1]

    seq = make_seq([1], free_slots(6))
    run([seq], ScriptedSpeculator(overeager), prefix_cache_tokens=0)
    assert (seq.finish, seq.output) == (FinishReason.STOP, [2, 3, 4, 5, 6, 7])
