"""Tool calls: an OpenAI-style tool list as one JSON Schema, and outputs parsed back into calls.

A call is ``{"name": <tool>, "arguments": <that tool's parameters>}`` (in that
order; ``anyOf`` over the tools, each with a ``const`` name); parallel calls are a
non-empty JSON list of calls. ``tool_choice``: "auto" (plain text not starting
with ``{``/``[``, or a call), "required" (a call), "none" (plain text only), or one
named tool (a call to it).

A ``ToolSet`` is a request's tool list parsed once (``ToolSet.parse``): its tools, the choice, whether calls
are parallel, and its keys, each the digest of one canonical text (``grammar.cache.canonical_json``) built
from the list's canonical text, made once. The grammar compiles it, the prompt shows its tools, the worked
examples and the statistics are looked up by its keys, and the output is read against it (``ToolSet.read``).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

from structspec.grammar import postcheck, schema_walk
from structspec.grammar.base import SchemaError, SchemaIssue
from structspec.grammar.cache import caller_canonical_json, canonical_json, text_digest

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_MODES = ("auto", "required", "none")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]
    pointer: str  # where the parameters schema sits in the request, e.g. /tools/2/function/parameters


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "required", "none", "named"]
    name: str | None = None


@dataclass(frozen=True)
class CallGrammar:
    """What the backend compiles: ``schema`` (None: no call possible) and whether text is allowed."""

    schema: dict[str, Any] | None
    allow_text: bool
    placements: tuple[tuple[str, str], ...] = ()  # (pointer in ``schema``, pointer in the request)

    def request_pointer(self, pointer: str) -> str:
        """A pointer into ``schema`` as a pointer into the request's tool list."""
        for inside, outside in self.placements:
            if pointer == inside or pointer.startswith(inside + "/"):
                return outside + pointer[len(inside):]
        return pointer


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolOutput:
    text: str | None  # plain-text answer, or None when the output is calls
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class ToolSet:
    """A request's tool list, parsed and keyed once (``parse``)."""

    entries: tuple[Any, ...]  # the request's entries as sent (OpenAI-style; worked examples are made from them)
    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool
    size: int  # bytes of the list's JSON text: what the schema size budget measures
    digest: str  # of the list: its worked examples' key
    grammar_digest: str  # of the list, ``tool_choice`` as sent and ``parallel``: the grammar cache's key
    # Statistics and the schema history per list, choice and answer schema: a named or required call writes other
    # text than an ``auto`` one, and an answer of one schema other text than another's (either history would draft
    # the wrong output). ``auto`` without an answer schema keeps the bare list's key.
    statistics_key: str

    @classmethod
    def parse(cls, entries: Any, tool_choice: Any = "auto", parallel: Any = False,
              answer_schema: Any = None) -> ToolSet:
        """``answer_schema``: the request's final answer's schema (None: a text answer), in the statistics key.
        Raises: SchemaError pointing into the request: the list too deep or not JSON, not a tool list
        (``parse_tools``), ``tool_choice`` neither a mode nor one of its tools, the answer schema not JSON."""
        listed = caller_canonical_json(list(entries) if isinstance(entries, (list, tuple)) else entries, at="/tools")
        chosen = caller_canonical_json(tool_choice, at="/tool_choice")
        tools = parse_tools(entries)
        choice = parse_tool_choice(tool_choice, tools)
        said = (_canonical_object(tools=listed, tool_choice=chosen, parallel_calls=canonical_json(parallel))
                if tool_choice != "auto" or parallel else _canonical_object(tools=listed))
        if answer_schema is not None:
            answer = caller_canonical_json(answer_schema, at="/answer_schema")
            said = _canonical_object(call=said, answer_schema=answer)
        keyed = _canonical_object(tools=listed, tool_choice=chosen, parallel=canonical_json(bool(parallel)))
        return cls(entries=tuple(entries), tools=tools, choice=choice, parallel=bool(parallel), size=len(listed.encode()),
                   digest=text_digest(listed), grammar_digest=text_digest(keyed), statistics_key=f"tools:{text_digest(said)}")

    def parameters(self, name: str) -> Mapping[str, Any]:
        """The parameters schema of the tool named ``name`` (KeyError: none is)."""
        for tool in self.tools:
            if tool.name == name:
                return tool.parameters
        raise KeyError(name)

    def read(self, text: str) -> ToolOutput:
        """Generated text -> plain text or calls; ValueError when it is neither (for this list and choice).
        Arguments are not validated here."""
        return _read_output(text, self.tools, self.choice, self.parallel)


def _canonical_object(**members: str) -> str:
    """The canonical text of an object from its members' canonical texts (keys sorted, as ``canonical_json``)."""
    return "{" + ",".join(f"{json.dumps(key)}:{text}" for key, text in sorted(members.items())) + "}"


def parse_tools(tools: Any) -> tuple[Tool, ...]:
    """Validate the list's shape: entries, unique identifier names, object parameter schemas."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise SchemaError([SchemaIssue("/tools", "", "tools must be a non-empty list")], kind="invalid_schema")
    issues: list[SchemaIssue] = []
    parsed: list[Tool] = []
    seen: set[str] = set()
    for i, entry in enumerate(tools):
        at = f"/tools/{i}"
        if isinstance(entry, Mapping) and ("function" in entry or "type" in entry):
            if entry.get("type", "function") != "function":
                issues.append(SchemaIssue(at + "/type", "type", "only function tools are supported"))
                continue
            entry, at = entry.get("function"), at + "/function"
        if not isinstance(entry, Mapping):
            issues.append(SchemaIssue(at, "", "a tool must be an object with name and parameters"))
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            issues.append(SchemaIssue(at + "/name", "name", f"{name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_-]*, <= 64)"))
        elif name in seen:
            issues.append(SchemaIssue(at + "/name", "name", f"duplicate tool name {name!r}"))
        if isinstance(name, str):
            seen.add(name)
        description = entry.get("description", "")
        if not isinstance(description, str):
            issues.append(SchemaIssue(at + "/description", "description", "must be a string"))
        parameters = entry.get("parameters", _NO_PARAMETERS)
        if not isinstance(parameters, Mapping):
            issues.append(SchemaIssue(at + "/parameters", "parameters", "must be a JSON Schema object"))
        elif parameters.get("type", "object") != "object":
            issues.append(SchemaIssue(at + "/parameters/type", "type", "arguments must be a JSON object"))
        else:
            parsed.append(Tool(str(name), str(description), parameters, at + "/parameters"))
    if issues:
        raise SchemaError(issues, kind="invalid_schema")
    return tuple(parsed)


def parse_tool_choice(choice: Any, tools: Sequence[Tool]) -> ToolChoice:
    """"auto" | "required" | "none" | a tool name | {"type": "function", "function": {"name": ...}}."""
    if choice is None or choice in _MODES:
        return ToolChoice(choice or "auto")
    name = choice
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        raise SchemaError([SchemaIssue("/tool_choice", "tool_choice", f"{name!r} is not a mode nor a tool name")],
                          kind="invalid_schema")
    return ToolChoice("named", name)


def call_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> CallGrammar:
    if choice.mode == "none":
        return CallGrammar(None, allow_text=True)
    chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    # Each tool's parameters live under the root's $defs and are referenced from its call: every
    # reference path then crosses object keys only (outlines-core cannot step into arrays).
    slots = [f"/$defs/tool{i}" for i in range(len(chosen))]
    calls = [_call(t, slot) for t, slot in zip(chosen, slots)]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        schema = {"type": "array", "items": schema, "minItems": 1}
    schema["$defs"] = {slot.rsplit("/", 1)[1]: _embed(t.parameters, slot) for t, slot in zip(chosen, slots)}
    drafts = {t.parameters.get("$schema") for t in chosen}
    if len(drafts) == 1 and None not in drafts:
        schema = {"$schema": drafts.pop(), **schema}
    placements = tuple((slot, t.pointer) for t, slot in zip(chosen, slots))
    return CallGrammar(schema, allow_text=choice.mode == "auto", placements=placements)


def _call(tool: Tool, slot: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": {"$ref": "#" + slot}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _embed(parameters: Mapping[str, Any], at: str) -> dict[str, Any]:
    """The parameters schema moved to ``at``: its local references are re-rooted there."""
    own_id = parameters.get("$id", parameters.get("id"))
    schema = {k: v for k, v in copy.deepcopy(dict(parameters)).items() if k not in ("$schema", "$id", "id")}
    for _, node in schema_walk.iter_schemas(schema):
        ref = node.get("$ref")
        if isinstance(ref, str):
            base, _, fragment = ref.partition("#")
            if (not base or base == own_id) and (not fragment or fragment.startswith("/")):
                assert isinstance(node, dict)  # a node of the deep copy above
                node["$ref"] = "#" + at + fragment
    return schema


def parse_tool_output(text: str, tools: Any = None, tool_choice: Any = "auto", parallel: bool | None = None) -> ToolOutput:
    """Generated text -> plain text or calls; ValueError when it is neither (for these ``tools``, a raw list).

    ``parallel=None`` accepts a single call or a list. Arguments are not validated
    here: see ``tool_call_errors``. A request's parsed list reads with ``ToolSet.read``.
    """
    parsed = parse_tools(tools) if tools is not None else None
    if parsed is not None:
        choice = parse_tool_choice(tool_choice, parsed)
    elif tool_choice in _MODES:
        choice = ToolChoice(tool_choice)
    else:
        raise ValueError("a named tool_choice needs the tool list")
    return _read_output(text, parsed, choice, parallel)


def _read_output(text: str, parsed: Sequence[Tool] | None, choice: ToolChoice, parallel: bool | None) -> ToolOutput:
    if choice.mode == "none":
        return ToolOutput(text=text)
    if text[:1] not in ("{", "["):
        if choice.mode != "auto":
            raise ValueError("expected a tool call, got plain text")
        return ToolOutput(text=text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool call is not JSON: {exc}") from exc
    if parallel is not None and isinstance(value, list) != parallel:
        raise ValueError("expected a list of calls" if parallel else "expected a single call")
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError("empty list of calls")
    names = {t.name for t in parsed} if parsed is not None else None
    calls = []
    for item in items:
        if not (isinstance(item, dict) and set(item) == {"name", "arguments"}
                and isinstance(item["name"], str) and isinstance(item["arguments"], dict)):
            raise ValueError(f"a call is {{\"name\": ..., \"arguments\": {{...}}}}, got {json.dumps(item)[:200]}")
        if names is not None and item["name"] not in names:
            raise ValueError(f"no tool named {item['name']!r}")
        if choice.mode == "named" and item["name"] != choice.name:
            raise ValueError(f"expected a call to {choice.name!r}, got {item['name']!r}")
        calls.append(ToolCall(item["name"], item["arguments"]))
    return ToolOutput(text=None, calls=tuple(calls))


def tool_call_errors(output: ToolOutput, tools: Any) -> list[tuple[int, jsonschema.ValidationError]]:
    """(call index, error) for arguments that break their tool's parameters schema
    (decide declared gaps vs bugs with ``postcheck.is_post_check_error``)."""
    by_name = {t.name: t for t in parse_tools(tools)}
    return [(i, error) for i, call in enumerate(output.calls)
            for error in postcheck.instance_errors(call.arguments, dict(by_name[call.name].parameters))]
