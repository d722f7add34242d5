"""The step on a model-free executor: draft -> forward -> verify -> roll back -> commit -> fast-forward -> finish."""

from __future__ import annotations

import time

import pytest

from structspec.engine.config import SchedulerLimits
from structspec.engine.core import EngineCore, run_until_idle
from structspec.engine.sequence import SequenceStatus
from structspec.engine.speculator import Draft, DraftVerdict
from structspec.engine.types import FinishReason
from structspec.models.executor import InputError
from tests.engine.fakes import AlwaysDrafts, EOS, VOCAB, SlotMatcher, TableExecutor, ToyTokenizer, free_slots, make_seq

CYCLE = {t: t % 15 + 1 for t in range(16)}


class ScriptedSpeculator(AlwaysDrafts):
    """Drafts ``script(seq)`` tokens; records every verdict and finish it is told."""

    def __init__(self, script):
        self.script = script
        self.verdicts: list[DraftVerdict] = []
        self.finished: list[str] = []

    def propose(self, seq, max_tokens, narrow=True):
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


def test_a_step_that_feeds_forced_tokens_is_not_timed():
    """A forced token is fed but not scored: a step carrying forced tokens costs more than a plain step (SmolLM2 on
    llama.cpp: 17 ms against 10 ms) and less than a k-row verification, which scores every row (on an executor
    where a scored row costs a forward, as Gemma's output layer makes it, far less). It is neither, so it is not
    timed: timed as a plain step it made drafts look cheap, timed as a k-row step it made them look cheap too
    (``tests/models/test_step_profile.py``: a cold schema priced in at k = 3 by forced runs of 3)."""
    from structspec.engine.sequence import Serving
    from structspec.stats.book import Series, StatsBook

    book = StatsBook()
    slots = free_slots(1) + [frozenset({7}), frozenset({8})] + free_slots(3)
    seq = make_seq([1, 2], slots)
    core = EngineCore(TableExecutor(CYCLE), ToyTokenizer(), EOS, SchedulerLimits(prefix_cache_tokens=0),
                      serving=Serving(book.recorder("m")))
    run_until_idle(core, [seq])
    assert seq.output == [3, 7, 8, 9, 10, 11]
    timed = {key.label: n for key, n in book.rows_for("m", "").items() if key.series == Series.STEPS}
    # the step feeding the pending 3 and the forced 7, 8 is not timed; the steps feeding one token are plain ones
    # (the prompt's and the finishing one are not timed)
    assert timed == {"0": 1.0}


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
    failed = [make_seq([1], free_slots(3)), make_seq([2], free_slots(3))]
    run_until_idle(core, failed)
    for seq in failed:  # a failure of the forward itself belongs to no one request: the error says so
        assert seq.finish is FinishReason.ERROR
        assert seq.error == "model failure (the forward pass of its whole batch of 2): RuntimeError: out of memory"
    assert not executor.cache  # their slots were freed
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


# -- one request's failure is never its batch's ---------------------------------------------------------------


class FaultyMatcher(SlotMatcher):
    """A grammar that breaks on one request's input: ``method`` raises from its call number ``after + 1`` on."""

    def __init__(self, slots, method: str, after: int):
        super().__init__(slots)
        self.method, self.after, self.calls = method, after, 0

    def _call(self, name: str) -> None:
        if name == self.method:
            self.calls += 1
            if self.calls > self.after:
                raise RuntimeError(f"{name} broke")

    def fill_mask(self, bitmask, row=0):
        self._call("fill_mask")
        super().fill_mask(bitmask, row)

    def consume(self, tokens):
        self._call("consume")
        return super().consume(tokens)

    def forced_tokens(self):
        self._call("forced_tokens")
        return super().forced_tokens()


def four_with_one_failing(make_failing, speculator_factory=lambda: None, executor=None):
    """Three requests run alone (the reference), then the same three beside a fourth that fails; returns
    (reference, the three, the fourth, core, executor)."""
    reference = [make_seq([p], free_slots(8)) for p in (1, 2, 3)]
    run(reference, speculator_factory(), prefix_cache_tokens=0)
    three = [make_seq([p], free_slots(8)) for p in (1, 2, 3)]
    fourth = make_failing()
    core, executor = run([three[0], fourth, *three[1:]], speculator_factory(), executor, prefix_cache_tokens=0)
    return reference, three, fourth, core, executor


def assert_alone_failed(reference, three, fourth, core, executor, error: str):
    assert fourth.finish is FinishReason.ERROR and fourth.error == error
    for got, want in zip(three, reference):  # as if the fourth had never been there
        assert (got.finish, got.output) == (want.finish, want.output) == (FinishReason.STOP, want.output)
        assert got.usage.target_forward_passes == want.usage.target_forward_passes
        assert got.usage.accepted == want.usage.accepted
    assert fourth.seq_id not in executor.cache  # its cache was freed
    assert not core.scheduler.running and core.scheduler.reserved == 0


def drafts_the_next_token():
    return ScriptedSpeculator(lambda seq: [(seq.prompt + seq.output)[-1] % 15 + 1])


@pytest.mark.parametrize("method, after, stage", [
    ("forced_tokens", 0, "starting its grammar"),  # at admission: the opening forced tokens
    ("fill_mask", 2, "drafting and masking"),
    ("consume", 1, "committing the step"),  # the draft consumes first, then the commit
])
def test_a_grammar_failing_for_one_request_ends_it_alone(method, after, stage):
    reference, three, fourth, core, executor = four_with_one_failing(
        lambda: _faulty([4], method, after), drafts_the_next_token)
    assert_alone_failed(reference, three, fourth, core, executor,
                        f"internal error while {stage}: RuntimeError: {method} broke")


def _faulty(prompt, method, after):
    seq = make_seq(prompt, free_slots(8))
    seq.matcher = FaultyMatcher(free_slots(8), method, after)
    return seq


def test_an_input_the_model_refuses_ends_that_request_alone_and_the_rest_run_again():
    """The executor names one input at fault (its allowed ids could not be scored): that request ends with ERROR,
    the step runs again without it, and the three others finish as they do alone."""
    executor = TableExecutor(CYCLE)
    real = executor.step
    fourth = make_seq([4], free_slots(8))

    def refusing(inputs):
        if len(executor.steps) == 2 and any(x.seq_id == fourth.seq_id for x in inputs):
            raise InputError({fourth.seq_id: "scoring its allowed ids failed: ValueError: cannot reshape"})
        return real(inputs)

    executor.step = refusing
    reference, three, _, core, executor = four_with_one_failing(lambda: fourth, drafts_the_next_token, executor)
    assert_alone_failed(reference, three, fourth, core, executor,
                        "model input refused: scoring its allowed ids failed: ValueError: cannot reshape")
    assert [len(step) for step in executor.steps[:4]] == [4, 4, 3, 3]  # the third forward ran again without it


def test_an_input_that_cannot_be_built_ends_that_request_alone(monkeypatch):
    """Listing one request's allowed ids for the executor fails: that request alone ends."""
    import structspec.engine.drafter as drafter_module

    real = drafter_module.small_allowed_set

    def failing(row, limit):
        ids = real(row, limit)
        if ids is not None and ids.tolist() == [9, 10]:  # only the fourth request's grammar allows just these
            raise MemoryError("no memory for the list")
        return ids

    monkeypatch.setattr(drafter_module, "small_allowed_set", failing)
    executor = TableExecutor(CYCLE)
    executor.restricted_logits_max = 4
    reference, three, fourth, core, executor = four_with_one_failing(
        lambda: make_seq([4], [frozenset(range(1, VOCAB)), frozenset({9, 10})]), executor=executor)
    assert_alone_failed(reference, three, fourth, core, executor,
                        "internal error while building its step input: MemoryError: no memory for the list")
    assert fourth.output == [5]


def test_a_draft_accepted_into_a_dead_end_is_an_error_not_a_stop():
    """Past an accepted draft token the grammar allows nothing: that row is -inf everywhere and its argmax (id 0,
    here the EOS) is no choice. The request ends as a dead end does at the first row, never as a STOP."""
    dead = [frozenset(range(1, VOCAB)), frozenset()]
    plain, drafted = make_seq([1], dead), make_seq([1], dead)
    run([plain])
    _, executor = run([drafted], drafts_the_next_token())
    assert list(executor.steps[0][0].tokens) == [1, 2]  # the draft token 2 was scored (and accepted)
    for seq in (plain, drafted):
        assert seq.finish is FinishReason.ERROR and seq.error == "grammar allows no token here (dead end)"


class BrittleTokenizer(ToyTokenizer):
    """Cannot decode the token 15 (a tokenizer's bug on one request's output)."""

    def decode(self, ids, **kwargs) -> str:
        if 15 in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return super().decode(ids, **kwargs)


def test_a_text_delta_failing_for_one_request_ends_it_alone():
    """Decoding one streaming request's text fails (every time, its last delta too): it ends with ERROR, the
    others stream on."""
    reference = [make_seq([p], free_slots(8)) for p in (1, 2, 3)]
    run(reference)
    three, fourth = [make_seq([p], free_slots(8)) for p in (1, 2, 3)], make_seq([12], free_slots(8))
    core = EngineCore(TableExecutor(CYCLE), BrittleTokenizer(), EOS, SchedulerLimits())
    run_until_idle(core, [three[0], fourth, *three[1:]])
    assert fourth.finish is FinishReason.ERROR and fourth.output == [13, 14, 15]
    assert fourth.error == "internal error while committing the step: UnicodeDecodeError: 'utf-8' codec can't " \
                          "decode byte 0xff in position 0: invalid start byte"
    assert [(s.finish, s.output) for s in three] == [(s.finish, s.output) for s in reference]
    assert not core.scheduler.running and core.scheduler.reserved == 0


OTHER_END = 15  # a second end-of-turn id beside EOS (Llama 3's <|eom_id|> beside <|eot_id|>)


class TwoEndsMatcher(SlotMatcher):
    """Slots, then either end-of-turn id (as a grammar over a view with both EOS ids allows); like free text it
    never stops by itself: only an end-of-turn token ends it."""

    ends = frozenset({EOS, OTHER_END})

    def is_stopped(self) -> bool:
        return False

    def _allowed(self) -> frozenset[int]:
        return self.ends if self.pos == len(self.slots) else self.slots[self.pos]

    def consume(self, tokens) -> bool:
        if any(t == OTHER_END for t in tokens):  # an end of turn is never text
            self._error = self._error or f"end of turn {OTHER_END} consumed as text"
            return False
        return super().consume(tokens)


def test_a_turn_ends_at_any_of_its_end_of_turn_ids_and_a_draft_never_carries_one():
    # CYCLE writes 14 then 15: after 12 slots the model's own choice is the second end of turn
    for speculator in (None, ScriptedSpeculator(lambda seq: [(seq.prompt + seq.output)[-1] % 15 + 1] * 3)):
        seq = make_seq([1, 2], [frozenset(range(1, OTHER_END))] * 12, max_tokens=20)
        seq.matcher = TwoEndsMatcher(seq.matcher.slots)
        executor = TableExecutor(CYCLE)
        core = EngineCore(executor, ToyTokenizer(), (EOS, OTHER_END), SchedulerLimits(), speculator)
        run_until_idle(core, [seq])
        assert (seq.finish, seq.error, seq.output) == (FinishReason.STOP, None, list(range(3, 15)))
        assert all(OTHER_END not in x.tokens for step in executor.steps for x in step)


class CappedSpeculator(ScriptedSpeculator):
    """Decides ``caps`` (full head) and ``wide`` (restricted caps) for its proposer, as the policy would."""

    def __init__(self, script, caps: dict[str, int], wide: dict[str, int]):
        super().__init__(script)
        self.caps, self.wide = caps, wide

    def decide(self, seq, batch_size):
        from structspec.engine.types import SpeculationReport

        return SpeculationReport(True, "drafted", False, dict(self.caps), {}, "", dict(self.wide))


class SmallSetsExecutor(TableExecutor):
    restricted_logits_max = 3  # allowed sets of up to 3 ids are "small" (scored without the output layer)


def greedy_draft(seq):
    """The target's own greedy continuation, six tokens: every drafted token is accepted where it is carried."""
    out, last = [], (seq.prompt + seq.output)[-1]
    for _ in range(6):
        last = CYCLE[last]
        out.append(last)
    return out if len(seq.output) == 0 else []


@pytest.mark.parametrize("caps, wide, carried", [
    ({"scripted": 1}, {"scripted": 8}, 2),  # past the cap of 1: while the scored positions' sets are small (rows 0-2)
    ({"scripted": 1}, {}, 1),               # no restricted cap: the cap alone
    ({"scripted": 4}, {"scripted": 8}, 4),  # the cap is longer than the small stretch: the cap
    ({}, {"scripted": 1}, 1),               # only a restricted cap: up to it, inside the stretch
])
def test_a_draft_runs_past_its_cap_only_while_every_scored_position_has_a_small_allowed_set(caps, wide, carried):
    slots = [frozenset({3, 9}), frozenset({4, 9}), frozenset({5, 9})] + free_slots(5)  # three small sets, then 15 ids
    plain = make_seq([1, 2], slots, max_tokens=8)
    run([plain], executor=SmallSetsExecutor(CYCLE))
    spec = CappedSpeculator(greedy_draft, caps, wide)
    seq = make_seq([1, 2], slots, max_tokens=8)
    _, executor = run([seq], spec, executor=SmallSetsExecutor(CYCLE), prefix_cache_tokens=0)
    assert seq.output == plain.output  # exact: the cut depends on the grammar alone, never on the target
    first = spec.verdicts[0]
    assert (first.drafted, first.accepted) == (carried, carried)  # what was cut for its price is not "drafted"
    assert first.narrow == (carried > caps.get("scripted", 0))  # carried on the restricted cap: told so
    drafted_step = next(x for step in executor.steps for x in step if len(x.logits_at) > 1)
    assert len(drafted_step.logits_at) == carried + 1
    small = all(a is not None for a in drafted_step.allowed)  # the executor is told every row's small set
    assert small == (carried <= 2)


def test_a_draft_whose_first_position_is_wide_is_not_carried_on_a_restricted_cap_alone():
    slots = free_slots(8)  # every position allows 15 ids: no forward can skip the output layer
    spec = CappedSpeculator(greedy_draft, {}, {"scripted": 8})
    seq = make_seq([1, 2], slots, max_tokens=8)
    _, executor = run([seq], spec, executor=SmallSetsExecutor(CYCLE), prefix_cache_tokens=0)
    assert seq.output == [3, 4, 5, 6, 7, 8, 9, 10]
    assert spec.verdicts == []  # cut to nothing for its price: no draft verified, none counted
    assert all(len(x.logits_at) <= 1 for step in executor.steps for x in step)


class AskedSpeculator(CappedSpeculator):
    """Records, per proposal asked, how much output was committed and whether the position was narrow."""

    def __init__(self, script, caps, wide):
        super().__init__(script, caps, wide)
        self.asked: list[tuple[int, bool]] = []

    def propose(self, seq, max_tokens, narrow=True):
        self.asked.append((len(seq.output), narrow))
        return super().propose(seq, max_tokens, narrow)


@pytest.mark.parametrize("caps", [{}, {"scripted": 2}])
def test_a_wide_position_asks_a_proposer_only_at_its_cap(caps):
    """Two wide positions, three small ones, wide ones after: with a restricted cap alone the speculator is not
    asked where the next position is wide (its proposing would buy nothing there); with a cap too, it is asked and
    told the position is wide, so a restricted cap alone does not carry a draft there."""
    slots = free_slots(2) + [frozenset({5, 9}), frozenset({6, 9}), frozenset({7, 9})] + free_slots(5)
    spec = AskedSpeculator(lambda seq: [], caps, {"scripted": 8})
    seq = make_seq([1, 2], slots, max_tokens=10)
    run([seq], spec, executor=SmallSetsExecutor(CYCLE), prefix_cache_tokens=0)
    assert seq.output == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    narrow_at = {n for n, narrow in spec.asked if narrow}
    assert narrow_at == {2, 3, 4}  # the small sets' positions, told narrow
    wide_at = {n for n, narrow in spec.asked if not narrow}
    assert wide_at == (set() if not caps else {0, 1, 5, 6, 7, 8})  # (the last position has no room to draft)


@pytest.mark.parametrize("slots, draft, carried, passes", [
    # the draft runs to the end: its forced tail and the last decision are left to the step's row and fast-forward
    (free_slots(2) + [frozenset({5}), frozenset({6})], [3, 4, 5, 6], 1, 1),
    # the position after the draft is forced (5): the draft's last decision (4) is the step's row's to make
    (free_slots(2) + [frozenset({5})] + free_slots(3), [3, 4], 1, 4),
    # the position after the draft is a decision: the draft is carried whole
    (free_slots(2) + [frozenset({5})] + free_slots(3), [3, 4, 5], 3, 3),
    # only forced positions after the first: nothing is left to draft
    (free_slots(1) + [frozenset({4}), frozenset({5})], [3, 4, 5], 0, 1),
])
def test_a_draft_ends_where_the_target_decides(slots, draft, carried, passes):
    """A scored row at a forced position decides nothing: a draft is cut so that the row after its last token is a
    decision. The same tokens are committed in the same steps, with fewer rows scored."""
    plain = make_seq([1, 2], slots)
    run([plain])
    spec = ScriptedSpeculator(lambda seq: draft if not seq.output else [])
    seq = make_seq([1, 2], slots)
    _, executor = run([seq], spec, prefix_cache_tokens=0)
    assert seq.output == plain.output and seq.finish is FinishReason.STOP
    assert [(v.drafted, v.accepted) for v in spec.verdicts] == ([(carried, carried)] if carried else [])
    assert len(executor.steps[0][0].logits_at) == carried + 1  # the prompt's step scored the draft's rows alone
    assert seq.usage.target_forward_passes == passes
    whole = make_seq([1, 2], slots, fast_forward=False)  # without fast-forward forced tokens need rows: kept whole
    spec_whole = ScriptedSpeculator(lambda seq: draft if not seq.output else [])
    run([whole], spec_whole, prefix_cache_tokens=0)
    assert whole.output == plain.output and spec_whole.verdicts[0].drafted == len(draft)
