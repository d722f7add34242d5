"""Engine results -> OpenAI chat-completion objects and stream chunks (pure functions).

- ``finish_reason``: ``stop`` (the grammar completed: a complete, schema-checked output), ``length``
  (``max_tokens`` reached: the content is a truncated prefix, never a complete object, so clients that
  check it, like the openai SDK's ``parse``, do not take it for one) or ``tool_calls`` (the message
  carries complete calls). Cancelled and failed requests are errors, never choices.
- A tool call has an id (``call_<24 hex>``) and its arguments as JSON text; text the model wrote before its
  calls (``preamble``) is the message's content beside them, else the content is null. A truncated tool output has
  no ``tool_calls`` (``finish_reason: "length"``); its content is the engine's cut text answer, if it was one,
  else null: never a call envelope cut midway as text.
  Streamed, each call is deltas keyed by its ``index``: the id and name first, then the arguments.
- Free text: ``stop`` (its end of turn or a stop string) or ``length``.
- ``usage`` has OpenAI's ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and
  ``prompt_tokens_details.cached_tokens`` (prompt tokens reused from the prefix cache), plus
  structspec's own fields under the extension key ``structspec`` (``usage_extension``), among them the
  model key and draft version that served the request (``system_fingerprint`` is that model key too).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from structspec.engine.types import ToolCallResult
from structspec.engine.types import GenerationResult

EXTENSION = "structspec"


@dataclass(frozen=True)
class Finished:
    """A request's checked end: the engine's result, a tool-call request's calls (None for other requests),
    the extraction's schema key (None for others) and the model key that served it."""

    result: GenerationResult
    calls: ToolCallResult | None
    schema_key: str | None
    fingerprint: str


class Rendering(Protocol):
    """One protocol's rendering of a request (chat completions, responses): the body of a request run once, or
    the server-sent events of a streamed one (``start``, ``delta`` per text delta, then ``end`` or ``error``)."""

    def body(self, fin: Finished) -> dict[str, Any]: ...

    def start(self) -> list[bytes]: ...

    def delta(self, text: str) -> list[bytes]: ...

    def end(self, fin: Finished) -> list[bytes]: ...

    def error(self, body: dict[str, Any]) -> list[bytes]: ...


def message_of(fin: Finished) -> tuple[dict[str, Any], str]:
    """(assistant message, finish reason) of any request."""
    if fin.calls is not None:
        return tool_message(fin.calls)
    if fin.schema_key is None:
        return text_message(fin.result)
    return extraction_message(fin.result)


class ChatRendering:
    """Chat completions: a ``chat.completion`` object, or ``chat.completion.chunk`` events ending in ``[DONE]``."""

    def __init__(self, request_id: str, model: str, created: int, fingerprint: str, include_usage: bool):
        self._id, self._model, self._created = request_id, model, created
        self._chunks = Chunks(request_id, model, created, fingerprint, include_usage)

    def body(self, fin: Finished) -> dict[str, Any]:
        message, finish = message_of(fin)
        return completion(self._id, self._model, self._created, fin.fingerprint, message, finish,
                          usage(fin.result, fin.schema_key))

    def start(self) -> list[bytes]:
        return [self._chunks.role()]

    def delta(self, text: str) -> list[bytes]:
        return [self._chunks.content(text)]

    def end(self, fin: Finished) -> list[bytes]:
        message, finish = message_of(fin)
        out = self._chunks.message(message) if fin.calls is not None else []  # a tool request's text is not streamed
        out.append(self._chunks.finish(finish))
        usage_chunk = self._chunks.usage(usage(fin.result, fin.schema_key))
        return [*out, *([usage_chunk] if usage_chunk is not None else []), DONE]

    def error(self, body: dict[str, Any]) -> list[bytes]:
        return [sse(body), DONE]


def completion_id(request_id: str) -> str:
    return f"chatcmpl-{request_id}"


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def usage_extension(result: GenerationResult, schema_key: str | None) -> dict[str, Any]:
    """What structspec measured: target passes, forced (fast-forwarded) tokens, drafted and accepted tokens per
    proposer, the drafting decision and why (``speculation.reason``, each proposer's reason), the post-check's
    outcome, the engine's timings, and the model and draft version that served it (``model_key``,
    ``draft_version``: fixed at admission, whatever draft was loaded meanwhile; absent from engines that do not
    say)."""
    u, s, t = result.usage, result.speculation, result.timings
    out: dict[str, Any] = {
        "target_forward_passes": u.target_forward_passes,
        "forced_tokens": u.forced_tokens,
        "drafted_tokens": dict(u.drafted),
        "accepted_tokens": dict(u.accepted),
        "speculation": None if s is None else {
            "drafted": s.drafted, "reason": s.reason, "probe": s.probe, "proposer_reasons": dict(s.reasons),
            "max_draft": dict(s.max_draft), "arm": s.arm,
        },
        "outcome": result.outcome.value,
        "timings_ms": {"queued": t.queued_ms, "prefill": t.prefill_ms, "decode": t.decode_ms, "total": t.total_ms},
    }
    if result.model_key:
        out["model_key"] = result.model_key
        out["draft_version"] = result.draft_version
    if schema_key is not None:
        out["schema_key"] = schema_key
    if result.error:
        out["error"] = result.error
    return out


def usage(result: GenerationResult, schema_key: str | None) -> dict[str, Any]:
    u = result.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.prompt_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
        EXTENSION: usage_extension(result, schema_key),
    }


def extraction_message(result: GenerationResult) -> tuple[dict[str, Any], str]:
    """(assistant message, finish reason) of an extraction: the JSON text as content."""
    return {"role": "assistant", "content": result.text, "refusal": None}, "length" if result.truncated else "stop"


def tool_message(res: ToolCallResult) -> tuple[dict[str, Any], str]:
    """(assistant message, finish reason) of a tool-call request."""
    r = res.result
    if r.truncated:  # a cut text answer stays text (the engine's ``text``); a cut call is neither call nor content
        return {"role": "assistant", "content": res.text or None, "refusal": None}, "length"
    if res.calls:
        calls = [{"id": tool_call_id(), "type": "function",
                  "function": {"name": c.name, "arguments": arguments_text(c.arguments)}} for c in res.calls]
        return {"role": "assistant", "content": preamble(res), "refusal": None, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": res.text if res.text is not None else r.text, "refusal": None}, "stop"


def preamble(res: ToolCallResult) -> str | None:
    """The text a model wrote before its calls (a native format's preamble), or None where it wrote none (or only
    whitespace): the message's content beside ``tool_calls``, as OpenAI's, and the Responses API's message item
    before its ``function_call`` items."""
    return res.text if res.calls and res.text and res.text.strip() else None


def arguments_text(arguments: Any) -> str:
    return json.dumps(dict(arguments), ensure_ascii=False)


def text_message(result: GenerationResult) -> tuple[dict[str, Any], str]:
    """(assistant message, finish reason) of a free-text turn."""
    return {"role": "assistant", "content": result.text, "refusal": None}, "length" if result.truncated else "stop"


def completion(request_id: str, model: str, created: int, fingerprint: str, message: dict[str, Any],
               finish_reason: str, usage_value: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": completion_id(request_id),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage_value,
    }


class Chunks:
    """The ``chat.completion.chunk`` objects of one streamed completion, as server-sent events."""

    def __init__(self, request_id: str, model: str, created: int, fingerprint: str, include_usage: bool):
        self._head = {"id": completion_id(request_id), "object": "chat.completion.chunk", "created": created,
                      "model": model, "system_fingerprint": fingerprint}
        self._include_usage = include_usage

    def _event(self, choices: list[dict[str, Any]], usage_value: dict[str, Any] | None = None,
               with_usage: bool = False) -> bytes:
        obj = {**self._head, "choices": choices}
        if self._include_usage:
            obj["usage"] = usage_value if with_usage else None
        return sse(obj)

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self._event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])

    def role(self) -> bytes:
        return self.delta({"role": "assistant", "content": ""})

    def content(self, text: str) -> bytes:
        return self.delta({"content": text})

    def message(self, message: dict[str, Any]) -> list[bytes]:
        """A whole message as deltas: its content, then each call's id and name, then its arguments."""
        out = []
        if message.get("content") is not None:
            out.append(self.delta({"content": message["content"]}))
        for i, call in enumerate(message.get("tool_calls") or ()):
            fn = call["function"]
            out.append(self.delta({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                   "function": {"name": fn["name"], "arguments": ""}}]}))
            out.append(self.delta({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]}))
        return out

    def finish(self, finish_reason: str) -> bytes:
        return self.delta({}, finish_reason)

    def usage(self, usage_value: dict[str, Any]) -> bytes | None:
        """The usage chunk (no choices), only when the request asked for it (``stream_options.include_usage``)."""
        return self._event([], usage_value, with_usage=True) if self._include_usage else None


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
