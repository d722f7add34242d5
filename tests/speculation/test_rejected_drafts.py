"""On the demo models with the policy: every rejected draft the verifier saw is a candidate sample, and a kept
sample says exactly what was drafted, where the target refused it and what it chose; the policy's state per
proposer is recorded as it decides; each finished request is offered to the traffic sample, ids as committed."""

from __future__ import annotations

from structspec.assembly import AssemblyConfig, assemble_engine
from structspec.engine.config import PolicyConfig, SchedulerLimits
from structspec.engine.core import run_until_idle
from structspec.models.step_profile import StepProfile
from structspec.speculation.configs import ProposerSet
from structspec.stats.book import StatsBook
from structspec.stats.counters import Series
from structspec.stats.policy_states import ON
from tests.speculation.test_speculative_decoding import ITEMS, sequences


def test_rejected_drafts_are_sampled_as_the_verifier_saw_them(demo_models, demo_compiler):
    book = StatsBook(samples_per_hour=1000, traffic_per_hour=1000)  # keep every one: each can be checked
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=4), compiler=demo_compiler,
                             proposers=ProposerSet(ngram=True, history=True, draft=True), stats=book.recorder("demo"), policy=PolicyConfig(), seed=0,
                             step_profile_seconds=0))
    # drafting priced on a stated profile where a k-row step costs barely more than a decode step (the demo target's
    # on this CPU, measured: 1.04-1.07x), not on this run's timing: a new schema's proposers then start drafting
    engine.core.drafter.speculator.decider.step_profile = StepProfile("test", {(1, k): 0.01 * (1 + 0.005 * k)
                                                                               for k in range(9)})
    seqs = sequences(engine, ITEMS[:6], max_tokens=120)
    run_until_idle(engine.core, seqs)
    samples = book.samples.take()
    drafted = sum(v for k, v in book.rows().items() if k.series == Series.DRAFTED)
    accepted = sum(v for k, v in book.rows().items() if k.series == Series.ACCEPTED)
    assert samples and drafted > accepted
    by_key = {s.schema_key: s for s in samples}
    assert set(by_key) <= {s.schema_key for s in seqs}
    decode = lambda ids: engine.tokenizer.decode(list(ids), skip_special_tokens=False,  # noqa: E731
                                                 clean_up_tokenization_spaces=False)
    outputs = {s.schema_key: [] for s in seqs}
    for s in seqs:
        outputs[s.schema_key].append(s.prompt + s.output)
    for s in samples:
        assert 0 <= s.position < len(s.draft_tokens) and s.rejected_token == s.draft_tokens[s.position]
        assert s.target_token != s.rejected_token
        assert (s.context_text, s.draft_text, s.target_text) == (decode(s.context_tokens), decode(s.draft_tokens),
                                                                 decode([s.target_token]))
        # the context, the accepted part and the target's choice are what the sequence committed
        committed = list(s.context_tokens) + list(s.draft_tokens[:s.position]) + [s.target_token]
        assert any(_contains(full, committed) for full in outputs[s.schema_key]), s
    assert {s.proposer for s in samples} >= {"ngram"}
    changes = book.policy.take()
    assert changes and all(c.model == "demo" and c.threshold == PolicyConfig().acceptance_threshold for c in changes)
    assert {c.state for c in changes if c.previous == ""} == {ON}  # a new schema's proposers start cold: on
    traffic = book.traffic.take()
    assert sorted((t.schema_key, t.prompt_tokens, t.output_tokens, t.finish) for t in traffic) == sorted(
        (s.schema_key, tuple(s.prompt), tuple(s.output), s.finish.value) for s in seqs)
    assert all(t.model == "demo" for t in traffic)


def _contains(seq: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(seq[i:i + n] == part for i in range(len(seq) - n + 1))
