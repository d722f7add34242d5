"""Hostile input against a running server: each probe gets a clear status in bounded time and
the server keeps answering (health SERVING) afterwards."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from structspec.client import Client, InvalidArgumentError
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.front.errors import DETAILS_KEY
from tests.service.harness import ServerThread

EXTRACT = "/structspec.v1.StructSpec/Extract"
STREAM = "/structspec.v1.StructSpec/ExtractStream"


def raw_call(target: str, method: str, payload: bytes, streaming: bool = False) -> grpc.RpcError:
    with grpc.insecure_channel(target) as channel:
        if streaming:
            call = channel.unary_stream(method)  # no serializers: bytes in, bytes out
            with pytest.raises(grpc.RpcError) as err:
                list(call(payload, timeout=10))
        else:
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(method)(payload, timeout=10)
    return err.value


def details(err: grpc.RpcError) -> pb.ErrorDetails:
    for key, value in err.trailing_metadata() or ():
        if key == DETAILS_KEY:
            return pb.ErrorDetails.FromString(value)
    raise AssertionError("no error details in the trailing metadata")


def serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


# field 3 (text, a string) with the bytes ff fe: not UTF-8
INVALID_UTF8 = bytes([0x1A, 0x02, 0xFF, 0xFE])
# field 6 (sampling, a message) announced as 50 bytes long, then cut off
TRUNCATED = bytes([0x32, 0x32, 0x08])


@pytest.mark.parametrize("payload", [INVALID_UTF8, TRUNCATED, b"\xff\xff\xff\xff"], ids=["utf8", "truncated", "garbage"])
@pytest.mark.parametrize("method", [EXTRACT, STREAM])
def test_undecodable_request_is_invalid_argument(served: ServerThread, payload: bytes, method: str) -> None:
    err = raw_call(served.target, method, payload, streaming=method == STREAM)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "not a valid ExtractRequest message" in err.details()
    assert details(err).reason == "MALFORMED_REQUEST"
    metrics = served.server.metrics  # type: ignore[union-attr]
    assert metrics.malformed.labels(method.rsplit("/", 1)[-1])._value.get() == 1
    assert serving(served.target)


def nested(levels: int, kind: str) -> str:
    """JSON text of a schema of ``levels`` objects (or arrays) within each other (``json.dumps``
    itself would hit the recursion limit)."""
    if kind == "object":
        return '{"type":"object","properties":{"a":' * levels + '{"type":"string"}' + "}}" * levels
    return '{"type":"array","items":' * levels + '{"type":"string"}' + "}" * levels


@pytest.mark.parametrize("levels", [500, 5000])
@pytest.mark.parametrize("kind", ["object", "array"])
def test_deeply_nested_schema_is_refused_with_its_pointer(client: Client, served: ServerThread, levels: int, kind: str) -> None:
    text = nested(levels, kind)
    with pytest.raises(InvalidArgumentError) as err:
        client.extract("an input", schema=text)
    assert err.value.reason == "SCHEMA_TOO_DEEP" and "128 levels" in err.value.message
    (v,) = err.value.field_violations
    assert v.field == "json_schema" and v.json_pointer.startswith("/properties/a/" if kind == "object" else "/items/items")
    with pytest.raises(InvalidArgumentError) as err:
        client.register_schema("deep", text)
    assert err.value.reason == "SCHEMA_TOO_DEEP" and err.value.field_violations[0].field == "schema_json"
    assert serving(served.target)


def test_schema_nesting_past_the_subschema_limit_is_refused_at_registration(client: Client) -> None:
    # 60 levels of arrays: 60 JSON levels (under 128) but 61 subschema levels (over 48)
    with pytest.raises(InvalidArgumentError) as err:
        client.register_schema("deep-items", nested(60, "array"))
    assert err.value.reason == "SCHEMA_TOO_DEEP" and "subschemas more than 48 levels" in err.value.message
    client.register_schema("fine", nested(20, "array"))  # well inside both limits


def test_deeply_nested_tool_parameters_and_example_outputs_are_refused(client: Client) -> None:
    params = '{"type":"object","properties":{"x":' + nested(300, "object") + "}}"
    with pytest.raises(InvalidArgumentError) as err:
        client.call_tool([{"role": "user", "content": "hi"}], tools=[{"name": "f", "parameters": params}])
    assert err.value.reason == "SCHEMA_TOO_DEEP"
    assert err.value.field_violations[0].field == "tools[0].parameters_json"
    deep_value = "[" * 5000 + "]" * 5000
    with pytest.raises(InvalidArgumentError) as err:
        client.extract("an input", schema={"type": "array"}, examples=[("a doc", deep_value)])
    assert err.value.reason == "INSTANCE_TOO_DEEP"
    assert err.value.field_violations[0].field == "examples[0].output_json"


def test_lone_surrogate_escapes_are_refused_and_the_schema_true_is_any_value(client: Client, served: ServerThread) -> None:
    lone = '{"type":"object","properties":{"a":{"type":"string","description":"\\ud800"}}}'
    with pytest.raises(InvalidArgumentError) as err:
        client.extract("an input", schema=lone)
    assert err.value.field_violations[0].field == "json_schema" and "lone surrogate" in err.value.message
    with pytest.raises(InvalidArgumentError) as err:
        client.register_schema("lone", lone)
    assert err.value.field_violations[0].field == "schema_json" and "\\ud800" in err.value.message
    paired = lone.replace("\\ud800", "\\ud83d\\ude00")  # a pair of escapes is one character
    assert client.register_schema("paired", paired).version == 1
    assert client.register_schema("anything", "true").version == 1
    assert client.get_schema("anything").schema == {}
    assert serving(served.target)


REDOS = ["^(a+)+$", "^(a|a)*$", "^(a|aa)+$", "^(\\w+\\s?)*$", "(x+x+)+y",
         "^([a-zA-Z0-9])(([\\-.]|[_]+)?([a-zA-Z0-9]+))*(@){1}[a-z0-9]+[.]{1}(([a-z]{2,3})|([a-z]{2,3}[.]{1}[a-z]{2,3}))$"]


@pytest.mark.parametrize("pattern", REDOS)
def test_worked_example_against_a_redos_pattern_answers_at_once(client: Client, served: ServerThread, pattern: str) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    evil = "a" * 64 + "!"  # with a backtracking engine, 2^64 ways to fail
    stop = threading.Event()
    health: list[bool] = []

    def probe() -> None:  # health checks keep being answered while the check runs
        while not stop.is_set():
            health.append(serving(served.target))
            time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.monotonic()
    try:
        with pytest.raises(InvalidArgumentError) as err:
            client.extract("an input", schema=schema, examples=[("a doc", json.dumps({"s": evil}))], timeout=10)
    finally:
        stop.set()
        prober.join()
    assert time.monotonic() - started < 5
    assert err.value.field_violations[0].field == "examples[0].output_json" and "does not match" in err.value.message
    assert health and all(health)
