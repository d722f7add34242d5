"""structspec on vLLM, end to end on the demo target (vLLM's CPU build): the same outputs as structspec's own
engine, truncation, deadlines, refusals, tool calls, the statistics per position and batch bucket, a dead engine.

Skipped where vLLM is not installed (its environment is its own: README); ``STRUCTSPEC_REQUIRE_VLLM=1`` (``.ci/run``)
makes them fail instead. One engine serves the module (its start costs ~20 s); the last test kills it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import pytest

from tests.vllm_engine import need_vllm

need_vllm()

from structspec.bench.workloads import build_workload  # noqa: E402
from structspec.engine.api import ChatMessage, ExtractionRequest, ToolCallRequest  # noqa: E402
from structspec.engine.config import EngineConfig, SchedulerLimits, VllmOptions  # noqa: E402
from structspec.engine.types import (ContextTooLong, EngineStopped, FinishReason, Outcome,  # noqa: E402
                                     SamplingParams)
from structspec.grammar.base import SchemaError  # noqa: E402
from structspec.models.profiles import DEMO_DIR  # noqa: E402
from structspec.stats.book import StatsBook  # noqa: E402
from structspec.stats.counters import Series  # noqa: E402

ITEMS = build_workload("extraction", 4)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
    "additionalProperties": False}}}


class Loop:
    """An event loop on a thread of its own: vLLM's output handler lives in the loop that first used it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


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
    from structspec.vllm_engine.build import build_vllm_engine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    config = EngineConfig(profile=str(DEMO_DIR / "target"), dtype="float32", engine="vllm", speculation="policy",
                          limits=SchedulerLimits(max_batch=8),
                          vllm=VllmOptions(max_model_len=768, speculative_config=json.dumps(NGRAM),
                                           extra='{"enforce_eager": true}'))
    made = build_vllm_engine(config, book=book)

    async def start():
        made.start()

    loop.run(start())
    yield made
    made.close()


def request_for(item, **kw) -> ExtractionRequest:
    kw.setdefault("sampling", SamplingParams(max_tokens=200))
    return ExtractionRequest(schema=item.schema, text=item.source, schema_key=item.schema_name, **kw)


def test_greedy_extractions_are_valid_and_equal_to_the_own_engines(engine, loop, demo_models, demo_compiler):
    from structspec.assembly import AssemblyConfig, assemble_engine

    own = assemble_engine(demo_models, AssemblyConfig(compiler=demo_compiler))  # transformers, fp32, same weights
    own.start()
    try:
        pairs = [(loop.run(engine.extract(request_for(i))), asyncio.run(own.extract(request_for(i)))) for i in ITEMS]
    finally:
        own.stop()
    for theirs, ours in pairs:
        assert theirs.outcome is Outcome.VALID and theirs.finish_reason is FinishReason.STOP, theirs.text
        assert theirs.text == ours.text and theirs.token_ids == ours.token_ids
        assert theirs.model_key == engine.model_key and engine.model_key.endswith("+vllm:ngram")


def test_statistics_land_per_position_and_batch_bucket_under_the_vllm_key(engine, loop, book):
    loop.run(engine.extract(request_for(ITEMS[0])))
    rows = {k: v for k, v in book.rows().items() if k.model == engine.model_key}
    reached = {(k.schema_key, k.batch_bucket, k.label) for k in rows if k.series == Series.REACHED}
    assert (ITEMS[0].schema_name, 1, "1") in reached
    drafted = sum(v for k, v in rows.items() if k.series == Series.DRAFTED and k.proposer == "ngram")
    accepted = sum(v for k, v in rows.items() if k.series == Series.ACCEPTED and k.proposer == "ngram")
    assert drafted > 0 and 0 < accepted <= drafted
    assert any(k.series == Series.STEPS for k in rows)  # step times, from vLLM's per-step statistics


def test_concurrent_requests_are_recorded_at_their_batch_size(engine, loop, book):
    async def four():
        return await asyncio.gather(*(engine.extract(request_for(i)) for i in ITEMS))

    results = loop.run(four())
    assert all(r.outcome is Outcome.VALID for r in results)
    buckets = {k.batch_bucket for k in book.rows() if k.model == engine.model_key and k.series == Series.DRAFTED}
    assert buckets & {2, 4}, buckets


def test_an_output_cut_at_max_tokens_is_truncated(engine, loop):
    result = loop.run(engine.extract(request_for(ITEMS[1], sampling=SamplingParams(max_tokens=7))))
    assert result.finish_reason is FinishReason.LENGTH and result.outcome is Outcome.TRUNCATED
    assert result.value is None and len(result.token_ids) == 7


def test_a_deadline_cancels_the_vllm_request(engine, loop):
    result = loop.run(engine.extract(request_for(ITEMS[2], deadline=time.monotonic() + 0.05,
                                                 sampling=SamplingParams(max_tokens=400))))
    assert result.finish_reason is FinishReason.CANCELLED and result.outcome is not Outcome.VALID
    assert loop.run(engine.extract(request_for(ITEMS[2]))).outcome is Outcome.VALID  # the engine goes on


def test_a_prompt_over_the_context_is_refused_before_vllm(engine, loop):
    with pytest.raises(ContextTooLong):
        loop.run(engine.extract(ExtractionRequest(schema=ITEMS[0].schema, text="word " * 2000)))


def test_a_schema_structspec_refuses_is_refused_alike(engine, loop, demo_compiler):
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}
    with pytest.raises(SchemaError) as theirs:
        loop.run(engine.extract(ExtractionRequest(schema=bad, text="x")))
    with pytest.raises(SchemaError) as ours:
        demo_compiler.compile_schema(bad)  # what the own engine's pipeline raises
    assert str(theirs.value) == str(ours.value) and theirs.value.kind == ours.value.kind
    assert "/properties/a/$ref" in str(theirs.value)


def test_a_forced_tool_call_is_valid(engine, loop):
    out = loop.run(engine.call_tool(ToolCallRequest(messages=(ChatMessage("user", "Weather in Paris?"),),
                                                    tools=(WEATHER,), tool_choice="required",
                                                    sampling=SamplingParams(max_tokens=60))))
    assert out.result.outcome is Outcome.VALID, out.result.text
    assert [c.name for c in out.calls] == ["get_weather"] and isinstance(out.calls[0].arguments["city"], str)


def test_the_batch_size_rule_built_the_engine_from_the_book(engine):
    assert engine.schedule and engine.schedule[0][0] == 1 and engine.schedule[-1][1] == 8
    assert {b.reason for b in engine.lengths} == {"cold"}  # an empty book: every bucket measures


def test_tensor_parallel_2_gives_the_same_greedy_outputs(engine, loop, monkeypatch):
    """Two ranks (one core each, vLLM's CPU binding) against the module's engine (one rank, n-gram speculation on):
    the same greedy tokens."""
    from structspec.vllm_engine.build import build_vllm_engine

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    config = EngineConfig(profile=str(DEMO_DIR / "target"), dtype="float32", engine="vllm", speculation="off",
                          vllm=VllmOptions(max_model_len=768, tensor_parallel_size=2, extra='{"enforce_eager": true}'))
    two = build_vllm_engine(config)
    other = Loop()
    try:
        split = [other.run(two.extract(request_for(i))) for i in ITEMS[:3]]
    finally:
        two.close()
        other.close()
    whole = [loop.run(engine.extract(request_for(i))) for i in ITEMS[:3]]
    assert [r.token_ids for r in split] == [r.token_ids for r in whole]
    assert all(r.outcome is Outcome.VALID for r in split)


def test_a_dead_engine_core_fails_requests_and_tells_the_watchers(engine, loop):
    import psutil

    told = threading.Event()
    engine.watch_health(told.set)
    def names(p: psutil.Process) -> str:
        """A child's name and command line; "" for one already gone or a zombie (the tensor-parallel test's ranks
        can linger unreaped, and psutil raises on their command line)."""
        try:
            return p.name() + " " + " ".join(p.cmdline())
        except psutil.Error:
            return ""

    children = psutil.Process().children(recursive=True)
    cores = [p for p in children if "EngineCore" in names(p)]
    assert cores, [names(p) for p in children]
    for p in cores:
        p.send_signal(signal.SIGKILL)
    assert told.wait(30), "health watchers were not told"
    with pytest.raises(EngineStopped):
        loop.run(engine.extract(request_for(ITEMS[0])), timeout=30)
