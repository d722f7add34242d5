"""What vLLM says of its steps, as records: batch sizes of a request's steps, step times, verifications."""

from __future__ import annotations

from structspec.engine.types import Usage
from structspec.vllm_engine.steps import StepLog, record_verifications


class Recorded:
    def __init__(self):
        self.steps: list[tuple[int, int, float]] = []
        self.verifications: list[tuple] = []

    def record_step(self, batch_size, longest_draft, seconds):
        self.steps.append((batch_size, longest_draft, seconds))

    def record_verification(self, schema_key, proposer, batch_size, drafted, accepted, probe):
        self.verifications.append((schema_key, proposer, batch_size, drafted, accepted, probe))


def test_a_requests_batch_size_is_the_median_running_count_of_its_steps():
    log = StepLog()
    for running in (1, 4, 4, 4, 2):
        log.record(0.0, running, 0)
    assert log.median_running(0) == 4
    assert log.median_running(4) == 2  # only the last step
    assert log.median_running(1, 2) == 4
    assert log.median_running(99) == 1  # none seen: one
    assert (log.number, log.running) == (5, 2)


def test_step_times_are_recorded_between_busy_steps_with_their_draft_length():
    rec = Recorded()
    log = StepLog(rec)
    log.record(10.0, 1, 0)
    log.record(10.010, 2, 0, drafts=2, drafted_tokens=7)  # 7 tokens over 2 drafts: the longest is taken as 4
    log.record(10.030, 0, 0)  # idle: the gap to it is not a step time
    log.record(11.000, 1, 0)  # after idle: no step time either
    log.record(11.012, 1, 0)
    assert [(b, k) for b, k, _ in rec.steps] == [(2, 4), (1, 0)]
    assert abs(rec.steps[0][2] - 0.010) < 1e-9 and abs(rec.steps[1][2] - 0.012) < 1e-9


def test_a_failing_recorder_never_fails_a_step():
    class Broken:
        def record_step(self, *args):
            raise RuntimeError("store down")

    log = StepLog(Broken())
    log.record(0.0, 1, 0)
    log.record(0.01, 1, 0)
    assert log.number == 2


def test_verifications_are_recorded_per_step_and_added_to_usage():
    rec, usage = Recorded(), Usage()
    accepted = record_verifications(rec, "s", "ngram", 4, drafted=[4, 0, 3, 2], accepted=[2, 0, 3, 9], usage=usage)
    assert accepted == 2 + 3 + 2  # an accepted count over the draft is clipped to it; empty steps skipped
    assert [(d, a) for *_, d, a, _ in rec.verifications] == [(4, 2), (3, 3), (2, 2)]
    assert {v[2] for v in rec.verifications} == {4} and not any(v[5] for v in rec.verifications)
    assert (usage.drafted["ngram"], usage.accepted["ngram"], usage.draft_steps["ngram"]) == (9, 7, 3)
