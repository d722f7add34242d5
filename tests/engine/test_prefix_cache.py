"""Prompt-prefix reuse: the cache's bookkeeping, and the engine's outputs with and without it."""

from __future__ import annotations

import random

from structspec.bench.workloads import build_workload
from structspec.engine.api import ExtractionRequest
from structspec.engine.core import run_until_idle
from structspec.engine.prefix_cache import PrefixCache, PromptOwner, common_prefix
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
    assert cache.retain(1, base[:40] + [900] * 5) == []
    assert cache.retain(2, base[:80]) == []
    hit = cache.lookup(base[:90] + [7], running=[])
    assert (hit.source_id, hit.tokens, hit.ready) == (2, 80, 80)
    hit = cache.lookup(base[:80], running=[])  # identical prompt: the last position is recomputed
    assert hit.tokens == 79
    running_hit = cache.lookup(base, running=[(9, base, 30, PromptOwner())])  # a running sequence still prefilling
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


def test_a_retained_sequence_replaces_the_ones_of_its_tenant_it_extends():
    """A conversation's turns: each retained turn starts with the last one, which then serves nothing more: it is
    dropped (its slot freed), unless it is another tenant's or shares more with other tenants (a longer public
    part)."""
    turn1, turn2 = list(range(40)), list(range(40)) + list(range(500, 530))
    cache = PrefixCache(max_tokens=1000, min_tokens=4)
    assert cache.retain(1, turn1, PromptOwner("t:alice")) == []
    assert cache.retain(2, turn1, PromptOwner("t:bob")) == []
    assert cache.retain(3, turn2, PromptOwner("t:alice")) == [1]  # bob's copy stays his
    assert cache.tokens == 110 and len(cache) == 2
    assert cache.lookup(turn2 + [7], running=[], tenant="t:alice").tokens == 70
    public = PrefixCache(max_tokens=1000, min_tokens=4)
    assert public.retain(1, turn1, PromptOwner("t:alice", public=30)) == []
    assert public.retain(2, turn2, PromptOwner("t:alice", public=0)) == []  # 1 still gives other tenants 30
    assert public.lookup(turn1 + [7], running=[], tenant="t:bob").source_id == 1
    assert public.retain(3, turn2 + [1, 2], PromptOwner("t:alice", public=0)) == [2]


def test_another_tenants_prompt_is_reused_only_as_far_as_its_public_part():
    """A cached prompt's owner is a tenant: another tenant matches it only as far as its public part (a registered
    schema's template), retained or running; its own tenant in full."""
    template, doc = list(range(30)), list(range(100, 140))
    alice = PromptOwner("t:alice", public=30)
    guess = template + doc[:30] + [7]  # bob's prompt runs 30 tokens on into alice's document
    cache = PrefixCache(max_tokens=1000, min_tokens=4)
    assert cache.retain(1, template + doc, alice) == []
    assert cache.lookup(guess, running=[], tenant="t:bob").tokens == 30
    assert cache.lookup(guess, running=[], tenant="t:alice").tokens == 60
    running = [(9, template + doc, 70, alice)]
    hit = PrefixCache(max_tokens=1000, min_tokens=4).lookup(guess, running, tenant="t:bob")
    assert (hit.source_id, hit.tokens, hit.ready) == (9, 30, 30)
    private = PrefixCache(max_tokens=1000, min_tokens=4)  # nothing public (an inline schema, a tool list)
    private.retain(1, template + doc, PromptOwner("t:alice"))
    assert private.lookup(guess, running=[], tenant="t:bob") is None
    assert private.lookup(guess, running=[], tenant="t:alice").tokens == 60
    one = PrefixCache(max_tokens=1000, min_tokens=4)  # no tokens configured: one tenant, everything shared
    one.retain(1, template + doc)
    assert one.lookup(guess, running=[]).tokens == 60
    # bob's own longer prompt beats the public part of alice's
    assert cache.retain(2, template + doc[:20], PromptOwner("t:bob", public=30)) == []
    assert cache.lookup(guess, running=[], tenant="t:bob").source_id == 2
    # the same prompt of another tenant does not replace alice's copy (that would tell her it was sent again);
    # it replaces bob's own shorter one, which it extends
    assert cache.retain(3, template + doc, PromptOwner("t:bob", public=30)) == [2] and len(cache) == 2
    assert cache.lookup(guess, running=[], tenant="t:alice").source_id == 1


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
    from structspec.assembly import AssemblyConfig, assemble_engine
    from structspec.engine.config import SchedulerLimits

    models = request.getfixturevalue("demo_llamacpp_models")
    engine = assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(prefix_cache_tokens=2048)))
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
    small = assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(prefix_cache_tokens=2048,
                                                                          kv_budget_tokens=3000)))
    assert small.core.executor.cells == 2048  # the power of two under the budget


def _contact_engine(demo_models, demo_compiler, **limits):
    """An engine adding the server's worked examples (a long public template) to requests for built-in schemas."""
    from structspec.assembly import AssemblyConfig, assemble_engine
    from structspec.engine.config import SchedulerLimits
    from structspec.engine.default_examples import build_example_book

    return assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(**limits), compiler=demo_compiler,
                           examples=build_example_book(1)))


def _tenant_request(text: str, tenant: str, max_tokens: int = 12) -> ExtractionRequest:
    from structspec.schemas import load_builtin_schemas

    return ExtractionRequest(schema=load_builtin_schemas()["contact"], text=text, schema_key="contact@1",
                             tenant=tenant, public_template=True, sampling=SamplingParams(max_tokens=max_tokens),
                             request_id=f"{tenant}-{len(text)}")


def _document_and_guess():
    """A contact document, and another that starts like it: a guess of its first three quarters."""
    doc = next(it.source for it in build_workload("extraction", 40) if it.schema_name == "contact")
    return doc, doc[: 3 * len(doc) // 4] + " Ignore the rest."


def _public_template(engine, seq) -> int:
    """Leading prompt tokens that decode to part of the template (the server's example, the schema's title)."""
    from structspec.prompts import extraction_template

    template = extraction_template(seq.schema, None, engine.examples.for_schema(seq.schema))
    start = n = int(engine.tokenizer.bos_token_id is not None)
    while n < len(seq.prompt) and template.startswith(engine.tokenizer.decode(seq.prompt[start:n + 1])):
        n += 1
    return n


def test_a_tenant_reuses_another_tenants_retained_prompt_only_up_to_the_template(demo_models, demo_compiler):
    engine = _contact_engine(demo_models, demo_compiler, prefix_cache_tokens=4096)
    doc, guess = _document_and_guess()
    alice = engine.prepare_extraction(_tenant_request(doc, "t:alice"))
    run_until_idle(engine.core, [alice])
    template = _public_template(engine, alice)
    assert template > 50 and alice.public_prefix == template
    bob = engine.prepare_extraction(_tenant_request(guess, "t:bob", max_tokens=4))
    assert common_prefix(bob.prompt, alice.prompt) > template + 20  # the guess runs on into alice's document
    run_until_idle(engine.core, [bob])
    assert bob.usage.cached_prompt_tokens == template  # the template, nothing of her document
    again = engine.prepare_extraction(_tenant_request(guess, "t:alice", max_tokens=4))
    run_until_idle(engine.core, [again])
    assert again.usage.cached_prompt_tokens == common_prefix(again.prompt, alice.prompt)  # her own, in full


def test_a_tenant_copies_only_the_template_from_another_tenants_running_prompt(demo_models, demo_compiler):
    """Submitted together: bob waits for alice's prefill of the template, copies it and computes the rest; greedy
    outputs are those of an engine without prefix caching."""
    doc, guess = _document_and_guess()
    engine = _contact_engine(demo_models, demo_compiler, prefix_cache_tokens=4096, prefill_chunk=32)
    alice = engine.prepare_extraction(_tenant_request(doc, "t:alice"))
    bob = engine.prepare_extraction(_tenant_request(guess, "t:bob"))
    run_until_idle(engine.core, [alice, bob])
    assert alice.usage.cached_prompt_tokens == 0
    assert bob.usage.cached_prompt_tokens == alice.public_prefix > 50
    plain = _contact_engine(demo_models, demo_compiler, prefix_cache_tokens=0)
    ref = [plain.prepare_extraction(_tenant_request(t, "")) for t in (doc, guess)]
    run_until_idle(plain.core, ref)
    assert [(s.output, s.finish) for s in (alice, bob)] == [(s.output, s.finish) for s in ref]


def test_a_private_template_is_not_shared_across_tenants(demo_models, demo_compiler):
    """An inline schema (not public): its title and examples are the caller's, so nothing is shared; a request
    that brings its own instruction neither."""
    from dataclasses import replace

    engine = _contact_engine(demo_models, demo_compiler, prefix_cache_tokens=4096)
    doc, guess = _document_and_guess()
    run_until_idle(engine.core, [engine.prepare_extraction(replace(_tenant_request(doc, "t:alice"),
                                                                   public_template=False))])
    bob = engine.prepare_extraction(replace(_tenant_request(guess, "t:bob"), public_template=False))
    run_until_idle(engine.core, [bob])
    assert bob.public_prefix == 0 and bob.usage.cached_prompt_tokens == 0
    told = engine.prepare_extraction(replace(_tenant_request(guess, "t:carol"), instruction="Names in full."))
    assert told.public_prefix == 0


def test_a_request_the_grammar_answers_alone_evaluates_no_prompt(demo_models, demo_compiler):
    """``max_tokens`` within the grammar's opening forced tokens (1: the ``{``): the answer is known at admission,
    so the request ends there with no forward pass: it reuses nothing because it computes nothing (cached 0 is
    true), and it leaves the retained prompts as they were."""
    engine = _contact_engine(demo_models, demo_compiler, prefix_cache_tokens=4096)
    doc, _ = _document_and_guess()
    first = engine.prepare_extraction(_tenant_request(doc, "t:alice"))
    run_until_idle(engine.core, [first])
    retained = engine.core.scheduler.prefix.tokens
    one = engine.prepare_extraction(_tenant_request(doc, "t:alice", max_tokens=1))
    run_until_idle(engine.core, [one])
    assert one.finish is FinishReason.LENGTH and one.output == first.output[:1]
    assert (one.usage.target_forward_passes, one.usage.cached_prompt_tokens, one.usage.forced_tokens) == (0, 0, 1)
    assert engine.core.scheduler.prefix.tokens == retained
