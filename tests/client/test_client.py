"""The Python client: typed extraction, streams, retries, deadlines and typed errors."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Literal

import grpc
import pytest
from pydantic import BaseModel, ConfigDict, field_validator

from structspec.client import (
    NO_RETRY,
    AsyncClient,
    Client,
    DeadlineExceededError,
    ExtractionResult,
    InvalidArgumentError,
    ModelValidationError,
    NotFoundError,
    ResourceExhaustedError,
    RetryPolicy,
    SchemaViolationError,
    StructSpecError,
    TextDelta,
    TruncatedOutputError,
    UnavailableError,
)
from structspec.client.convert import extract_request, tool_pb
from structspec.json_limits import MAX_JSON_DEPTH
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    age: int
    kind: Literal["customer", "vendor"]
    address: Address  # nested model: exercised through $defs/$ref
    tags: list[str]


class Strict(BaseModel):
    name: str

    @field_validator("name")
    @classmethod
    def not_placeholder(cls, v: str) -> str:
        if v == "text":
            raise ValueError("placeholder name")
        return v


def test_typed_extraction(client: Client, engine: FakeEngine) -> None:
    person = client.extract("Ada, 36, customer in London", model=Person)
    assert isinstance(person, Person) and person.kind == "customer" and person.address.city == "text"
    assert engine.requests[-1].schema == Person.model_json_schema()
    with pytest.raises(ModelValidationError) as err:
        client.extract("x", model=Strict)
    assert "placeholder" in str(err.value) and err.value.result.outcome == "valid"


def test_worked_examples_reach_the_engine(client: Client, engine: FakeEngine) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    client.extract_result("Grace, 45", schema=schema, examples=[("Ada, 36", {"name": "Ada", "age": 36}),
                                                                ("Bo, 2", '{"name":"Bo"}')])
    assert [(e.text, e.output) for e in engine.requests[-1].examples] == [
        ("Ada, 36", '{"name":"Ada","age":36}'), ("Bo, 2", '{"name":"Bo"}')]


def test_output_errors(client: Client) -> None:
    with pytest.raises(TruncatedOutputError) as err:
        client.extract("[length]", model=Person)
    assert err.value.partial_text.startswith("{") and err.value.result.finish_reason == "length"
    with pytest.raises(SchemaViolationError):
        client.extract("[violation]", schema_id="invoice")
    r = client.call_tool([("user", "[length]")], [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}], check=False)
    assert r.truncated and r.calls == []


def test_typed_errors_carry_code_and_message(client: Client) -> None:
    with pytest.raises(NotFoundError) as err:
        client.extract("x", schema_id="nope")
    assert isinstance(err.value, StructSpecError) and err.value.code is grpc.StatusCode.NOT_FOUND
    assert str(err.value).startswith("NOT_FOUND: ")


def nested(levels: int) -> dict:
    """A schema of ``levels`` objects within each other (2 x ``levels`` JSON levels), built without recursion."""
    node: dict = {"type": "string"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"a": node}}
    return node


def nested_text(levels: int) -> str:
    """``nested(levels)`` as JSON text, written out (``json.dumps`` would raise RecursionError)."""
    return '{"type": "object", "properties": {"a": ' * levels + '{"type": "string"}' + "}}" * levels


class DeepExample(BaseModel):
    """A model whose schema nests past the limit (its example: 200 levels), within what pydantic writes."""

    model_config = ConfigDict(json_schema_extra={"examples": [nested(100)]})
    x: int


class TooDeepForPydantic(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [nested(500)]})
    x: int


def refusal(err: InvalidArgumentError) -> tuple:
    return err.code, err.reason, err.message, err.field_violations


UNREACHABLE = "127.0.0.1:1"  # a request that were sent would fail UNAVAILABLE, not INVALID_ARGUMENT


def test_json_too_deep_to_encode_is_refused_before_sending_as_the_server_refuses_its_text(client: Client) -> None:
    """A schema nested 500 levels (json.dumps would raise RecursionError), in every place a request carries JSON:
    the client refuses it without sending anything, with the very error the server gives the same text (the
    field, the limit, the pointer)."""
    messages = [{"role": "user", "content": "hi"}]
    with Client(UNREACHABLE, retry=NO_RETRY, timeout=5) as offline:
        cases = [
            (lambda c, s: c.extract("x", schema=s), nested(500), nested_text(500)),
            (lambda c, s: c.register_schema("deep", s), nested(500), nested_text(500)),
            (lambda c, s: c.call_tool(messages, [Address, {"name": "f", "parameters": s}]), nested(500),
             nested_text(500)),
            (lambda c, s: c.extract("x", schema={"type": "object"}, examples=[("a doc", s)]), nested(500),
             nested_text(500)),
        ]
        for call, value, text in cases:
            with pytest.raises(InvalidArgumentError) as server:
                call(client, text)
            with pytest.raises(InvalidArgumentError) as mine:
                call(offline, value)
            assert refusal(mine.value) == refusal(server.value)
            assert f"more than {MAX_JSON_DEPTH} levels deep" in mine.value.message
        with pytest.raises(InvalidArgumentError) as err:  # a pydantic model's schema: the pointer into it
            offline.call_tool(messages, [Address, DeepExample])
        (v,) = err.value.field_violations
        assert (err.value.reason, v.field) == ("SCHEMA_TOO_DEEP", "tools[1].parameters_json")
        assert v.json_pointer.startswith("/examples/0/properties/a/") and f"{MAX_JSON_DEPTH} levels" in v.description
        with pytest.raises(InvalidArgumentError) as err:  # ... or pydantic itself recursing too deep to write it
            offline.extract("x", model=TooDeepForPydantic)
        assert err.value.reason == "SCHEMA_TOO_DEEP" and err.value.field_violations[0].field == "json_schema"
        assert f"at most {MAX_JSON_DEPTH} levels" in err.value.message


def test_the_async_client_refuses_json_too_deep_to_encode_before_sending() -> None:
    async def main() -> None:
        async with AsyncClient(UNREACHABLE, retry=NO_RETRY, timeout=5) as c:
            for call in (lambda: c.extract("x", schema=nested(500)), lambda: c.register_schema("deep", nested(500)),
                         lambda: c.call_tool([("user", "hi")], [{"name": "f", "parameters": nested(500)}]),
                         lambda: c.extract("x", model=DeepExample)):
                with pytest.raises(InvalidArgumentError) as err:
                    await call()
                assert err.value.reason == "SCHEMA_TOO_DEEP" and f"{MAX_JSON_DEPTH} levels" in err.value.message

    asyncio.run(main())


def test_timeout_raises_deadline_exceeded(client: Client) -> None:
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        client.extract("[slow=0.3]", schema_id="contact", timeout=0.4)
    assert time.monotonic() - t0 < 1.5


def test_retries_unavailable_until_the_model_is_loaded(tmp_path: Path) -> None:
    with ServerThread(settings_for(tmp_path), None) as st:
        engine = FakeEngine()
        threading.Timer(0.4, lambda: st.run(st.server.set_engine(engine))).start()  # type: ignore[union-attr]
        with Client(st.target, retry=RetryPolicy(max_attempts=10, initial_backoff=0.05, max_backoff=0.2)) as c:
            assert c.extract("x", schema_id="contact")
            assert list(c.extract_stream("x", schema_id="contact"))


def test_no_retry_on_other_codes(tmp_path: Path) -> None:
    engine = FakeEngine(max_running=1, max_queue=0)
    with ServerThread(settings_for(tmp_path), engine) as st, Client(st.target, retry=RetryPolicy(max_attempts=5)) as c:
        blocker = threading.Thread(target=lambda: c.extract("[slow=0.05]", schema_id="contact"))
        blocker.start()
        while engine.running() == 0:
            time.sleep(0.01)
        before = len(engine.requests)
        with pytest.raises(ResourceExhaustedError):
            c.extract("x", schema_id="contact")
        assert len(engine.requests) == before  # refused at admission, not retried
        blocker.join()


def test_unreachable_server_gives_up_after_retries() -> None:
    t0 = time.monotonic()
    with Client("127.0.0.1:1", retry=RetryPolicy(max_attempts=3, initial_backoff=0.05), timeout=5) as c:
        with pytest.raises(UnavailableError):
            c.extract("x", schema_id="contact")
    assert time.monotonic() - t0 < 4


def test_async_client(served: ServerThread, engine: FakeEngine) -> None:
    async def main() -> None:
        async with AsyncClient(served.target, retry=NO_RETRY, timeout=10) as c:
            assert await c.health() == "SERVING"
            person = await c.extract("Ada", model=Person)
            assert isinstance(person, Person)
            items = [i async for i in c.extract_stream("Ada", schema_id="contact")]
            assert isinstance(items[0], TextDelta) and isinstance(items[-1], ExtractionResult)
            calls = await c.call_tool([{"role": "user", "content": "hi"}], [Address], tool_choice="Address")
            assert calls.calls[0].name == "Address" and calls.calls[0].arguments == {"city": "text", "country": "text"}
            info = await c.register_schema("person", Person, description="pydantic")
            assert info.created and info.schema == json.loads(json.dumps(Person.model_json_schema()))
            assert (await c.get_schema("person")).version == 1
            assert [s.schema_id for s in await c.list_schemas("person")] == ["person"]
            assert (await c.get_schema_stats("person")).schema_key == "person@1"
            assert await c.list_schema_stats() == []
            assert (await c.set_schema_speculation("person", "off")).speculation == "off"
            assert (await c.get_schema("person")).speculation == "off"
            r = await c.extract_result("Ada", schema_id="person")
            assert engine.last_request.schema_speculation.value == "off"
            assert r.model == "fake" and r.speculation is not None and r.speculation.reason == "schema_off"
            assert (await c.get_schema_stats("person", model="fake")).model == "fake"
            assert await c.delete_schema("person") == [1]
            with pytest.raises(NotFoundError):
                await c.get_schema("person")
            with pytest.raises(TruncatedOutputError):
                async for _ in c.extract_stream("[length]", schema_id="contact"):
                    pass
            with pytest.raises(DeadlineExceededError):
                await c.extract("[slow=0.3]", schema_id="contact", timeout=0.3)

    asyncio.run(main())


def test_request_building() -> None:
    req = extract_request(text="t", schema={"type": "object"}, seed=0, temperature=0.0)
    assert req.WhichOneof("schema") == "json_schema" and req.sampling.HasField("seed") and req.sampling.seed == 0
    assert req.sampling.HasField("temperature") and not req.sampling.HasField("top_p")
    with pytest.raises(ValueError, match="exactly one of schema_id"):
        extract_request(text="t", schema_id="a", model=Person)
    with pytest.raises(ValueError, match="text= and messages="):
        extract_request(schema_id="a")
    with pytest.raises(ValueError, match="role"):
        extract_request(messages=[("robot", "hi")], schema_id="a")
    t = tool_pb({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}})
    assert (t.name, t.description, json.loads(t.parameters_json)) == ("f", "d", {"type": "object"})
    assert tool_pb(Address).name == "Address"


class _Unavailable(grpc.RpcError):
    def __init__(self, message: str, reason: str = ""):
        self._message, self._reason = message, reason

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return self._message

    def trailing_metadata(self):
        if not self._reason:
            return ()
        from structspec.client.errors import DETAILS_KEY
        from structspec.proto_gen.v1 import structspec_pb2 as pb

        return ((DETAILS_KEY, pb.ErrorDetails(reason=self._reason).SerializeToString()),)


def test_a_retry_that_may_run_a_request_twice_says_so(caplog):
    """A draining server cancels what still runs after its grace with a bare UNAVAILABLE: the client retries
    (a replacement may be up) but warns that the request may run twice; refusals and connect failures are silent."""
    from structspec.client.errors import may_have_started
    from structspec.client.sync import warn_if_restarted

    assert may_have_started(_Unavailable("Cancelling all calls"))
    assert not may_have_started(_Unavailable("server is shutting down", "DRAINING"))
    assert not may_have_started(_Unavailable("model is loading; retry shortly", "MODEL_LOADING"))
    assert not may_have_started(_Unavailable("failed to connect to all addresses; last error: UNKNOWN"))
    caplog.set_level("WARNING", logger="structspec.client")
    warn_if_restarted(_Unavailable("failed to connect to all addresses"))
    assert not caplog.records
    warn_if_restarted(_Unavailable("Cancelling all calls"))
    assert "may run twice" in caplog.text
