"""Worked examples the server adds to requests for the built-in schemas and tools, on base models.

Why: a base LM (Gemma 3 270M) given only an instruction and a schema writes prose or
loops inside the JSON (an amount repeated until ``max_tokens``); one worked document ->
JSON example of the same schema first and it finishes with ``stop`` (the benchmark's
workloads rely on the same thing). Profiles say how many they need (``few_shot``: 0
for the demo pair, trained on the bare format; 3 for Gemma). A request that brings its
own ``examples`` keeps them, after as many of the server's own as bring it up to that count (``fill_examples``);
any other schema or tool list gets one synthesised from
the schema itself where the schema names every value it holds (``synthetic_examples``:
never a placeholder, which models copy into real calls), else none.

The examples ship as data (``schemas/examples/builtin.json``, written once from the
synthetic corpus by ``structspec.demo.worked_examples``), so the same server always sends
the same prompts (and prefix caching shares them across requests).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Callable

from structspec.engine.synthetic_examples import synthesize_extraction_examples, synthesize_tool_examples
from structspec.grammar.cache import schema_digest
from structspec.prompts import FewShotExample, compact_json, schema_title
from structspec.schemas import BUILTIN_EXAMPLES_FILE, load_builtin_schemas, load_builtin_tools

MAX_SYNTHESIZED = 1024  # schemas and tool lists whose synthesised example is kept (each a few hundred bytes)

# Worked calls of tools no request's list is likely to hold, each under its own tool list (``FewShotExample.title``),
# for a tool list that gets no example of its own (a free argument): a base model shown none runs on inside the first
# string argument of a forced call; shown calls that close a string, a list and a number after the values asked for,
# it writes those and closes. Their values are of another domain than most requests' (time zones, photo tags, a
# reminder's days), and a list is shown the two its digest picks, so what one list's calls could copy is a few short
# values, never the same for every list.
FOREIGN_CALLS = (
    FewShotExample("What time is it in Oslo right now?", '{"name":"get_time","arguments":{"zone":"Europe/Oslo"}}',
                   "- get_time(zone): The current time in a time zone."),
    FewShotExample("Show me 5 photos tagged sunset and harbour.",
                   '{"name":"search_photos","arguments":{"tags":["sunset","harbour"],"limit":5}}',
                   "- search_photos(tags, limit): Finds photos with every tag."),
    FewShotExample("Say good morning in Italian, please.",
                   '{"name":"translate","arguments":{"text":"good morning","language":"Italian"}}',
                   "- translate(text, language): Translates a text into a language."),
    FewShotExample("Remind me to water the ferns at 7.5 on Monday and Thursday.",
                   '{"name":"set_reminder","arguments":{"task":"water the ferns","days":["Monday","Thursday"],'
                   '"hour":7.5}}',
                   "- set_reminder(task, days, hour): Sets a weekly reminder."),
)
FOREIGN_SHOWN = 2  # calls of other tools shown to a list with none of its own


def fill_examples(given: tuple[FewShotExample, ...], server: tuple[FewShotExample, ...]) -> tuple[FewShotExample, ...]:
    """The worked examples a request is shown: the caller's ``given``, after as many of the server's own of the same
    schema (``server``: ``for_schema``'s, those without a ``title``) as bring the count up to the server's. Shown
    one example, Gemma 3 270M writes that example's values into most of what it extracts; shown it after two of the
    server's varied ones, it copies less and gets more fields right (docs/benchmarks.md, "Long invoices with a
    worked example"). A request with none gets ``server``; a model that needs none (an empty book) gets ``given``
    alone. Raises: Never."""
    if not given:
        return server
    own = tuple(ex for ex in server if not ex.title)
    return own[:max(0, len(own) - len(given))] + tuple(given)


class ExampleBook:
    """Worked examples keyed by the exact schema (or tool list) they belong to (``schema_digest``).

    ``synthesize``: a schema or tool list with no shipped example gets examples made from the schema
    (``synthetic_examples``), built once per digest and kept in a bounded LRU: a tool list, that many
    (0-2) calls per tool (a tool with a free argument gets none); a schema, one made example followed by
    ``foreign`` (a real worked example of another schema, under its own title) when given, else that many
    made ones. The real example last shows that values come from the input. A schema with a free value
    (most) gets ``foreign`` alone, or nothing: never a placeholder value, which Gemma 3 270M copied into
    half its extractions. Never raises for a schema it cannot fill."""

    def __init__(self, by_schema: dict[str, tuple[FewShotExample, ...]] | None = None,
                 by_tools: dict[str, tuple[FewShotExample, ...]] | None = None, synthesize: int = 0,
                 foreign: FewShotExample | None = None):
        self._by_schema = by_schema or {}
        self._by_tools = by_tools or {}
        self.synthesize = min(2, max(0, int(synthesize)))
        self.foreign = foreign
        self._made: OrderedDict[str, tuple[FewShotExample, ...]] = OrderedDict()
        self._lock = threading.Lock()  # requests are prepared on worker threads

    def __bool__(self) -> bool:
        """Whether any request may be shown one of this book's examples."""
        return bool(self._by_schema or self._by_tools or self.synthesize)

    def for_schema(self, schema: dict[str, Any], digest: str | None = None) -> tuple[FewShotExample, ...]:
        """``digest``: the schema's ``schema_digest``, where the caller has it already."""
        key = digest or schema_digest(schema)
        if key in self._by_schema or not self.synthesize:
            return self._by_schema.get(key, ())
        foreign = self.foreign
        if foreign is None:
            return self._synthesized("s:" + key, lambda: synthesize_extraction_examples(schema, self.synthesize))
        return self._synthesized("s:" + key, lambda: (*synthesize_extraction_examples(schema, 1),
                                                       _cut_to(foreign, schema)))

    def for_tools(self, tools: tuple[dict[str, Any], ...] | list[dict[str, Any]],
                  digest: str | None = None, forced: bool = True) -> tuple[FewShotExample, ...]:
        """``digest``: the list's ``schema_digest``, where the caller has it already (``ToolSet.digest``).
        ``forced``: the request must call (``tool_choice`` required or a tool's name); only then does a list with
        no example of its own get calls of other tools (``FOREIGN_CALLS``): where the model may answer in words,
        two more calls before the request made Gemma 3 270M call where no tool was needed (13 of 20 requests
        answered in text, 18 of 20 without them), and the answer episode already shows calls that close."""
        key = digest or schema_digest(list(tools))
        if key in self._by_tools or not self.synthesize:
            return self._by_tools.get(key, ())
        own = self._synthesized("t:" + key, lambda: synthesize_tool_examples(list(tools), self.synthesize))
        return own or (_foreign_calls(key, tools) if forced else ())

    def _synthesized(self, key: str, make: Callable[[], tuple[FewShotExample, ...]]) -> tuple[FewShotExample, ...]:
        with self._lock:
            if key in self._made:
                self._made.move_to_end(key)
                return self._made[key]
        made = make()
        with self._lock:
            self._made[key] = made
            while len(self._made) > MAX_SYNTHESIZED:
                self._made.popitem(last=False)
        return made


def _foreign_calls(digest: str, tools: Any) -> tuple[FewShotExample, ...]:
    """``FOREIGN_SHOWN`` of ``FOREIGN_CALLS`` for a tool list that gets no example of its own: consecutive ones
    from where ``digest`` points, among those whose tool the list does not hold (fewer where it holds them)."""
    held = {(t.get("function", t) if isinstance(t, dict) else {}).get("name") for t in tools}
    free = [ex for ex in FOREIGN_CALLS if json.loads(ex.output)["name"] not in held]
    at = int(digest[:8], 16) % len(free) if free else 0
    return tuple(free[(at + i) % len(free)] for i in range(min(FOREIGN_SHOWN, len(free))))


def _cut_to(example: FewShotExample, schema: dict[str, Any]) -> FewShotExample:
    """The other schema's example with its object cut to as many keys as ``schema`` has properties: a model
    shown eight keys before a three-key object whose grammar forbids a fourth runs on inside the third
    string instead of closing it."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    value = json.loads(example.output)
    if not isinstance(props, dict) or not props or not isinstance(value, dict) or len(props) >= len(value):
        return example
    return FewShotExample(example.text, compact_json(dict(list(value.items())[: len(props)])), example.title)


def build_example_book(shots: int) -> ExampleBook:
    """``shots`` examples per built-in schema, and per tool for the built-in tool list."""
    if shots <= 0:
        return ExampleBook()
    shipped = json.loads(BUILTIN_EXAMPLES_FILE.read_text())
    def pick(items: list[dict[str, Any]]) -> tuple[FewShotExample, ...]:
        return tuple(FewShotExample(e["text"], e["output"]) for e in items[:shots])
    schemas = load_builtin_schemas()
    contact = shipped["schemas"]["contact"][0]  # short and every value copied from its document
    return ExampleBook(
        synthesize=shots, foreign=FewShotExample(contact["text"], contact["output"], schema_title(schemas["contact"])),
        by_schema={schema_digest(schemas[name]): pick(items) for name, items in shipped["schemas"].items()
                   if name in schemas and items},
        # Round by round (every tool once, then again): the calls nearest the request are not all one tool's.
        by_tools={schema_digest(load_builtin_tools()): tuple(e for i in range(shots) for items in shipped["tools"].values()
                                                             for e in pick(items)[i: i + 1])},
    )
