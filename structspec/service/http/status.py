"""``front.errors.Code`` -> HTTP status and OpenAI's error shape: the one place the HTTP API maps errors.

Every failure is first the same ``FrontError`` the gRPC servicer answers with (``front.failures`` and the
request checks decide the code and reason); this module only renders it:

    {"error": {"message": ..., "type": ..., "param": ..., "code": <reason, lower case>,
               "structspec": {"reason", "request_id", "violations": [{field, description, json_pointer, keyword}]}}}

| code (reason) | HTTP | type |
| --- | --- | --- |
| INVALID_ARGUMENT | 400 | invalid_request_error |
| INVALID_ARGUMENT (MESSAGE_TOO_LARGE) | 413 | invalid_request_error |
| RESOURCE_EXHAUSTED (KV_BUDGET, GRAMMAR_LIMIT: this request can never fit) | 400 | invalid_request_error |
| RESOURCE_EXHAUSTED (QUEUE_FULL, TOO_MANY_REQUESTS) | 429 + Retry-After | rate_limit_error |
| UNAUTHENTICATED | 401 + WWW-Authenticate | invalid_request_error (code invalid_api_key) |
| PERMISSION_DENIED | 403 | permission_error |
| NOT_FOUND | 404 | invalid_request_error |
| DEADLINE_EXCEEDED | 504 | timeout_error |
| UNAVAILABLE (MODEL_LOADING, DRAINING, ENGINE_STOPPED), CANCELLED (by the server) | 503 + Retry-After | server_error |
| INTERNAL, anything else | 500 | server_error |

``param`` names the request body's field (``messages[0].content``, ``max_tokens``); for a schema it
also carries the JSON pointer of the offending keyword within it, after ``#``
(``response_format.json_schema.schema#/properties/age/type``), and the message says the same in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from structspec.front.errors import Code, FrontError

# (HTTP status, OpenAI error type) per code; reasons that need another status are in _BY_REASON
_BY_CODE: dict[Code, tuple[int, str]] = {
    Code.INVALID_ARGUMENT: (400, "invalid_request_error"),
    Code.UNAUTHENTICATED: (401, "invalid_request_error"),
    Code.PERMISSION_DENIED: (403, "permission_error"),
    Code.NOT_FOUND: (404, "invalid_request_error"),
    Code.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    Code.DEADLINE_EXCEEDED: (504, "timeout_error"),
    Code.UNAVAILABLE: (503, "server_error"),
    Code.CANCELLED: (503, "server_error"),  # the server cancelled it (shutdown); a client that left gets nothing
}
_BY_REASON: dict[str, tuple[int, str]] = {
    "MESSAGE_TOO_LARGE": (413, "invalid_request_error"),
    "KV_BUDGET": (400, "invalid_request_error"),
    "GRAMMAR_LIMIT": (400, "invalid_request_error"),
}
_CODE_OVERRIDES = {"UNAUTHENTICATED": "invalid_api_key", "CONTEXT_TOO_LONG": "context_length_exceeded",
                   "SCHEMA_NOT_FOUND": "schema_not_found"}
RETRY_AFTER_S = {429: 1, 503: 1}
LOADING_RETRY_AFTER_S = 5

# request fields (as ``front.failures`` and the engine's request types name them) -> the body's fields
_FIELDS = {
    "sampling.temperature": "temperature", "sampling.top_p": "top_p", "sampling.seed": "seed",
    "text": "messages", "tool_choice.tool_name": "tool_choice", "schema_id": "structspec.schema_id",
    "version": "structspec.schema_version", "request": None,
}
_TOOL_NAME = re.compile(r"^tools\[(\d+)\]\.name$")
_TOOL_POINTER = re.compile(r"^/tools/(\d+)(?:/function)?(/parameters)?(.*)$")


@dataclass(frozen=True)
class HttpError:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class ParamNames:
    """How one request's gRPC field names read as its body's fields (which max-tokens field it set, where
    its schema came from, what holds the conversation, and where a tool's fields sit: ``.function`` on chat
    completions, directly on the tool in the Responses API)."""

    def __init__(self, max_tokens: str = "max_tokens", schema: str = "response_format.json_schema.schema",
                 messages: str = "messages", tool_fields: str = ".function"):
        self.max_tokens = max_tokens
        self.schema = schema
        self.messages = messages
        self.tool_fields = tool_fields

    def field(self, name: str) -> str | None:
        if name in ("max_tokens", "sampling.max_tokens"):
            return self.max_tokens
        if name in ("json_schema",):
            return self.schema
        if name in ("text", "messages"):
            return self.messages
        m = _TOOL_NAME.match(name)
        if m:
            return f"tools[{m.group(1)}]{self.tool_fields}.name"
        return _FIELDS.get(name, name)

    def param(self, name: str, pointer: str = "", keyword: str = "") -> str | None:
        """The body field, plus ``#<JSON pointer>`` to the keyword at fault inside a schema."""
        base = self.field(name)
        if base is None:
            return None
        if base == "tools" and pointer:
            m = _TOOL_POINTER.match(pointer)
            if m:
                base = f"tools[{m.group(1)}]{self.tool_fields}" + ("." + m.group(2)[1:] if m.group(2) else "")
                pointer = m.group(3)
        where = pointer + ("/" + _escape(keyword) if keyword and not pointer.endswith("/" + _escape(keyword)) else "")
        return f"{base}#{where}" if where else base


def render(err: FrontError, request_id: str, names: ParamNames | None = None) -> HttpError:
    names = names or ParamNames()
    status, kind = _BY_REASON.get(err.reason) or _BY_CODE.get(err.code, (500, "server_error"))
    first = err.violations[0] if err.violations else None
    param = names.param(first.field, first.json_pointer, first.keyword) if first is not None else None
    message = err.message
    if first is not None:  # the message starts with the gRPC field name: say the body's instead
        body_field = names.field(first.field)
        if body_field and message.startswith(first.field + ":"):
            message = body_field + message[len(first.field):]
    headers: dict[str, str] = {"x-request-id": request_id} if request_id else {}
    if status in RETRY_AFTER_S:
        headers["retry-after"] = str(LOADING_RETRY_AFTER_S if err.reason == "MODEL_LOADING" else RETRY_AFTER_S[status])
    if status == 401:
        headers["www-authenticate"] = 'Bearer realm="structspec"'
    error = {
        "message": message,
        "type": kind,
        "param": param,
        "code": _CODE_OVERRIDES.get(err.reason, err.reason.lower()),
        "structspec": {
            "reason": err.reason,
            "request_id": request_id,
            "violations": [{"field": names.field(v.field) or v.field, "description": v.description,
                            "json_pointer": v.json_pointer, "keyword": v.keyword} for v in err.violations],
        },
    }
    return HttpError(status, {"error": error}, headers)
