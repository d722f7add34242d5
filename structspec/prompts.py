"""The plain prompt format: how an extraction or tool-call request becomes model input for a model without a chat
template (a model with one renders through it: ``chat_template``).

The format is named and versioned (``PROMPT_FORMAT``) so acceptance statistics
stay comparable: a change of wording changes what the model writes, so it gets
a new version, and the version is part of the statistics key (``PlainPrompts.stats_format``);
tests/test_prompts.py holds the digest of each version's wording and fails on a change
without one. The demo models are trained on exactly these templates.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

PROMPT_FORMAT = "structspec-plain-v5"

ROLES = ("system", "user", "assistant", "tool")  # the roles of a conversation's turns (``engine.api.ChatMessage``)
TOOLS_HEADING = "Tools"  # the tool list's heading
CALL_TURN = "Call"  # the heading of a turn that holds calls (a model trained on call-only turns writes them there)
ANSWER_TURN = "Assistant"  # the model's own turn: a text answer, or under ``answers`` a call or a text answer
RESULT_TURN = "Answer"  # under ``answers``, the model's turn after a tool's result (a text answer, or another call)


def heading(name: str) -> str:
    """A heading line of the plain format: ``### <name>:`` and its newline."""
    return f"### {name}:\n"


# The line an extraction's output follows, per model (``ModelProfile.plain_json_line``): the format's heading, or a
# bare label. Under the label Gemma 3 270M copies its worked examples' values less and gets more fields right
# (docs/benchmarks.md, "Long invoices with a worked example"); the demo pair is trained on the heading.
JSON_LINES = {"heading": heading("JSON"), "label": "JSON:\n"}


# Where a text answer ends besides the model's end of turn: a base model runs on into the format's next turn, whose
# heading starts a line. Only the format's own headings: an answer's Markdown heading (``### Results``) is its text.
TURN_STOPS = tuple("\n" + heading(name).rstrip("\n")
                   for name in (TOOLS_HEADING, *(role.capitalize() for role in ROLES), CALL_TURN, RESULT_TURN))


@dataclass(frozen=True)
class FewShotExample:
    """A worked input -> output pair shown before the real request.

    ``title``: the schema title the example's output follows when it is not the request's schema
    (an example of another schema, shown under its own ``### Extract <title> as JSON.``); for a worked call, the
    tool list it calls from when that is not the request's (a call of another tool, shown under its own
    ``### Tools:`` before the request's list)."""

    text: str
    output: str
    title: str = ""


class ShownTool(Protocol):
    """What a prompt shows of a tool: a ``ToolSpec``, or a request's tool as the grammar layer parsed it."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class ToolSpec:
    """One tool as agents declare it (OpenAI-style function)."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_openai(cls, tool: dict[str, Any]) -> "ToolSpec":
        fn = tool.get("function", tool)
        return cls(fn["name"], fn.get("description", ""), fn.get("parameters", {}))


def schema_title(schema: dict[str, Any], schema_id: str = "") -> str:
    """What the plain format calls a schema's object: its title, else its registered id ("": neither)."""
    title = schema.get("title") if isinstance(schema, dict) else None
    return str(title) if title else schema_id


def extraction_prompt(
    schema: dict[str, Any],
    text: str,
    instruction: str | None = None,
    examples: tuple[FewShotExample, ...] = (),
    schema_id: str = "",
    json_line: str = "heading",
) -> str:
    """``### Extract <Title> as JSON.`` + optional instruction + input + ``### JSON:`` (``json_line``: a key of
    ``JSON_LINES``).

    Few-shot examples repeat the same block with their output, separated by a
    blank line, so a base model sees the pattern before the real request.
    A schema without a title is named by ``schema_id`` (a registered schema's id),
    else announced as ``### Extract JSON.`` with its description on the next line.
    """
    template = extraction_template(schema, instruction, examples, schema_id, json_line)
    return f"{template}{text.strip()}\n{JSON_LINES[json_line]}"


def extraction_template(
    schema: dict[str, Any],
    instruction: str | None = None,
    examples: tuple[FewShotExample, ...] = (),
    schema_id: str = "",
    json_line: str = "heading",
) -> str:
    """The start of ``extraction_prompt`` before the input text: the same for every input."""
    said = f"{instruction.strip()}\n" if instruction else ""
    before_output = JSON_LINES[json_line]

    def head(title: str) -> str:
        return f"### Extract {title} as JSON.\n" if title else "### Extract JSON.\n"

    own = head(schema_title(schema, schema_id))
    description = schema.get("description") if isinstance(schema, dict) and not schema.get("title") else None
    if description:  # an untitled schema says what it holds in its description
        own += " ".join(str(description).split()) + "\n"
    blocks = [f"{head(ex.title) if ex.title else own}{said}### Input:\n{ex.text.strip()}\n{before_output}{ex.output}\n"
              for ex in examples]
    return "\n".join([*blocks, f"{own}{said}### Input:\n"])


def describe_tool(tool: ShownTool) -> str:
    params = ", ".join((tool.parameters.get("properties") or {}).keys())
    return f"- {tool.name}({params}): {tool.description}"


class ShownTurn(Protocol):
    """A conversation turn (``engine.api.ChatMessage``): role and content; where it has them, its calls
    (``tool_calls``, ``tool_call_ids``) or the call it answers (``tool_call_id``, ``name``)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


Turn = tuple[str, str] | ShownTurn  # (role, content), or a message with ``tool_calls``


# A finished episode shown before the request when the model may answer (``tool_choice`` auto): two requests a
# tool serves (one asked by the tool's name, one in plain words) -> a call, the tool's result -> a text answer, and
# between them a request no tool serves -> a text answer. Its tools are no request's (the grammar allows only the
# request's own). Measured on Gemma 3 270M (``bench.auto_calls``, 20 tool lists): an episode of one call and one
# text answer made it call where a tool was needed 3 times in 20, this one 15 (text where none was: 20 and 18).
# After a tool's result the model's turn is ``### Answer:`` (``RESULT_TURN``), here and in the conversation: under
# ``### Assistant:`` there Gemma 3 270M made the same call again after its result in 12 of 20 agent loops, and
# 8 of 20 loops ended within 4 requests; under ``### Answer:`` none repeated and 19 of 20 ended
# (``bench.agent_loops``). A call is still allowed there (the grammar is the same): only the heading differs.
ANSWER_EPISODE = (
    "### Tools:\n- get_time(zone): The current time in a time zone.\n"
    "- convert(amount, unit): Converts an amount to another unit.\n"
    "### User:\nUse get_time with zone Europe/Oslo.\n"
    "### Assistant:\n{\"name\":\"get_time\",\"arguments\":{\"zone\":\"Europe/Oslo\"}}\n"
    "### Tool:\n{\"time\":\"14:05\"}\n"
    "### Answer:\nIt is 14:05 in Oslo.\n"
    "### User:\nHi! Say hello to my friend Sam.\n"
    "### Assistant:\nHello Sam, nice to meet you!\n"
    "### User:\nHow many km are 3 miles?\n"
    "### Assistant:\n{\"name\":\"convert\",\"arguments\":{\"amount\":3,\"unit\":\"km\"}}\n"
    "### Tool:\n{\"result\":4.83}\n"
    "### Answer:\n3 miles is 4.83 km.\n\n"
)


# the episode's requests and the calls that answer them (what a call could copy from it), read from the episode
ANSWER_EPISODE_CALLS = tuple(FewShotExample(m[1], m[2]) for m in re.finditer(
    r"### User:\n(.*)\n### Assistant:\n(\{.*\})\n", ANSWER_EPISODE))


def episode_examples(answers: bool) -> tuple[FewShotExample, ...]:
    """The worked calls a tool-call prompt shows besides its examples (``answers``: ``toolcall_prompt``'s)."""
    return ANSWER_EPISODE_CALLS if answers else ()


def toolcall_prompt(
    tools: Sequence[ShownTool],
    messages: Sequence[Turn],
    examples: tuple[FewShotExample, ...] = (),
    *,
    answers: bool = False,
    may_call: bool = True,
) -> str:
    """``### Tools:`` list + the conversation + the turn the model writes.

    ``messages`` are (role, content) pairs or messages (``api.ChatMessage``: an assistant turn's ``tool_calls``
    are shown as the call JSON, a tool result as ``### Tool:``); the last user turn is the request.

    ``answers`` False (a call is forced, or the model was trained on call-only turns): the prompt ends in
    ``### Call:``; worked examples are ``### User:`` / ``### Call:`` pairs, a blank line apart after the tool
    list (shown once: repeating it per example made prompts 2-3x longer and calls no better).

    ``answers`` True (``tool_choice`` auto): the model's turn is ``### Assistant:``, which holds either a call
    (a JSON object ``{"name":...,"arguments":...}``) or a text answer (ending at EOS or at the next turn's
    heading, ``TURN_STOPS``), and ``### Answer:`` after a tool's result (``RESULT_TURN``: the same choice);
    ``ANSWER_EPISODE`` first shows both, and worked calls are ``### User:`` / ``### Assistant:``.

    ``may_call`` False (``tool_choice`` none): the model's turn is ``### Assistant:`` and holds a text answer; the
    tools are listed (the conversation may name them) but no worked call is shown, nor the episode (both call).
    Earlier calls keep the heading ``answers`` gives them.
    """
    tool_block = heading(TOOLS_HEADING) + "\n".join(describe_tool(t) for t in tools) + "\n"
    said = ANSWER_TURN if answers else CALL_TURN
    if not may_call:
        convo = "".join(_shown_turn(turn, said) for turn in messages)
        return f"{tool_block}{convo}{heading(ANSWER_TURN)}"
    def shot(ex: FewShotExample) -> str:
        return f"{heading('User')}{ex.text.strip()}\n{heading(said)}{ex.output}\n\n"

    # another tool list's worked calls first, under their own list (as the episode shows its tools)
    foreign = "".join(f"{heading(TOOLS_HEADING)}{ex.title.strip()}\n{shot(ex)}" for ex in examples if ex.title)
    shots = "".join(shot(ex) for ex in examples if not ex.title)
    if not answers:
        convo = "".join(_shown_turn(turn, said) for turn in messages)
        return f"{foreign}{tool_block}{shots}{convo}{heading(said)}"
    # a turn after a tool's result is headed RESULT_TURN, the model's own one included
    convo, before = "", ""  # ``before``: the role of the turn before
    for turn in messages:
        own = RESULT_TURN if before == "tool" else said
        convo += _shown_turn(turn, own, own if before == "tool" and _role(turn) == "assistant" else "")
        before = _role(turn)
    return f"{ANSWER_EPISODE}{foreign}{tool_block}{shots}{convo}{heading(RESULT_TURN if before == 'tool' else said)}"


def _role(turn: Turn) -> str:
    return turn[0] if isinstance(turn, tuple) else turn.role


def _shown_turn(turn: Turn, said: str, title: str = "") -> str:
    """One turn as ``### Role:`` (``title`` where given) + its content; an assistant's calls as the call JSON under
    ``said`` (one a line)."""
    role, content = turn if isinstance(turn, tuple) else (turn.role, turn.content)
    calls = () if isinstance(turn, tuple) else tuple(getattr(turn, "tool_calls", ()) or ())
    out = f"{heading(title or role.capitalize())}{content.strip()}\n" if content.strip() or not calls else ""
    if calls:
        shown = "\n".join(compact_json({"name": c.name, "arguments": c.arguments}) for c in calls)
        out += f"{heading(said)}{shown}\n"
    return out


def compact_json(value: Any) -> str:
    """The output form the grammar produces by default: compact, key order kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a prompt: BOS (when the tokenizer has one) + the text, no other special tokens.

    Gemma needs its ``<bos>``; the demo models were trained on EOS-separated packed
    examples, so their BOS (= EOS) is exactly what preceded each training example.
    """
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + ids
