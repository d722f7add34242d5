"""Request building, shared by both fronts: what a caller asked, protocol-neutral -> the engine's request.

An *input* (``ExtractionInput``, ``ToolCallInput``, ``TextInput``) is a request converted from its protocol and
nothing more: unset sampling fields are None, worked examples are JSON text. An extraction's schema,
a ``SchemaSource`` (a registered ``SchemaRef``, inline JSON text from gRPC, or an inline value from
HTTP, parsed with its body), is resolved first. A ``Caller`` is who asks and until when (the call
guard's ``Call``). Field names in errors are the request's as the gRPC messages name them; the HTTP
front renames them to its body's fields.

What happens here, once per request:

- the schema is resolved (``registry``) or parsed, and its canonical text hashed (``resolve_schema``):
  the digest rides on the request to the engine (grammar cache, worked examples) and keys an inline
  schema's statistics;
- unset sampling fields take the engine's defaults, ``max_tokens`` within the server's cap (``sampling``);
- worked examples are parsed, checked against the schema (or the tool list) and compacted (``examples``).

Every other rule about a request's values is its engine type's ``validate`` (the one owner), which
the engine calls.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import jsonschema

from structspec.engine.api import ChatMessage, ExtractionRequest, TextRequest, ToolCallRequest
from structspec.engine.types import SamplingParams, SpeculationMode
from structspec.front.errors import invalid
from structspec.front.limits import Limits
from structspec.front.registry import ResolvedSchema, SchemaRegistry, inline_schema, parse_schema_json
from structspec.grammar import json_text
from structspec.grammar.postcheck import validator
from structspec.prompts import FewShotExample

MAX_EXAMPLES = 8  # worked examples per request (each costs prompt tokens on every request that carries it)
INLINE_FIELD = "json_schema"  # the field an inline schema's errors name
REGISTERED_FIELD = "schema_id"  # ... and a registered one's, where the registry does not name its own
TOOL_CHOICE_MODES = ("auto", "none", "required")  # the tool_choice strings that are no tool's name


@dataclass(frozen=True)
class Sampling:
    """The sampling fields a caller set (None: unset, the engine's default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class SchemaRef:
    """A registered schema: ``version`` None is the latest."""

    schema_id: str
    version: int | None = None


@dataclass(frozen=True)
class Example:
    """A worked example: an input text and the output the model should write for it, as JSON text."""

    text: str
    output_json: str


class Caller(Protocol):
    """Who asks and until when (the call guard's ``Call``): its request id and deadline (``time.monotonic()``),
    the caller's tenant and the history scope its outputs draft from ("": the one tenant, everyone's)."""

    request_id: str
    deadline: float | None
    history_scope: str
    tenant: str


@dataclass(frozen=True)
class ExtractionInput:
    """An extraction but its schema (resolved first: ``resolve_schema``)."""

    text: str = ""
    messages: tuple[ChatMessage, ...] = ()
    instruction: str | None = None
    examples: tuple[Example, ...] = ()
    sampling: Sampling = Sampling()
    speculation: SpeculationMode = SpeculationMode.AUTO
    fast_forward: bool = True


@dataclass(frozen=True)
class ToolCallInput:
    messages: tuple[ChatMessage, ...]
    tools: tuple[dict[str, Any], ...]  # the engine's (OpenAI-style) tool entries
    tool_choice: str = "auto"  # auto | required | none | a tool name
    parallel: bool = False
    examples: tuple[Example, ...] = ()
    sampling: Sampling = Sampling()
    speculation: SpeculationMode = SpeculationMode.AUTO
    fast_forward: bool = True
    answer_schema: dict[str, Any] | None = None  # a final answer, where the model answers, is JSON valid against it


@dataclass(frozen=True)
class TextInput:
    """A free-text chat turn: no schema, no tools; ``stop`` strings end the text (checked by ``TextRequest``)."""

    messages: tuple[ChatMessage, ...]
    stop: tuple[str, ...] = ()
    sampling: Sampling = Sampling()
    speculation: SpeculationMode = SpeculationMode.AUTO
    fast_forward: bool = True


SchemaSource = SchemaRef | str | dict[str, Any]  # registered, inline JSON text (gRPC), or an inline value (HTTP)


# -- building ------------------------------------------------------------------------------------


async def resolve_schema(registry: SchemaRegistry, source: SchemaSource) -> ResolvedSchema:
    """The schema, resolved by the registry or parsed, its digest taken. Raises: FrontError (not registered,
    not a schema), ``StoreUnavailable`` (a registered schema this process does not remember)."""
    if isinstance(source, SchemaRef):
        return await registry.resolve(source.schema_id, source.version)
    return inline_schema(parse_schema_json(source, INLINE_FIELD) if isinstance(source, str) else source)


async def extraction(inp: ExtractionInput, schema: ResolvedSchema, caller: Caller, limits: Limits) -> ExtractionRequest:
    """``extraction_request``, off the event loop when there are worked examples to check (that runs the caller's
    schema over the caller's data)."""
    if inp.examples:
        return await asyncio.to_thread(extraction_request, inp, schema, caller, limits)
    return extraction_request(inp, schema, caller, limits)


def tool_by_name(name: str, param: str) -> str:
    """A tool chosen by name, as the engine's ``tool_choice``: one string that is a mode or a tool's name, so a tool
    named like a mode cannot be told from that mode and is refused rather than run as the mode."""
    if name in TOOL_CHOICE_MODES:
        raise invalid(param, f"a tool named {name!r} cannot be chosen by name: {name!r} is also a tool_choice "
                             "mode (rename the tool, or choose it with tool_choice required and only that tool)")
    return name


def extraction_request(inp: ExtractionInput, schema: ResolvedSchema, caller: Caller, limits: Limits) -> ExtractionRequest:
    schema_field = INLINE_FIELD if schema.record is None else REGISTERED_FIELD
    return ExtractionRequest(
        schema=schema.schema,
        text=inp.text,
        messages=inp.messages,
        instruction=inp.instruction,
        examples=examples(inp.examples, _instance_error(schema.schema, schema_field)),
        schema_key=schema.key,
        schema_digest=schema.digest,
        schema_speculation=schema.speculation,
        public_template=schema.record is not None,
        **_alike(inp, caller, limits),
    )


def tool_request(inp: ToolCallInput, caller: Caller, limits: Limits) -> ToolCallRequest:
    """Raises: FrontError (the examples)."""
    return ToolCallRequest(
        messages=inp.messages,
        tools=inp.tools,
        tool_choice=inp.tool_choice,
        parallel_calls=inp.parallel,
        examples=examples(inp.examples, _call_error(inp.tools)),
        answer_schema=inp.answer_schema,
        **_alike(inp, caller, limits),
    )


def text_request(inp: TextInput, caller: Caller, limits: Limits) -> TextRequest:
    """The engine's free-text request (its ``validate`` checks the stop strings and messages)."""
    return TextRequest(messages=inp.messages, stop=inp.stop, **_alike(inp, caller, limits))


def _alike(inp: ExtractionInput | ToolCallInput | TextInput, caller: Caller, limits: Limits) -> dict[str, Any]:
    """The fields every engine request takes alike: sampling, speculation, the caller's."""
    return dict(sampling=sampling(inp.sampling, limits), speculation=inp.speculation, fast_forward=inp.fast_forward,
                deadline=caller.deadline, request_id=caller.request_id, history_scope=caller.history_scope,
                tenant=caller.tenant)


def sampling(s: Sampling, limits: Limits) -> SamplingParams:
    """Unset fields take the engine's defaults, ``max_tokens`` within the server's cap (the values are validated
    by the engine's request types)."""
    defaults = SamplingParams()
    return SamplingParams(
        temperature=defaults.temperature if s.temperature is None else s.temperature,
        top_p=defaults.top_p if s.top_p is None else s.top_p,
        top_k=defaults.top_k if s.top_k is None else s.top_k,
        seed=defaults.seed if s.seed is None else s.seed,
        max_tokens=min(defaults.max_tokens, limits.max_tokens_cap) if s.max_tokens is None else s.max_tokens,
    )


# -- worked examples -----------------------------------------------------------------------------


def examples(items: Sequence[Example], check: Callable[[Any], str | None]) -> tuple[FewShotExample, ...]:
    """Worked examples -> prompt examples; ``check(value)`` returns why an output does not fit (or None)."""
    if len(items) > MAX_EXAMPLES:
        raise invalid("examples", f"at most {MAX_EXAMPLES} worked examples per request, got {len(items)}")
    out = []
    for i, ex in enumerate(items):
        if not ex.text.strip():
            raise invalid(f"examples[{i}].text", "a worked example needs an input text")
        try:
            value = json_text.loads(ex.output_json)
        except json_text.TooDeep as exc:
            raise invalid(f"examples[{i}].output_json", str(exc), "INSTANCE_TOO_DEEP") from None
        except json.JSONDecodeError as exc:
            raise invalid(f"examples[{i}].output_json", f"not JSON: {exc.msg} at position {exc.pos}") from exc
        reason = check(value)
        if reason:
            raise invalid(f"examples[{i}].output_json", reason)
        # Compact JSON, as the model is asked to write it.
        out.append(FewShotExample(ex.text, json.dumps(value, ensure_ascii=False, separators=(",", ":"))))
    return tuple(out)


def _instance_error(schema: dict[str, Any], schema_field: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        try:  # patterns on RE2 (linear time): an example cannot pin a core
            error = jsonschema.exceptions.best_match(validator(schema).iter_errors(value))
        except Exception as exc:  # noqa: BLE001 - the schema itself is unusable (bad regex, unknown type, dangling $ref)
            raise invalid(schema_field, f"cannot check the worked examples against it: {type(exc).__name__}: {exc}") from exc
        return None if error is None else f"does not match the schema: {error.message}"
    return check


def _call_error(tool_list: Sequence[dict[str, Any]]) -> Callable[[Any], str | None]:
    names = {t["function"]["name"] for t in tool_list}

    def check(value: Any) -> str | None:
        if not isinstance(value, dict) or set(value) != {"name", "arguments"} or not isinstance(value["arguments"], dict):
            return 'a call must be {"name": ..., "arguments": {...}}'
        if value["name"] not in names:
            return f"calls {value['name']!r}, which is not one of the request's tools"
        return None
    return check
