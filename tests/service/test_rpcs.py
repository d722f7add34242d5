"""Every RPC against a real server (fake engine), through the real client."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from structspec.client import NO_RETRY, Client, ExtractionResult, NotFoundError, TextDelta
from structspec.schemas import load_builtin_schemas
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"name": "get_time", "description": "time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
]


def test_extract_by_id_and_inline(client: Client, engine: FakeEngine) -> None:
    invoice = client.extract("Invoice INV-1 from ACME", schema_id="invoice")
    assert set(invoice) >= {"invoice_number", "vendor", "line_items", "total"}
    sent = engine.requests[-1]
    assert sent.schema == load_builtin_schemas()["invoice"] and sent.schema_key == "invoice@1"
    value = client.extract("x", schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    assert value == {"n": 1}
    assert engine.requests[-1].schema_key.startswith("inline:")


def test_extract_result_fields(client: Client, engine: FakeEngine) -> None:
    r = client.extract_result(messages=[{"role": "system", "content": "be brief"}, ("user", "Ada, ada@example.com")],
                              schema_id="contact", version=1, temperature=0.5, top_p=0.9, top_k=5, seed=7, max_tokens=100,
                              speculation="off", disable_fast_forward=True, instruction="extract", request_id="req-1")
    sent = engine.requests[-1]
    assert sent.sampling.temperature == 0.5 and sent.sampling.top_p == 0.9 and sent.sampling.top_k == 5
    assert sent.sampling.seed == 7 and sent.sampling.max_tokens == 100
    assert sent.speculation.value == "off" and sent.fast_forward is False and sent.instruction == "extract"
    assert [m.role for m in sent.messages] == ["system", "user"]
    assert r.request_id == "req-1" == sent.request_id
    assert r.finish_reason == "stop" and r.outcome == "valid" and not r.truncated
    assert r.usage.output_tokens > 0 and r.usage.drafted["draft_model"] == r.usage.output_tokens
    assert r.usage.target_forward_passes > 0 and r.timings.total_ms >= 0
    assert r.schema_key == "contact@1" and json.loads(r.json) == r.value


def test_defaults_when_sampling_unset(client: Client, engine: FakeEngine) -> None:
    client.extract("x", schema_id="contact")
    s = engine.requests[-1].sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_tokens) == (0.0, 1.0, 0, None, 256)
    assert engine.requests[-1].speculation.value == "auto" and engine.requests[-1].fast_forward


def test_struct_and_value_in_proto(served: ServerThread) -> None:
    from structspec.proto_gen.v1 import structspec_pb2 as pb
    from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc

    with grpc.insecure_channel(served.target) as ch:
        stub = pb_grpc.StructSpecStub(ch)
        obj = stub.Extract(pb.ExtractRequest(schema_ref=pb.SchemaRef(schema_id="contact"), text="x")).result
        assert obj.WhichOneof("parsed") == "object" and obj.object["email"] == "ada@example.com"
        arr = stub.Extract(pb.ExtractRequest(json_schema='{"type": "array", "items": {"type": "integer"}}', text="x")).result
        assert arr.WhichOneof("parsed") == "value" and arr.value.list_value.values[0].number_value == 1
        assert arr.finish_reason == pb.FINISH_REASON_STOP and arr.outcome == pb.OUTCOME_VALID


def test_stream_deltas_then_result(client: Client) -> None:
    items = list(client.extract_stream("Ada", schema_id="contact"))
    deltas = [i for i in items if isinstance(i, TextDelta)]
    assert len(deltas) >= 3 and isinstance(items[-1], ExtractionResult)
    assert "".join(d.text for d in deltas) == items[-1].json


def test_call_tool(client: Client, engine: FakeEngine) -> None:
    msgs = [{"role": "user", "content": "weather in Oslo?"}]
    r = client.call_tool(msgs, TOOLS)
    assert [c.name for c in r.calls] == ["get_weather"] and r.calls[0].arguments == {"city": "text"}
    sent = engine.requests[-1]
    assert sent.tool_choice == "auto" and sent.tools[1]["function"]["name"] == "get_time"
    r = client.call_tool(msgs, TOOLS, tool_choice="get_time")
    assert [c.name for c in r.calls] == ["get_time"]
    r = client.call_tool(msgs, TOOLS, parallel=True, tool_choice="required")
    assert [c.name for c in r.calls] == ["get_weather", "get_time"] and engine.requests[-1].parallel_calls
    r = client.call_tool(msgs, TOOLS, tool_choice="none")
    assert r.calls == [] and r.text and r.outcome == "text"


def test_registry_rpcs(tmp_path: Path) -> None:
    with ServerThread(settings_for(tmp_path), FakeEngine()) as st, Client(st.target, retry=NO_RETRY) as c:
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        v1 = c.register_schema("custom", schema, description="first")
        assert (v1.version, v1.created, v1.source, v1.description) == (1, True, "api", "first")
        same = c.register_schema("custom", {"properties": {"a": {"type": "string"}}, "type": "object"})  # key order differs
        assert (same.version, same.created, same.sha256) == (1, False, v1.sha256)
        v2 = c.register_schema("custom", {**schema, "required": ["a"]})
        assert (v2.version, v2.created) == (2, True)
        assert c.get_schema("custom").version == 2 and c.get_schema("custom", 1).schema == schema
        assert [s.version for s in c.list_schemas("custom", all_versions=True)] == [1, 2]
        latest = {s.schema_id: s.version for s in c.list_schemas()}
        assert latest["custom"] == 2 and latest["invoice"] == 1
        assert all(s.schema is None for s in c.list_schemas(omit_content=True))
        assert c.extract("x", schema_id="custom", version=1) == {"a": "text"}
        assert c.delete_schema("custom", 1) == [1]
        v3 = c.register_schema("custom", schema)  # deleted versions are never reused
        assert v3.version == 3
        assert c.delete_schema("custom") == [2, 3]
        assert "custom" not in {s.schema_id for s in c.list_schemas()}


def test_registry_persists_across_restart(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with ServerThread(settings, FakeEngine()) as st, Client(st.target, retry=NO_RETRY) as c:
        c.register_schema("mine", {"type": "object"})
        c.register_schema("mine", {"type": "object", "title": "v2"})
        before = {s.key: s.sha256 for s in c.list_schemas(all_versions=True)}
    with ServerThread(settings, FakeEngine()) as st, Client(st.target, retry=NO_RETRY) as c:
        after = {s.key: s.sha256 for s in c.list_schemas(all_versions=True)}
        assert after == before and "mine@2" in after and "invoice@1" in after  # built-ins: same content, same version
    changed = dict(load_builtin_schemas())
    changed["invoice"] = {**changed["invoice"], "title": "Invoice v2"}
    with ServerThread(settings, FakeEngine(), builtin_schemas=changed) as st, Client(st.target, retry=NO_RETRY) as c:
        assert c.get_schema("invoice").version == 2 and c.get_schema("invoice", 1).schema["title"] == "Invoice"


def test_schema_stats(served: ServerThread, client: Client) -> None:
    store = served.server.store  # type: ignore[union-attr]
    now = time.time()
    store.record_acceptance("invoice@1", "draft_model", 4, 10, 7, now)
    store.record_acceptance("invoice@1", "draft_model", 4, 10, 5, now)
    store.record_acceptance("invoice@1", "ngram", 1, 4, 4, now - 2000)
    store.record_acceptance("contact@1", "draft_model", 1, 8, 2, now)
    stats = client.get_schema_stats("invoice", windows=[600, 3600])
    assert stats.schema_key == "invoice@1"
    short = {(p.proposer, p.batch_bucket): p for p in stats.windows[600]}
    assert set(short) == {("draft_model", 4)}
    p = short[("draft_model", 4)]
    assert (p.drafted, p.accepted, p.events) == (20, 12, 2) and p.acceptance_rate == pytest.approx(0.6)
    assert {(p.proposer, p.batch_bucket) for p in stats.windows[3600]} == {("draft_model", 4), ("ngram", 1)}
    assert client.get_schema_stats(schema_key="contact@1").windows[86400][0].accepted == 2
    assert sorted(s.schema_key for s in client.list_schema_stats()) == ["contact@1", "invoice@1"]
    empty = client.get_schema_stats("event")
    assert list(empty.windows) == [300, 3600, 86400] and all(not rows for rows in empty.windows.values())


def test_health_reflection_and_metrics(tmp_path: Path) -> None:
    with ServerThread(settings_for(tmp_path, metrics_port=0), FakeEngine()) as st, Client(st.target, retry=NO_RETRY) as c:
        assert c.health() == "SERVING" and c.health("structspec.v1.StructSpec") == "SERVING"
        c.extract("x", schema_id="contact")
        with pytest.raises(NotFoundError):
            c.extract("x", schema_id="nope")
        assert list(c.extract_stream("x", schema_id="contact"))[-1].value  # read to the end: an OK, not a cancel
        with grpc.insecure_channel(st.target) as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            resp = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
            names = {s.name for s in resp.list_services_response.service}
            assert {"structspec.v1.StructSpec", "grpc.health.v1.Health"} <= names
        body = urllib.request.urlopen(f"http://127.0.0.1:{st.server.metrics_port}/metrics", timeout=5).read().decode()  # type: ignore[union-attr]
        assert 'structspec_requests_total{code="OK",finish_reason="stop",rpc="Extract"} 1.0' in body
        assert 'structspec_requests_total{code="NOT_FOUND",finish_reason="",rpc="Extract"} 1.0' in body
        assert 'structspec_requests_total{code="OK",finish_reason="stop",rpc="ExtractStream"} 1.0' in body, body
        assert 'code="CANCELLED"' not in body
        for name in ("structspec_request_latency_seconds_bucket", "structspec_output_tokens_total", "structspec_queue_depth",
                     "structspec_running_batch_size", "structspec_target_forward_passes_per_token_bucket", "structspec_drafted_tokens_total"):
            assert name in body, name
        assert "structspec_serving 1.0" in body


def test_not_serving_while_engine_loads(tmp_path: Path) -> None:
    from structspec.client import UnavailableError

    with ServerThread(settings_for(tmp_path), None) as st, Client(st.target, retry=NO_RETRY) as c:
        assert c.health() == "NOT_SERVING"
        with pytest.raises(UnavailableError) as err:
            c.extract("x", schema_id="contact")
        assert err.value.reason == "MODEL_LOADING"
        assert c.list_schemas()  # the registry works while the model loads

        def slow_factory(settings: object) -> FakeEngine:
            time.sleep(0.5)
            return FakeEngine()

        future = __import__("asyncio").run_coroutine_threadsafe(st.server.load_engine(slow_factory), st.loop)  # type: ignore[union-attr]
        time.sleep(0.2)
        assert c.health() == "NOT_SERVING"
        future.result(10)
        assert c.health() == "SERVING"
        assert c.extract("x", schema_id="contact")


def test_engine_factory_gets_the_store_and_stats_flow(tmp_path: Path) -> None:
    from tests.service.fakes import make_fake_engine

    with ServerThread(settings_for(tmp_path), None) as st, Client(st.target, retry=NO_RETRY) as c:
        engine = st.run(st.server.load_engine(make_fake_engine))  # type: ignore[union-attr]
        assert engine.store is st.server.store  # type: ignore[union-attr]
        c.extract("x", schema_id="contact")
        c.extract("x", schema_id="contact")
        (row,) = c.get_schema_stats("contact", windows=[60]).windows[60]
        assert row.proposer == "draft_model" and row.events == 2 and row.drafted > row.accepted > 0


def test_a_stream_read_to_its_result_counts_as_ok_even_if_the_client_then_hangs_up(tmp_path: Path) -> None:
    """A client that takes the final message and cancels at once (as a client that stops reading would)
    ended a finished stream as CANCELLED in the metrics and the log; it is a success."""
    from structspec.proto_gen.v1 import structspec_pb2 as pb
    from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc

    with ServerThread(settings_for(tmp_path, metrics_port=0), FakeEngine()) as st:
        with grpc.insecure_channel(st.target) as ch:
            stub = pb_grpc.StructSpecStub(ch)
            for _ in range(8):
                call = stub.ExtractStream(pb.ExtractRequest(text="x", schema_ref=pb.SchemaRef(schema_id="contact")))
                for resp in call:
                    if resp.HasField("result"):
                        call.cancel()  # hang up the moment the result is in
                        break
        url = f"http://127.0.0.1:{st.server.metrics_port}/metrics"  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            if 'code="OK",finish_reason="stop",rpc="ExtractStream"} 8.0' in body:
                break
            time.sleep(0.05)
        assert 'structspec_requests_total{code="OK",finish_reason="stop",rpc="ExtractStream"} 8.0' in body, body
