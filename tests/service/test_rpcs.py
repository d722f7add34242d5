"""Every RPC against a real server (fake engine), through the real client."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from structspec.client import NO_RETRY, Client, ExtractionResult, NotFoundError, SpeculationReport, TextDelta
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
    assert r.usage.output_tokens > 0 and r.usage.drafted == {}  # speculation off: nothing drafted
    assert r.usage.target_forward_passes == r.usage.output_tokens and r.timings.total_ms >= 0
    assert r.speculation is not None and (r.speculation.drafted, r.speculation.reason) == (False, "request_off")
    assert client.extract_result("x", schema_id="contact").usage.drafted["draft_model"] > 0
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


def record_two_models(served: ServerThread) -> None:
    """Counters of the server's model ("fake") and of another sharing the store, and one of 3 hours ago."""
    book = served.server.store.stats  # type: ignore[union-attr]
    fake, other = book.recorder("fake"), book.recorder("other")
    fake.record_verification("invoice@1", "draft_model", 3, 10, 7, probe=False)
    fake.record_verification("invoice@1", "draft_model", 3, 10, 5, probe=False)
    fake.record_verification("invoice@1", "ngram", 1, 4, 4, probe=True)
    fake.record_request("invoice@1", 40, 25, 10, "stop", 120.0)
    fake.record_request("invoice@1", 8, 8, 0, "length", 30.0)
    fake.record_decision("invoice@1", "drafted", {"draft_model": "drafted", "ngram": "probe"})
    fake.record_decision("invoice@1", "short_output", {"draft_model": "short_output", "ngram": "short_output"})
    other.record_verification("invoice@1", "draft_model", 1, 8, 2, probe=False)
    other.record_request("contact@1", 12, 12, 0, "stop", 50.0)
    clock = book.clock
    book.clock = lambda: time.time() - 3 * 3600
    try:
        fake.record_verification("invoice@1", "ngram", 1, 6, 0, probe=False)
    finally:
        book.clock = clock


def test_schema_stats(served: ServerThread, client: Client) -> None:
    from structspec.stats.counters import LENGTH_BOUNDS

    record_two_models(served)
    stats = client.get_schema_stats("invoice", windows=[60, 86400])
    assert (stats.model, stats.schema_key, list(stats.windows)) == ("fake", "invoice@1", [60, 86400])  # the server's model
    short = stats.windows[60]
    rows = {(p.proposer, p.batch_bucket): p for p in short.proposers}
    assert set(rows) == {("draft_model", 4), ("ngram", 1)}
    p = rows[("draft_model", 4)]
    assert (p.drafted, p.accepted, p.events, p.probe_verifications) == (20, 12, 2, 0) and p.acceptance_rate == pytest.approx(0.6)
    # 7 of 10 accepted examines 8 positions, 5 of 10 examines 6
    assert p.reached == [2, 2, 2, 2, 2, 2, 1, 1] and p.accepted_at == [2, 2, 2, 2, 2, 1, 1, 0]
    assert p.acceptance_by_position == pytest.approx([1, 1, 1, 1, 1, 0.5, 1, 0])
    assert (rows[("ngram", 1)].events, rows[("ngram", 1)].probe_verifications) == (1, 1)
    assert (short.requests, short.output_tokens, short.target_passes, short.forced_tokens) == (2, 48, 33, 10)
    assert short.finish_reasons == {"stop": 1, "length": 1} and short.passes_per_token == pytest.approx(33 / 48)
    assert 0 < short.output_tokens_p50 <= short.output_tokens_p95 <= 48
    assert short.latency_ms_mean == pytest.approx(75) and 0 < short.latency_ms_p50 <= short.latency_ms_p99
    assert [b.upper_bound for b in short.output_length] == list(LENGTH_BOUNDS)  # every bucket, the last infinite
    # the "stop" one (40 tokens) and the truncated one (8: a long output all the same, here cut at its max_tokens)
    assert [(b.upper_bound, b.count) for b in short.output_length if b.count] == [(8, 1), (48, 1)]
    assert sum(b.count for b in short.latency_ms) == 2
    assert [(d.proposer, d.reason, d.requests) for d in short.decisions] == [
        ("", "drafted", 1), ("", "short_output", 1), ("draft_model", "drafted", 1), ("draft_model", "short_output", 1),
        ("ngram", "probe", 1), ("ngram", "short_output", 1)]
    day = {(p.proposer, p.batch_bucket): p for p in stats.windows[86400].proposers}
    assert (day[("ngram", 1)].events, day[("ngram", 1)].drafted) == (2, 10)  # three hours ago counts in the day only

    theirs = client.get_schema_stats(schema_key="invoice@1", model="other", windows=[60])
    assert theirs.model == "other" and [(p.proposer, p.drafted) for p in theirs.windows[60].proposers] == [("draft_model", 8)]
    assert theirs.windows[60].requests == 0
    assert [(s.model, s.schema_key) for s in client.list_schema_stats()] == [
        ("fake", "invoice@1"), ("other", "contact@1"), ("other", "invoice@1")]  # sorted by model, then key
    listed = {(s.model, s.schema_key): s for s in client.list_schema_stats([60])}
    assert listed[("other", "contact@1")].windows[60].requests == 1
    assert listed[("fake", "invoice@1")].windows[60] == short
    assert [(s.model, s.schema_key) for s in client.list_schema_stats(model="other")] == [
        ("other", "contact@1"), ("other", "invoice@1")]
    assert client.list_schema_stats(model="nobody") == []
    empty = client.get_schema_stats("event")
    assert empty.model == "fake" and list(empty.windows) == [3600, 86400, 604800]
    assert all(not w.proposers and not w.requests and not w.output_length for w in empty.windows.values())


def test_set_schema_speculation(tmp_path: Path) -> None:
    from structspec.client import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError
    from structspec.client.errors import error_from_rpc
    from structspec.proto_gen.v1 import structspec_pb2 as pb
    from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc
    from structspec.service.settings import Secret

    engine = FakeEngine()
    settings = settings_for(tmp_path, auth_token=Secret("user-tok"), admin_token=Secret("admin-tok"))
    with ServerThread(settings, engine) as st, Client(st.target, token="user-tok", retry=NO_RETRY) as user, \
            Client(st.target, token="user-tok", admin_token="admin-tok", retry=NO_RETRY) as admin:
        with pytest.raises(PermissionDeniedError):
            user.set_schema_speculation("contact", "off")  # an admin write
        with Client(st.target, retry=NO_RETRY) as anonymous, pytest.raises(UnauthenticatedError):
            anonymous.set_schema_speculation("contact", "off")
        r = admin.extract_result("x", schema_id="contact")
        assert r.speculation is not None and (r.speculation.drafted, r.speculation.reason) == (True, "drafted")
        assert engine.last_request.schema_speculation.value == "auto"

        info = admin.set_schema_speculation("contact", "off")
        assert (info.schema_id, info.version, info.speculation) == ("contact", 1, "off")
        assert user.get_schema("contact").speculation == "off"
        r = user.extract_result("x", schema_id="contact")
        assert engine.last_request.schema_speculation.value == "off"  # the override reaches the engine's request
        assert r.speculation is not None and (r.speculation.drafted, r.speculation.reason) == (False, "schema_off")
        assert r.speculation.reasons == {"draft_model": "schema_off"} and r.usage.drafted == {}
        items = list(user.extract_stream("x", schema_id="contact"))
        assert engine.last_request.schema_speculation.value == "off" and items[-1].speculation.reason == "schema_off"

        assert admin.set_schema_speculation("contact", "on", version=1).speculation == "on"
        r = user.extract_result("x", schema_id="contact")
        assert r.speculation.reason == "schema_on" and r.speculation.max_draft == {"draft_model": 8}  # type: ignore[union-attr]
        user.extract("x", schema={"type": "object"})  # an inline schema has no owner: AUTO
        assert engine.last_request.schema_speculation.value == "auto"
        r = user.extract_result("x", schema_id="contact", speculation="off")  # the request's own OFF still wins
        assert r.speculation.reason == "request_off"  # type: ignore[union-attr]
        admin.register_schema("contact", {"type": "object", "title": "v2"})  # the latest is a version of its own
        assert admin.set_schema_speculation("contact", "off").version == 2
        assert user.get_schema("contact", 1).speculation == "on"

        with grpc.insecure_channel(st.target) as ch:  # the client never sends UNSPECIFIED: the raw stub does
            stub = pb_grpc.StructSpecStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                stub.SetSchemaSpeculation(pb.SetSchemaSpeculationRequest(schema_ref=pb.SchemaRef(schema_id="contact")),
                                          metadata=(("authorization", "Bearer admin-tok"),))
        bad = error_from_rpc(err.value)
        assert isinstance(bad, InvalidArgumentError) and "speculation" in str(bad)
        assert [v.field for v in bad.field_violations] == ["speculation"]
        assert user.get_schema("contact").speculation == "off"  # unchanged
        with pytest.raises(NotFoundError):
            admin.set_schema_speculation("contact", "on", version=9)
        with pytest.raises(ValueError, match="speculation"):
            admin.set_schema_speculation("contact", "sometimes")


def test_results_carry_the_speculation_report_and_the_model(client: Client, engine: FakeEngine) -> None:
    msgs = [{"role": "user", "content": "weather in Oslo?"}]
    r = client.extract_result("x", schema_id="contact")
    assert r.model == "fake"
    assert r.speculation == SpeculationReport(True, "drafted", False, {"draft_model": 8}, {"draft_model": "drafted"})
    t = client.call_tool(msgs, TOOLS)
    assert t.model == "fake" and t.speculation is not None and t.speculation.reason == "drafted"
    t = client.call_tool(msgs, TOOLS, speculation="off")
    assert t.speculation is not None and (t.speculation.drafted, t.speculation.reason) == (False, "request_off")


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
        rss = next(line for line in body.splitlines() if line.startswith("process_resident_memory_bytes "))
        assert float(rss.split()[1]) > 10 * 2**20  # the memory in use, as any Prometheus target exports it


def test_not_serving_while_engine_loads(tmp_path: Path) -> None:
    from structspec.client import UnavailableError

    with ServerThread(settings_for(tmp_path), None) as st, Client(st.target, retry=NO_RETRY) as c:
        assert c.health() == "NOT_SERVING"
        with pytest.raises(UnavailableError) as err:
            c.extract("x", schema_id="contact")
        assert err.value.reason == "MODEL_LOADING"
        assert c.list_schemas()  # the registry works while the model loads
        with pytest.raises(UnavailableError) as err:
            c.get_schema_stats("contact")  # whose statistics? the server's model is not known yet
        assert err.value.reason == "MODEL_LOADING"
        assert c.get_schema_stats("contact", model="fake").model == "fake"  # a named model's are there
        assert c.list_schema_stats() == []

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
        stats = c.get_schema_stats("contact", windows=[60])
        (row,) = stats.windows[60].proposers
        assert stats.model == "fake" and row.proposer == "draft_model" and row.events == 2 and row.drafted > row.accepted > 0
        assert stats.windows[60].requests == 2 and stats.windows[60].finish_reasons == {"stop": 2}
        assert [(d.proposer, d.reason, d.requests) for d in stats.windows[60].decisions] == [
            ("", "drafted", 2), ("draft_model", "drafted", 2)]


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


# -- Chat, ChatStream and CallTool's text answers (fake engine) ------------------------------------------------------

from structspec.client import AsyncClient, ChatResult, InvalidArgumentError, ResourceExhaustedError  # noqa: E402
from structspec.client import DeadlineExceededError, UnauthenticatedError  # noqa: E402
from structspec.engine.api import TextRequest  # noqa: E402
from structspec.engine.types import GenerationResult, SpeculationReport as EngineReport  # noqa: E402
from structspec.engine.types import ToolCallResult as EngineToolResult  # noqa: E402
from structspec.service.settings import Secret  # noqa: E402

CHAT_REPLY = "Hello there. The sky is blue.\nAnything else?"


class ChatFake(FakeEngine):
    """The fake with free text: it answers ``CHAT_REPLY`` (cut at the first stop string, one chunk per "token"),
    and under ``tool_choice`` auto answers in text when the last message says ``[answer]`` (a cut text answer
    stays text, as the engine's does)."""

    async def chat(self, request: TextRequest) -> GenerationResult:
        result = None
        async for item in self.chat_stream(request):
            result = item
        assert isinstance(result, GenerationResult)
        return result

    async def chat_stream(self, request: TextRequest):
        self._admit(request)
        prompt = request.messages[-1].content
        self._check_prompt(prompt)
        cuts = [CHAT_REPLY.find(s) for s in request.stop if s in CHAT_REPLY]
        text = CHAT_REPLY[:min(cuts)] if cuts else CHAT_REPLY
        decision = EngineReport(request.speculation.value != "off", "drafted" if request.speculation.value != "off" else "request_off")
        async for item in self._decode(request.request_id, prompt, text, request.sampling.max_tokens, request.deadline,
                                       is_json=False, decision=decision):
            yield item

    async def call_tool(self, request):
        if request.tool_choice != "auto" or "[answer]" not in request.messages[-1].content:
            return await super().call_tool(request)
        self._admit(request)
        answer = '{"reply": "no tool needed"}' if request.answer_schema else "No tool needed: it is sunny."
        result = None
        async for item in self._decode(request.request_id, request.messages[-1].content, answer,
                                       request.sampling.max_tokens, request.deadline, is_json=False):
            result = item
        return EngineToolResult(result=result, text=result.text)  # cut or not, a text answer stays text


@pytest.fixture
def chat_served(tmp_path: Path):
    engine = ChatFake(chunk_chars=4)
    with ServerThread(settings_for(tmp_path), engine) as st:
        yield st, engine


def test_chat_answers_with_text_honours_stop_and_max_tokens(chat_served) -> None:
    st, engine = chat_served
    with Client(st.target, retry=NO_RETRY, timeout=20) as client:
        r = client.chat([{"role": "system", "content": "be brief"}, ("user", "hi")], temperature=0.5, seed=3,
                        speculation="off", request_id="chat-1")
        assert isinstance(r, ChatResult) and r.text == CHAT_REPLY
        assert (r.finish_reason, r.outcome, r.truncated, r.request_id) == ("stop", "text", False, "chat-1")
        assert r.usage.output_tokens == -(-len(r.text) // 4) and r.usage.prompt_tokens > 0 and r.model == "fake"
        assert r.speculation is not None and r.speculation.reason == "request_off"
        sent = engine.requests[-1]
        assert isinstance(sent, TextRequest) and [m.role for m in sent.messages] == ["system", "user"]
        assert (sent.sampling.temperature, sent.sampling.seed, sent.speculation.value) == (0.5, 3, "off")
        cut = client.chat([("user", "hi")], stop=["\n", "zzz"])
        assert cut.text == "Hello there. The sky is blue." and cut.finish_reason == "stop"
        assert engine.requests[-1].stop == ("\n", "zzz")
        assert client.chat([("user", "hi")], stop=".").text == "Hello there"  # one string is one stop string
        short = client.chat([("user", "hi")], max_tokens=2)
        assert (short.text, short.finish_reason, short.outcome, short.truncated) == ("Hell" "o th", "length", "truncated", True)


def test_chat_stream_deltas_then_the_result(chat_served) -> None:
    st, _ = chat_served
    with Client(st.target, retry=NO_RETRY, timeout=20) as client:
        items = list(client.chat_stream([("user", "hi")], stop=["?"]))
        deltas = [i for i in items if isinstance(i, TextDelta)]
        assert len(deltas) >= 3 and isinstance(items[-1], ChatResult)
        assert "".join(d.text for d in deltas) == items[-1].text == "Hello there. The sky is blue.\nAnything else"
        cut = list(client.chat_stream([("user", "hi")], max_tokens=3))  # a truncated answer is a result, not an error
        assert cut[-1].finish_reason == "length" and "".join(d.text for d in cut[:-1]) == cut[-1].text


@pytest.mark.parametrize("stop, field", [(["a", "b", ""], "stop[2]"), (["x" * 65], "stop[0]"),
                                         (["a", "b", "c", "d", "e"], "stop")])
def test_chat_refuses_a_bad_stop_string_naming_it(chat_served, stop, field) -> None:
    st, engine = chat_served
    with Client(st.target, retry=NO_RETRY, timeout=20) as client:
        with pytest.raises(InvalidArgumentError) as err:
            client.chat([("user", "hi")], stop=stop)
    assert err.value.field_violations[0].field == field and engine.requests == []


def test_chat_guards_like_the_other_rpcs(tmp_path: Path) -> None:
    engine = ChatFake(max_running=1, max_queue=0)
    (tmp_path / "tokens").write_text("alice-token\n")
    with ServerThread(settings_for(tmp_path, auth_token_file=tmp_path / "tokens", admin_token=Secret("admin")), engine) as st:
        with Client(st.target, retry=NO_RETRY, timeout=20) as anonymous:
            with pytest.raises(UnauthenticatedError):
                anonymous.chat([("user", "hi")])
        with Client(st.target, token="alice-token", retry=NO_RETRY, timeout=20) as client:
            assert client.chat([("user", "hi")]).text == CHAT_REPLY
            assert engine.requests[-1].tenant.startswith("t:")  # the caller's tenant rides on the request
            with pytest.raises(DeadlineExceededError):
                client.chat([("user", "[slow=0.2]")], timeout=0.5)
            with pytest.raises(InvalidArgumentError) as err:
                client.chat([("user", "hi")], max_tokens=0)
            assert err.value.field_violations[0].field == "sampling.max_tokens"
            with pytest.raises(InvalidArgumentError) as err:
                client.chat([])
            assert err.value.field_violations[0].field == "messages"
            slow = client.chat_stream([("user", "[slow=0.3]")])
            next(slow)  # holds the one slot; the queue takes none
            with pytest.raises(ResourceExhaustedError):
                client.chat([("user", "hi")])
            slow.close()


def test_a_conversations_tool_calls_and_results_reach_the_engine(chat_served) -> None:
    st, engine = chat_served
    history = [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "call_2", "name": "get_time", "arguments": {"tz": "CET"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
    ]
    with Client(st.target, retry=NO_RETRY, timeout=20) as client:
        client.chat(history)
        sent = engine.requests[-1].messages
        assert [c.name for c in sent[1].tool_calls] == ["get_weather", "get_time"]
        assert sent[1].tool_calls[0].arguments == {"city": "Oslo"} and sent[1].tool_calls[1].arguments == {"tz": "CET"}
        assert sent[1].tool_call_ids == ("call_1", "call_2")
        assert (sent[2].tool_call_id, sent[2].name, sent[3].tool_call_id) == ("call_1", "get_weather", "call_2")
        client.call_tool(history, TOOLS)
        assert engine.requests[-1].messages[1].tool_call_ids == ("call_1", "call_2")
        bad = [history[0], {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "f", "arguments": "{x"}]}]
        with pytest.raises(InvalidArgumentError) as err:
            client.chat(bad)
        assert err.value.field_violations[0].field == "messages[1].tool_calls[0].arguments_json"
        with pytest.raises(InvalidArgumentError) as err:
            client.chat([{"role": "user", "content": "x", "tool_calls": [{"name": "f", "arguments": {}}]}])
        assert err.value.field_violations[0].field == "messages[0].tool_calls"
        with pytest.raises(InvalidArgumentError) as err:
            client.chat([{"role": "user", "content": "x", "tool_call_id": "call_1"}])
        assert err.value.field_violations[0].field == "messages[0].tool_call_id"


def test_call_tool_answers_in_text_under_auto_and_calls_carry_ids(chat_served) -> None:
    st, engine = chat_served
    with Client(st.target, retry=NO_RETRY, timeout=20) as client:
        r = client.call_tool([("user", "[answer] is it sunny?")], TOOLS)
        assert r.calls == [] and r.text == "No tool needed: it is sunny." and r.outcome == "text"
        assert r.finish_reason == "stop" and engine.requests[-1].answer_schema is None
        called = client.call_tool([("user", "weather in Oslo?")], TOOLS, parallel=True, tool_choice="required")
        ids = [c.id for c in called.calls]
        assert len(ids) == 2 and len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
        assert called.text is None
        again = client.call_tool([("user", "weather in Oslo?")], TOOLS)
        assert again.calls[0].id not in ids  # unique across responses too
        follow_up = [("user", "weather in Oslo?"), called.assistant_message(),
                     {"role": "tool", "tool_call_id": ids[0], "content": "sunny"}]
        client.call_tool(follow_up, TOOLS)
        assert engine.requests[-1].messages[1].tool_call_ids == tuple(ids)
        schema = {"type": "object", "properties": {"reply": {"type": "string"}}, "required": ["reply"]}
        typed = client.call_tool([("user", "[answer] hi")], TOOLS, answer_schema=schema)
        assert engine.requests[-1].answer_schema == schema and typed.answer == {"reply": "no tool needed"}
        with pytest.raises(InvalidArgumentError) as err:
            client.call_tool([("user", "hi")], TOOLS, answer_schema="{not json")
        assert err.value.field_violations[0].field == "answer_schema_json"


def test_a_cut_call_is_neither_call_nor_text_and_a_cut_text_answer_stays_text(chat_served) -> None:
    st, _ = chat_served
    with Client(st.target, retry=NO_RETRY, timeout=20) as client:
        r = client.call_tool([("user", "[length] weather in Oslo?")], TOOLS, check=False)
        assert (r.finish_reason, r.outcome, r.truncated, r.calls, r.text) == ("length", "truncated", True, [], None)
        assert r.raw_output.startswith("[{")  # the cut envelope, for debugging: never a call, never text
        r = client.call_tool([("user", "[answer] [length] hi")], TOOLS, check=False)
        assert (r.finish_reason, r.truncated, r.calls) == ("length", True, [])
        assert r.text and "No tool needed: it is sunny.".startswith(r.text) and r.text != "No tool needed: it is sunny."


def test_async_client_chat(chat_served) -> None:
    import asyncio

    st, _ = chat_served

    async def go() -> tuple[ChatResult, list]:
        async with AsyncClient(st.target, retry=NO_RETRY, timeout=20) as client:
            r = await client.chat([("user", "hi")], stop=["\n"])
            items = [i async for i in client.chat_stream([("user", "hi")], max_tokens=2)]
            return r, items

    r, items = asyncio.run(go())
    assert r.text == "Hello there. The sky is blue." and r.finish_reason == "stop"
    assert items[-1].finish_reason == "length" and "".join(i.text for i in items[:-1]) == items[-1].text


def test_the_chat_command(chat_served) -> None:
    from typer.testing import CliRunner

    from structspec import cli_client

    st, _ = chat_served
    runner, app = CliRunner(), cli_client.standalone_app()
    r = runner.invoke(app, ["chat", "--target", st.target, "-m", "user: hi", "--stop", "\n"])
    assert r.exit_code == 0, r.output
    assert r.stdout == "Hello there. The sky is blue.\n" and "finish_reason=stop" in r.stderr
    r = runner.invoke(app, ["chat", "--target", st.target, "-m", "hi", "--max-tokens", "2", "--stream"])
    assert r.exit_code == 0 and r.stdout == "Hello th\n" and "finish_reason=length" in r.stderr
    r = runner.invoke(app, ["chat", "--target", st.target, "-m", "hi", "--stop", ""])
    assert r.exit_code == 1 and "stop[0]" in r.stderr
    r = runner.invoke(app, ["call-tool", "--target", st.target, "-m", "[answer] hi"])
    answer = json.loads(r.stdout)
    assert answer["text"] == "No tool needed: it is sunny." and answer["calls"] == [] and answer["finish_reason"] == "stop"


# -- Chat on the real engine (the demo models) -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_served(tmp_path_factory, demo_models, demo_compiler):
    from structspec.assembly import AssemblyConfig, assemble_engine
    from structspec.speculation.configs import speculation_config

    engine = assemble_engine(demo_models, AssemblyConfig(proposers=speculation_config("all").proposers,
                                                         compiler=demo_compiler))
    with ServerThread(settings_for(tmp_path_factory.mktemp("chat-demo")), engine) as st:
        yield st


def test_chat_on_the_demo_engine_ends_honours_stop_and_max_tokens(demo_served) -> None:
    msgs = [("user", "Write a short note about the invoice from ACME.")]
    with Client(demo_served.target, retry=NO_RETRY, timeout=60) as client:
        free = client.chat(msgs, max_tokens=48)
        assert free.finish_reason in ("stop", "length") and free.text and 0 < free.usage.output_tokens <= 48
        assert free.truncated == (free.finish_reason == "length") and free.model
        # a stop string from the middle of the greedy answer ends the same answer before its first occurrence
        stop = free.text[len(free.text) // 2:][:3]
        assert stop.strip(), free.text
        cut = client.chat(msgs, max_tokens=48, stop=[stop])
        assert cut.finish_reason == "stop" and cut.text == free.text[:free.text.find(stop)]
        assert stop not in cut.text
        short = client.chat(msgs, max_tokens=3)
        assert (short.finish_reason, short.truncated, short.usage.output_tokens) == ("length", True, 3)
        items = list(client.chat_stream(msgs, max_tokens=48, stop=[stop]))
        assert isinstance(items[-1], ChatResult) and items[-1].text == cut.text
        assert "".join(i.text for i in items[:-1]) == cut.text  # no delta carries a part of the stop string
        with pytest.raises(InvalidArgumentError) as err:
            client.chat(msgs, stop=["a", "b", ""])
        assert err.value.field_violations[0].field == "stop[2]"


def test_call_tool_on_the_demo_engine_ids_a_follow_up_turn_and_a_cut_call(demo_served) -> None:
    from structspec.bench.workloads import build_workload

    item = build_workload("toolcall", 1)[0]
    msgs, tools = [("user", item.source)], list(item.tools)
    with Client(demo_served.target, retry=NO_RETRY, timeout=60) as client:
        r = client.call_tool(msgs, tools, max_tokens=120)
        assert [c.name for c in r.calls] == [item.truth["name"]] and r.calls[0].id.startswith("call_")
        # the call and its result go back structured; the engine answers the next turn (a call or text)
        follow = msgs + [r.assistant_message(), {"role": "tool", "tool_call_id": r.calls[0].id, "content": "done"}]
        nxt = client.call_tool(follow, tools, max_tokens=120, check=False)
        assert nxt.finish_reason in ("stop", "length") and (nxt.calls or nxt.text is not None or nxt.truncated)
        assert all(c.id and c.id != r.calls[0].id for c in nxt.calls)
        cut = client.call_tool(msgs, tools, tool_choice="required", max_tokens=5, check=False)
        assert (cut.finish_reason, cut.outcome, cut.calls, cut.text) == ("length", "truncated", [], None)
        assert cut.raw_output  # the cut envelope stays out of the answer


def test_call_tool_answers_in_text_under_auto_on_an_instruct_model(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (llama.cpp): greeted, with a weather tool on offer, it answers in text, not a call."""
    from structspec.assembly import assemble_engine
    from structspec.models.loading import load_profile
    from tests.conftest import need_llamacpp, smollm2_gguf

    need_llamacpp()
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    engine = assemble_engine(load_profile(str(smollm2_gguf()), executor="llamacpp"))
    with ServerThread(settings_for(tmp_path), engine) as st, Client(st.target, retry=NO_RETRY, timeout=120) as client:
        r = client.call_tool([("user", "Say hello")], [weather], max_tokens=48)
        assert (r.finish_reason, r.outcome, r.calls) == ("stop", "text", []) and "hello" in r.text.lower()
        free = client.chat([("user", "Say hello")], max_tokens=30, stop=["!"])
        assert free.finish_reason == "stop" and free.text and "!" not in free.text
