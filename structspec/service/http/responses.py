"""The Responses API (``POST /v1/responses``): its body, its translation to the chat path's plans, and its rendering.

Terms:

- An *input item* is one entry of ``input`` when it is a list: a message (``role`` and ``content``, a string or
  ``input_text``/``output_text`` parts), a ``function_call`` the model made earlier (``call_id``, ``name``,
  ``arguments`` as JSON text) or a ``function_call_output`` (the tool's ``output`` for a ``call_id``).
- An *output item* is one entry of the response's ``output``: a ``message`` holding one ``output_text`` part, or
  a ``function_call`` (``call_id``, ``name``, ``arguments`` as JSON text). Text the model wrote before its calls
  (``render.preamble``) is a message item before the ``function_call`` items, in the order it was written.

``plan`` turns a body into the same ``translate.ChatPlan`` a chat completion gets (free text, an extraction for
``text.format`` json_schema/json_object, or tool calls for ``tools``, with the format as the answer schema), so
the engine calls are the chat path's, and so are the rules on tools (``tools: []`` is no tools; a ``tool_choice``
without tools, and a tool named like a ``tool_choice`` mode chosen by name, are refused). ``instructions`` is the
first, system, message.

Stateless: ``store`` is accepted and ignored, and ``previous_response_id`` is refused with a 400 naming it (no
response is kept to continue from: send the conversation as ``input``). Fields that would change the output and
are not implemented (``include``, ``reasoning``, ``top_logprobs``, ``truncation`` other than disabled) are refused.

A response's ``status`` is ``completed``, or ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` when the output was cut (a cut call is no ``function_call`` item; cut text is a message
marked incomplete). Streamed, the events are the ones the openai SDK types (``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``/``.done``, ``response.content_part.done``,
``response.function_call_arguments.delta``/``.done``, ``response.output_item.done``, then ``response.completed``
or ``response.incomplete``), each with its ``sequence_number``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from structspec.engine.api import ChatMessage
from structspec.engine.types import SpeculationMode
from structspec.front.errors import invalid
from structspec.front.requests import Sampling, tool_by_name
from structspec.service.http import render, translate
from structspec.service.http.body import SCHEMA_NAME_PATTERN, StructspecOptions

SCHEMA_PARAM = "text.format.schema"
FORMAT_PARAM = "text.format"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=True)


class Part(BaseModel):
    """A content part: ``input_text``/``output_text`` (an earlier output sent back may carry annotations)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class InputItem(_Body):
    """Any input item; which fields each kind may carry is checked by ``plan``."""

    type: Literal["message", "function_call", "function_call_output"] | None = None
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[Part] | None = None
    id: str | None = None
    status: str | None = None
    phase: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[Part] | None = None


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=SCHEMA_NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # structspec always enforces the schema

    @field_validator("schema_", mode="before")
    @classmethod
    def _true_is_any_value(cls, value: Any) -> Any:
        return {} if value is True else value


class TextOptions(_Body):
    format: TextFormat | None = None


class FunctionTool(_Body):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # structspec always enforces the parameters schema


class NamedFunction(_Body):
    type: Literal["function"]
    name: str


class ResponsesRequest(_Body):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    user: str | None = Field(default=None, max_length=256)
    # accepted and ignored (``translate.LENIENT_FIELDS``)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = Field(default=None, max_length=64)
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    safety_identifier: str | None = Field(default=None, max_length=256)
    # declared so that a clear refusal names them
    previous_response_id: str | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    top_logprobs: int | None = None
    truncation: Literal["disabled", "auto"] | None = None
    structspec: StructspecOptions | None = None


# -- the plan --------------------------------------------------------------------------------------------


def plan(body: ResponsesRequest) -> translate.ChatPlan:
    _refuse_unimplemented(body)
    translate.note_lenient([name for name in translate.LENIENT_FIELDS if getattr(body, name) is not None])
    messages = _messages(body)
    sampling = Sampling(temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_output_tokens)
    ext = body.structspec
    speculation = SpeculationMode.OFF if ext is not None and ext.speculation == "off" else SpeculationMode.AUTO
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type != "json_schema" and (fmt.schema_ is not None or fmt.name is not None):
        raise invalid(FORMAT_PARAM, "name and schema only with type json_schema (never ignored)")
    if fmt is not None and fmt.type == "json_schema" and fmt.schema_ is None:
        raise invalid(SCHEMA_PARAM, "is required with type json_schema")
    if fmt is not None and fmt.type == "json_schema" and fmt.name is None:
        raise invalid("text.format.name", "is required with type json_schema")
    schema = None if fmt is None or fmt.type == "text" else (
        dict(translate.ANY_OBJECT) if fmt.type == "json_object" else fmt.schema_)
    target: translate.Target
    if body.tools:  # left out or []: no tools
        choice = body.tool_choice
        tool_choice = tool_by_name(choice.name, "tool_choice.name") if isinstance(choice, NamedFunction) \
            else (choice or "auto")
        parallel = bool(body.parallel_tool_calls)  # unset: one call, as on chat completions
        target = translate.tool_target(messages, [(t.name, t.description, t.parameters) for t in body.tools],
                                       tool_choice, parallel, schema, sampling, speculation)
    else:
        translate.refuse_tool_options(body.tool_choice, body.parallel_tool_calls)
        if schema is None:
            target = translate.TextTarget(translate.text_input(messages, (), sampling, speculation))
        else:
            assert fmt is not None
            target = translate.extraction_target(messages, schema, fmt.name,
                                                 SCHEMA_PARAM if fmt.type == "json_schema" else FORMAT_PARAM,
                                                 fmt.description, sampling, speculation)
    return translate.ChatPlan(model=body.model, target=target, max_tokens_param="max_output_tokens",
                              stream=bool(body.stream), include_usage=True,
                              timeout_seconds=ext.timeout_seconds if ext is not None else None, user=body.user)


def _refuse_unimplemented(body: ResponsesRequest) -> None:
    if body.previous_response_id is not None:
        raise invalid("previous_response_id", "responses are not stored here: send the conversation as input "
                                              "(the earlier output items and the function_call_output items)")
    if body.include:
        raise invalid("include", "no extra output data is returned (only [])")
    if body.reasoning and any(v is not None for v in body.reasoning.values()):
        raise invalid("reasoning", "reasoning settings are not supported (only null)")
    if body.top_logprobs not in (None, 0):
        raise invalid("top_logprobs", "log-probabilities are not returned (only 0)")
    if body.truncation == "auto":
        raise invalid("truncation", "only disabled: an input longer than the context is refused, never cut")
    ext = body.structspec
    if ext is not None and ext.schema_id is not None:
        raise invalid("structspec.schema_id", "not on the Responses API (use text.format, or chat completions)")


def _text(content: str | list[Part] | None, at: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text"):
            raise invalid(f"{at}[{j}].type", f"{part.type!r} content is not supported (text parts only)")
        if part.text is None:
            raise invalid(f"{at}[{j}].text", "a text part needs its text")
        texts.append(part.text)
    return "\n".join(texts)


def _messages(body: ResponsesRequest) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = [ChatMessage("system", body.instructions)] if body.instructions else []
    if isinstance(body.input, str):
        return (*out, ChatMessage("user", body.input))
    names: dict[str, str] = {}  # an earlier call's id -> its tool's name
    for i, item in enumerate(body.input):
        at = f"input[{i}]"
        kind = item.type or "message"
        if kind == "function_call":
            if item.call_id is None or item.name is None or item.arguments is None:
                raise invalid(at, "a function_call item needs call_id, name and arguments")
            call = translate.parse_call(item.name, item.arguments, f"{at}.arguments")
            names[item.call_id] = item.name
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":  # several calls of one turn: one assistant message
                out[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, call),
                                      (*last.tool_call_ids, item.call_id))
            else:
                out.append(ChatMessage("assistant", "", (call,), (item.call_id,)))
        elif kind == "function_call_output":
            if item.call_id is None or item.output is None:
                raise invalid(at, "a function_call_output item needs call_id and output")
            if item.call_id not in names:
                raise invalid(f"{at}.call_id", f"{item.call_id!r} is not the call_id of an earlier function_call item")
            out.append(ChatMessage("tool", _text(item.output, f"{at}.output") or "", tool_call_id=item.call_id,
                                   name=names[item.call_id]))
        else:
            if item.role is None:
                raise invalid(f"{at}.role", "a message item needs its role")
            content = _text(item.content, f"{at}.content")
            if content is None:
                raise invalid(f"{at}.content", "a message item needs content")
            out.append(ChatMessage("system" if item.role == "developer" else item.role, content))
    if not out:
        raise invalid("input", "must not be empty")
    return tuple(out)


# -- rendering -------------------------------------------------------------------------------------------


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _usage(fin: render.Finished) -> dict[str, Any]:
    u = fin.result.usage
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
            "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.output_tokens,
            render.EXTENSION: render.usage_extension(fin.result, fin.schema_key)}


class ResponsesRendering:
    """A ``response`` object, or its stream of typed events (``render.Rendering``)."""

    def __init__(self, request_id: str, body: ResponsesRequest, created: int):
        self._body = body
        self._head: dict[str, Any] = {"id": f"resp_{request_id}", "object": "response", "created_at": created}
        self._seq = 0
        self._message_id = _item_id("msg")
        self._text: list[str] | None = None  # the streamed message's text so far (None: no message opened)

    def _response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                  incomplete: bool = False) -> dict[str, Any]:
        b = self._body
        fmt = b.text.format.model_dump(by_alias=True, exclude_none=True) if b.text and b.text.format else {"type": "text"}
        choice = b.tool_choice.model_dump() if isinstance(b.tool_choice, NamedFunction) else (b.tool_choice or "auto")
        return {**self._head, "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": b.model,
                "output": output, "parallel_tool_calls": bool(b.parallel_tool_calls), "previous_response_id": None,
                "reasoning": None, "store": False, "temperature": b.temperature, "text": {"format": fmt},
                "tool_choice": choice, "tools": [t.model_dump() for t in b.tools or ()], "top_p": b.top_p,
                "truncation": "disabled", "usage": usage, "metadata": b.metadata or {}, "user": b.user}

    def _output(self, fin: render.Finished) -> tuple[list[dict[str, Any]], bool]:
        """(output items, incomplete)."""
        r = fin.result
        if fin.calls is not None and fin.calls.calls and not r.truncated:
            before = render.preamble(fin.calls)  # generation order, as OpenAI's: the text, then the calls
            return [*([self._message(before, "completed")] if before is not None else []),
                    *({"type": "function_call", "id": _item_id("fc"), "call_id": render.tool_call_id(),
                       "name": c.name, "arguments": render.arguments_text(c.arguments), "status": "completed"}
                      for c in fin.calls.calls)], False
        if fin.calls is not None and r.truncated and not fin.calls.text:
            return [], True  # a cut call is no call, and its envelope is no text
        text = fin.calls.text if fin.calls is not None and fin.calls.text is not None else r.text
        return [self._message(text, "incomplete" if r.truncated else "completed")], r.truncated

    def _message(self, text: str, status: str) -> dict[str, Any]:
        return {"type": "message", "id": self._message_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    def body(self, fin: render.Finished) -> dict[str, Any]:
        output, incomplete = self._output(fin)
        return self._response("incomplete" if incomplete else "completed", output, _usage(fin), incomplete)

    # -- events

    def _event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def start(self) -> list[bytes]:
        return [self._event("response.created", response=self._response("in_progress", [], None)),
                self._event("response.in_progress", response=self._response("in_progress", [], None))]

    def _open_message(self) -> list[bytes]:
        self._text = []  # the message is always the first output item (a preamble comes before its calls)
        item = {**self._message("", "in_progress"), "content": []}
        return [self._event("response.output_item.added", output_index=0, item=item),
                self._event("response.content_part.added", item_id=self._message_id, output_index=0,
                            content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                   "logprobs": []})]

    def delta(self, text: str) -> list[bytes]:
        out = self._open_message() if self._text is None else []
        assert self._text is not None
        self._text.append(text)
        out.append(self._event("response.output_text.delta", item_id=self._message_id, output_index=0,
                               content_index=0, delta=text, logprobs=[]))
        return out

    def end(self, fin: render.Finished) -> list[bytes]:
        output, incomplete = self._output(fin)
        events: list[bytes] = []
        for index, item in enumerate(output):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                if self._text is None:  # not streamed (a tool request's text answer): all of it now
                    events += self._open_message()
                    if text:
                        events.append(self._event("response.output_text.delta", item_id=self._message_id,
                                                  output_index=index, content_index=0, delta=text, logprobs=[]))
                events.append(self._event("response.output_text.done", item_id=self._message_id, output_index=index,
                                          content_index=0, text=text, logprobs=[]))
                events.append(self._event("response.content_part.done", item_id=self._message_id,
                                          output_index=index, content_index=0, part=item["content"][0]))
            else:
                events.append(self._event("response.output_item.added", output_index=index,
                                          item={**item, "arguments": "", "status": "in_progress"}))
                events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                          output_index=index, delta=item["arguments"]))
                events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                          output_index=index, name=item["name"], arguments=item["arguments"]))
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        final = self._response("incomplete" if incomplete else "completed", output, _usage(fin), incomplete)
        return [*events, self._event("response.incomplete" if incomplete else "response.completed", response=final)]

    def error(self, body: dict[str, Any]) -> list[bytes]:
        return [render.sse(body)]
