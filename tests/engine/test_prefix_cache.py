"""Prompt-prefix reuse: the cache's bookkeeping, and the engine's outputs with and without it."""

from __future__ import annotations

import random

from structspec.bench.workloads import build_workload
from structspec.engine.api import ExtractionRequest
from structspec.engine.core import run_until_idle
from structspec.engine.prefix_cache import PrefixCache, common_prefix
from structspec.engine.types import FinishReason, SamplingParams


def test_common_prefix_blocks_and_tail():
    rng = random.Random(0)
    a = [rng.randrange(50) for _ in range(300)]
    for n in (0, 1, 63, 64, 65, 200, 300):
        b = a[:n] + [999] + a[n + 1:]
        assert common_prefix(a, b) == min(n, 300)
    assert common_prefix(a, a[:130]) == 130
    assert common_prefix([], a) == 0


def test_lookup_prefers_longest_and_keeps_one_token_to_score():
    cache = PrefixCache(max_tokens=1000, min_tokens=4)
    base = list(range(100))
    assert cache.retain(1, base[:40]) == []
    assert cache.retain(2, base[:80]) == []
    hit = cache.lookup(base[:90] + [7], running=[])
    assert (hit.source_id, hit.tokens, hit.ready) == (2, 80, 80)
    hit = cache.lookup(base[:80], running=[])  # identical prompt: the last position is recomputed
    assert hit.tokens == 79
    running_hit = cache.lookup(base, running=[(9, base, 30)])  # a running sequence still prefilling
    assert (running_hit.source_id, running_hit.tokens, running_hit.ready) == (9, 99, 30)
    assert cache.lookup([500, 501, 502, 503, 504], running=[]) is None  # nothing shared
    assert cache.lookup(base[:3] + [999] * 10, running=[]) is None  # under min_tokens


def test_retain_is_lru_within_the_token_cap_and_dedupes():
    cache = PrefixCache(max_tokens=100, min_tokens=4)
    assert cache.retain(1, list(range(40))) == []
    assert cache.retain(2, list(range(100, 140))) == []
    cache.lookup(list(range(40)) + [1], running=[])  # touches 1: 2 is now the least recently used
    assert cache.retain(3, list(range(200, 240))) == [2]
    assert cache.tokens == 80 and len(cache) == 2
    assert cache.retain(4, list(range(40))) == [1]  # same prompt again: the newer copy replaces the older
    assert cache.retain(5, list(range(3))) == [5]  # too short to be worth keeping: freed at once
    assert cache.retain(6, list(range(101))) == [6]  # larger than the whole cache
    assert cache.evict() == 3 and cache.tokens == 40


def _requests(items):
    return [ExtractionRequest(schema=it.schema, text=it.source, schema_key=it.schema_name, examples=it.examples,
                              sampling=SamplingParams(max_tokens=120), request_id=f"r{i}")
            for i, it in enumerate(items)]


def test_engine_reuses_shared_prefix_with_identical_outputs(make_engine):
    """Few-shot prompts of one schema share a long prefix: later requests copy it, and greedy text is unchanged."""
    items = [it for it in build_workload("extraction", 40, few_shot=1) if it.schema_name == "contact"][:4]
    assert len(items) == 4
    plain = make_engine(prefix_cache_tokens=0)
    cached = make_engine(prefix_cache_tokens=4096)
    for engine in (plain, cached):
        run_until_idle(engine.core, [engine.prepare_extraction(r) for r in _requests(items[:1])])  # fills the cache
    together = [cached.prepare_extraction(r) for r in _requests(items[1:])]  # submitted at once: one waits for another
    run_until_idle(cached.core, together)
    alone = []
    for r in _requests(items[1:]):
        seq = plain.prepare_extraction(r)
        run_until_idle(plain.core, [seq])
        alone.append(seq)
    for a, b in zip(alone, together):
        assert b.finish is FinishReason.STOP and a.output == b.output
        assert a.usage.cached_prompt_tokens == 0
        assert b.usage.cached_prompt_tokens > len(b.prompt) // 2  # the instruction, schema and worked example
    assert cached.core.scheduler.prefix is not None and len(cached.core.scheduler.prefix) >= 1


def test_requests_arriving_together_prefill_the_shared_prefix_once(make_engine):
    items = [it for it in build_workload("extraction", 40, few_shot=1) if it.schema_name == "invoice"][:3]
    engine = make_engine(prefix_cache_tokens=4096, prefill_chunk=64)
    seqs = [engine.prepare_extraction(r) for r in _requests(items)]
    run_until_idle(engine.core, seqs)
    assert seqs[0].usage.cached_prompt_tokens == 0
    assert all(s.usage.cached_prompt_tokens > 64 for s in seqs[1:])  # waited for the first one's chunks
    plain = make_engine(prefix_cache_tokens=0, prefill_chunk=64)
    ref = [plain.prepare_extraction(r) for r in _requests(items)]
    run_until_idle(plain.core, ref)
    assert [(s.output, s.finish) for s in seqs] == [(s.output, s.finish) for s in ref]


def test_retained_prefixes_give_way_to_requests(make_engine):
    """Retained prompts are a cache: a request needing their memory evicts them instead of waiting."""
    items = build_workload("extraction", 3, few_shot=1)
    probe = make_engine()
    need = max(probe.core.scheduler.kv_need(len(probe.prepare_extraction(r).prompt), 120) for r in _requests(items))
    engine = make_engine(kv_budget_tokens=need + 10, prefix_cache_tokens=4096)
    for r in _requests(items):
        seq = engine.prepare_extraction(r)
        run_until_idle(engine.core, [seq])
        assert seq.finish is FinishReason.STOP
        assert engine.core.scheduler.reserved == 0
    assert engine.core.scheduler.prefix.tokens <= need + 10


def test_on_llama_cpp_the_pool_starts_at_twice_the_prefix_budget_and_a_stream_keeps_it(request):
    """A resize moves the whole cache (~0.25 s for Gemma at 4k cells): the engine starts llama.cpp's pool at what
    retained prompts and the requests copying them count, so a stream over cached prefixes runs in one context;
    never above the KV budget (a pool over it would stop admission)."""
    from structspec.assembly import assemble_engine
    from structspec.engine.config import SchedulerLimits

    models = request.getfixturevalue("demo_llamacpp_models")
    engine = assemble_engine(models, limits=SchedulerLimits(prefix_cache_tokens=2048))
    executor = engine.core.executor
    assert executor.cells == 4096
    context = executor._ctx
    items = build_workload("extraction", 8, few_shot=1)
    cached = 0
    for r in _requests(items):
        seq = engine.prepare_extraction(r)
        run_until_idle(engine.core, [seq])
        assert seq.finish is FinishReason.STOP
        cached += seq.usage.cached_prompt_tokens
    assert cached > 0  # prompts were reused
    assert executor._ctx == context and executor.cells == 4096
    assert engine.core.scheduler.prefix.tokens > 0
    small = assemble_engine(models, limits=SchedulerLimits(prefix_cache_tokens=2048, kv_budget_tokens=3000))
    assert small.core.executor.cells == 2048  # the power of two under the budget
