"""Request building: one schema digest per request (per version for a registered schema), sampling defaults,
the same engine request from either front's input."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from structspec.engine.api import ChatMessage
from structspec.front.errors import Code, FrontError
from structspec.front.limits import Limits
from structspec.front.registry import SchemaRegistry, canonical_json, content_hash, inline_stats_key
from structspec.front.requests import (
    ExtractionInput,
    Sampling,
    SchemaRef,
    extraction,
    resolve_schema,
    sampling,
)
from structspec.grammar.cache import schema_digest
from structspec.store.base import SchemaRecord

SCHEMA = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "required": ["b"]}
CALLER = SimpleNamespace(request_id="r1", deadline=12.5, history_scope="h", tenant="t")


class OneSchemaStore:
    """Just enough of a ``Store`` for resolving: one registered version, reads counted."""

    def __init__(self, schema: dict) -> None:
        text = canonical_json(schema)
        self.record = SchemaRecord("contact", 3, text, content_hash(text), "", 0.0, "api")
        self.reads = 0

    async def get_schema(self, schema_id: str, version: int | None) -> SchemaRecord | None:
        self.reads += 1
        return self.record if schema_id == "contact" and version in (None, 3) else None


def test_unset_sampling_fields_take_the_engine_defaults_within_the_cap() -> None:
    s = sampling(Sampling(), Limits(max_tokens_cap=100))
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_tokens) == (0.0, 1.0, 0, None, 100)
    assert sampling(Sampling(), Limits()).max_tokens == 256
    kept = sampling(Sampling(temperature=0.0, top_k=0, seed=0, max_tokens=5000), Limits(max_tokens_cap=100))
    assert (kept.temperature, kept.top_k, kept.seed, kept.max_tokens) == (0.0, 0, 0, 5000)  # the engine refuses 5000


def test_an_inline_schema_is_hashed_once_into_its_digest_and_statistics_key() -> None:
    from_value = asyncio.run(resolve_schema(None, SCHEMA))  # type: ignore[arg-type]
    from_text = asyncio.run(resolve_schema(None, json.dumps(SCHEMA)))  # type: ignore[arg-type]
    assert from_value.digest == from_text.digest == schema_digest(SCHEMA)
    assert from_value.key == from_text.key == inline_stats_key(canonical_json(SCHEMA))
    assert from_text.schema == SCHEMA and from_text.record is None
    with pytest.raises(FrontError) as err:
        asyncio.run(resolve_schema(None, "[1]"))  # type: ignore[arg-type]
    assert err.value.code is Code.INVALID_ARGUMENT and err.value.violations[0].field == "json_schema"


def test_a_registered_schema_is_parsed_and_hashed_once_per_version() -> None:
    store = OneSchemaStore(SCHEMA)
    registry = SchemaRegistry(store)  # type: ignore[arg-type]
    first = asyncio.run(resolve_schema(registry, SchemaRef("contact")))
    again = asyncio.run(resolve_schema(registry, SchemaRef("contact", 3)))
    assert first.digest == schema_digest(SCHEMA) and first.key == "contact@3" and first.record is store.record
    assert again.schema is first.schema and again.digest == first.digest  # the cached parse, not a new one
    assert store.reads == 2  # the record is read each time (its drafting override may change)


def test_the_request_carries_the_schema_its_digest_and_the_caller() -> None:
    schema = asyncio.run(resolve_schema(None, SCHEMA))  # type: ignore[arg-type]
    inp = ExtractionInput(messages=(ChatMessage("user", "hi"),), instruction="be brief")
    req = asyncio.run(extraction(inp, schema, CALLER, Limits()))
    assert (req.schema, req.schema_key, req.schema_digest) == (SCHEMA, schema.key, schema.digest)
    assert (req.request_id, req.deadline, req.history_scope, req.tenant) == ("r1", 12.5, "h", "t")
    assert req.messages == inp.messages and req.instruction == "be brief" and not req.public_template


def test_a_text_input_becomes_the_engines_text_request_with_the_caller() -> None:
    from structspec.engine.api import TextRequest
    from structspec.engine.types import InvalidRequest, SpeculationMode
    from structspec.front.requests import TextInput, ToolCallInput, text_request, tool_request

    msgs = (ChatMessage("user", "hi"),)
    req = text_request(TextInput(msgs, stop=("\n",), sampling=Sampling(max_tokens=7), speculation=SpeculationMode.OFF),
                       CALLER, Limits(max_tokens_cap=100))
    assert isinstance(req, TextRequest) and req.messages == msgs and req.stop == ("\n",)
    assert (req.sampling.max_tokens, req.speculation, req.request_id, req.deadline, req.tenant, req.history_scope) == (
        7, SpeculationMode.OFF, "r1", 12.5, "t", "h")
    with pytest.raises(InvalidRequest) as err:  # the engine type's validate names the stop string at fault
        text_request(TextInput(msgs, stop=("a", "")), CALLER, Limits()).validate(100)
    assert err.value.field == "stop[1]"
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    answer = {"type": "object", "properties": {"reply": {"type": "string"}}}
    assert tool_request(ToolCallInput(msgs, tools, answer_schema=answer), CALLER, Limits()).answer_schema == answer
    assert tool_request(ToolCallInput(msgs, tools), CALLER, Limits()).answer_schema is None
