"""Every error path: status code, readable message, field details; cancellation and deadlines
reach the engine."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc
import pytest

from structspec.client import (
    NO_RETRY,
    AsyncClient,
    Client,
    DeadlineExceededError,
    ExtractionResult,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SchemaViolationError,
    TextDelta,
    TruncatedOutputError,
    UnavailableError,
)
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for


def wait_for(predicate, timeout: float = 3.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_unsupported_schema_names_pointer_and_keyword(client: Client) -> None:
    schema = {"type": "object", "properties": {"when": {"type": "string", "x-fake-unsupported": True}}}
    with pytest.raises(InvalidArgumentError) as err:
        client.extract("x", schema=schema)
    e = err.value
    assert e.code is grpc.StatusCode.INVALID_ARGUMENT and e.reason == "UNSUPPORTED_SCHEMA"
    assert "/properties/when" in e.message and "x-fake-unsupported" in e.message
    (v,) = e.field_violations
    assert (v.field, v.json_pointer, v.keyword) == ("json_schema", "/properties/when", "x-fake-unsupported")
    assert e.request_id


def test_invalid_inline_and_registered_schemas(client: Client) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        client.extract("x", schema='{"type": "object",')
    assert err.value.reason == "INVALID_SCHEMA" and "not valid JSON" in err.value.message
    with pytest.raises(InvalidArgumentError) as err:
        client.extract("x", schema="[1, 2]")
    assert "JSON object" in err.value.message
    # registration checks the metaschema and reports where
    with pytest.raises(InvalidArgumentError) as err:
        client.register_schema("bad", {"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}})
    (v,) = err.value.field_violations
    assert (v.json_pointer, v.keyword) == ("/properties/n", "minimum") and err.value.reason == "INVALID_SCHEMA"
    with pytest.raises(InvalidArgumentError) as err:
        client.register_schema("no spaces", {"type": "object"})
    assert err.value.field_violations[0].field == "schema_id"


def test_unknown_schema_or_version_is_not_found(client: Client) -> None:
    with pytest.raises(NotFoundError) as err:
        client.extract("x", schema_id="nope")
    assert err.value.reason == "SCHEMA_NOT_FOUND" and "'nope'" in err.value.message
    with pytest.raises(NotFoundError) as err:
        client.extract("x", schema_id="invoice", version=9)
    assert "version 9" in err.value.message and err.value.field_violations[0].field == "version"
    with pytest.raises(NotFoundError):
        client.get_schema("nope")
    with pytest.raises(NotFoundError):
        client.delete_schema("invoice", 5)


def test_bad_requests_are_invalid_argument(client: Client) -> None:
    cases = [
        (dict(text="x", schema_id="contact", top_p=0.0), "sampling.top_p"),
        (dict(text="x", schema_id="contact", temperature=11.0), "sampling.temperature"),
        (dict(text="x", schema_id="contact", max_tokens=5000), "sampling.max_tokens"),  # above the cap
        (dict(text="[too-long]", schema_id="contact"), "text"),
        (dict(messages=[("user", "[too-long]")], schema_id="contact"), "text"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidArgumentError) as err:
            client.extract(**kwargs)
        assert err.value.field_violations[0].field == field, (kwargs, err.value)
        assert field in err.value.message
    with pytest.raises(InvalidArgumentError) as err:
        client.extract("[too-long]", schema_id="contact")
    assert err.value.reason == "CONTEXT_TOO_LONG"


def test_tool_request_validation(client: Client) -> None:
    tools = [{"name": "a", "parameters": {"type": "object"}}]
    with pytest.raises(InvalidArgumentError, match="tool_choice.tool_name"):
        client.call_tool([("user", "hi")], tools, tool_choice="b")
    with pytest.raises(InvalidArgumentError, match="duplicate"):
        client.call_tool([("user", "hi")], tools * 2)
    with pytest.raises(InvalidArgumentError, match="parameters_json"):
        client.call_tool([("user", "hi")], [{"name": "a", "parameters": "{nope"}])
    with pytest.raises(InvalidArgumentError, match="at least one message"):
        client.call_tool([], tools)


def test_oversized_message(tmp_path: Path) -> None:
    with ServerThread(settings_for(tmp_path, max_message_bytes=2000), FakeEngine()) as st, Client(st.target, retry=NO_RETRY) as c:
        with pytest.raises(InvalidArgumentError) as err:
            c.extract("x" * 3000, schema_id="contact")
        assert err.value.reason == "MESSAGE_TOO_LARGE" and "2000" in err.value.message
        # beyond twice the limit gRPC itself refuses the message
        with pytest.raises(ResourceExhaustedError):
            c.extract("x" * 10_000, schema_id="contact")
        assert c.extract("x" * 100, schema_id="contact")


def test_length_is_success_with_truncated(client: Client) -> None:
    r = client.extract_result("[length]", schema_id="contact")
    assert r.finish_reason == "length" and r.truncated and r.outcome == "truncated" and r.value is None
    assert r.json and not r.json.endswith("}")
    with pytest.raises(TruncatedOutputError) as err:
        client.extract("[length]", schema_id="contact")
    assert err.value.partial_text == r.json
    with pytest.raises(TruncatedOutputError):
        list(client.extract_stream("[length]", schema_id="contact"))


def test_schema_violation_is_success_with_outcome(client: Client) -> None:
    r = client.extract_result("[violation]", schema_id="invoice")
    assert r.outcome == "schema_violation" and r.finish_reason == "stop" and "multipleOf" in r.error
    assert isinstance(r.value, dict)
    with pytest.raises(SchemaViolationError) as err:
        client.extract("[violation]", schema_id="invoice")
    assert err.value.value == r.value and "multipleOf" in str(err.value)


def test_model_failures_are_internal_and_logged(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="structspec")
    with pytest.raises(InternalError) as err:
        client.extract("[crash]", schema_id="contact", request_id="boom-1")
    assert err.value.request_id == "boom-1" and "boom-1" in err.value.message
    assert "CUDA" not in err.value.message  # internals stay in the log
    assert any("boom-1" in r.getMessage() and r.exc_info for r in caplog.records)
    with pytest.raises(InternalError) as err:
        client.extract("[error]", schema_id="contact", request_id="boom-2")
    assert err.value.reason == "MODEL_FAILURE" and "NaN" in err.value.message
    assert any("boom-2" in r.getMessage() for r in caplog.records)
    with pytest.raises(InternalError) as err:
        client.extract("[internal]", schema_id="contact")
    assert err.value.reason == "OUTPUT_CHECK_FAILED"
    with pytest.raises(UnavailableError):
        client.extract("[stopped]", schema_id="contact")


def test_deadline_reaches_engine(client: Client, engine: FakeEngine) -> None:
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        client.extract("[slow=0.2]", schema_id="invoice", timeout=0.6, request_id="late-1")
    assert time.monotonic() - started < 2.0
    sent = engine.requests[-1]
    assert sent.deadline is not None and 0.3 < sent.deadline - started < 0.8
    assert wait_for(lambda: engine.running() == 0)  # decoding stopped
    assert "late-1" not in engine.finished
    assert "late-1" in engine.cancelled or "late-1" in engine.deadline_hits


def test_deadline_guard_cancels_an_engine_that_ignores_it(client: Client, engine: FakeEngine) -> None:
    engine.honour_deadlines = False
    with pytest.raises(DeadlineExceededError):
        client.extract("[slow=0.2]", schema_id="invoice", timeout=0.5, request_id="late-2")
    assert wait_for(lambda: "late-2" in engine.cancelled)
    with pytest.raises(DeadlineExceededError):
        list(client.extract_stream("[slow=0.2]", schema_id="invoice", timeout=0.5, request_id="late-3"))
    assert wait_for(lambda: "late-3" in engine.cancelled)


def test_cancel_mid_stream_stops_decoding(served: ServerThread, engine: FakeEngine) -> None:
    async def main() -> list[str]:
        got = []
        async with AsyncClient(served.target, retry=NO_RETRY) as c:
            stream = c.extract_stream("[slow=0.1]", schema_id="invoice", request_id="cancel-me")
            async for item in stream:
                assert isinstance(item, TextDelta)
                got.append(item.text)
                if len(got) == 2:
                    break
            await stream.aclose()  # type: ignore[attr-defined]
        return got

    assert len(asyncio.run(main())) == 2
    assert wait_for(lambda: "cancel-me" in engine.cancelled)
    assert "cancel-me" not in engine.finished and engine.running() == 0


def test_cancel_unary_with_sync_stream_close(client: Client, engine: FakeEngine) -> None:
    stream = client.extract_stream("[slow=0.1]", schema_id="invoice", request_id="cancel-2")
    assert isinstance(next(stream), TextDelta)
    stream.close()  # type: ignore[attr-defined]
    assert wait_for(lambda: "cancel-2" in engine.cancelled)


def test_queue_full_is_resource_exhausted(tmp_path: Path) -> None:
    engine = FakeEngine(max_running=1, max_queue=1)
    with ServerThread(settings_for(tmp_path), engine) as st:

        async def main() -> list[object]:
            async with AsyncClient(st.target, retry=NO_RETRY) as c:
                slow = [asyncio.create_task(c.extract("[slow=0.02]", schema_id="contact")) for _ in range(2)]
                while engine.running() + engine.queue_depth() < 2:  # noqa: ASYNC110 (the fake engine's counters have no event)
                    await asyncio.sleep(0.01)
                with pytest.raises(ResourceExhaustedError) as err:
                    await c.extract("x", schema_id="contact")
                assert err.value.reason == "QUEUE_FULL"
                return await asyncio.gather(*slow)

        assert all(isinstance(v, dict) for v in asyncio.run(main()))


def test_a_request_over_the_kv_budget_is_resource_exhausted_naming_max_tokens(client: Client) -> None:
    # not INTERNAL: the request is fine, the server's budget is too small for it, and retrying will not help
    with pytest.raises(ResourceExhaustedError) as err:
        client.extract("[over-budget]", schema_id="contact")
    assert err.value.reason == "KV_BUDGET" and "65536" in err.value.message
    assert [v.field for v in err.value.field_violations] == ["sampling.max_tokens"]


def test_concurrent_clients(tmp_path: Path) -> None:
    engine = FakeEngine(token_delay=0.002, max_running=8, max_queue=64)
    with ServerThread(settings_for(tmp_path), engine) as st:

        async def one(i: int) -> tuple[str, object]:
            async with AsyncClient(st.target, retry=NO_RETRY) as c:
                if i % 3 == 0:
                    items = [x async for x in c.extract_stream(f"doc {i}", schema_id="contact", request_id=f"c{i}")]
                    return f"c{i}", items[-1]
                r = await c.extract_result(f"doc {i}", schema_id="invoice", request_id=f"c{i}")
                return f"c{i}", r

        async def main() -> list[tuple[str, object]]:
            return await asyncio.gather(*(one(i) for i in range(32)))

        results = asyncio.run(main())
        assert all(isinstance(r, ExtractionResult) and r.request_id == rid and r.outcome == "valid" for rid, r in results)
        assert len(engine.finished) == 32
