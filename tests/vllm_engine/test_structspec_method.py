"""structspec's drafting inside vLLM (vLLM's CPU build, the demo target): the proposer reached through the worker
extension, greedy outputs unchanged, per-request plans honoured in one batch, verdicts per proposer and position,
and the output distribution under sampling that of plain constrained sampling.

Skipped where vLLM is not installed; ``STRUCTSPEC_REQUIRE_VLLM=1`` (``.ci/run``) makes them fail instead. One
engine serves the module (its start costs ~20 s)."""

from __future__ import annotations

import asyncio
import collections
import json
import os

import pytest

from tests.vllm_engine import chi2_sf, need_vllm

need_vllm()

from structspec.bench.workloads import build_workload  # noqa: E402
from structspec.engine.api import ExtractionRequest  # noqa: E402
from structspec.engine.config import EngineConfig, PolicyConfig, SchedulerLimits, VllmOptions  # noqa: E402
from structspec.engine.types import (FinishReason, Outcome, SamplingParams, SchemaSpeculation,  # noqa: E402
                                     SpeculationMode)
from structspec.models.profiles import DEMO_DIR  # noqa: E402
from structspec.stats.book import StatsBook  # noqa: E402
from structspec.stats.counters import Reason, Series  # noqa: E402
from structspec.stats.summary import summarize  # noqa: E402
from tests.vllm_engine.test_engine import Loop, request_for  # noqa: E402

ITEMS = build_workload("extraction", 6)
SHORT = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
         "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Perth", "Prague", "Porto"]}},
        "required": ["city"], "additionalProperties": False}
CITY_TEXT = "The company has offices in Paris, Perth, Prague and Porto. Its headquarters city:"


@pytest.fixture(scope="module")
def loop():
    made = Loop()
    yield made
    made.close()


@pytest.fixture(scope="module")
def book():
    return StatsBook()


@pytest.fixture(scope="module")
def engine(loop, book):
    """structspec's proposer under the policy (which, with an empty book, drafts cold schemas at K and turns
    short outputs off)."""
    from structspec.vllm_engine.build import build_vllm_engine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    extra = {"enforce_eager": True}
    config = EngineConfig(profile=str(DEMO_DIR / "target"), dtype="float32", engine="vllm", speculation="policy",
                          limits=SchedulerLimits(max_batch=16), policy=PolicyConfig(probe_rate=0.0),
                          vllm=VllmOptions(max_model_len=768, extra=json.dumps(extra),
                                           speculative_config='{"method": "structspec", "num_speculative_tokens": 8}'))
    made = build_vllm_engine(config, book=book)

    async def start():
        made.start()

    loop.run(start())
    yield made
    made.close()


def test_greedy_outputs_with_the_proposer_equal_the_undrafted_ones(engine, loop):
    async def both():
        drafted = await asyncio.gather(*(engine.extract(request_for(i)) for i in ITEMS))
        plain = await asyncio.gather(*(engine.extract(request_for(i, speculation=SpeculationMode.OFF)) for i in ITEMS))
        return drafted, plain

    drafted, plain = loop.run(both(), timeout=300)
    assert engine.model_key.endswith("+vllm:structspec")
    for d, p in zip(drafted, plain):
        assert d.outcome is Outcome.VALID and d.finish_reason is FinishReason.STOP, d.text
        assert d.token_ids == p.token_ids
        assert sum(d.usage.accepted.values()) > 0 and d.usage.forced_tokens > 0
        assert d.usage.target_forward_passes < p.usage.target_forward_passes
        assert p.usage.drafted == {} and p.usage.forced_tokens > 0  # forced tokens stay, as on the own engine
        assert p.speculation.reason == Reason.REQUEST_OFF


def test_a_schema_the_policy_turns_off_drafts_nothing_beside_one_that_drafts_in_the_same_batch(engine, loop):
    async def mixed():
        short = [engine.extract(ExtractionRequest(schema=SHORT, text=f"Is {n} even?", schema_key="short",
                                                  sampling=SamplingParams(max_tokens=20))) for n in range(4)]
        long = [engine.extract(request_for(i, schema_speculation=SchemaSpeculation.ON)) for i in ITEMS[:4]]
        return await asyncio.gather(*short, *long)

    results = loop.run(mixed(), timeout=300)
    short, long = results[:4], results[4:]
    for r in short:
        assert r.outcome is Outcome.VALID
        assert r.speculation.reason == Reason.SHORT_OUTPUT and not r.speculation.max_draft
        assert r.usage.drafted == {}  # no proposer drafted, request by request
    assert all(sum(r.usage.drafted.values()) > 0 for r in long), [(r.speculation, r.usage) for r in long]
    assert all(r.speculation.reason != Reason.SHORT_OUTPUT for r in long)
    buckets = {k.batch_bucket for k, v in engine.stats.book.rows().items()
               if k.model == engine.model_key and k.schema_key == ITEMS[0].schema_name and k.series == Series.DRAFTED}
    assert buckets - {1}, buckets  # verified in a batch of several requests


def test_the_statistics_hold_acceptance_per_proposer_and_position(engine, loop, book):
    loop.run(engine.extract(request_for(ITEMS[0])))
    summaries = [s for s in summarize(book.rows(), 3600) if s.model == engine.model_key]
    ours = next(s for s in summaries if s.schema_key == ITEMS[0].schema_name)
    rows = [p for p in ours.proposers if p.proposer in ("ngram", "history")]
    assert rows and all(p.verifications > 0 for p in rows) and any(len(p.reached) >= 2 for p in rows)
    deep = max(rows, key=lambda p: len(p.reached))
    assert deep.reached[0] >= deep.reached[1] and deep.accepted_at[0] > 0  # reached falls with the position
    assert ours.passes_per_token < 0.8


def city_request() -> ExtractionRequest:
    return ExtractionRequest(schema=CITY, text=CITY_TEXT, schema_key="city", schema_speculation=SchemaSpeculation.ON,
                             sampling=SamplingParams(max_tokens=16, temperature=1.0))  # (short: drafts only when on)


def test_sampled_requests_draft_forced_tokens_only(engine, loop):
    out = loop.run(engine.extract(city_request()))
    assert out.speculation.reason == Reason.SAMPLED_ON_VLLM and out.usage.drafted == {}
    assert out.usage.forced_tokens > 0  # '{"city":"' is forced: drafted, verified, kept


def city_counts(engine, run, n: int) -> collections.Counter:
    async def many():
        return await asyncio.gather(*(engine.extract(city_request()) for _ in range(n)))

    out = run(many())
    assert all(r.outcome is Outcome.VALID for r in out)
    return collections.Counter(r.value["city"] for r in out)


N_SAMPLES = 240


@pytest.fixture(scope="module")
def plain_cities(demo_models, demo_compiler) -> collections.Counter:
    """Plain constrained sampling of the city: structspec's own engine, no drafts, no fast-forward, the same
    weights and grammar."""
    from structspec.assembly import AssemblyConfig, assemble_engine

    own = assemble_engine(demo_models, AssemblyConfig(compiler=demo_compiler, fast_forward=False,
                                                      limits=SchedulerLimits(max_batch=16)))
    own.start()
    try:
        plain = city_counts(own, asyncio.run, N_SAMPLES)
    finally:
        own.stop()
    assert len([c for c in plain if plain[c] >= 10]) >= 2, plain  # a distribution to test, not one value
    return plain


def drafted_cities(engine, loop) -> tuple[collections.Counter, int]:
    """The city sampled on vLLM with the proposer, and how many verifications the proposers' drafts got."""
    def verifications() -> int:
        return sum(v for k, v in engine.stats.book.rows().items()
                   if k.model == engine.model_key and k.schema_key == "city" and k.series == Series.VERIFICATIONS)

    before = verifications()
    counts = city_counts(engine, lambda c: loop.run(c, timeout=600), N_SAMPLES)
    return counts, verifications() - before


def test_sampled_outputs_keep_the_constrained_distribution(engine, loop, plain_cities):
    """As shipped (a sampled request drafts its forced tokens only), a two-sample chi-square test finds vLLM's
    sampled city distributed as plain constrained sampling. Power: the same test, given the proposers' drafts
    (below), rejects at p < 1e-20."""
    for _ in range(3):  # the schema's history: earlier outputs the proposers could draft from
        loop.run(engine.extract(city_request()))
    drafted, verifications = drafted_cities(engine, loop)
    assert verifications == 0  # forced tokens only: no proposer's draft was verified
    cities = sorted(set(plain_cities) | set(drafted))
    assert homogeneity_p(plain_cities, drafted, cities) > 0.001, (plain_cities, drafted)


# not strict: in a whole run of tests/vllm_engine it once came out within the chi-square bound (an XPASS), alone it
# fails as measured; the bug is vLLM's, so either outcome is reported and neither fails the run
@pytest.mark.xfail(strict=False, reason="measured: sampled requests with the proposers' drafts on vLLM 0.32's CPU build "
                   "come out far from plain constrained sampling (the drafted value over-accepted, p < 1e-20); "
                   "the front drafts forced tokens only for sampled requests (planning.SAMPLED_EXACT)")
def test_sampling_with_drafts_keeps_the_constrained_distribution(engine, loop, plain_cities, monkeypatch):
    """The chi-square test above with the proposers drafting sampled requests: vLLM's verification of
    structspec's drafts (one-hot: no probabilities, so a drafted token is kept with the target's probability and a
    rejected position resamples from the target with that token removed) should leave the distribution as it is."""
    from structspec.vllm_engine import planning

    monkeypatch.setattr(planning, "SAMPLED_EXACT", True)  # draft sampled requests, to test what that does
    for _ in range(3):  # the schema's history: earlier outputs to draft from
        loop.run(engine.extract(city_request()))
    drafted, verifications = drafted_cities(engine, loop)
    assert verifications > N_SAMPLES / 2  # drafts were verified (a test of nothing otherwise)
    cities = sorted(set(plain_cities) | set(drafted))
    assert homogeneity_p(plain_cities, drafted, cities) > 0.001, (plain_cities, drafted)


def homogeneity_p(a: collections.Counter, b: collections.Counter, cities: list[str]) -> float:
    """The p-value of Pearson's chi-square test that ``a`` and ``b`` are samples of one distribution over
    ``cities`` (a 2 x k contingency table; survival function of chi-square with k - 1 degrees of freedom)."""
    rows = [[a[c] for c in cities], [b[c] for c in cities]]
    n = sum(map(sum, rows))
    stat = 0.0
    for row in rows:
        for j, observed in enumerate(row):
            expected = sum(row) * (rows[0][j] + rows[1][j]) / n
            stat += (observed - expected) ** 2 / expected if expected else 0.0
    return chi2_sf(stat, len(cities) - 1)
