"""The policy's state per proposer: changes, switches, seeding after a restart, bounds."""

from __future__ import annotations

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason
from structspec.stats.policy_states import OFF, ON, PolicyChange, PolicyStates, proposer_states, state_of
from structspec.stats.totals import SWITCHES, TotalKey


def test_reasons_that_do_not_show_the_state_leave_it_alone():
    assert state_of(Reason.COLD) == ON and state_of(Reason.LOW_ACCEPTANCE) == OFF
    assert {state_of(r) for r in (Reason.REQUEST_OFF, Reason.PROBE, Reason.EXPLORE, Reason.POLICY_ERROR,
                                  Reason.SERVER_OFF)} == {None}
    states = PolicyStates()
    assert states.observe("m", "s", "ngram", Reason.COLD, 1.0).is_switch  # first seen
    assert states.observe("m", "s", "ngram", Reason.COLD, 2.0) is None
    assert states.observe("m", "s", "ngram", Reason.PROBE, 3.0) is None
    change = states.observe("m", "s", "ngram", Reason.DRAFTED, 4.0)
    assert change is not None and not change.is_switch and change.previous == ON  # the reason changed, not the state
    off = states.observe("m", "s", "ngram", Reason.LOW_ACCEPTANCE, 5.0, 4, 0.41, 0.55)
    assert off.is_switch and (off.previous, off.state, off.acceptance, off.threshold, off.batch_bucket) == (
        ON, OFF, 0.41, 0.55, 4)
    assert states.observe("m", "s", "ngram", Reason.NO_GAIN, 6.0) is not None
    assert states.observe("m", "s", "ngram", Reason.DRAFTED, 7.0).is_switch
    assert [c.at for c in states.take()] == [1.0, 4.0, 5.0, 6.0, 7.0]
    assert states.take() == []


def test_the_current_state_says_since_when_and_the_last_switches():
    changes = [PolicyChange("m", "s", "draft", 10.0, ON, Reason.COLD),
               PolicyChange("m", "s", "draft", 20.0, OFF, Reason.LOW_ACCEPTANCE, ON, 1, 0.3, 0.55),
               PolicyChange("m", "s", "draft", 30.0, OFF, Reason.NO_GAIN, OFF),
               PolicyChange("m", "s", "ngram", 15.0, ON, Reason.COLD)]
    got = proposer_states(reversed(changes))
    draft = got[("m", "s", "draft")]
    assert (draft.state, draft.reason, draft.since, draft.changed_at, draft.last_off, draft.last_on) == (
        OFF, Reason.NO_GAIN, 20.0, 30.0, 20.0, 10.0)
    ngram = got[("m", "s", "ngram")]
    assert (ngram.state, ngram.since, ngram.last_off, ngram.last_on) == (ON, 15.0, None, 15.0)


def test_a_seeded_state_is_not_switched_again_and_bounds_hold():
    states = PolicyStates()
    states.seed([PolicyChange("m", "s", "ngram", 1.0, OFF, Reason.NO_GAIN, ON),
                 PolicyChange("m", "s", "ngram", 0.5, ON, Reason.COLD)])
    assert states.observe("m", "s", "ngram", Reason.NO_GAIN, 9.0) is None  # the store's latest, not the older one
    assert states.observe("m", "s", "ngram", Reason.DRAFTED, 10.0).previous == OFF
    states.seed([PolicyChange("m", "s", "ngram", 11.0, OFF, Reason.NO_GAIN, ON)])  # decided here: kept
    assert states.latest()[("m", "s", "ngram")].at == 10.0
    small = PolicyStates(max_keys=2, max_pending=3)
    for i in range(5):
        small.observe("m", f"inline:{i}", "ngram", Reason.COLD, float(i))
    assert len(small.latest()) == 2 and len(small.pending()) == 3 and small.dropped == 2


def test_the_recorder_counts_switches_in_the_totals():
    book = StatsBook(clock=lambda: 3 * HOUR)
    rec = book.recorder("m")
    rec.record_policy("inv@2", {"ngram": Reason.COLD, "draft": Reason.BATCH_SIZE}, 40, {"ngram": None}, 0.55)
    rec.record_policy("inv@2", {"ngram": Reason.LOW_ACCEPTANCE}, 1, {"ngram": 0.2}, 0.55)
    rec.record_policy("inline:ab", {"ngram": Reason.COLD}, 1, {}, 0.55)
    totals = book.totals.snapshot()
    assert totals[TotalKey(SWITCHES, "inv@2", "ngram", 0, ON)] == 1
    assert totals[TotalKey(SWITCHES, "inv@2", "ngram", 0, OFF)] == 1
    assert totals[TotalKey(SWITCHES, "inv@2", "draft", 0, OFF)] == 1
    assert totals[TotalKey(SWITCHES, "inline", "ngram", 0, ON)] == 1
    change = book.policy.latest()[("m", "inv@2", "ngram")]
    assert (change.acceptance, change.threshold, change.batch_bucket) == (0.2, 0.55, 1)
