"""A bounded, seeded fuzzing campaign against one real running server (fake engine).

Covers Extract (random inline ``json_schema`` text: plausible JSON Schemas from a recursive
strategy, random JSON values, mangled and deeply nested text, tricky literals; random text or
messages, sampling parameters in and out of range, worked examples), CallTool (random tools,
names invalid or duplicate, random ``parameters_json``, every kind of ``tool_choice``),
RegisterSchema (random ids and schema text), and raw bytes (random, or serialized requests
mutated byte by byte) sent to those three methods without serializers.

Asserts, per call: OK with a documented outcome (Extract: VALID, TRUNCATED, SCHEMA_VIOLATION;
CallTool: those or TEXT; ``truncated`` exactly when finish_reason is LENGTH), or one of the
documented error statuses with a non-empty message and decodable error details; never INTERNAL
or UNKNOWN, and never DEADLINE_EXCEEDED unless the request itself asked for a tiny deadline (a
hang). After the campaign the server still answers health checks with SERVING, and the counts of
(rpc, status) are printed (``pytest -s``) and checked.

The engine is ``FakeEngine`` behind the real engine's schema intake (``grammar.intake`` and
``grammar.tools``, as ``GrammarCompiler`` runs them), so inline schemas and tools are refused
where the real engine would refuse them; schemas the fake alone cannot build an instance for
are refused as unsupported (a limit of the test double, not of the server). Generated texts never
contain '[', so the fake's magic markers (``[crash]``, ``[error]``, ...) are never triggered.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterator

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.message import Message
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from structspec.engine.api import ExtractionRequest, ToolCallRequest
from structspec.engine.types import GenerationResult, TextDelta, ToolCallResult
from structspec.grammar import intake, json_text
from structspec.grammar import tools as toolcalls
from structspec.grammar.base import GrammarOptions, SchemaError, SchemaIssue
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc
from structspec.front.errors import DETAILS_KEY
from tests.service.fakes import FakeEngine, instance_for
from tests.service.harness import ServerThread, settings_for
from tests.service.test_hostile_input import nested, serving

TIMEOUT_S = 10.0  # every call's gRPC deadline: hitting it means the server hung
EXAMPLES = 200  # per property: the whole file stays well under a minute on 2 cores
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # seeded: the same examples on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

EXTRACT = "/structspec.v1.StructSpec/Extract"
CALL_TOOL = "/structspec.v1.StructSpec/CallTool"
REGISTER = "/structspec.v1.StructSpec/RegisterSchema"
RESPONSE_TYPES: dict[str, type[Message]] = {
    EXTRACT: pb.ExtractResponse, CALL_TOOL: pb.CallToolResponse, REGISTER: pb.RegisterSchemaResponse,
}

# Documented error statuses; DEADLINE_EXCEEDED only where the request asked for a tiny deadline.
ALLOWED_ERRORS = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
})
EXTRACT_OUTCOMES = frozenset({pb.OUTCOME_VALID, pb.OUTCOME_TRUNCATED, pb.OUTCOME_SCHEMA_VIOLATION})
TOOL_OUTCOMES = EXTRACT_OUTCOMES | {pb.OUTCOME_TEXT}
# The fake's magic markers (see fakes.py); raw payloads holding one are skipped.
MARKERS = tuple(m.encode() for m in ("[length]", "[violation]", "[crash]", "[error]", "[internal]", "[too-long]",
                                     "[stopped]", "[over-budget]", "[slow"))

# (rpc, status code name) of every call, Hypothesis's replays while shrinking a failure included
COUNTS: collections.Counter[tuple[str, str]] = collections.Counter()


# -- the engine: the fake behind the real engine's intake ---------------------------------------------


def _fake_cannot_build(schema: Any, pointer: str) -> None:
    """Refuse schemas the fake's ``instance_for`` cannot turn into a small instance (dangling or
    anchor ``$ref``s, empty ``enum``/``anyOf``, cycles, non-numeric bounds, minItems that multiply)."""
    stack = [schema]
    while stack:  # minItems > 1 nested in arrays would make the fake build exponentially large outputs
        node = stack.pop()
        if isinstance(node, dict):
            if not isinstance(node.get("minItems", 0), int) or node.get("minItems", 0) > 1:
                raise SchemaError([SchemaIssue(pointer, "minItems", "the fake builds every item")], kind="unsupported")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    try:
        json.dumps(instance_for(schema))
    except Exception as exc:  # noqa: BLE001 - RecursionError, KeyError, TypeError, ...: all the fake's
        raise SchemaError([SchemaIssue(pointer, "", f"the fake cannot build an instance: {type(exc).__name__}")],
                          kind="unsupported") from None


class IntakeFakeEngine(FakeEngine):
    """``FakeEngine`` that first runs the schema checks the real engine runs before compiling."""

    options = GrammarOptions()

    async def extract_stream(self, request: ExtractionRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        pointer = json_text.value_too_deep(request.schema)  # as GrammarCompiler._key
        if pointer is not None:
            raise SchemaError([SchemaIssue(pointer, "", "too deep")], kind="too_deep")
        intake.check_schema(request.schema, self.options)
        _fake_cannot_build(request.schema, "")
        async for item in super().extract_stream(request):
            yield item

    async def call_tool(self, request: ToolCallRequest) -> ToolCallResult:
        if request.tool_choice != "none" or request.tools:  # as GrammarCompiler._compile_tools
            parsed = toolcalls.parse_tools(list(request.tools))
            toolcalls.parse_tool_choice(request.tool_choice, parsed)
            for tool in parsed:
                intake.check_schema(dict(tool.parameters), self.options, at=tool.pointer)
                _fake_cannot_build(dict(tool.parameters), tool.pointer)
        return await super().call_tool(request)


# -- the server, shared by every example -----------------------------------------------------------


class _Tracebacks(logging.Handler):
    """Keeps the server's logged errors, so a failing example shows the server-side traceback."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(logging.Formatter().format(record))


TRACEBACKS = _Tracebacks()


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    logger = logging.getLogger("structspec.service")
    logger.addHandler(TRACEBACKS)
    try:
        with ServerThread(settings_for(tmp_path_factory.mktemp("fuzz")), IntakeFakeEngine()) as server:
            yield server
    finally:
        logger.removeHandler(TRACEBACKS)


@pytest.fixture(scope="module")
def channel(fuzz_server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(fuzz_server.target) as ch:
        yield ch


# -- strategies ------------------------------------------------------------------------------------

# No '[' (the fake's markers), no surrogates (protobuf strings are UTF-8).
texts = st.text(st.characters(blacklist_characters="[", blacklist_categories=("Cs",)), max_size=40)
ints = st.one_of(st.integers(-1000, 1000), st.integers(-(2**70), 2**70), st.integers(-(10**320), 10**320))
json_scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), st.text(max_size=12))
json_values = st.recursive(
    json_scalars, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
    max_leaves=8,
)
names = st.sampled_from(["a", "b", "x", "name", "total", "é", "", "a/b", "~0"])
sizes = st.one_of(st.integers(0, 3), st.integers(-2, 10**6), st.floats(0, 5), st.just("2"))
numbers = st.one_of(ints, st.floats(), st.just("1"))
patterns = st.one_of(
    st.sampled_from(["^[a-z]+$", "\\d{3}-\\d{4}", "(a+)+$", "(a)\\1", "(?=x)x", "(?<!a)b", "[", "(", "", ".*", "\\p{L}+"]),
    st.text(max_size=8),
)
refs = st.one_of(
    st.sampled_from(["#", "#/$defs/a", "#/$defs/b", "#/definitions/a", "#/$defs/missing", "#/properties/x", "#anchor",
                     "#/$defs/a~1b", "#/$defs/%61", "other.json", "http://example.com/s.json#/a", ""]),
    st.text(max_size=10),
)
KEYWORDS = ["type", "properties", "required", "items", "prefixItems", "additionalProperties", "enum", "const", "anyOf",
            "oneOf", "allOf", "not", "$ref", "$defs", "$anchor", "$id", "$schema", "$dynamicRef", "pattern",
            "patternProperties", "minLength", "maxLength", "minimum", "maximum", "minItems", "maxItems", "multipleOf",
            "format", "if", "then", "else", "uniqueItems", "dependentRequired", "x-fake-unsupported", "default"]
type_names = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array", "date", ""])

leaf_schemas = st.one_of(
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"minLength": sizes, "maxLength": sizes, "pattern": patterns,
                                    "format": st.sampled_from(["date", "email", "date-time", "uuid", "regex", "nope"])}),
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "number"])},
                          optional={"minimum": numbers, "maximum": numbers, "exclusiveMinimum": numbers,
                                    "multipleOf": numbers}),
    st.fixed_dictionaries({"type": st.one_of(type_names, st.lists(type_names, max_size=3), json_scalars)}),
    st.builds(lambda v: {"enum": v}, st.one_of(st.lists(json_values, max_size=4), json_values)),
    st.builds(lambda v: {"const": v}, json_values),
    st.builds(lambda r: {"$ref": r}, refs),
    st.dictionaries(st.sampled_from(KEYWORDS), json_values, max_size=3),  # keyword soup: wrong value types
    st.booleans(),  # boolean schemas
)


def _compound(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(names, children, max_size=4)},
            optional={"required": st.lists(names, max_size=3), "additionalProperties": st.one_of(st.booleans(), children),
                      "patternProperties": st.dictionaries(patterns, children, max_size=2)},
        ),
        st.fixed_dictionaries({"type": st.just("array"), "items": children},
                              optional={"minItems": sizes, "maxItems": sizes, "prefixItems": st.lists(children, max_size=2),
                                        "uniqueItems": st.booleans()}),
        st.builds(lambda k, xs: {k: xs}, st.sampled_from(["anyOf", "oneOf", "allOf"]), st.lists(children, max_size=3)),
        st.builds(lambda c: {"not": c}, children),
        st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, children, children, children),
    )


schema_bodies = st.recursive(leaf_schemas, _compound, max_leaves=10)


@st.composite
def plausible_schemas(draw: st.DrawFn) -> Any:
    body = draw(schema_bodies)
    if not isinstance(body, dict):
        return body
    body = dict(body)
    if draw(st.booleans()):
        body["$defs"] = draw(st.dictionaries(st.sampled_from(["a", "b", "a/b"]), schema_bodies, max_size=2))
    if draw(st.integers(0, 5)) == 0:
        body["$schema"] = draw(st.one_of(
            st.sampled_from(["https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#",
                             "http://json-schema.org/draft-04/schema#", "https://example.com/unknown"]),
            json_values))
    if draw(st.integers(0, 5)) == 0:
        body["$anchor"] = draw(st.sampled_from(["anchor", "1bad", ""]))
    return body


good_leaves = st.one_of(
    st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
                     {"type": "string", "format": "date"}, {"type": "string", "pattern": "^[a-z]+$"},
                     {"type": "integer", "minimum": 0, "maximum": 9}, {"type": ["string", "null"]}, {"enum": ["a", "b"]},
                     {"$ref": "#/$defs/item"}]),
    st.builds(lambda v: {"const": v}, json_scalars.filter(lambda v: not isinstance(v, float))),
    st.builds(lambda n: {"type": "string", "minLength": n, "maxLength": n + 3}, st.integers(0, 3)),
)
good_bodies = st.recursive(good_leaves, lambda c: st.one_of(
    st.builds(lambda props, req: {"type": "object", "properties": props, "required": sorted(set(req) & set(props))},
              st.dictionaries(st.sampled_from(["a", "b", "name", "total", "é"]), c, max_size=4), st.lists(names, max_size=3)),
    st.builds(lambda items, n: {"type": "array", "items": items, "minItems": n}, c, st.integers(0, 1)),
    st.builds(lambda xs: {"anyOf": xs}, st.lists(c, min_size=1, max_size=3)),
), max_leaves=8)
# Well-formed schemas (every $ref resolves): most of these reach the engine and succeed.
good_schemas = st.builds(lambda body: {"type": "object", "properties": {"x": body}, "$defs": {"item": {"type": "string"}}},
                         good_bodies)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=True)  # NaN/Infinity on purpose: the server's parser accepts them
    except ValueError:  # an int past Python's str() digit limit
        return "{}"


@st.composite
def mangled(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    """Valid JSON text, then cut, spliced, duplicated or with a byte changed."""
    text = draw(base)
    i = draw(st.integers(0, len(text)))
    op = draw(st.sampled_from(["truncate", "delete", "insert", "replace", "double"]))
    if op == "truncate":
        return text[:i]
    if op == "delete":
        return text[:i] + text[i + draw(st.integers(1, 5)):]
    if op == "insert":
        return text[:i] + draw(st.sampled_from(['"', "{", "}", "]", ",", ":", "\\", "\x00", "\ufeff", "NaN", "-"])) + text[i:]
    if op == "replace":
        return text[:i] + draw(st.characters(blacklist_categories=("Cs",))) + text[i + 1:]
    return text + text


deep_texts = st.builds(
    lambda n, kind: nested(n, kind) if kind in ("object", "array") else {"open": "[" * n, "keys": '{"a":' * n}[kind],
    st.sampled_from([10, 47, 48, 49, 60, 127, 128, 129, 1000, 5000]),
    st.sampled_from(["object", "array", "open", "keys"]),
)
TRICKY_TEXTS = [
    "", " ", "\n", "null", "{}", "[]", '""', "0", "true", "{}{}", '{"a":1,"a":2}', "\ufeff{}", "{\x00}",
    '{"type":"number","minimum":NaN}', '{"type":"number","maximum":Infinity}', '{"const":-Infinity}',
    '{"type":"integer","const":' + "7" * 400 + "}",  # an integer no double can hold
    '{"type":"integer","minimum":' + "9" * 5000 + "}",  # past Python's int-from-text digit limit
    '{"type":"number","const":1e400}', '{"enum":[]}', '{"anyOf":[]}', '{"type":"object","properties":{"a":{"$ref":"#"}}}',
    '{"$schema":["x"]}', '{"$schema":{}}', '{"$schema":5}', '{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}',
    '{"type":"string","pattern":"(a)\\\\1"}', '{"type":"string","pattern":"["}', '{"x-fake-unsupported":true}',
]
json_texts = st.one_of(json_values.map(_dumps), st.sampled_from(TRICKY_TEXTS))
schema_texts = st.one_of(
    good_schemas.map(_dumps),
    plausible_schemas().map(_dumps),
    json_texts,
    mangled(plausible_schemas().map(_dumps)),
    deep_texts,
    st.text(max_size=30),
)
schema_ids = st.one_of(
    st.sampled_from(["fuzz", "fuzz-a", "fuzz.b", "invoice", "a", "A" * 128, "A" * 129, "", "-x", "x y", "é", "a/b"]),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
    texts,
)


@st.composite
def sampling_params(draw: st.DrawFn, in_range: bool | None = None) -> pb.SamplingParams:
    msg = pb.SamplingParams()
    if in_range is None:  # half the time only valid values, so requests get past validation
        in_range = draw(st.booleans())
    if draw(st.booleans()):
        msg.temperature = draw(st.floats(0, 10) if in_range else st.floats())
    if draw(st.booleans()):
        msg.top_p = draw(st.floats(0.01, 1) if in_range else st.floats())
    if draw(st.booleans()):
        msg.top_k = draw(st.integers(0, 100) if in_range else st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        msg.seed = draw(st.integers(0, 2**63 - 1) if in_range else st.integers(0, 2**64 - 1))
    if draw(st.booleans()):
        msg.max_tokens = draw(st.integers(1, 64) if in_range else st.integers(0, 2**32 - 1))
    return msg


chat_messages = st.lists(st.builds(pb.ChatMessage, role=st.integers(0, 6), content=texts), max_size=3)


def examples_of(outputs: st.SearchStrategy[str]) -> st.SearchStrategy[list[pb.Example]]:
    return st.one_of(st.just([]), st.lists(st.builds(pb.Example, text=texts, output_json=outputs), max_size=9))


@st.composite
def deadlines(draw: st.DrawFn) -> tuple[float, bool]:
    """(timeout, whether the request asked for a deadline short enough to be hit)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.floats(0.0001, 0.02)), True
    return TIMEOUT_S, False


sane_texts = texts.filter(str.strip)
user_messages = st.lists(st.builds(pb.ChatMessage, role=st.sampled_from([pb.ROLE_SYSTEM, pb.ROLE_USER, pb.ROLE_ASSISTANT]),
                                   content=texts), max_size=2).map(lambda ms: [*ms, pb.ChatMessage(role=pb.ROLE_USER, content="hi")])


@st.composite
def extract_requests(draw: st.DrawFn) -> pb.ExtractRequest:
    req = pb.ExtractRequest()
    if draw(st.booleans()):  # sane: a well-formed request, so the engine path and OK answers get exercised
        req.json_schema = draw(good_schemas.map(_dumps))
        if draw(st.booleans()):
            req.text = draw(sane_texts)
        else:
            req.messages.extend(draw(user_messages))
        req.sampling.CopyFrom(draw(sampling_params(in_range=True)))
        req.speculation = draw(st.integers(0, 2))
        req.disable_fast_forward = draw(st.booleans())
        if draw(st.booleans()):
            req.examples.append(pb.Example(text="a doc", output_json=json.dumps(instance_for(json.loads(req.json_schema)))))
        return req
    which = draw(st.sampled_from(["json", "json", "json", "json", "ref", "none"]))
    if which == "json":
        req.json_schema = draw(schema_texts)
    elif which == "ref":
        req.schema_ref.schema_id = draw(schema_ids)
        if draw(st.booleans()):
            req.schema_ref.version = draw(st.integers(0, 2**32 - 1))
    inputs = draw(st.sampled_from(["text", "text", "messages", "both", "neither"]))
    if inputs in ("text", "both"):
        req.text = draw(texts)
    if inputs in ("messages", "both"):
        req.messages.extend(draw(chat_messages))
    if draw(st.integers(0, 3)) == 0:
        req.instruction = draw(texts)
    if draw(st.booleans()):
        req.sampling.CopyFrom(draw(sampling_params()))
    req.speculation = draw(st.integers(0, 4))
    req.disable_fast_forward = draw(st.booleans())
    req.request_id = draw(st.one_of(st.just(""), st.just("fuzz-1"), texts))
    req.examples.extend(draw(examples_of(st.one_of(json_texts, mangled(json_texts), deep_texts))))
    return req


tool_names = st.one_of(st.sampled_from(["f", "g", "get_weather", "", "a b", "x" * 200, "f-1", "1f", "é"]), texts)


@st.composite
def sane_call_tool_requests(draw: st.DrawFn) -> pb.CallToolRequest:
    """A well-formed CallTool request: unique valid names, well-formed parameters, a valid choice."""
    req = pb.CallToolRequest()
    req.messages.extend(draw(user_messages))
    chosen = draw(st.lists(st.sampled_from(["f", "g", "get_weather", "f-1", "lookup_2"]), min_size=1, max_size=3, unique=True))
    for name in chosen:
        req.tools.append(pb.Tool(name=name, description=draw(texts),
                                 parameters_json=draw(st.one_of(st.just(""), good_schemas.map(_dumps)))))
    choice = draw(st.sampled_from(["unset", "mode", "tool"]))
    if choice == "mode":
        req.tool_choice.mode = draw(st.integers(0, 3))
    elif choice == "tool":
        req.tool_choice.tool_name = draw(st.sampled_from(chosen))
    req.parallel_tool_calls = draw(st.booleans())
    req.sampling.CopyFrom(draw(sampling_params(in_range=True)))
    if draw(st.booleans()):
        req.examples.append(pb.Example(text="what now?", output_json=json.dumps({"name": chosen[0], "arguments": {}})))
    return req


@st.composite
def call_tool_requests(draw: st.DrawFn) -> pb.CallToolRequest:
    if draw(st.booleans()):
        return draw(sane_call_tool_requests())
    req = pb.CallToolRequest()
    req.messages.extend(draw(st.one_of(chat_messages, st.lists(st.builds(pb.ChatMessage, role=st.just(pb.ROLE_USER),
                                                                          content=texts), min_size=1, max_size=2))))
    tools = draw(st.lists(st.builds(pb.Tool, name=tool_names, description=texts,
                                    parameters_json=st.one_of(st.just(""), schema_texts)), max_size=4))
    req.tools.extend(tools)
    choice = draw(st.sampled_from(["unset", "mode", "tool", "random-name"]))
    if choice == "mode":
        req.tool_choice.mode = draw(st.integers(0, 5))
    elif choice == "tool" and tools:
        req.tool_choice.tool_name = draw(st.sampled_from([t.name for t in tools]))
    elif choice == "random-name":
        req.tool_choice.tool_name = draw(tool_names)
    req.parallel_tool_calls = draw(st.booleans())
    if draw(st.booleans()):
        req.sampling.CopyFrom(draw(sampling_params()))
    req.speculation = draw(st.integers(0, 4))
    req.disable_fast_forward = draw(st.booleans())
    req.request_id = draw(st.one_of(st.just(""), texts))
    calls = st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}), tool_names, json_values)
    req.examples.extend(draw(examples_of(st.one_of(calls, json_texts))))
    return req


register_requests = st.one_of(
    st.builds(pb.RegisterSchemaRequest, schema_id=st.sampled_from(["fuzz", "fuzz-a", "fuzz.b"]),
              schema_json=good_schemas.map(_dumps), description=texts),
    st.builds(pb.RegisterSchemaRequest, schema_id=schema_ids, schema_json=schema_texts, description=texts),
)


@st.composite
def raw_payloads(draw: st.DrawFn) -> tuple[str, bytes]:
    """(method, bytes): random bytes, or a serialized request with bytes flipped, inserted, cut."""
    method = draw(st.sampled_from([EXTRACT, CALL_TOOL, REGISTER]))
    if draw(st.integers(0, 2)) == 0:
        return method, draw(st.binary(max_size=200))
    seed = {EXTRACT: extract_requests(), CALL_TOOL: call_tool_requests(), REGISTER: register_requests}[method]
    data = bytearray(draw(seed).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "varint"]))
        if op == "flip" and i < len(data):
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[i:]
        else:  # a huge or overlong length/varint where a field starts
            data[i:i] = draw(st.sampled_from([b"\xff\xff\xff\xff\x0f", b"\x80" * 11, b"\x12\xff\xff\xff\x7f", b"\x0a\x00"]))
    return method, bytes(data)


# -- the property ------------------------------------------------------------------------------------


def _show(request: Message | bytes) -> str:
    text = repr(request) if isinstance(request, bytes) else text_format.MessageToString(request, as_utf8=True)
    return text if len(text) <= 1500 else text[:1500] + f"... ({len(text)} chars)"


def _server_errors_since(mark: int) -> str:
    return "\n".join(TRACEBACKS.records[mark:]) or "(no server-side error logged)"


def _check_result(rpc: str, response: Message) -> None:
    if isinstance(response, pb.ExtractResponse):
        result, outcomes = response.result, EXTRACT_OUTCOMES
    elif isinstance(response, pb.CallToolResponse):
        result, outcomes = response, TOOL_OUTCOMES
    else:
        assert isinstance(response, pb.RegisterSchemaResponse)
        assert response.schema.version >= 1 and response.schema.schema_id, response
        return
    assert result.outcome in outcomes, f"{rpc}: outcome {pb.Outcome.Name(result.outcome)}"
    assert result.truncated == (result.finish_reason == pb.FINISH_REASON_LENGTH), f"{rpc}: {result}"


def check_call(rpc: str, request: Message | bytes, invoke: Callable[[float], Any], parse: Callable[[Any], Message],
               timeout: float = TIMEOUT_S, asked_deadline: bool = False) -> None:
    """Call once, count (rpc, status), and assert the campaign's property."""
    mark = len(TRACEBACKS.records)
    started = time.monotonic()
    try:
        response = invoke(timeout)
    except grpc.RpcError as err:
        code = err.code()
        COUNTS[(rpc, code.name)] += 1
        allowed = ALLOWED_ERRORS | ({grpc.StatusCode.DEADLINE_EXCEEDED} if asked_deadline else set())
        assert code in allowed, (
            f"{rpc} -> {code.name} {err.details()!r} after {time.monotonic() - started:.2f} s\n"
            f"request: {_show(request)}\nserver: {_server_errors_since(mark)}"
        )
        assert err.details(), f"{rpc} -> {code.name} with an empty message; request: {_show(request)}"
        for key, value in err.trailing_metadata() or ():
            if key == DETAILS_KEY:
                pb.ErrorDetails.FromString(value)  # must decode
        return
    COUNTS[(rpc, "OK")] += 1
    _check_result(rpc, parse(response))


@FUZZ_SETTINGS
@given(request=extract_requests(), deadline=deadlines())
def test_extract_never_fails_internally(channel: grpc.Channel, request: pb.ExtractRequest, deadline: tuple[float, bool]) -> None:
    stub = pb_grpc.StructSpecStub(channel)
    check_call("Extract", request, lambda t: stub.Extract(request, timeout=t), lambda r: r, *deadline)


@FUZZ_SETTINGS
@given(request=call_tool_requests(), deadline=deadlines())
def test_call_tool_never_fails_internally(channel: grpc.Channel, request: pb.CallToolRequest, deadline: tuple[float, bool]) -> None:
    stub = pb_grpc.StructSpecStub(channel)
    check_call("CallTool", request, lambda t: stub.CallTool(request, timeout=t), lambda r: r, *deadline)


@FUZZ_SETTINGS
@given(request=register_requests)
def test_register_schema_never_fails_internally(channel: grpc.Channel, request: pb.RegisterSchemaRequest) -> None:
    stub = pb_grpc.StructSpecStub(channel)
    check_call("RegisterSchema", request, lambda t: stub.RegisterSchema(request, timeout=t), lambda r: r)


@FUZZ_SETTINGS
@given(payload=raw_payloads())
def test_raw_bytes_never_fail_internally(channel: grpc.Channel, payload: tuple[str, bytes]) -> None:
    method, data = payload
    assume(not any(m in data for m in MARKERS))  # a mutation could spell a fake marker into the text
    call = channel.unary_unary(method)  # no serializers: bytes in, bytes out
    check_call("raw:" + method.rsplit("/", 1)[-1], data, lambda t: call(data, timeout=t),
               RESPONSE_TYPES[method].FromString)


def test_server_still_serving_and_counts(fuzz_server: ServerThread) -> None:
    assert serving(fuzz_server.target)
    width = max((len(rpc) for rpc, _ in COUNTS), default=10)
    print(f"\nfuzz campaign: {sum(COUNTS.values())} calls")
    for (rpc, code), n in sorted(COUNTS.items()):
        print(f"  {rpc:<{width}}  {code:<20} {n:>5}")
    assert COUNTS, "the campaign made no calls"
    bad = {k: n for k, n in COUNTS.items() if k[1] in ("INTERNAL", "UNKNOWN")}
    assert not bad, f"calls that failed internally: {bad}"
