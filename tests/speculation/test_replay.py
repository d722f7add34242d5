"""Replayed drafts (``speculation.replay``) on the demo models: on a greedy output they are the verdicts the engine
recorded when the same proposer drafted, draft for draft; the router replays a priced-out proposer's drafts on
finished outputs until they hold ``min_evidence_tokens``, and the policy prices the proposer with them."""

from __future__ import annotations

from structspec.assembly import AssemblyConfig, assemble_engine
from structspec.bench.workloads import build_workload
from structspec.engine.config import PolicyConfig, SchedulerLimits
from structspec.engine.core import run_until_idle
from structspec.models.step_profile import StepProfile
from structspec.speculation.configs import ProposerSet
from structspec.speculation.replay import replay_drafts, sequence_context
from structspec.stats.book import StatsBook
from structspec.stats.counters import Reason, Series
from tests.speculation.test_speculative_decoding import sequences

EXTRACTION = build_workload("extraction", 4)


def test_replayed_drafts_on_a_greedy_output_are_the_verdicts_the_engine_recorded(demo_models, demo_compiler):
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=4), compiler=demo_compiler,
                                                         proposers=ProposerSet(ngram=True, history=False, draft=False)))
    router = engine.core.drafter.speculator
    seen: dict[str, list[tuple[str, int, int]]] = {}
    on_verified = router.on_verified

    def record(seq, verdict):
        seen.setdefault(seq.request_id, []).append((verdict.proposer, verdict.drafted, verdict.accepted))
        on_verified(seq, verdict)

    router.on_verified = record
    seqs = sequences(engine, EXTRACTION, max_tokens=256)
    run_until_idle(engine.core, seqs)
    replayed_any = 0
    for seq in seqs:
        assert seq.finish.value == "stop"
        got = replay_drafts(router.ngram, seq.output, seq.grammar.matcher(), engine.core.drafter.executor.vocab_size,
                            sequence_context(seq, router._decode), 8,
                            seq.fast_forward)
        assert got == seen.get(seq.request_id, []), (seq.request_id, got, seen.get(seq.request_id))
        replayed_any += len(got)
    assert replayed_any >= 10  # copy lookup drafted: a comparison of something


def test_a_priced_out_proposer_is_replayed_until_its_evidence_holds_then_priced_with_it(demo_models, demo_compiler):
    """A k-row step costing 1 + 0.2 k decode steps, and a pessimistic prior (0.1, then 0.3), price copy lookup out
    cold; replays on finished outputs give it evidence without a draft, and stop once they hold
    ``min_evidence_tokens`` examined tokens."""
    book = StatsBook()
    policy = PolicyConfig(min_evidence_tokens=150, probe_rate=0.0, prior_acceptance=0.1, prior_continuation=0.3)
    recorder = book.recorder("demo")
    recorder.record_step = lambda *args, **kwargs: None  # priced by the profile alone: no served (wall) times
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=1), compiler=demo_compiler,
                                                         proposers=ProposerSet(ngram=True, history=True, draft=False),
                                                         stats=recorder, policy=policy, seed=0,
                                                         step_profile_seconds=0))
    router = engine.core.drafter.speculator
    router.decider.step_profile = StepProfile("test", {(1, k): 0.01 * (1 + 0.2 * k) for k in range(9)})
    contacts = [i for i in build_workload("extraction", 24) if i.schema_name == "contact"][:5]
    first = sequences(engine, contacts[:1], max_tokens=256)
    run_until_idle(engine.core, first)
    assert first[0].decision.reasons["ngram"] == Reason.PRICED_OUT and first[0].usage.drafted == {}

    def replayed(series: str) -> float:
        return sum(v for k, v in book.rows().items() if k.series == series and k.proposer == "ngram")

    after_one = replayed(Series.REPLAYED_DRAFTED)
    assert after_one > 0 and replayed(Series.REPLAYED) > 0
    assert replayed(Series.DRAFTED) == 0  # replays are not drafting
    examined = [replayed(Series.REPLAYED_REACHED)]
    rest = sequences(engine, contacts[1:], max_tokens=256)
    for seq in rest:
        run_until_idle(engine.core, [seq])
        examined.append(replayed(Series.REPLAYED_REACHED))
    decisions = [s.decision.reasons["ngram"] for s in rest]
    for before, after, seq, why in zip(examined, examined[1:], rest, decisions):
        # replayed exactly when priced out and the replays were thin; drafting (cold) once they price it in
        assert (after > before) == (why == Reason.PRICED_OUT and before < policy.min_evidence_tokens), (examined,
                                                                                                       decisions)
        assert (seq.usage.drafted.get("ngram", 0) > 0) == (why == Reason.COLD)
    # the replays price it in: it drafts (cold) on a later request; its own drafts may then price it out again
    assert decisions[0] == Reason.PRICED_OUT and Reason.COLD in decisions[1:], decisions
    ev = router.decider._read(recorder, "contact", book.clock())[0].replayed["ngram"]
    assert sum(ev.reached) == examined[-1] > 0 and replayed(Series.DRAFTED) > 0


def test_a_short_output_refused_drafting_is_replayed(demo_models, demo_compiler):
    """A short output on an executor where an 8-row step costs 3 decode steps: at the prior no cap pays, so copy
    lookup does not draft (``short_output``); its drafts are replayed on the output, the evidence that prices its
    cap at the rows its drafts fill (``policy.short_draft_length``)."""
    book = StatsBook()
    recorder = book.recorder("demo")
    recorder.record_step = lambda *args, **kwargs: None  # priced by the profile alone: no served (wall) times
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=1), compiler=demo_compiler,
                                                         proposers=ProposerSet(ngram=True, history=True, draft=False),
                                                         stats=recorder, policy=PolicyConfig(probe_rate=0.0), seed=0,
                                                         step_profile_seconds=0))
    router = engine.core.drafter.speculator
    router.decider.step_profile = StepProfile("test", {(1, k): 0.01 * (1 + 0.25 * k) for k in range(9)})
    triage = [i for i in build_workload("mixed", 48) if i.schema_name == "ticket_triage"][:1]
    assert triage
    (seq,) = sequences(engine, triage, max_tokens=64)
    run_until_idle(engine.core, [seq])
    assert seq.decision.reasons["ngram"] == Reason.SHORT_OUTPUT and seq.usage.drafted == {}
    replayed = sum(v for k, v in book.rows().items() if k.series == Series.REPLAYED and k.proposer == "ngram")
    assert replayed > 0
