"""Conversions between protobuf messages and the front's values (no I/O, no gRPC context).

Requests become the front's protocol-neutral inputs (``structspec.front.requests``), which build the
engine's requests; engine results become response messages. What is refused here exists on the
wire alone: an unknown enum value, a tool's parameters as JSON text that does not parse.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from typing import Any, Sequence

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from structspec.engine.api import ChatMessage
from structspec.engine.types import (
    FinishReason,
    GenerationResult,
    Outcome,
    SchemaSpeculation,
    SpeculationMode,
    SpeculationReport,
    Timings,
    ToolCall,
    ToolCallResult,
    Usage,
)
from structspec.front.errors import invalid, schema_too_deep
from structspec.front.registry import parse_schema_json
from structspec.front.requests import (Example, ExtractionInput, Sampling, SchemaRef, SchemaSource, TextInput,
                                     ToolCallInput, tool_by_name)
from structspec.grammar import json_text
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.store.base import SchemaRecord

_ROLES = {pb.ROLE_SYSTEM: "system", pb.ROLE_USER: "user", pb.ROLE_ASSISTANT: "assistant", pb.ROLE_TOOL: "tool"}
_FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}
_OUTCOME = {
    Outcome.VALID: pb.OUTCOME_VALID,
    Outcome.TRUNCATED: pb.OUTCOME_TRUNCATED,
    Outcome.SCHEMA_VIOLATION: pb.OUTCOME_SCHEMA_VIOLATION,
    Outcome.INTERNAL_ERROR: pb.OUTCOME_INTERNAL_ERROR,
    Outcome.TEXT: pb.OUTCOME_TEXT,
    Outcome.NOT_CHECKED: pb.OUTCOME_NOT_CHECKED,
}
_SCHEMA_SPECULATION = {
    SchemaSpeculation.AUTO: pb.SCHEMA_SPECULATION_AUTO,
    SchemaSpeculation.OFF: pb.SCHEMA_SPECULATION_OFF,
    SchemaSpeculation.ON: pb.SCHEMA_SPECULATION_ON,
}
_TOOL_CHOICE = {
    pb.TOOL_CHOICE_MODE_UNSPECIFIED: "auto",
    pb.TOOL_CHOICE_MODE_AUTO: "auto",
    pb.TOOL_CHOICE_MODE_REQUIRED: "required",
    pb.TOOL_CHOICE_MODE_NONE: "none",
}


# -- requests ------------------------------------------------------------------------------------


def sampling(msg: pb.SamplingParams) -> Sampling:
    """The fields the caller set (``front.requests.sampling`` gives the unset ones the engine's defaults)."""
    return Sampling(
        temperature=msg.temperature if msg.HasField("temperature") else None,
        top_p=msg.top_p if msg.HasField("top_p") else None,
        top_k=msg.top_k if msg.HasField("top_k") else None,
        seed=msg.seed if msg.HasField("seed") else None,
        max_tokens=msg.max_tokens if msg.HasField("max_tokens") else None,
    )


def messages(msgs: Sequence[pb.ChatMessage], field: str = "messages") -> tuple[ChatMessage, ...]:
    """Proto messages -> the engine's, an assistant turn's tool calls (and their ids) and a tool turn's call id
    and name carried along. Calls belong to assistant turns and call ids to tool turns: elsewhere they are refused."""
    out = []
    for i, m in enumerate(msgs):
        at = f"{field}[{i}]"
        role = _ROLES.get(m.role)
        if role is None:
            raise invalid(f"{at}.role", "role must be SYSTEM, USER, ASSISTANT or TOOL")
        if m.tool_calls and role != "assistant":
            raise invalid(f"{at}.tool_calls", "only an assistant turn carries tool calls")
        if (m.tool_call_id or m.name) and role != "tool":
            raise invalid(f"{at}.tool_call_id" if m.tool_call_id else f"{at}.name", "only on a tool turn")
        calls = tuple(_history_call(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(m.tool_calls))
        out.append(ChatMessage(role=role, content=m.content, tool_calls=calls,
                               tool_call_ids=tuple(c.id for c in m.tool_calls) if calls else (),
                               tool_call_id=m.tool_call_id, name=m.name))
    return tuple(out)


def _history_call(call: pb.ToolCall, at: str) -> ToolCall:
    """A call an earlier assistant turn made: its arguments from ``arguments_json``, else ``arguments``."""
    if not call.name:
        raise invalid(f"{at}.name", "a tool call needs the tool's name")
    if not call.arguments_json.strip():
        return ToolCall(call.name, json_format.MessageToDict(call.arguments))
    try:
        args = json_text.loads(call.arguments_json)
    except json_text.TooDeep as exc:
        raise invalid(f"{at}.arguments_json", str(exc), "INSTANCE_TOO_DEEP") from None
    except json.JSONDecodeError as exc:
        raise invalid(f"{at}.arguments_json", f"not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(args, dict):
        raise invalid(f"{at}.arguments_json", "a call's arguments are a JSON object")
    return ToolCall(call.name, args)


def examples(items: Sequence[pb.Example]) -> tuple[Example, ...]:
    return tuple(Example(ex.text, ex.output_json) for ex in items)


def speculation(value: int) -> SpeculationMode:
    return SpeculationMode.OFF if value == pb.SPECULATION_MODE_OFF else SpeculationMode.AUTO


def schema_speculation(value: int, field: str = "speculation") -> SchemaSpeculation:
    """A SchemaSpeculation enum value; UNSPECIFIED (or one this server does not know) is refused."""
    for mode, number in _SCHEMA_SPECULATION.items():
        if value == number:
            return mode
    raise invalid(field, "must be SCHEMA_SPECULATION_AUTO, SCHEMA_SPECULATION_OFF or SCHEMA_SPECULATION_ON")


def schema_ref(ref: pb.SchemaRef) -> SchemaRef:
    return SchemaRef(ref.schema_id, ref.version if ref.HasField("version") else None)


def schema_source(req: pb.ExtractRequest) -> SchemaSource:
    which = req.WhichOneof("schema")
    if which == "schema_ref":
        return schema_ref(req.schema_ref)
    if which == "json_schema":
        return req.json_schema
    raise invalid("schema", "set schema_ref or json_schema")


def extraction_input(req: pb.ExtractRequest) -> ExtractionInput:
    return ExtractionInput(
        text=req.text,
        messages=messages(req.messages),
        instruction=req.instruction if req.HasField("instruction") else None,
        examples=examples(req.examples),
        sampling=sampling(req.sampling),
        speculation=speculation(req.speculation),
        fast_forward=not req.disable_fast_forward,
    )


def tools(items: Sequence[pb.Tool]) -> tuple[dict[str, Any], ...]:
    """Proto tools -> OpenAI-style entries, the engine's format."""
    out = []
    for i, tool in enumerate(items):
        params: Any = {"type": "object", "properties": {}}
        if tool.parameters_json.strip():
            try:
                params = json_text.loads(tool.parameters_json)
            except json_text.TooDeep as exc:
                raise schema_too_deep(f"tools[{i}].parameters_json", exc) from None
            except json.JSONDecodeError as exc:
                raise invalid(f"tools[{i}].parameters_json", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "INVALID_SCHEMA") from None
            if not isinstance(params, dict):
                raise invalid(f"tools[{i}].parameters_json", "must be a JSON object (a JSON Schema)", "INVALID_SCHEMA")
        fn = {"name": tool.name, "description": tool.description, "parameters": params}
        out.append({"type": "function", "function": fn})
    return tuple(out)


def tool_choice(choice: pb.ToolChoice) -> str:
    if choice.WhichOneof("choice") == "tool_name":
        return tool_by_name(choice.tool_name, "tool_choice.tool_name")
    return _TOOL_CHOICE.get(choice.mode, "auto")


def tool_call_input(req: pb.CallToolRequest) -> ToolCallInput:
    tool_list = tools(req.tools)  # first: its errors come before the messages'
    return ToolCallInput(
        messages=messages(req.messages),
        tools=tool_list,
        tool_choice=tool_choice(req.tool_choice),
        parallel=req.parallel_tool_calls,
        examples=examples(req.examples),
        sampling=sampling(req.sampling),
        speculation=speculation(req.speculation),
        fast_forward=not req.disable_fast_forward,
        answer_schema=(parse_schema_json(req.answer_schema_json, "answer_schema_json")
                       if req.HasField("answer_schema_json") else None),
    )


def text_input(req: pb.ChatRequest) -> TextInput:
    return TextInput(
        messages=messages(req.messages),
        stop=tuple(req.stop),
        sampling=sampling(req.sampling),
        speculation=speculation(req.speculation),
        fast_forward=not req.disable_fast_forward,
    )


# -- results -------------------------------------------------------------------------------------


def usage(u: Usage) -> pb.Usage:
    return pb.Usage(
        prompt_tokens=u.prompt_tokens,
        cached_prompt_tokens=u.cached_prompt_tokens,
        output_tokens=u.output_tokens,
        target_forward_passes=u.target_forward_passes,
        forced_tokens=u.forced_tokens,
        drafted_tokens=dict(u.drafted),
        accepted_tokens=dict(u.accepted),
    )


def timings(t: Timings) -> pb.Timings:
    return pb.Timings(queued_ms=t.queued_ms, prefill_ms=t.prefill_ms, decode_ms=t.decode_ms, total_ms=t.total_ms)


_MAX_DOUBLE = int(sys.float_info.max)


def _finite(value: Any) -> bool:
    """Struct/Value cannot hold NaN or infinities (JSON cannot either, but be safe)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) <= _MAX_DOUBLE  # a Value holds a double: beyond that it overflows
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def parsed_value(result: GenerationResult) -> tuple[bool, Any]:
    """(has a complete JSON value, the value) for outcomes that carry one."""
    if result.truncated or result.outcome not in (Outcome.VALID, Outcome.SCHEMA_VIOLATION):
        return False, None
    if result.value is not None:
        return True, result.value
    try:
        return True, json.loads(result.text)
    except (json.JSONDecodeError, ValueError):
        return False, None


# protobuf decoders stop at 100 nested messages and each JSON level costs up to three of them
# (Struct, map entry, Value): deeper values travel as JSON text only (``json``, ``arguments_json``).
STRUCT_MAX_DEPTH = 30


def _fits_struct(value: Any) -> bool:
    return json_text.value_too_deep(value, STRUCT_MAX_DEPTH) is None and _finite(value)


def struct_of(value: dict[str, Any]) -> struct_pb2.Struct:
    msg = struct_pb2.Struct()
    json_format.ParseDict(value, msg)
    return msg


def speculation_report(r: SpeculationReport) -> pb.SpeculationReport:
    return pb.SpeculationReport(drafted=r.drafted, reason=r.reason, probe=r.probe, max_draft=dict(r.max_draft),
                                proposer_reasons=dict(r.reasons), arm=r.arm)


def extract_result(result: GenerationResult, key: str, model: str = "") -> pb.ExtractResult:
    """``model``: the engine's model, for a result that does not name the one that served it."""
    out = pb.ExtractResult(
        request_id=result.request_id,
        json=result.text,
        finish_reason=_FINISH[result.finish_reason],
        outcome=_OUTCOME[result.outcome],
        truncated=result.truncated,
        usage=usage(result.usage),
        timings=timings(result.timings),
        error=result.error or "",
        schema_key=key,
        model=result.model_key or model,
        draft_version=result.draft_version,
    )
    if result.speculation is not None:
        out.speculation.CopyFrom(speculation_report(result.speculation))
    ok, value = parsed_value(result)
    if ok and _fits_struct(value):
        if isinstance(value, dict):
            out.object.CopyFrom(struct_of(value))
        else:
            json_format.ParseDict(value, out.value)
    return out


def chat_result(result: GenerationResult, model: str = "") -> pb.ChatResult:
    """``model``: the engine's model, for a result that does not name the one that served it."""
    out = pb.ChatResult(
        request_id=result.request_id,
        text=result.text,
        finish_reason=_FINISH[result.finish_reason],
        outcome=_OUTCOME[result.outcome],
        truncated=result.truncated,
        usage=usage(result.usage),
        timings=timings(result.timings),
        model=result.model_key or model,
        draft_version=result.draft_version,
    )
    if result.speculation is not None:
        out.speculation.CopyFrom(speculation_report(result.speculation))
    return out


def tool_call_id() -> str:
    """A new call id, unique across responses (a later tool turn names the call it answers by it)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_result(res: ToolCallResult, model: str = "") -> pb.CallToolResponse:
    """A cut answer (finish LENGTH) carries no calls: a cut call is neither call nor text (only ``raw_output``);
    a cut text answer stays ``text`` (the engine's, which never holds a call's envelope)."""
    r = res.result
    out = pb.CallToolResponse(
        request_id=r.request_id,
        finish_reason=_FINISH[r.finish_reason],
        outcome=_OUTCOME[r.outcome],
        truncated=r.truncated,
        usage=usage(r.usage),
        timings=timings(r.timings),
        error=r.error or "",
        raw_output=r.text,
        model=r.model_key or model,
        draft_version=r.draft_version,
    )
    if r.speculation is not None:
        out.speculation.CopyFrom(speculation_report(r.speculation))
    if res.text is not None:
        out.text = res.text
    if r.truncated:
        return out
    for call in res.calls:
        args = dict(call.arguments)
        msg = pb.ToolCall(name=call.name, arguments_json=json.dumps(args, ensure_ascii=False), id=tool_call_id())
        if _fits_struct(args):
            msg.arguments.CopyFrom(struct_of(args))
        out.tool_calls.append(msg)
    return out


# -- registry ------------------------------------------------------------------------------------


def timestamp(ts: float) -> timestamp_pb2.Timestamp:
    seconds = int(ts)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=int(round((ts - seconds) * 1e9)) % 1_000_000_000)


def schema_version(rec: SchemaRecord, omit_content: bool = False) -> pb.SchemaVersion:
    return pb.SchemaVersion(
        schema_id=rec.schema_id,
        version=rec.version,
        schema_json="" if omit_content else rec.schema_json,
        sha256=rec.sha256,
        description=rec.description,
        created_at=timestamp(rec.created_at),
        source=rec.source,
        speculation=_SCHEMA_SPECULATION.get(SchemaSpeculation(rec.speculation), pb.SCHEMA_SPECULATION_AUTO),
    )

