"""A model's prompt format turned into prompt ids: its own chat template (``ChatPrompts``) or the plain one.

A *prompt format* renders an extraction or a tool-call request as the text the model reads and its token ids,
with the length of the start that is no caller's data (the *public* tokens, which any tenant's request may reuse
from the prefix cache). Two formats, one interface (``PromptFormat``):

- ``PlainPrompts``: ``prompts.extraction_prompt``/``toolcall_prompt`` with a BOS in front (``encode_prompt``),
  for models without a chat template (a base model such as Gemma 3 270M; the demo pair, trained on it).
- ``ChatPrompts``: the model's chat template (jinja2, rendered by transformers' sandboxed
  ``apply_chat_template``). An extraction is a system message (what to extract: the schema's title or id, its
  description, the caller's instruction, and the JSON Schema itself, compact), the document as the user's turn
  and the template's generation prompt; worked examples are earlier user/assistant turns. A tool call is the
  conversation with the tools passed to the template (its ``tool_use`` variant where it has named ones); the
  answer is a call in the template's own family (``call_family``: the markers it renders), whose instructions
  say the form; for a template without them, the generic JSON call, which the system message says. The rendered text
  holds the template's own special tokens, so it is tokenized without adding any (no second BOS).

``format_id`` names the format and its wording version; ``stats_format`` is what the statistics key adds
(``stats.counters.model_key``): ``plain-v5`` for the plain format, ``chat-v2:<template digest>`` for a chat
template, so a new wording or another template starts statistics and history of its own.

Contract: a template that raises (one that refuses a system message: Gemma's and Mistral's older ones) is
retried once with the system text folded into the first user turn; if it still fails, ``ChatTemplateError``
(a ValueError) says so. Nothing else a template does escapes as another exception.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, Protocol

from structspec.prompts import (ANSWER_TURN, CALL_TURN, JSON_LINES, PROMPT_FORMAT, TURN_STOPS, FewShotExample,
                                ShownTool, Turn, compact_json, describe_tool, encode_prompt, extraction_prompt,
                                extraction_template, heading, toolcall_prompt)

CHAT_FORMAT = "chat-v2"  # the wording of the messages below; a change of wording is a new version
SAID_IN_WORDS = ("$schema", "$id", "title", "description")  # a schema's top-level keys the system message says
ANSWER_FORM = "Once the tools' results answer the request, answer with only a JSON object that follows this JSON Schema:"
CALL_FORM = 'To call a tool, answer with only a JSON object: {"name": <tool name>, "arguments": <its arguments>}.'
# A template that renders tools and writes calls in one of these families says that form in its own words, so the
# system message does not ask for the generic JSON call (``grammar.call_formats`` writes the grammar per family).
CALL_MARKERS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3"),
                ('"parameters": dictionary', "llama3"))


def call_family(template: str | None) -> str:
    """The family a chat template writes tool calls in (the markers it renders): hermes, mistral, llama3, or json
    (the generic JSON call: a template that renders no tools or none of the markers, and the plain format)."""
    if not isinstance(template, str) or "tools" not in template:
        return "json"
    return next((family for marker, family in CALL_MARKERS if marker in template), "json")


class ChatTemplateError(ValueError):
    """The chat template could not render a request (the message says what it raised)."""


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: ``text``, its token ``ids`` (what the model reads), and ``public_ids``: the ids of the
    same prompt rendered without the caller's data (empty: nothing of it is public); the start both share is
    public."""

    text: str
    ids: list[int]
    public_ids: list[int] = field(default_factory=list)


class PromptFormat(Protocol):
    """How an engine turns requests into prompts (``ChatPrompts`` or ``PlainPrompts``)."""

    format_id: str
    stats_format: str
    text_stop: tuple[str, ...]
    call_headings: tuple[str, ...]  # text that opens a call turn in this format: under ``none`` no answer holds it

    def extraction(self, schema: dict[str, Any], text: str, instruction: str | None = None,
                   examples: tuple[FewShotExample, ...] = (), *, schema_id: str = "", public: bool = False) -> Prompt:
        """``schema_id``: a registered schema's id ("": inline); ``public``: the schema and the examples are
        public (no caller's instruction or examples), so the prompt's start before the document is too.
        Raises: ChatTemplateError."""

    def toolcall(self, tools: Sequence[ShownTool], messages: Sequence[Turn],
                 examples: tuple[FewShotExample, ...] = (), *, answer_schema: dict[str, Any] | None = None,
                 may_answer: bool = False, may_call: bool = True) -> Prompt:
        """``tools``: the request's tools, parsed; ``messages``: the conversation; ``answer_schema``: a final answer
        is JSON valid against it (the prompt says so); ``may_answer``: the model may answer instead of calling
        (``tool_choice`` auto); ``may_call`` False: the model answers and never calls (``tool_choice`` none).
        Raises: ChatTemplateError."""

    def text(self, messages: Sequence[Turn]) -> Prompt:
        """A free-text answer's prompt: the conversation and the model's turn. ``text_stop`` is the format's own end
        of an answer besides the model's end of turn (EOS). Raises: ChatTemplateError."""


class PlainPrompts:
    """The plain format (``prompts``): BOS + ``extraction_prompt`` / ``toolcall_prompt``, byte for byte."""

    format_id = PROMPT_FORMAT
    stats_format = PROMPT_FORMAT.removeprefix("structspec-")  # plain-v<N>
    text_stop: tuple[str, ...] = TURN_STOPS  # a base model runs on into the format's next turn: the answer ends before its heading
    call_headings: tuple[str, ...] = (heading(CALL_TURN).rstrip("\n"),)  # a model trained on call turns would open one

    def __init__(self, tokenizer: Any, answers: bool = False, json_line: str = "heading"):
        """``json_line``: the line an extraction's output follows (``prompts.JSON_LINES``;
        ``ModelProfile.plain_json_line``): another wording, so another statistics key. Raises: ValueError for an
        unknown one."""
        if json_line not in JSON_LINES:
            raise ValueError(f"unknown json_line {json_line!r}: one of {', '.join(JSON_LINES)}")
        self.tokenizer = tokenizer
        self.answers = answers  # under auto, offer a text answer beside a call (``ModelProfile.plain_answers``)
        self.json_line = json_line
        if json_line != "heading":
            self.format_id = f"{PROMPT_FORMAT}+json-{json_line}"
            self.stats_format = self.format_id.removeprefix("structspec-")

    def extraction(self, schema: dict[str, Any], text: str, instruction: str | None = None,
                   examples: tuple[FewShotExample, ...] = (), *, schema_id: str = "", public: bool = False) -> Prompt:
        prompt = extraction_prompt(schema, text, instruction, examples, schema_id, self.json_line)
        ids = encode_prompt(self.tokenizer, prompt)
        shared = (encode_prompt(self.tokenizer, extraction_template(schema, None, examples, schema_id, self.json_line))
                  if public else [])
        return Prompt(prompt, ids, shared)

    def toolcall(self, tools: Sequence[ShownTool], messages: Sequence[Turn],
                 examples: tuple[FewShotExample, ...] = (), *, answer_schema: dict[str, Any] | None = None,
                 may_answer: bool = False, may_call: bool = True) -> Prompt:
        said = f"### Answer JSON Schema:\n{compact_json(answer_schema)}\n" if answer_schema is not None else ""
        prompt = said + toolcall_prompt(tools, messages, examples, answers=self.answers and may_answer,
                                        may_call=may_call)
        return Prompt(prompt, encode_prompt(self.tokenizer, prompt))

    def text(self, messages: Sequence[Turn]) -> Prompt:
        prompt = plain_conversation(messages)
        return Prompt(prompt, encode_prompt(self.tokenizer, prompt))


class ChatPrompts:
    """Prompts through the model's chat template ``template``: its text, or named variants (``default``, and
    ``tool_use`` for requests with tools) as a tokenizer's ``chat_template`` dict holds them."""

    def __init__(self, tokenizer: Any, template: str | dict[str, str]):
        if isinstance(template, dict):
            if "default" not in template:
                raise ChatTemplateError(f"a chat template dict needs a 'default' one (it has {sorted(template)})")
            self.template, self.tool_template = template["default"], template.get("tool_use", template["default"])
        else:
            self.template = self.tool_template = template
        self.tokenizer = tokenizer
        source = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
        digest = hashlib.sha256(source.encode()).hexdigest()[:8]
        self.format_id = f"{CHAT_FORMAT}:{digest}"
        self.stats_format = self.format_id
        self._renders_tools = "tools" in self.tool_template  # a template that never reads them: tools in words
        self._folds_system: set[str] = set()  # templates that refused a system message once: later renders fold it
        self.text_stop: tuple[str, ...] = ()  # the template's end of turn is the model's EOS
        self.call_headings: tuple[str, ...] = ()  # the call format's trigger opens its calls (``call_formats``)

    def extraction(self, schema: dict[str, Any], text: str, instruction: str | None = None,
                   examples: tuple[FewShotExample, ...] = (), *, schema_id: str = "", public: bool = False) -> Prompt:
        def conversation(document: str) -> list[dict[str, str]]:
            turns = [{"role": "system", "content": extraction_system(schema, instruction, schema_id)}]
            for ex in examples:
                shown = ex.text.strip() if not ex.title else f"Extract {ex.title} as JSON:\n{ex.text.strip()}"
                turns += [{"role": "user", "content": shown}, {"role": "assistant", "content": ex.output}]
            return turns + [{"role": "user", "content": document}]

        prompt = self._render(conversation(text.strip()), None, self.template)
        # the same conversation without the document: the ids the two share are the template's, the schema's, the
        # examples' (as the plain format's public template is)
        shared = self._render(conversation(""), None, self.template).ids if public else []
        return Prompt(prompt.text, prompt.ids, shared)

    def toolcall(self, tools: Sequence[ShownTool], messages: Sequence[Turn],
                 examples: tuple[FewShotExample, ...] = (), *, answer_schema: dict[str, Any] | None = None,
                 may_answer: bool = False, may_call: bool = True) -> Prompt:
        """``answer_schema``: a final answer (instead of a call) is JSON valid against it; the system message says
        so. ``may_answer`` and ``may_call`` change nothing here: the template renders the model's turn, and the
        grammar lets it answer, or only answer."""
        listed = "" if self._renders_tools else "Tools:\n" + "\n".join(describe_tool(t) for t in tools) + "\n"
        # the template's own instructions say its call format; only the generic JSON call is said here
        system = listed + (CALL_FORM if call_family(self.tool_template) == "json" else "")
        if answer_schema is not None:
            system += f"\n{ANSWER_FORM}\n{compact_json(answer_schema)}"
        turns = [template_message(m) for m in messages]  # an agent's calls and the tools' results, as templates read them
        if turns and turns[0]["role"] == "system":  # one system message: the caller's first, then the call form
            system = f"{turns.pop(0)['content'].strip()}\n\n{system}".strip()
        shots = [turn for ex in examples for turn in ({"role": "user", "content": ex.text.strip()},
                                                      {"role": "assistant", "content": ex.output})]
        functions = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                        "parameters": dict(t.parameters)}} for t in tools]
        head = [{"role": "system", "content": system}] if system else []  # none: the template's own default
        return self._render([*head, *shots, *turns], functions or None, self.tool_template)

    def text(self, messages: Sequence[Turn]) -> Prompt:
        return self._render([template_message(m) for m in messages], None, self.template)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template: str) -> Prompt:
        """The template's text for ``messages`` (+ the generation prompt) and its ids, no special tokens added.
        Raises: ChatTemplateError (after one retry with the system message folded into the first user turn)."""
        folded = fold_system(messages)
        try:
            # a template known to refuse system messages is not made to raise again on every request
            folds = template in self._folds_system and folded is not None
            text = self._apply(folded if folds and folded is not None else messages, tools, template)
        except Exception as first:  # noqa: BLE001 - a template may raise anything; retried once, then said
            if folded is None or template in self._folds_system:
                raise ChatTemplateError(f"the model's chat template failed: {_reason(first)}") from first
            try:
                text = self._apply(folded, tools, template)
            except Exception as exc:  # noqa: BLE001
                raise ChatTemplateError(f"the model's chat template failed: {_reason(first)} (and with the system "
                                        f"message folded into the first user turn: {_reason(exc)})") from exc
            self._folds_system.add(template)
        return Prompt(text, list(self.tokenizer(text, add_special_tokens=False)["input_ids"]))

    def _apply(self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None, template: str) -> str:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=template,
                                                  add_generation_prompt=True, tokenize=False)
        if not isinstance(text, str):
            raise TypeError(f"rendering gave {type(text).__name__}, not text")
        return text


def template_message(turn: Turn) -> dict[str, Any]:
    """A turn as chat templates read it (Hugging Face's message form): an assistant's calls as ``tool_calls``
    (``{"id", "type": "function", "function": {"name", "arguments"}}``, the arguments a dict), a tool result with
    its ``tool_call_id`` and ``name`` where the caller gave them."""
    if isinstance(turn, tuple):
        return {"role": turn[0], "content": turn[1]}
    out: dict[str, Any] = {"role": turn.role, "content": turn.content}
    calls = tuple(getattr(turn, "tool_calls", ()) or ())
    if calls:
        ids = tuple(getattr(turn, "tool_call_ids", ()) or ())
        out["tool_calls"] = [{"id": (ids[i] if i < len(ids) and ids[i] else f"call_{i}"), "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]
    for key in ("tool_call_id", "name"):
        if getattr(turn, key, ""):
            out[key] = getattr(turn, key)
    return out


def plain_conversation(messages: Sequence[Turn]) -> str:
    """The plain format's conversation: each turn ``### <Role>:`` and its content (an assistant's calls as call
    JSON, one a line), ending with the model's ``### Assistant:`` turn."""
    lines = []
    for turn in messages:
        message = template_message(turn)
        content = str(message.get("content") or "").strip()
        calls = [compact_json({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                 for c in message.get("tool_calls", ())]
        lines.append(heading(message["role"].capitalize()) + "\n".join(x for x in [content, *calls] if x) + "\n")
    return "".join(lines) + heading(ANSWER_TURN)


def extraction_system(schema: dict[str, Any], instruction: str | None, schema_id: str = "") -> str:
    """The system message of an extraction: what to extract (the schema's title, else its id), its description,
    the caller's instruction, and the JSON Schema the answer follows, compact (without what the words said
    already, its title and description, nor its ``$schema`` and ``$id`` URLs)."""
    schema = schema if isinstance(schema, dict) else {}
    name = _text(schema.get("title")) or schema_id
    lines = [f"Extract {name} from the user's document as JSON." if name else
             "Extract the data of the user's document as JSON."]
    if _text(schema.get("description")):
        lines.append(_text(schema.get("description")))
    if instruction and instruction.strip():
        lines.append(instruction.strip())
    shown = {key: value for key, value in schema.items() if key not in SAID_IN_WORDS}
    lines.append(f"Answer with only a JSON object that follows this JSON Schema:\n{compact_json(shown)}")
    return "\n".join(lines)


def fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """``messages`` with a leading system message put in front of the first user turn's content; None when
    there is no system message to fold (or no user turn to take it)."""
    if not messages or messages[0]["role"] != "system":
        return None
    rest = list(messages[1:])
    for i, turn in enumerate(rest):
        if turn["role"] == "user":
            rest[i] = {**turn, "content": f"{messages[0]['content']}\n\n{turn['content']}"}
            return rest
    return None


def _text(value: Any) -> str:
    return " ".join(str(value).split()) if value else ""


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
