"""The executor's step profile: measured on a real executor, cached per key, and what it makes a cold policy do.

The engine tests hand the policy an executor whose k-row verification costs k + 1 forwards (each scored row past
the first runs the model again): on a cold schema it must draft nothing but forced tokens, while the same engine on
the plain executor drafts to measure.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Sequence

import pytest

import structspec.assembly as assembly
import structspec.models.step_profile as step_profile
from structspec.assembly import AssemblyConfig, assemble_engine
from structspec.bench.workloads import build_workload
from structspec.engine.api import ExtractionRequest
from structspec.engine.config import PolicyConfig
from structspec.engine.types import FinishReason, SamplingParams
from structspec.models.executor import StepInput
from structspec.models.hf_executor import TransformersExecutor
from structspec.models.step_profile import StepProfile, StepProfileCache, cached_step_profile, measure_step_profile
from structspec.speculation.configs import ProposerSet
from structspec.stats.book import StatsBook
from structspec.stats.counters import Reason, Series


class RowsCostForwards:
    """A ForwardStep whose step costs one more forward of the model for each scored row past the first of any
    input: a k-row verification costs k + 1 forwards (as Gemma's output layer makes it on llama.cpp)."""

    def __init__(self, inner):
        self.inner = inner
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context
        self.restricted_logits_max = 0

    @property
    def forward_calls(self) -> int:
        return self.inner.forward_calls

    def step(self, inputs: Sequence[StepInput]):
        out = self.inner.step(inputs)
        extra = max(len(x.logits_at) for x in inputs) - 1
        for _ in range(extra):  # the same work again on a scratch sequence, thrown away
            scratch = self.inner.new_sequence()
            try:
                self.inner.step([StepInput(scratch, list(inputs[0].tokens) * 4)])
            finally:
                self.inner.free(scratch)
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_profile_measures_k_row_steps_on_a_real_executor(demo_models):
    executor = TransformersExecutor(demo_models.target)
    profile = measure_step_profile(executor, "demo-test", buckets=(1, 2), budget_seconds=30.0, reps=2)
    assert {(b, k) for b in (1, 2) for k in (0, 1, 2, 3, 4, 6, 8)} <= set(profile.full)
    assert all(s > 0 for s in profile.full.values())
    costly = measure_step_profile(RowsCostForwards(executor), "costly", buckets=(1,), reps=2)
    real, dear = profile.ratio(1, 8), costly.ratio(1, 8)
    assert real is not None and dear is not None and dear > 2 * real  # the wrapper's rows cost forwards
    assert executor.seq_len(executor.new_sequence()) == 0  # the measurement freed its sequences


def test_the_cache_keeps_a_profile_per_key_and_ignores_what_it_cannot_read(tmp_path):
    cache = StepProfileCache(tmp_path)
    profile = StepProfile("model|cpu", {(1, 0): 0.01, (1, 4): 0.02}, {(1, 4): 0.011}, {1: 0.002}, 5.0, 1.5)
    cache.put(profile)
    assert cache.get("model|cpu") == profile
    assert cache.get("other") is None
    for path in tmp_path.iterdir():
        path.write_text("{not json")
    assert cache.get("model|cpu") is None
    with pytest.raises(ValueError):
        StepProfile.from_json({"version": 99})


def test_a_cached_profile_is_not_measured_again(tmp_path):
    cache = StepProfileCache(tmp_path)
    stored = StepProfile("key-a", {(1, 0): 0.5, (1, 1): 0.6})
    cache.put(stored)

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError("the executor was used")

    assert cached_step_profile(Untouchable(), "key-a", cache) == stored


LONG_SCHEMA = build_workload("extraction", 1)[0]


def _engine(demo_models, costly: bool, monkeypatch, book: StatsBook):
    monkeypatch.setattr(step_profile, "_MEMORY", {})  # this process's profiles are per model: measure this one
    if costly:
        real = assembly.make_executor
        monkeypatch.setattr(assembly, "make_executor", lambda *a, **kw: RowsCostForwards(real(*a, **kw)))
    recorder = book.recorder("demo-costs" + ("-costly" if costly else ""))
    engine = assemble_engine(demo_models, AssemblyConfig(proposers=ProposerSet(ngram=True, history=True, draft=True),
                                                       policy=PolicyConfig(), stats=recorder, seed=0,
                                                       step_profile_seconds=10.0))
    _check_profile(engine, costly)
    return engine


def _check_profile(engine, costly: bool) -> None:
    """The profile the policy got is this executor's: a 4-row step costs about 5 forwards on the costly one."""
    profile = engine.core.speculator.decider.step_profile
    ratio = profile.ratio(1, 4)
    assert ratio is not None and (ratio > 3.0 if costly else ratio < 2.0), step_profile.describe(profile)


async def _extract(engine, requests):
    engine.start()
    try:
        return [await engine.extract(r) for r in requests]
    finally:
        engine.stop()


def _requests(n: int):
    items = build_workload("extraction", n)
    return [ExtractionRequest(schema=i.schema, text=i.source, schema_key="cold-" + i.schema_name,
                              sampling=SamplingParams(max_tokens=160)) for i in items]


def test_a_cold_schema_drafts_nothing_but_forced_tokens_where_rows_cost_forwards(demo_models, monkeypatch):
    book = StatsBook()
    results = asyncio.run(_extract(_engine(demo_models, True, monkeypatch, book), _requests(3)))
    for r in results:
        assert r.finish_reason is FinishReason.STOP
        assert r.usage.forced_tokens > 0  # fast-forward still runs
        assert sum(r.usage.drafted.values()) == 0, r.usage.drafted
        assert r.speculation is not None and r.speculation.reason == Reason.PRICED_OUT
        assert set(r.speculation.reasons.values()) == {Reason.PRICED_OUT}
    # the profile the policy priced with is in the book (the owners' view reads it from the store)
    profiled = {(k.proposer, k.batch_bucket, k.label) for k in book.rows_for("demo-costs-costly", "", 0)
                if k.series == Series.PROFILE_STEPS}
    assert ("full", 1, "8") in profiled and ("draft", 1, "1") in profiled


def test_the_same_cold_schema_drafts_on_an_executor_where_rows_are_cheap(demo_models, monkeypatch):
    # the demo target's rows are about free (a measured 8-row step ~1.1 decode steps); given as such here, since a
    # busy machine can make any single measurement read otherwise
    flat = StepProfile("flat", {(1, k): 0.012 * (1 + 0.01 * k) for k in (0, 1, 2, 3, 4, 6, 8)})
    monkeypatch.setattr(assembly, "cached_step_profile", lambda *a, **kw: flat)
    monkeypatch.setattr(sys.modules[__name__], "_check_profile", lambda engine, costly: None)
    book = StatsBook()
    results = asyncio.run(_extract(_engine(demo_models, False, monkeypatch, book), _requests(2)))
    assert all(r.speculation is not None and r.speculation.reason == Reason.COLD for r in results)
    assert sum(sum(r.usage.drafted.values()) for r in results) > 0
    assert json.dumps([r.value for r in results])  # valid outputs


def test_a_probe_of_a_priced_out_proposer_drafts_at_most_its_token_budget(demo_models, monkeypatch):
    monkeypatch.setattr(step_profile, "_MEMORY", {})
    real = assembly.make_executor
    monkeypatch.setattr(assembly, "make_executor", lambda *a, **kw: RowsCostForwards(real(*a, **kw)))
    policy = PolicyConfig(probe_rate=1.0, probe_max_tokens=10)  # every request probes what is priced out
    engine = assemble_engine(demo_models, AssemblyConfig(proposers=ProposerSet(ngram=True, history=True, draft=False),
                                                         policy=policy, stats=StatsBook().recorder("probe-budget"),
                                                         seed=0, step_profile_seconds=10.0))
    _check_profile(engine, True)
    results = asyncio.run(_extract(engine, _requests(1)))  # priced by the profile alone (no served step yet)
    for r in results:
        assert r.speculation is not None and r.speculation.probe
        drafted = sum(r.usage.drafted.values())
        assert 0 < drafted <= 10, r.usage.drafted  # it measured, within its budget, on outputs of 60+ tokens
        assert r.usage.output_tokens > 40


class Burst:
    """A ForwardStep whose steps take no time except a run of consecutive ones (a neighbour's burst of work), each
    of which the clock reads as 1 s long."""

    def __init__(self, inner, burst: range):
        self.inner, self.burst, self.calls = inner, burst, 0
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context
        self.restricted_logits_max = 0

    def step(self, inputs: Sequence[StepInput]):
        self.calls += 1
        if self.calls in self.burst:
            Burst.now += 1.0
        return self.inner.step(inputs)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    now = 0.0


def test_a_burst_of_interference_does_not_price_one_draft_length(demo_models, monkeypatch):
    # 6 consecutive slow steps (as long as a measurement's reps of one k): rounds over every k leave each k a
    # fast rep, so no k reads the burst (reps measured k after k would read all of one k's reps in it)
    monkeypatch.setattr(step_profile.time, "perf_counter", lambda: Burst.now)
    lengths = (0, 1, 2, 3)
    # step 1 is the prefill; measured k after k, steps 8-13 would be k=1's warm-up and all five of its reps
    executor = Burst(TransformersExecutor(demo_models.target), range(8, 14))
    prof = measure_step_profile(executor, "k", buckets=(1,), lengths=lengths, reps=5)
    assert all(prof.full[(1, k)] == 0.0 for k in lengths)
