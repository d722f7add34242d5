"""Call formats: how a model family writes tool calls, the grammar that allows exactly that, and its parser.

A *call format* (``CallFormat``) is one family's way of writing calls after (or instead of) a text answer:

- ``hermes`` (Hermes, Qwen2.5): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per
  call, parallel calls one after another (``\\n`` between).
- ``llama3`` (Llama 3.1/3.2): the answer is one JSON call ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>``; parallel calls are separated by ``; ``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.
- ``json``: the generic form, for templates that render no tools and for the plain format: the whole output is a
  JSON call object (a JSON list of calls when parallel), or a text answer that does not start with ``{`` or ``[``.

The *trigger* is the text that opens the calls (``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>``); where the
tokenizer has it as one special token, the grammar uses that token (``<[id]>``), else its text. Text before the
trigger is the answer's content. ``detect`` reads the family from a chat template's text (the markers it renders).

Grammars (``lark_grammar``, llguidance's Lark with ``%json``) per ``tool_choice``: ``auto`` is free text that never
writes the trigger (ending at the model's end of turn), or that text then calls; ``required`` and a named tool
start with the trigger; ``none`` is text only (for ``json``, text that does not open as a call would). Every call
names a declared tool (``name`` a ``const``) and its arguments are that tool's parameters schema (one ``%json``
alternative per tool). An *answer schema* replaces the free text with one JSON value valid against it. *Refused
text* (a prompt format's own call heading) is never part of the free text.

``CallFormat.parse`` reads each call's JSON with the JSON decoder, so an argument string may hold any marker (a
closer, a trigger, a separator). Beside an answer schema, an output is read as the grammar's branch that admitted it:
where a call is a bare JSON object (llama3, json), an object is a call when the call grammar admits it, the answer
when only the answer schema does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from structspec.grammar.postcheck import instance_errors
from structspec.grammar.tools import Tool, ToolCall, ToolChoice, ToolOutput, _embed

FAMILIES = ("hermes", "llama3", "mistral", "json")


@dataclass(frozen=True)
class CallFormat:
    family: str
    trigger: str = ""  # opens the calls ("" for json: a call opens with "{" or "[")
    closer: str = ""  # ends each call (hermes)
    separator: str = ""  # between parallel calls
    arguments_key: str = "arguments"
    listed: bool = False  # the calls are one JSON list after the trigger (mistral)
    text_before: bool = True  # a text answer may precede the calls (not where the calls are the whole answer)

    def parse(self, text: str, tools: Sequence[Tool], choice: ToolChoice, parallel: bool,
              answer: Mapping[str, Any] | None = None) -> ToolOutput:
        """Generated text -> content + calls; ValueError when it is neither (for these tools and choice).
        ``answer``: the answer schema, where one replaces the text answer (its JSON is kept as text). Arguments are
        not validated here, except to tell a call from an answer that reads as one (``_answer_or_calls``)."""
        return _parse(self, text, tools, choice, parallel, answer)

    def partial_text(self, text: str) -> str | None:
        """A truncated output's text answer, or None where a call had begun (a cut call is never content)."""
        return None if _call_start(self, text) is not None else text


HERMES = CallFormat("hermes", trigger="<tool_call>", closer="</tool_call>", separator="\n")
LLAMA3 = CallFormat("llama3", trigger="<|python_tag|>", separator="; ", arguments_key="parameters", text_before=False)
MISTRAL = CallFormat("mistral", trigger="[TOOL_CALLS]", listed=True)
JSON = CallFormat("json", text_before=False)
BY_FAMILY = {f.family: f for f in (HERMES, LLAMA3, MISTRAL, JSON)}


# -- grammars --------------------------------------------------------------------------------------------------

def call_schema(fmt: CallFormat, tool: Tool, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """One call to ``tool`` in ``fmt``: ``name`` its const, the arguments its parameters (under ``$defs``)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": tool.name}, fmt.arguments_key: {"$ref": "#/$defs/parameters"}},
        "required": ["name", fmt.arguments_key],
        "additionalProperties": False,
        "$defs": {"parameters": _embed(tool.parameters, "/$defs/parameters")},
        "x-guidance": dict(overrides),
    }
    if "$schema" in tool.parameters:
        schema["$schema"] = tool.parameters["$schema"]
    return schema


def lark_grammar(fmt: CallFormat, tools: Sequence[Tool], choice: ToolChoice, parallel: bool,
                 overrides: Mapping[str, Any], special: Callable[[str], int | None],
                 answer_schema: Mapping[str, Any] | None = None, refused_text: Sequence[str] = ()) -> str:
    """The Lark grammar of ``fmt``'s outputs. ``special(text)``: the id of the special token spelling ``text``, or
    None (then the grammar writes the text); ``overrides``: llguidance's JSON options for every ``%json``;
    ``refused_text``: what the free text never holds."""
    chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    trigger_id = special(fmt.trigger) if fmt.trigger else None
    trigger = f"<[{trigger_id}]>" if trigger_id is not None else json.dumps(fmt.trigger)
    closer_id = special(fmt.closer) if fmt.closer else None
    closer = f"<[{closer_id}]>" if closer_id is not None else json.dumps(fmt.closer)
    lines = [f"call: {' | '.join(f'call_{i}' for i in range(len(chosen)))}"]
    lines += [f"call_{i}: %json {json.dumps(call_schema(fmt, t, overrides))}" for i, t in enumerate(chosen)]
    if answer_schema is not None:
        lines.append(f"answer: %json {json.dumps({**answer_schema, 'x-guidance': dict(overrides)})}")
    # ``rest``: what follows the trigger; ``calls``: the trigger and the rest
    if fmt.family == "hermes":
        block = f'"\\n" call "\\n" {closer}'
        rest = f'{block} ("\\n" {trigger} {block})*' if parallel else block
    elif fmt.family == "mistral":
        rest = '"[" call ("," call)* "]"' if parallel else '"[" call "]"'
    elif fmt.family == "llama3":
        rest = f'call ({json.dumps(fmt.separator)} call)*' if parallel else "call"
    else:
        rest = '"[" call ("," call)* "]"' if parallel else "call"
    lines.append(f"rest: {rest}")
    opened = f"{trigger} rest" if fmt.trigger and fmt.family != "llama3" else "rest"
    if choice.mode == "none":
        start = "answer" if answer_schema is not None else "TEXT"
    elif choice.mode in ("required", "named"):
        start = opened
    elif answer_schema is not None:
        start = f"answer | {opened}"
    elif fmt.family == "llama3":
        start = f"TEXT | {trigger}? rest"
    elif fmt.text_before and trigger_id is None and fmt.trigger:
        # a text trigger ends the text lexeme itself: the lexer cannot end a text lexeme just before it
        lines.append(f"LEAD: /(?s:.)*{re.escape(fmt.trigger)}/ & ~/(?s:.)*{re.escape(fmt.trigger)}(?s:.)+/")
        start = "TEXT | LEAD rest"
    elif fmt.text_before:
        start = f"TEXT | TEXT? {opened}"
    else:
        start = f"TEXT | {opened}"
    lines.append(f"TEXT: {_text_lexeme(fmt, refused_text)}")
    return "\n".join([f"start: {start}", *lines]) + "\n"


def _text_lexeme(fmt: CallFormat, refused: Sequence[str] = ()) -> str:
    """Free text: never the trigger's text (a special-token trigger is outside any text already) nor ``refused``;
    where calls are the whole answer, not starting as a call would."""
    first = "[^{\\[]" if not fmt.text_before else "."
    text = f"/(?s:{first})(?s:.)*/"
    for never in (fmt.trigger, *refused):
        if never:
            text += f" & ~/(?s:.)*{re.escape(never)}(?s:.)*/"
    return text


# -- parsing ---------------------------------------------------------------------------------------------------

def _call_start(fmt: CallFormat, text: str) -> int | None:
    """Where the calls begin in ``text`` (None: a text answer). Where text may precede them, at the first trigger
    (the text never holds one); where the calls are the whole answer, at the start or nowhere (an argument string
    may hold the trigger)."""
    if fmt.text_before:
        return text.index(fmt.trigger) if fmt.trigger and fmt.trigger in text else None
    if (fmt.trigger and text.startswith(fmt.trigger)) or text[:1] in ("{", "["):
        return 0
    return None


def _parse(fmt: CallFormat, text: str, tools: Sequence[Tool], choice: ToolChoice, parallel: bool,
           answer: Mapping[str, Any] | None) -> ToolOutput:
    if choice.mode == "none":
        return ToolOutput(text=text)
    if answer is not None and choice.mode == "auto":
        return _answer_or_calls(fmt, text, tools, choice, parallel, answer)
    at = _call_start(fmt, text)
    if at is None:
        if choice.mode != "auto":
            raise ValueError("expected a tool call, got plain text")
        return ToolOutput(text=text)
    content = text[:at].strip() or None
    return ToolOutput(text=content, calls=_read_calls(fmt, text[at:], tools, choice, parallel))


def _answer_or_calls(fmt: CallFormat, text: str, tools: Sequence[Tool], choice: ToolChoice, parallel: bool,
                     answer: Mapping[str, Any]) -> ToolOutput:
    """An output of the grammar ``answer | calls`` (nothing before either) read as the branch that admitted it.

    The trigger opens calls (an answer's JSON never starts with it, though its strings may hold it). Where a call
    is a bare JSON object too (llama3, json), an object that reads as a call is one unless its arguments break
    their tool's parameters and the object is the answer schema's: the call grammar would not have admitted it, the
    answer's did. An object both admit (an answer schema that allows call-shaped objects) is the call."""
    if fmt.trigger and text.startswith(fmt.trigger):
        return ToolOutput(text=None, calls=_read_calls(fmt, text, tools, choice, parallel))
    if fmt.text_before:  # these families' calls always open with the trigger
        return ToolOutput(text=text)
    try:
        calls = _read_calls(fmt, text, tools, choice, parallel)
    except ValueError:
        return ToolOutput(text=text)
    parameters = {t.name: t.parameters for t in tools}
    if any(instance_errors(c.arguments, dict(parameters[c.name])) for c in calls) and _answers(text, answer):
        return ToolOutput(text=text)
    return ToolOutput(text=None, calls=calls)


def _answers(text: str, answer: Mapping[str, Any]) -> bool:
    """Whether ``text`` is one JSON value valid against the answer schema (parallel calls in a sequence are not)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return not instance_errors(value, dict(answer))


def _read_calls(fmt: CallFormat, text: str, tools: Sequence[Tool], choice: ToolChoice,
                parallel: bool) -> tuple[ToolCall, ...]:
    items: list[Any] = []
    if fmt.family == "hermes":
        items = _blocks(text, fmt.trigger, fmt.closer)
    elif fmt.family == "mistral":
        value = _json(text.removeprefix(fmt.trigger))
        if not isinstance(value, list):
            raise ValueError("[TOOL_CALLS] is followed by a JSON list of calls")
        items = value
    elif fmt.family == "llama3":
        items = _json_sequence(text.removeprefix(fmt.trigger), fmt.separator)
    else:
        value = _json(text)
        if isinstance(value, list) != parallel:
            raise ValueError("expected a list of calls" if parallel else "expected a single call")
        items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError("empty list of calls")
    if len(items) > 1 and not parallel:
        raise ValueError("expected a single call")
    names = {t.name for t in tools}
    calls = []
    for item in items:
        if not (isinstance(item, dict) and set(item) == {"name", fmt.arguments_key}
                and isinstance(item["name"], str) and isinstance(item[fmt.arguments_key], dict)):
            raise ValueError(f'a call is {{"name": ..., "{fmt.arguments_key}": {{...}}}}, got {json.dumps(item)[:200]}')
        if item["name"] not in names:
            raise ValueError(f"no tool named {item['name']!r}")
        if choice.mode == "named" and item["name"] != choice.name:
            raise ValueError(f"expected a call to {choice.name!r}, got {item['name']!r}")
        calls.append(ToolCall(item["name"], item[fmt.arguments_key]))
    return tuple(calls)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool call is not JSON: {exc}") from exc


_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


def _skip_space(text: str, at: int) -> int:
    """Where JSON's whitespace from ``at`` ends (it always matches, if only the empty string)."""
    found = _SPACE.match(text, at)
    assert found is not None
    return found.end()


def _blocks(text: str, opener: str, closer: str) -> list[Any]:
    """``opener JSON closer`` blocks, whitespace around them and nothing else; each JSON value read by the decoder,
    so that an argument string may hold the closer."""
    decoder, items, at = json.JSONDecoder(), [], 0
    while True:
        at = _skip_space(text, at)
        if not text.startswith(opener, at):
            raise ValueError(f"calls are {opener} JSON {closer} blocks and nothing else")
        try:
            value, at = decoder.raw_decode(text, _skip_space(text, at + len(opener)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call is not JSON: {exc}") from exc
        at = _skip_space(text, at)
        if not text.startswith(closer, at):
            raise ValueError(f"calls are {opener} JSON {closer} blocks and nothing else")
        items.append(value)
        at += len(closer)
        if _skip_space(text, at) == len(text):
            return items


def _json_sequence(text: str, separator: str) -> list[Any]:
    """JSON values one after another, ``separator`` (and whitespace) between them."""
    decoder, items, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call is not JSON: {exc}") from exc
        items.append(value)
        rest = text[at:].lstrip()
        if rest.startswith(separator.strip()):
            rest = rest[len(separator.strip()):].lstrip()
        elif rest:
            raise ValueError(f"calls are separated by {separator!r}")
        at = len(text) - len(rest)
    return items
