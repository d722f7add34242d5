"""Worked examples the server adds to requests for the built-in schemas and tools, on base models.

Why: a base LM (Gemma 3 270M) given only an instruction and a schema writes prose or
loops inside the JSON (an amount repeated until ``max_tokens``); one worked document ->
JSON example of the same schema first and it finishes with ``stop`` (the benchmark's
workloads rely on the same thing). Profiles say how many they need (``few_shot``: 0
for the demo pair, trained on the bare format; 1 for Gemma). A request that brings its
own ``examples`` keeps them; a schema that is not built in gets none (we have no
worked document for it).

The examples are generated once, from the project's synthetic corpus with a fixed seed
different from the benchmark's, so the same server always sends the same prompts (and
prefix caching shares them across requests).
"""

from __future__ import annotations

from typing import Any

from structspec.grammar.cache import schema_key
from structspec.prompts import FewShotExample

EXAMPLES_SEED = 7331  # not BENCH_SEED: serving examples are never benchmark items


class ExampleBook:
    """Worked examples keyed by the exact schema (or tool list) they belong to (``schema_key``)."""

    def __init__(self, by_schema: dict[str, tuple[FewShotExample, ...]] | None = None,
                 by_tools: dict[str, tuple[FewShotExample, ...]] | None = None):
        self._by_schema = by_schema or {}
        self._by_tools = by_tools or {}

    def for_schema(self, schema: dict[str, Any]) -> tuple[FewShotExample, ...]:
        return self._by_schema.get(schema_key(schema), ())

    def for_tools(self, tools: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> tuple[FewShotExample, ...]:
        return self._by_tools.get(schema_key(list(tools)), ())


def build_example_book(shots: int, seed: int = EXAMPLES_SEED) -> ExampleBook:
    """``shots`` examples per built-in schema, and per tool for the built-in tool list."""
    if shots <= 0:
        return ExampleBook()
    from structspec.demo.corpus import generate
    from structspec.schemas import load_builtin_schemas, load_builtin_tools

    schemas = load_builtin_schemas()
    tools = load_builtin_tools()
    per_schema: dict[str, list[FewShotExample]] = {name: [] for name in schemas}
    per_tool: dict[str, list[FewShotExample]] = {t["function"]["name"]: [] for t in tools}
    for ex in generate(seed, 400, toolcall_share=0.5):
        if ex.task == "toolcall":
            bucket = per_tool.get(ex.value["name"])
        else:
            bucket = per_schema.get(ex.schema_name)
        if bucket is not None and len(bucket) < shots:
            bucket.append(FewShotExample(ex.source, ex.output))
    return ExampleBook(
        by_schema={schema_key(schemas[name]): tuple(found) for name, found in per_schema.items() if found},
        by_tools={schema_key(tools): tuple(e for found in per_tool.values() for e in found)},
    )
