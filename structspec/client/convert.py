"""Python arguments -> request messages, and result checks (pure; shared by both clients)."""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

import grpc

from structspec import json_limits
from structspec.client.errors import (FieldViolation, InvalidArgumentError, ModelValidationError, SchemaViolationError,
                                      TruncatedOutputError)
from structspec.client.results import ExtractionResult, ToolCallResult
from structspec.proto_gen.v1 import structspec_pb2 as pb

ROLES = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}
SPECULATION = {None: pb.SPECULATION_MODE_UNSPECIFIED, "auto": pb.SPECULATION_MODE_AUTO, "off": pb.SPECULATION_MODE_OFF}
SCHEMA_SPECULATION = {"auto": pb.SCHEMA_SPECULATION_AUTO, "off": pb.SCHEMA_SPECULATION_OFF, "on": pb.SCHEMA_SPECULATION_ON}
TOOL_CHOICE_MODES = {"auto": pb.TOOL_CHOICE_MODE_AUTO, "required": pb.TOOL_CHOICE_MODE_REQUIRED, "none": pb.TOOL_CHOICE_MODE_NONE}

Message = Mapping[str, str] | tuple[str, str] | Any


def chat_messages(messages: Iterable[Message] | None) -> list[pb.ChatMessage]:
    """Dicts ``{"role", "content"}``, ``(role, content)`` pairs or objects with those attributes. A dict may carry
    an assistant turn's ``tool_calls`` (``{"id", "name", "arguments"}`` or OpenAI's ``{"id", "type", "function":
    {"name", "arguments"}}``, arguments a dict or JSON text) and a tool turn's ``tool_call_id`` and ``name``."""
    out = []
    for m in messages or ():
        extra: Mapping[str, Any] = {}
        if isinstance(m, Mapping):
            role, content, extra = m["role"], m.get("content") or "", m
        elif isinstance(m, tuple):
            role, content = m
        else:
            role, content = m.role, m.content
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
        out.append(pb.ChatMessage(role=ROLES[role], content=content,
                                  tool_calls=[history_call(c) for c in extra.get("tool_calls") or ()],
                                  tool_call_id=extra.get("tool_call_id") or "", name=extra.get("name") or ""))
    return out


def history_call(call: Mapping[str, Any] | Any) -> pb.ToolCall:
    """A call an earlier assistant turn made (a dict as ``chat_messages`` takes, or a result's ``ToolCall``)."""
    if not isinstance(call, Mapping):
        return pb.ToolCall(id=call.id, name=call.name, arguments_json=call.arguments_json)
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    return pb.ToolCall(id=call.get("id") or "", name=fn["name"],
                       arguments_json=args if isinstance(args, str) else encode_json(args, "arguments", schema=False))


def sampling(
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
) -> pb.SamplingParams:
    msg = pb.SamplingParams()
    for name, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("seed", seed), ("max_tokens", max_tokens)):
        if value is not None:
            setattr(msg, name, value)
    return msg


def encode_json(value: Any, field: str, schema: bool = True) -> str:
    """``value`` (a schema when ``schema``, else an instance) as JSON text for the request field ``field``; text
    passes as it is (the server checks it). Raises InvalidArgumentError, as the server answers that text, for a
    value nesting past ``json_limits.MAX_JSON_DEPTH``: SCHEMA_TOO_DEEP or INSTANCE_TOO_DEEP, with the pointer
    (``json.dumps`` would recurse into a RecursionError before anything is sent)."""
    if isinstance(value, str):
        return value
    pointer = json_limits.value_too_deep(value)
    if pointer is None:
        return json.dumps(value)
    deep = json_limits.TooDeep(pointer, json_limits.MAX_JSON_DEPTH)
    message, reason = (f"schema {deep}", "SCHEMA_TOO_DEEP") if schema else (str(deep), "INSTANCE_TOO_DEEP")
    raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", reason,
                               field_violations=(FieldViolation(field, message, pointer if schema else ""),))


def model_schema(model: Any, field: str = "json_schema") -> dict[str, Any]:
    """A pydantic model class's JSON Schema. Raises TypeError (not a model class); InvalidArgumentError
    (SCHEMA_TOO_DEEP, for the request field ``field``) where pydantic recursed too deep to write it."""
    schema_fn = getattr(model, "model_json_schema", None)
    if schema_fn is None:
        raise TypeError(f"{model!r} is not a pydantic model class (it has no model_json_schema)")
    try:
        return schema_fn()
    except RecursionError:  # pydantic walks the schema it writes (a deep json_schema_extra) recursively
        message = (f"schema of {getattr(model, '__name__', model)!r} nests too deep for pydantic to write it; the "
                   f"server takes objects and arrays at most {json_limits.MAX_JSON_DEPTH} levels deep")
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", "SCHEMA_TOO_DEEP",
                                   field_violations=(FieldViolation(field, message),)) from None


def extract_request(
    *,
    text: str | None = None,
    messages: Iterable[Message] | None = None,
    schema_id: str | None = None,
    version: int | None = None,
    schema: Mapping[str, Any] | str | None = None,
    model: Any = None,
    instruction: str | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
    speculation: str | None = None,
    disable_fast_forward: bool = False,
    request_id: str | None = None,
    examples: Iterable[tuple[str, Any]] = (),
) -> pb.ExtractRequest:
    sources = [x for x in (schema_id, schema, model) if x is not None]
    if len(sources) != 1:
        raise ValueError("give exactly one of schema_id=, schema= and model=")
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of text= and messages=")
    if speculation not in SPECULATION:
        raise ValueError("speculation must be 'auto' or 'off'")
    req = pb.ExtractRequest(
        text=text or "",
        messages=chat_messages(messages),
        sampling=sampling(temperature, top_p, top_k, seed, max_tokens),
        speculation=SPECULATION[speculation],
        disable_fast_forward=disable_fast_forward,
        request_id=request_id or "",
        examples=example_pbs(examples),
    )
    if instruction is not None:
        req.instruction = instruction
    if schema_id is not None:
        req.schema_ref.schema_id = schema_id
        if version is not None:
            req.schema_ref.version = version
    else:
        req.json_schema = encode_json(model_schema(model) if model is not None else schema, "json_schema")
    return req


def example_pbs(examples: Iterable[tuple[str, Any]]) -> list[pb.Example]:
    """Worked examples as ``(input text, output)`` pairs; the output is JSON text or a JSON-able value
    (for a tool call ``{"name": ..., "arguments": {...}}``)."""
    return [pb.Example(text=text, output_json=encode_json(out, f"examples[{i}].output_json", schema=False))
            for i, (text, out) in enumerate(examples)]


def tool_pb(tool: Any, index: int = 0) -> pb.Tool:
    """OpenAI-style ``{"type": "function", "function": {...}}``, a plain ``{"name", "description",
    "parameters"}`` dict, or a pydantic model class (name = class name, description = docstring); ``index``: its
    place in the request's tool list (the field errors name)."""
    field = f"tools[{index}].parameters_json"
    if isinstance(tool, Mapping):
        fn = tool.get("function", tool)
        params = fn.get("parameters")
        return pb.Tool(
            name=fn["name"],
            description=fn.get("description", ""),
            parameters_json="" if params is None else encode_json(params, field),
        )
    return pb.Tool(name=tool.__name__, description=(tool.__doc__ or "").strip(),
                   parameters_json=encode_json(model_schema(tool, field), field))


def tool_request(
    *,
    messages: Iterable[Message],
    tools: Sequence[Any],
    tool_choice: str = "auto",
    parallel: bool = False,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
    speculation: str | None = None,
    disable_fast_forward: bool = False,
    request_id: str | None = None,
    examples: Iterable[tuple[str, Any]] = (),
    answer_schema: Mapping[str, Any] | str | Any = None,
) -> pb.CallToolRequest:
    choice = pb.ToolChoice()
    if tool_choice in TOOL_CHOICE_MODES:
        choice.mode = TOOL_CHOICE_MODES[tool_choice]
    else:
        choice.tool_name = tool_choice
    if speculation not in SPECULATION:
        raise ValueError("speculation must be 'auto' or 'off'")
    req = pb.CallToolRequest(
        messages=chat_messages(messages),
        tools=[tool_pb(t, i) for i, t in enumerate(tools)],
        tool_choice=choice,
        parallel_tool_calls=parallel,
        sampling=sampling(temperature, top_p, top_k, seed, max_tokens),
        speculation=SPECULATION[speculation],
        disable_fast_forward=disable_fast_forward,
        request_id=request_id or "",
        examples=example_pbs(examples),
    )
    if answer_schema is not None:  # a dict, JSON text or a pydantic model class
        value = answer_schema if isinstance(answer_schema, (str, Mapping)) else model_schema(answer_schema, "answer_schema_json")
        req.answer_schema_json = encode_json(value, "answer_schema_json")
    return req


def chat_request(
    *,
    messages: Iterable[Message],
    stop: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
    speculation: str | None = None,
    disable_fast_forward: bool = False,
    request_id: str | None = None,
) -> pb.ChatRequest:
    """``stop``: one string or several (the server checks them: at most 4, each 1 to 64 characters)."""
    if speculation not in SPECULATION:
        raise ValueError("speculation must be 'auto' or 'off'")
    return pb.ChatRequest(
        messages=chat_messages(messages),
        stop=[stop] if isinstance(stop, str) else list(stop or ()),
        sampling=sampling(temperature, top_p, top_k, seed, max_tokens),
        speculation=SPECULATION[speculation],
        disable_fast_forward=disable_fast_forward,
        request_id=request_id or "",
    )


def register_request(schema_id: str, schema: Mapping[str, Any] | str | Any, description: str = "") -> pb.RegisterSchemaRequest:
    value = schema if isinstance(schema, (str, Mapping)) else model_schema(schema, "schema_json")
    return pb.RegisterSchemaRequest(schema_id=schema_id, schema_json=encode_json(value, "schema_json"),
                                    description=description)


def set_speculation_request(schema_id: str, mode: str, version: int | None = None) -> pb.SetSchemaSpeculationRequest:
    if mode not in SCHEMA_SPECULATION:
        raise ValueError(f"speculation must be one of {', '.join(SCHEMA_SPECULATION)}, got {mode!r}")
    req = pb.SetSchemaSpeculationRequest(schema_ref=pb.SchemaRef(schema_id=schema_id), speculation=SCHEMA_SPECULATION[mode])
    if version is not None:
        req.schema_ref.version = version
    return req


def stats_request(schema_id: str | None, version: int | None, schema_key: str | None, windows: Sequence[int],
                  model: str | None = None, include_timeline: bool = False) -> pb.GetSchemaStatsRequest:
    if (schema_id is None) == (schema_key is None):
        raise ValueError("give exactly one of schema_id and schema_key")
    req = pb.GetSchemaStatsRequest(window_seconds=list(windows), model=model or "", include_timeline=include_timeline)
    if schema_key is not None:
        req.schema_key = schema_key
    else:
        req.schema_ref.schema_id = schema_id or ""
        if version is not None:
            req.schema_ref.version = version
    return req


def rejected_drafts_request(schema_id: str | None, version: int | None, schema_key: str | None, model: str | None,
                            proposer: str | None, limit: int) -> pb.ListRejectedDraftsRequest:
    if schema_id is not None and schema_key is not None:
        raise ValueError("give at most one of schema_id and schema_key")
    req = pb.ListRejectedDraftsRequest(model=model or "", proposer=proposer or "", limit=limit)
    if schema_key is not None:
        req.schema_key = schema_key
    elif schema_id is not None:
        req.schema_ref.schema_id = schema_id
        if version is not None:
            req.schema_ref.version = version
    return req


def check_output(result: ExtractionResult | ToolCallResult) -> None:
    """Raise for outputs that are not complete valid instances."""
    if result.truncated:
        raise TruncatedOutputError(result)
    if result.outcome == "schema_violation":
        raise SchemaViolationError(result)


def typed_value(result: ExtractionResult, model: Any) -> Any:
    """The result's value, validated into ``model`` when one is given."""
    check_output(result)
    if model is None:
        return result.value
    try:
        return model.model_validate_json(result.json)
    except Exception as exc:  # pydantic.ValidationError, without importing pydantic here
        raise ModelValidationError(f"output does not validate as {model.__name__}: {exc}", result) from exc
