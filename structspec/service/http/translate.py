"""A chat-completions body -> the front's protocol-neutral inputs (pure: no I/O, no engine, no registry).

``plan`` decides what a request is and refuses what structspec cannot do, each refusal an
INVALID_ARGUMENT ``FrontError`` naming the body's own field (``param``):

- **Extraction** (an ``ExtractionInput`` and its schema): ``response_format`` ``json_schema`` (its ``schema``) or
  ``json_object`` (any JSON object), or a registered schema named by ``structspec.schema_id``.
  System and developer messages, after ``json_schema.description``, become the prompt's
  instruction; a single remaining user message is the text to extract from, several messages are
  passed as the conversation.
- **Tool calls** (a ``ToolCallInput``): ``tools`` with ``tool_choice`` ``auto`` (a text answer or
  calls), ``none`` (a text answer), ``required`` (calls) or a named function (a call to it; a tool named
  ``auto``, ``none`` or ``required`` cannot be chosen by name, ``front.requests.tool_by_name``), and
  ``parallel_tool_calls``: true, one or more calls (a JSON list); false or unset, exactly one call.
  Unset is OpenAI's "may call several", and one call is a valid answer to it: the models structspec
  serves write one call per turn (their worked examples show one), and a list they were never shown
  degrades their calls.
  Every message goes to the prompt in order.
  ``response_format`` json_schema or json_object beside ``tools`` is the *answer schema*: the model
  calls, or answers with JSON valid against it (the content).
  An assistant message's ``tool_calls`` (with their ids) and a tool message's ``tool_call_id`` and
  ``name`` stay on the ``ChatMessage``, so the prompt renders them the model's own way.
- **Free text** (a ``TextInput``): no ``response_format`` (or ``text``), no tools, no registered schema;
  ``stop`` (a string or up to 4) ends the text.
- No tools is ``tools`` left out or ``[]``: clients send ``[]`` for an agent without tools, and OpenAI's
  Responses API takes it so.
- **Lenient** (``LENIENT_FIELDS``): fields that do not change the output are accepted and logged once
  per field per process (``note_lenient``).
- Refused: ``n`` other than 1, ``stop`` on a JSON output (an output ends where its grammar ends;
  cutting a JSON document at a stop sequence would make it invalid), penalties, log-probabilities,
  logit biases, non-text content parts, and a ``tool_choice`` or ``parallel_tool_calls`` without tools
  (``refuse_tool_options``).

Unset sampling fields stay unset: the front gives them the engine's defaults (greedy, ``max_tokens``
256 within the server's cap), as on gRPC; their ranges are checked by the engine's request types.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from structspec.engine.api import ChatMessage
from structspec.engine.types import SpeculationMode, ToolCall
from structspec.front.requests import ExtractionInput, Sampling, SchemaRef, TextInput, ToolCallInput, tool_by_name
from structspec.grammar import json_text
from structspec.front.errors import invalid
from structspec.service.http.body import ChatCompletionRequest, Message

log = logging.getLogger("structspec.service.http")
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # response_format json_object
# accepted and ignored: none changes what the model writes (``strict`` is always enforced, ``parallel_tool_calls``
# is honoured, ``user`` is logged at debug)
LENIENT_FIELDS = ("store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier")
_noted: set[str] = set()

# where an extraction's schema came from, as the body's field
SCHEMA_PARAM = "response_format.json_schema.schema"
JSON_OBJECT_PARAM = "response_format"
SCHEMA_ID_PARAM = "structspec.schema_id"


@dataclass(frozen=True)
class ExtractionTarget:
    schema: dict[str, Any] | SchemaRef  # inline, or the registered ``structspec.schema_id``
    name: str | None  # json_schema.name: the readable label of an inline schema's statistics
    schema_param: str  # the body field the schema came from (errors about the schema name it)
    input: ExtractionInput


@dataclass(frozen=True)
class ToolTarget:
    input: ToolCallInput


@dataclass(frozen=True)
class TextTarget:
    input: TextInput


Target = ExtractionTarget | ToolTarget | TextTarget


@dataclass(frozen=True)
class ChatPlan:
    model: str
    target: Target
    max_tokens_param: str  # "max_tokens" or "max_completion_tokens": the one the caller set
    stream: bool
    include_usage: bool
    timeout_seconds: float | None
    user: str | None


def note_lenient(names: list[str]) -> None:
    """Log each accepted-and-ignored field once per process (what a deployment's clients send, without noise)."""
    for name in names:
        if name not in _noted:
            _noted.add(name)
            log.info("accepted and ignored request field %r (it does not change the output); logged once", name)


def plan(body: ChatCompletionRequest) -> ChatPlan:
    _refuse_unimplemented(body)
    note_lenient([name for name in LENIENT_FIELDS if getattr(body, name) is not None])
    ext = body.structspec
    if ext is not None and ext.schema_version is not None and ext.schema_id is None:
        raise invalid("structspec.schema_version", "needs structspec.schema_id")
    fmt = body.response_format
    target: Target
    if body.tools:  # left out or []: no tools
        target = _tool_target(body)
    elif (fmt is None or fmt.type == "text") and (ext is None or ext.schema_id is None):
        target = _text_target(body)
    else:
        target = _extraction_target(body)
    if not isinstance(target, TextTarget) and body.stop not in (None, "", []):
        raise invalid("stop", "stop sequences are for free text only: a JSON output or tool call ends where its "
                              "grammar ends, and one cut at a stop sequence would not be valid")
    return ChatPlan(
        model=body.model,
        target=target,
        max_tokens_param="max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
        stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        timeout_seconds=ext.timeout_seconds if ext is not None else None,
        user=body.user,
    )


# -- refusals ----------------------------------------------------------------------------------------


def _refuse_unimplemented(body: ChatCompletionRequest) -> None:
    if body.n not in (None, 1):
        raise invalid("n", "only n = 1 is supported (one choice per request; send several requests for several)")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name) not in (None, 0):
            raise invalid(name, "penalties are not supported (only 0)")
    if body.logprobs:
        raise invalid("logprobs", "log-probabilities are not returned (only false)")
    if body.top_logprobs not in (None, 0):
        raise invalid("top_logprobs", "log-probabilities are not returned (only 0)")
    if body.logit_bias:
        raise invalid("logit_bias", "logit biases are not supported (only {})")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options", "only with stream: true")


# -- what the request asks for -----------------------------------------------------------------------


def refuse_tool_options(tool_choice: object, parallel_tool_calls: bool | None) -> None:
    """Without tools, a ``tool_choice`` or ``parallel_tool_calls`` has nothing to apply to: refused, never ignored."""
    if tool_choice is not None:
        raise invalid("tool_choice", "only with tools (a non-empty tools list)")
    if parallel_tool_calls is not None:
        raise invalid("parallel_tool_calls", "only with tools (a non-empty tools list)")


def _text_target(body: ChatCompletionRequest) -> TextTarget:
    refuse_tool_options(body.tool_choice, body.parallel_tool_calls)
    if body.response_format is not None and body.response_format.json_schema is not None:
        raise invalid("response_format.json_schema", "only with type json_schema (never ignored)")
    stop = body.stop
    stops = () if stop in (None, "") else ((stop,) if isinstance(stop, str) else tuple(stop))
    return TextTarget(text_input(_messages(body.messages), stops, _sampling(body), _speculation(body)))


def text_input(messages: tuple[ChatMessage, ...], stop: tuple[str, ...], sampling: Sampling,
               speculation: SpeculationMode) -> TextInput:
    """A free-text turn (the Responses API's too); ``developer`` is already ``system``."""
    if not any(m.role == "user" for m in messages):
        raise invalid("messages", "needs a user message")
    return TextInput(messages, stop, sampling=sampling, speculation=speculation)


def _extraction_target(body: ChatCompletionRequest) -> ExtractionTarget:
    refuse_tool_options(body.tool_choice, body.parallel_tool_calls)
    fmt, ext = body.response_format, body.structspec
    description: str | None = None
    name: str | None = None
    schema: dict[str, Any] | SchemaRef
    if ext is not None and ext.schema_id is not None:
        if fmt is not None:
            raise invalid("response_format", "set either response_format or structspec.schema_id, not both")
        schema, param = SchemaRef(ext.schema_id, ext.schema_version), SCHEMA_ID_PARAM
    elif fmt is None or fmt.type == "text":
        raise AssertionError("free text is planned by _text_target")
    elif fmt.type == "json_object":
        if fmt.json_schema is not None:
            raise invalid("response_format.json_schema", "only with type json_schema")
        schema, param = dict(ANY_OBJECT), JSON_OBJECT_PARAM
    else:
        spec = fmt.json_schema
        if spec is None:
            raise invalid("response_format.json_schema", "is required with type json_schema")
        if spec.schema_ is None:
            raise invalid(SCHEMA_PARAM, "is required: structspec constrains the output to this schema")
        schema, param, name, description = spec.schema_, SCHEMA_PARAM, spec.name, spec.description
    return extraction_target(_messages(body.messages), schema, name, param, description, _sampling(body),
                             _speculation(body))


def extraction_target(messages: tuple[ChatMessage, ...], schema: dict[str, Any] | SchemaRef, name: str | None,
                      param: str, description: str | None, sampling: Sampling,
                      speculation: SpeculationMode) -> ExtractionTarget:
    """System messages (after the schema's description) are the instruction; one remaining user message is the
    text, several are the conversation."""
    instruction_parts = [description] if description else []
    rest: list[ChatMessage] = []
    for msg in messages:
        if msg.role == "system":
            instruction_parts.append(msg.content)
        else:
            rest.append(msg)
    if not any(m.role == "user" for m in rest):
        raise invalid("messages", "needs a user message (the input to extract from)")
    single = len(rest) == 1
    return ExtractionTarget(schema, name, param, ExtractionInput(
        text=rest[0].content if single else "", messages=() if single else tuple(rest),
        instruction="\n".join(p.strip() for p in instruction_parts if p.strip()) or None,
        sampling=sampling, speculation=speculation,
    ))


def _tool_target(body: ChatCompletionRequest) -> ToolTarget:
    assert body.tools
    fmt = body.response_format
    answer_schema: dict[str, Any] | None = None
    if fmt is not None and fmt.type == "json_object":
        if fmt.json_schema is not None:
            raise invalid("response_format.json_schema", "only with type json_schema")
        answer_schema = dict(ANY_OBJECT)
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise invalid(SCHEMA_PARAM, "is required: a final answer beside the tools is constrained to this schema")
        answer_schema = fmt.json_schema.schema_
    elif fmt is not None and fmt.json_schema is not None:
        raise invalid("response_format.json_schema", "only with type json_schema (never ignored)")
    if body.structspec is not None and body.structspec.schema_id is not None:
        raise invalid("structspec.schema_id", "not with tools")
    tools = [(t.function.name, t.function.description, t.function.parameters) for t in body.tools]
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        tool_choice: str = choice or "auto"
    else:
        tool_choice = tool_by_name(choice.function.name, "tool_choice.function.name")
    parallel = bool(body.parallel_tool_calls)  # unset: one call (see the module's docstring)
    return tool_target(_messages(body.messages), tools, tool_choice, parallel, answer_schema, _sampling(body),
                       _speculation(body))


def tool_target(messages: tuple[ChatMessage, ...], tools: list[tuple[str, str | None, dict[str, Any] | None]],
                tool_choice: str, parallel: bool, answer_schema: dict[str, Any] | None, sampling: Sampling,
                speculation: SpeculationMode) -> ToolTarget:
    """(name, description, parameters) per tool -> the engine's OpenAI-style tool entries."""
    entries = []
    for name, description, parameters in tools:
        fn: dict[str, Any] = {"name": name, "description": description or ""}
        if parameters is not None:
            fn["parameters"] = parameters
        entries.append({"type": "function", "function": fn})
    return ToolTarget(ToolCallInput(messages, tuple(entries), tool_choice, parallel, sampling=sampling,
                                    speculation=speculation, answer_schema=answer_schema))


def _sampling(body: ChatCompletionRequest) -> Sampling:
    if body.max_tokens is not None and body.max_completion_tokens is not None \
            and body.max_tokens != body.max_completion_tokens:
        raise invalid("max_completion_tokens", "differs from max_tokens; set one of them")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return Sampling(temperature=body.temperature, top_p=body.top_p, seed=body.seed, max_tokens=max_tokens)


def _speculation(body: ChatCompletionRequest) -> SpeculationMode:
    off = body.structspec is not None and body.structspec.speculation == "off"
    return SpeculationMode.OFF if off else SpeculationMode.AUTO


# -- messages ----------------------------------------------------------------------------------------


def _messages(messages: list[Message]) -> tuple[ChatMessage, ...]:
    out = []
    call_names: dict[str, str] = {}  # an earlier call's id -> its tool's name
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        content = _content(m, at)
        if m.refusal is not None:
            raise invalid(f"{at}.refusal", "only null (an earlier refusal cannot be replayed)")
        if m.role != "assistant" and m.tool_calls is not None:
            raise invalid(f"{at}.tool_calls", "only on assistant messages")
        if m.role != "tool" and m.tool_call_id is not None:
            raise invalid(f"{at}.tool_call_id", "only on tool messages")
        if m.role == "assistant":
            calls = tuple(parse_call(c.function.name, c.function.arguments, f"{at}.tool_calls[{j}].function.arguments")
                          for j, c in enumerate(m.tool_calls or ()))
            if not content and not calls:
                raise invalid(f"{at}.content", "an assistant message needs content or tool_calls")
            ids = tuple(c.id for c in m.tool_calls or ())
            call_names.update(zip(ids, (c.name for c in calls)))
            out.append(ChatMessage("assistant", content or "", tool_calls=calls, tool_call_ids=ids,
                                   name=m.name or ""))
            continue
        if content is None:
            raise invalid(f"{at}.content", f"a {m.role} message needs content")
        if m.role == "tool":
            if m.tool_call_id is None:
                raise invalid(f"{at}.tool_call_id", "a tool message needs the id of the call it answers")
            if m.tool_call_id not in call_names:
                raise invalid(f"{at}.tool_call_id", f"{m.tool_call_id!r} is not the id of an earlier assistant "
                                                    "message's tool call")
            out.append(ChatMessage("tool", content, tool_call_id=m.tool_call_id,
                                   name=m.name or call_names[m.tool_call_id]))
            continue
        out.append(ChatMessage("system" if m.role == "developer" else m.role, content, name=m.name or ""))
    return tuple(out)


def parse_call(name: str, arguments: str, where: str) -> ToolCall:
    """An earlier call as the caller sent it back (arguments as JSON text of an object) -> the engine's call."""
    try:
        args = json_text.loads(arguments)
    except json_text.TooDeep as exc:
        raise invalid(where, str(exc)) from None
    except json.JSONDecodeError as exc:
        raise invalid(where, f"not JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(args, dict):
        raise invalid(where, "must be the JSON text of an object")
    return ToolCall(name, args)


def _content(m: Message, at: str) -> str | None:
    if m.content is None or isinstance(m.content, str):
        return m.content
    texts = []
    for j, part in enumerate(m.content):
        where = f"{at}.content[{j}]"
        if part.type != "text":
            raise invalid(f"{where}.type", f"{part.type!r} content is not supported (text parts only)")
        for key in part.model_extra or {}:
            raise invalid(f"{where}.{key}", "unsupported field of a text part")
        if part.text is None:
            raise invalid(f"{where}.text", "a text part needs its text")
        texts.append(part.text)
    return "\n".join(texts)
