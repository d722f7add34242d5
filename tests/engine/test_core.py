"""The decode loop on the demo models: finish reasons, reproducibility, fast-forward, scheduling, validity."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import replace

import pytest
import torch

from structspec.bench.workloads import build_workload
from structspec.engine.api import ChatMessage, ExtractionRequest, ToolCallRequest
from structspec.engine.core import run_until_idle
from structspec.engine.types import (ContextTooLong, FinishReason, InvalidRequest, OverBudget, Outcome, QueueFull,
                                     SamplingParams, SpeculationMode, TextDelta)
from structspec.schemas import load_builtin_schemas, load_builtin_tools
from tests.conftest import MASKBENCH

SCHEMAS = load_builtin_schemas()
ITEMS = build_workload("extraction", 6) + build_workload("freetext", 2)


def request_for(item, **kw) -> ExtractionRequest:
    kw.setdefault("sampling", SamplingParams(max_tokens=200))
    return ExtractionRequest(schema=item.schema, text=item.source, schema_key=item.schema_name, **kw)


def run(engine, *requests):
    seqs = [engine.prepare_extraction(r) for r in requests]
    run_until_idle(engine.core, seqs)
    return seqs


def test_greedy_extraction_matches_unconstrained_model_and_validates(make_engine, demo_models):
    """Where the model's own greedy output is already valid, masking must not change it (same text as HF generate)."""
    engine = make_engine()
    result = asyncio.run(_extract_started(engine, request_for(ITEMS[0])))
    assert result.finish_reason is FinishReason.STOP
    assert result.outcome is Outcome.VALID
    seq = engine.prepare_extraction(request_for(ITEMS[0]))
    with torch.no_grad():
        out = demo_models.target.generate(torch.tensor([seq.prompt]), max_new_tokens=200, do_sample=False,
                                          eos_token_id=engine.tokenizer.eos_token_id,
                                          pad_token_id=engine.tokenizer.eos_token_id)
    hf_text = engine.tokenizer.decode(out[0, len(seq.prompt):], skip_special_tokens=True)
    assert result.text == hf_text
    assert result.usage.output_tokens == len(result.token_ids) > 10
    assert 0 < result.usage.target_forward_passes < result.usage.output_tokens  # fast-forward saved passes
    assert result.usage.forced_tokens > 0


async def _extract_started(engine, request):
    engine.start()
    return await engine.extract(request)


def test_length_finish_is_truncated_not_complete(make_engine):
    engine = make_engine()
    engine.start()
    result = asyncio.run(engine.extract(request_for(ITEMS[1], sampling=SamplingParams(max_tokens=7))))
    assert result.finish_reason is FinishReason.LENGTH and result.truncated
    assert result.outcome is Outcome.TRUNCATED and result.value is None
    assert len(result.token_ids) == 7
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.text)


def test_fast_forward_on_off_identical_greedy(make_engine):
    engine = make_engine()
    on = run(engine, *[request_for(it) for it in ITEMS])
    off = run(engine, *[request_for(it, fast_forward=False) for it in ITEMS])
    for a, b in zip(on, off):
        assert a.output == b.output, (a.request_id, a.output, b.output)
        assert a.finish is b.finish is FinishReason.STOP
        assert a.usage.target_forward_passes < b.usage.target_forward_passes
        assert b.usage.forced_tokens == 0


def test_scoring_small_allowed_sets_alone_keeps_greedy_outputs(make_engine):
    """The executor may score only the ids a position allows (large vocabularies do): same greedy text."""
    full = run(make_engine(), *[request_for(it) for it in ITEMS])
    engine = make_engine()
    engine.core.executor.restricted_logits_max = 64  # the demo's 4k vocabulary would not use it by itself
    scored = {"restricted": 0}
    real_step = engine.core.executor.step

    def counting(inputs):
        scored["restricted"] += sum(1 for x in inputs for ids in (x.allowed or ()) if ids is not None)
        return real_step(inputs)

    engine.core.executor.step = counting
    restricted = run(engine, *[request_for(it) for it in ITEMS])
    assert scored["restricted"] > 0
    for a, b in zip(full, restricted):
        assert a.output == b.output, (a.request_id, a.output, b.output)


def test_batched_equals_one_at_a_time(make_engine):
    """Continuous batching (mixed prompt lengths, joins and leaves) does not change greedy outputs."""
    engine = make_engine(max_batch=4, prefill_chunk=32, step_tokens=64)
    together = run(engine, *[request_for(it) for it in ITEMS])
    alone = [run(engine, request_for(it))[0] for it in ITEMS]
    assert [s.output for s in together] == [s.output for s in alone]


def test_seeded_sampling_reproducible(make_engine):
    engine = make_engine()
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=120)
    a, b = run(engine, request_for(ITEMS[2], sampling=params), request_for(ITEMS[2], sampling=params))
    assert a.output == b.output
    # Another seed draws other noise: over a few seeds some output differs (a confident model may repeat one).
    others = run(engine, *[request_for(ITEMS[2], sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=s,
                                                                          max_tokens=120)) for s in (99, 7, 42, 2024)])
    assert any(c.output != a.output for c in others)


def test_cancel_frees_memory_at_once(make_engine):
    engine = make_engine()
    core = engine.core
    seq = engine.prepare_extraction(request_for(ITEMS[3]))
    core.submit(seq)
    for _ in range(3):
        core.step()
    assert core.executor.cached_tokens() > 0 and core.scheduler.reserved > 0
    core.abort(seq.key)
    core.step()
    assert seq.finish is FinishReason.CANCELLED
    assert core.executor.cached_tokens() == 0 and core.scheduler.reserved == 0 and not core.scheduler.running


def test_deadline_cancels(make_engine):
    engine = make_engine()
    seq = engine.prepare_extraction(request_for(ITEMS[0], deadline=time.monotonic() - 1))
    run_until_idle(engine.core, [seq])
    assert seq.finish is FinishReason.CANCELLED and seq.error == "deadline exceeded"


def test_full_queue_is_refused(make_engine):
    engine = make_engine(max_queue=2)
    engine.core.submit(engine.prepare_extraction(request_for(ITEMS[0])))
    engine.core.submit(engine.prepare_extraction(request_for(ITEMS[1])))
    with pytest.raises(QueueFull):
        engine.core.submit(engine.prepare_extraction(request_for(ITEMS[2])))


def test_kv_admission_waits_and_refuses(make_engine):
    probe = make_engine()
    big = [probe.prepare_extraction(request_for(it, sampling=SamplingParams(max_tokens=200))) for it in ITEMS[:3]]
    need = max(probe.core.scheduler.kv_need(len(s.prompt), 200) for s in big)
    engine = make_engine(kv_budget_tokens=need + 10)  # room for exactly one of them at a time
    for s in big:
        engine.core.submit(s)
    engine.core.step()
    assert len(engine.core.scheduler.running) == 1 and len(engine.core.scheduler.waiting) == 2  # the others wait for memory
    while any(s.finish is None for s in big):
        engine.core.step()
        assert len(engine.core.scheduler.running) <= 1
    assert all(s.finish is FinishReason.STOP for s in big)
    with pytest.raises(OverBudget):
        engine.core.submit(engine.prepare_extraction(request_for(ITEMS[0], sampling=SamplingParams(max_tokens=400))))


def test_context_and_parameter_errors(make_engine):
    engine = make_engine()
    with pytest.raises(ContextTooLong):
        engine.prepare_extraction(request_for(ITEMS[0], sampling=SamplingParams(max_tokens=1000)))
    with pytest.raises(InvalidRequest) as bad:
        engine.prepare_extraction(request_for(ITEMS[0], sampling=SamplingParams(top_p=0.0)))
    assert bad.value.field == "top_p"
    with pytest.raises(InvalidRequest):
        engine.prepare_extraction(ExtractionRequest(schema=SCHEMAS["invoice"], text="  "))


def test_model_failure_finishes_with_error_and_engine_survives(make_engine):
    engine = make_engine()
    real_step = engine.core.executor.step
    calls = {"n": 0}

    def flaky(inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated device failure")
        return real_step(inputs)

    engine.core.executor.step = flaky
    seq = run(engine, request_for(ITEMS[0]))[0]
    assert seq.finish is FinishReason.ERROR and "simulated device failure" in seq.error
    assert engine.core.executor.cached_tokens() == 0
    assert run(engine, request_for(ITEMS[0]))[0].finish is FinishReason.STOP


def test_an_input_the_model_refuses_ends_that_request_alone(make_engine):
    """Another request's failure is never yours: from the third forward on, one request of four sends a token the
    model does not have, once; it ends with ERROR, the forward runs again without it, and the three beside it give
    what they give without it."""
    alone = run(make_engine(max_batch=4), *[request_for(it) for it in ITEMS[:3]])
    engine = make_engine(max_batch=4)
    victim = engine.prepare_extraction(request_for(ITEMS[3]))
    others = [engine.prepare_extraction(request_for(it)) for it in ITEMS[:3]]
    executor = engine.core.executor
    real_step, calls = executor.step, {"n": 0, "corrupted": 0}

    def corrupting(inputs):
        calls["n"] += 1
        if calls["n"] >= 3 and not calls["corrupted"] and any(x.seq_id == victim.seq_id for x in inputs):
            calls["corrupted"] = len(inputs)
            inputs = [replace(x, tokens=[executor.vocab_size]) if x.seq_id == victim.seq_id else x for x in inputs]
        return real_step(inputs)

    executor.step = corrupting
    run_until_idle(engine.core, [others[0], victim, *others[1:]])
    assert calls["corrupted"] == 4  # beside the three others
    assert victim.finish is FinishReason.ERROR and victim.error.startswith("model input refused: token ids")
    assert [(s.finish, s.output) for s in others] == [(s.finish, s.output) for s in alone]
    assert not engine.core.scheduler.running and engine.core.scheduler.reserved == 0


async def _two_in_a_row(engine):
    """The same request twice, one after the other (each within a timeout: a hang fails the test)."""
    first = await asyncio.wait_for(engine.extract(request_for(ITEMS[0])), timeout=60)
    second = await asyncio.wait_for(engine.extract(request_for(ITEMS[0])), timeout=60)
    return first, second


def test_bug_after_the_forward_ends_the_request_with_error_not_a_hang(make_engine, monkeypatch):
    """An exception while committing a step (a bug, not the model) must finish the request, free its cache
    and leave the engine serving: before, the engine thread retried the same failing step forever."""
    import structspec.engine.core as core_module

    engine = make_engine()
    real_verify = core_module.verify
    calls = {"n": 0}

    def buggy(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise IndexError("simulated bug")
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(core_module, "verify", buggy)
    engine.start()

    first, second = asyncio.run(_two_in_a_row(engine))
    assert first.finish_reason is FinishReason.ERROR and "simulated bug" in first.error
    assert second.finish_reason is FinishReason.STOP and second.outcome is Outcome.VALID
    assert not engine.core.scheduler.running and engine.core.scheduler.reserved == 0  # the failed request's reservation is back


def test_a_failed_slot_allocation_ends_that_request_not_the_engine(make_engine, monkeypatch):
    """Growing the KV cache for a new sequence can fail (out of memory): that request ends with ERROR, its
    budget is not leaked and it is not left in no queue (before: popped, reserved, then lost: a hung RPC)."""
    engine = make_engine()
    executor = engine.core.executor
    real_new = executor.new_sequence
    calls = {"n": 0}

    def failing_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError("simulated out of memory")
        return real_new()

    monkeypatch.setattr(executor, "new_sequence", failing_once)
    engine.start()

    first, second = asyncio.run(_two_in_a_row(engine))
    assert first.finish_reason is FinishReason.ERROR and "out of memory" in first.error
    assert second.finish_reason is FinishReason.STOP and second.outcome is Outcome.VALID
    assert not engine.core.scheduler.running and not engine.core.scheduler.waiting and engine.core.scheduler.reserved == 0


async def _collect(engine, request):
    """A streamed extraction: (text deltas, final result)."""
    parts, final = [], None
    async for item in engine.extract_stream(request):
        if isinstance(item, TextDelta):
            parts.append(item.text)
        else:
            final = item
    return parts, final


def test_streaming_deltas_concatenate_to_final_text(make_engine):
    engine = make_engine()
    engine.start()

    parts, final = asyncio.run(_collect(engine, request_for(ITEMS[4])))
    assert len(parts) > 3 and "".join(parts) == final.text
    assert final.outcome is Outcome.VALID


def test_requests_sharing_a_request_id_stay_apart(make_engine):
    """Request ids come from callers (a retry may reuse one while the first attempt is being cancelled):
    two live requests under one id each stream their own text, and cancelling one leaves the other."""
    engine = make_engine()
    engine.start()

    def stream(item):
        return _collect(engine, request_for(item, request_id="same", sampling=SamplingParams(max_tokens=300)))

    async def both():
        doomed = asyncio.create_task(stream(ITEMS[5]))
        kept = asyncio.create_task(stream(ITEMS[4]))
        for _ in range(500):  # midway: once both decode (a fixed sleep can outlast a request on a fast executor)
            if sum(bool(s.output) for s in engine.core.scheduler.running) == 2:
                break
            await asyncio.sleep(0.002)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return await kept

    parts, final = asyncio.run(both())
    alone = asyncio.run(engine.extract(request_for(ITEMS[4], sampling=SamplingParams(max_tokens=300))))
    assert final.finish_reason is FinishReason.STOP and final.outcome is Outcome.VALID
    assert "".join(parts) == final.text == alone.text


def test_cancelling_the_awaiting_task_aborts(make_engine):
    engine = make_engine()
    engine.start()

    async def cancel_midway():
        task = asyncio.create_task(engine.extract(request_for(ITEMS[5], sampling=SamplingParams(max_tokens=300))))
        for _ in range(500):  # midway: once it decodes (a fixed sleep can outlast a request on a fast executor)
            if any(s.output for s in engine.core.scheduler.running):
                break
            await asyncio.sleep(0.002)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if not engine.core.scheduler.running:
                break
            await asyncio.sleep(0.02)

    asyncio.run(cancel_midway())
    assert not engine.core.scheduler.running and engine.core.executor.cached_tokens() == 0


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_builtin_schema_valid(make_engine, name):
    """Whatever the text, the output validates (the demo model sees an unrelated document here)."""
    engine = make_engine()
    seq = run(engine, ExtractionRequest(schema=SCHEMAS[name], text=ITEMS[0].source,
                                        sampling=SamplingParams(temperature=1.0, seed=5, max_tokens=300)))[0]
    assert seq.finish in (FinishReason.STOP, FinishReason.LENGTH)
    if seq.finish is FinishReason.STOP:
        from structspec.engine.postcheck import check_json_text

        text = engine.tokenizer.decode(seq.output)
        assert check_json_text(text, SCHEMAS[name], seq.grammar.info.post_check_keywords).outcome is Outcome.VALID


def _maskbench_sample(n: int) -> list[dict]:
    if not MASKBENCH.is_dir():
        pytest.skip(f"MaskBench data not found at {MASKBENCH}")
    files = sorted(p for p in MASKBENCH.glob("*.json") if p.name.startswith(("Github_easy", "Glaiveai2K", "JME")))
    return [json.loads(p.read_text())["schema"] for p in random.Random(0).sample(files, n)]


def test_maskbench_schemas_valid_with_demo_model(make_engine):
    """Real-world schemas the demo model never saw: a completed output validates; one cut by ``max_tokens``
    (the small model often runs on inside an unfamiliar string) comes back as truncated, never as a success."""
    from structspec.grammar.base import SchemaError

    engine = make_engine()

    async def run_all():
        engine.start()
        results = []
        for schema in _maskbench_sample(12):
            request = ExtractionRequest(schema=schema, text="Name: Ada Lovelace, born 1815.",
                                        sampling=SamplingParams(max_tokens=120))
            try:
                engine.prepare_extraction(request)
            except SchemaError:
                continue  # refused up front with a reason: fine
            results.append((schema, await engine.extract(request)))
        return results

    results = asyncio.run(run_all())
    assert len(results) >= 8
    for schema, result in results:
        assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), result.error
        if result.finish_reason is FinishReason.STOP:
            assert result.outcome in (Outcome.VALID, Outcome.SCHEMA_VIOLATION)
            if result.outcome is Outcome.VALID:
                import jsonschema

                jsonschema.validate(json.loads(result.text), schema)
        else:
            assert result.outcome is Outcome.TRUNCATED and result.value is None
            assert len(result.token_ids) == 120


def test_tool_call_required(make_engine):
    engine = make_engine()
    engine.start()
    item = build_workload("toolcall", 1)[0]
    out = asyncio.run(engine.call_tool(ToolCallRequest(messages=(ChatMessage("user", item.source),),
                                                       tools=item.tools, tool_choice="required",
                                                       sampling=SamplingParams(max_tokens=120),
                                                       speculation=SpeculationMode.OFF)))
    assert out.result.finish_reason is FinishReason.STOP and out.result.outcome is Outcome.VALID
    assert len(out.calls) == 1 and out.calls[0].name == item.truth["name"]
    import jsonschema

    params = {t["function"]["name"]: t["function"]["parameters"] for t in load_builtin_tools()}
    jsonschema.validate(out.calls[0].arguments, params[out.calls[0].name])


def test_tool_call_statistics_key_separates_the_tool_choice(make_engine):
    """A required or named call writes other text than an ``auto`` one: its statistics and schema history are
    kept apart; ``auto`` keeps the bare tool list's key."""
    from structspec.engine.api import ChatMessage, ToolCallRequest
    from structspec.grammar.cache import schema_digest
    from structspec.schemas import load_builtin_tools

    engine = make_engine()
    tools = tuple(load_builtin_tools()[:2])
    keys = {choice: engine.prepare_toolcall(ToolCallRequest(messages=(ChatMessage("user", "hi"),), tools=tools,
                                                            tool_choice=choice)).schema_key
            for choice in ("auto", "required", tools[0]["function"]["name"])}
    assert keys["auto"] == f"tools:{schema_digest({'tools': list(tools)})}"
    assert len(set(keys.values())) == 3


def test_tool_call_statistics_and_history_keys_separate_the_answer_schema(make_engine):
    """Tools with no answer schema, with S1 and with S2: three statistics keys and three histories, so S1's
    answers are never drafted into S2's requests."""
    from structspec.engine.api import ChatMessage, ToolCallRequest
    from structspec.schemas import load_builtin_tools
    from structspec.speculation.history import history_key

    engine = make_engine()
    tools = tuple(load_builtin_tools()[:2])
    s1 = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    s2 = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    seqs = [engine.prepare_toolcall(ToolCallRequest(messages=(ChatMessage("user", "hi"),), tools=tools,
                                                    answer_schema=s)) for s in (None, s1, s2)]
    assert len({s.schema_key for s in seqs}) == 3 and len({history_key(s) for s in seqs}) == 3
