"""The request body of ``POST /v1/chat/completions``: strict, closed Pydantic models (the wire contract).

- **Strict**: a value of the wrong JSON type is refused, never coerced (``"0.5"`` is not a
  temperature, ``1`` is not ``true``).
- **Closed**: a field not declared here is refused (``extra="forbid"``). An ignored field can change
  what the caller gets without saying so (``logprobs: true`` with no log-probabilities back), so every
  field structspec does not implement is an error, except the few that cannot change the output
  (``store``, ``metadata``, ``service_tier``, ``prompt_cache_key``, ``safety_identifier``: accepted and
  logged once, ``translate.LENIENT_FIELDS``).
- Fields that OpenAI defines and structspec does not implement, but that clients commonly send at
  their no-op value (``frequency_penalty: 0``, ``logprobs: false``, ``n: 1``, ...), are declared
  here and refused at any other value by ``translate`` (which owns every rule beyond the JSON type).
- Roles and response formats are one model each (role-specific rules live in ``translate``), so a
  validation error's location is the request's own path (``messages[2].content``), with no union
  member names in it.

structspec's own request fields travel under one extension key, ``structspec`` (the openai SDK
sends it with ``extra_body={"structspec": {...}}``): ``StructspecOptions``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from structspec.front.errors import FrontError, invalid
from structspec.grammar import json_text

# the body's nesting limit: a schema inside it may nest as deep as gRPC allows one (the schema check reports it)
MAX_BODY_DEPTH = json_text.MAX_JSON_DEPTH + 8
SCHEMA_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for json_schema.name (also a statistics label)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=True)


class ContentPart(_Body):
    """One part of a message's content; only ``text`` parts are supported (``translate`` refuses the rest)."""

    model_config = ConfigDict(extra="allow", strict=True)  # other part types carry other keys: refused by type
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it


class ToolCall(_Body):
    """A call an assistant message made earlier in the conversation."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(_Body):
    """Any chat message; which fields a role may carry is checked by ``translate``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool
    name: str | None = Field(default=None, max_length=256)  # a participant's name, or the tool's on a tool message
    refusal: str | None = None  # assistant: accepted only as null


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of the arguments object
    strict: bool | None = None  # structspec always enforces the parameters schema


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body):
    name: str = Field(pattern=SCHEMA_NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # structspec always enforces the schema

    @field_validator("schema_", mode="before")
    @classmethod
    def _true_is_any_value(cls, value: Any) -> Any:
        return {} if value is True else value  # the schema true admits any JSON value, as {} does


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Body):
    include_usage: bool | None = None


class StructspecOptions(_Body):
    """The extension key: what OpenAI's protocol has no field for."""

    schema_id: str | None = None  # a registered schema instead of response_format
    schema_version: int | None = None  # of schema_id (default: the latest)
    speculation: Literal["auto", "off"] | None = None  # off: no drafting for this request (fast-forward stays)
    timeout_seconds: float | None = Field(default=None, gt=0)  # the request's deadline, from its arrival


class ChatCompletionRequest(_Body):
    model: str
    messages: list[Message] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    user: str | None = Field(default=None, max_length=256)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # declared so that their no-op values pass; any other value is refused by ``translate``
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    # accepted and ignored (``translate.LENIENT_FIELDS``): they do not change the output
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = Field(default=None, max_length=64)
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    safety_identifier: str | None = Field(default=None, max_length=256)
    structspec: StructspecOptions | None = None


# -- parsing ---------------------------------------------------------------------------------------


def parse(raw: bytes, model: type[BaseModel] = ChatCompletionRequest) -> Any:
    """The body's bytes -> the request (``model``); INVALID_ARGUMENT (param = the offending field) otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("body", f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value = json_text.loads(text, MAX_BODY_DEPTH)
    except json_text.TooDeep as exc:
        raise invalid("body", str(exc)) from None
    except json.JSONDecodeError as exc:
        raise invalid("body", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise invalid("body", "must be a JSON object")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise validation_error(exc) from None


# segments of a pydantic error location that name a union member or a type, not a field of the body
_NOT_A_FIELD = re.compile(r"^(?:[A-Z]|str$|int$|float$|bool$|none$|dict|list|literal|function-)|[\[\]]")


def param_of(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the body's field path: ``messages[2].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _NOT_A_FIELD.search(str(part)):
            out += ("." if out else "") + ("schema" if part == "schema_" else str(part))
    return out or "body"


def validation_error(exc: ValidationError) -> FrontError:
    """The most specific failing field (the deepest; the first of those), with every reason pydantic gives for
    it (one per union member)."""
    errors = exc.errors(include_url=False)
    params = [param_of(tuple(e["loc"])) for e in errors]
    first = max(range(len(errors)), key=lambda i: (params[i].count(".") + params[i].count("["), -i))
    param = params[first]
    if errors[first]["type"] == "extra_forbidden":
        return invalid(param, "unknown or unsupported field (structspec refuses fields it does not implement "
                              "rather than ignore them)")
    reasons = []
    for e, where in zip(errors, params):
        if where == param and e["msg"] not in reasons:
            reasons.append(e["msg"])
    return invalid(param, "; or ".join(reasons[:4]))
