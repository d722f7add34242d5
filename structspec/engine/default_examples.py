"""Worked examples the server adds to requests for the built-in schemas and tools, on base models.

Why: a base LM (Gemma 3 270M) given only an instruction and a schema writes prose or
loops inside the JSON (an amount repeated until ``max_tokens``); one worked document ->
JSON example of the same schema first and it finishes with ``stop`` (the benchmark's
workloads rely on the same thing). Profiles say how many they need (``few_shot``: 0
for the demo pair, trained on the bare format; 1 for Gemma). A request that brings its
own ``examples`` keeps them; a schema that is not built in gets none (we have no
worked document for it).

The examples ship as data (``schemas/examples/builtin.json``, written once from the
synthetic corpus by ``structspec.demo.worked_examples``), so the same server always sends
the same prompts (and prefix caching shares them across requests).
"""

from __future__ import annotations

import json
from typing import Any

from structspec.grammar.cache import schema_digest
from structspec.prompts import FewShotExample


class ExampleBook:
    """Worked examples keyed by the exact schema (or tool list) they belong to (``schema_digest``)."""

    def __init__(self, by_schema: dict[str, tuple[FewShotExample, ...]] | None = None,
                 by_tools: dict[str, tuple[FewShotExample, ...]] | None = None):
        self._by_schema = by_schema or {}
        self._by_tools = by_tools or {}

    def for_schema(self, schema: dict[str, Any]) -> tuple[FewShotExample, ...]:
        return self._by_schema.get(schema_digest(schema), ())

    def for_tools(self, tools: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> tuple[FewShotExample, ...]:
        return self._by_tools.get(schema_digest(list(tools)), ())


def build_example_book(shots: int) -> ExampleBook:
    """``shots`` examples per built-in schema, and per tool for the built-in tool list."""
    if shots <= 0:
        return ExampleBook()
    from structspec.schemas import BUILTIN_EXAMPLES_FILE, load_builtin_schemas, load_builtin_tools

    shipped = json.loads(BUILTIN_EXAMPLES_FILE.read_text())
    pick = lambda items: tuple(FewShotExample(e["text"], e["output"]) for e in items[:shots])  # noqa: E731
    schemas = load_builtin_schemas()
    return ExampleBook(
        by_schema={schema_digest(schemas[name]): pick(items) for name, items in shipped["schemas"].items()
                   if name in schemas and items},
        by_tools={schema_digest(load_builtin_tools()): tuple(e for items in shipped["tools"].values()
                                                             for e in pick(items))},
    )
