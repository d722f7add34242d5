"""The facade the engine calls: intake -> backend compile under a deadline -> cache."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from structspec.grammar import intake, json_text
from structspec.grammar import tools as toolcalls
from structspec.grammar.base import (
    CompiledGrammar,
    GrammarBackend,
    GrammarOptions,
    SchemaError,
    SchemaIssue,
)
from structspec.grammar.cache import GrammarCache, cache_key, schema_digest
from structspec.grammar.deadline import run_with_deadline
from structspec.grammar.llguidance_backend import LLGuidanceBackend
from structspec.grammar.outlines_backend import OutlinesBackend
from structspec.grammar.tokenizer_view import TokenizerView

BACKENDS = ("llguidance", "outlines")


def make_backend(name: str, view: TokenizerView) -> GrammarBackend:
    if name == "llguidance":
        return LLGuidanceBackend(view)
    if name == "outlines":
        return OutlinesBackend(view)
    raise ValueError(f"unknown grammar backend {name!r} (one of {', '.join(BACKENDS)})")


class GrammarCompiler:
    """Compiles JSON schemas and tool lists for one tokenizer; thread-safe; results and refusals cached."""

    def __init__(self, view: TokenizerView, backend: str | GrammarBackend = "llguidance", cache_size: int = 256):
        self.view = view
        self.backend = make_backend(backend, view) if isinstance(backend, str) else backend
        self.cache = GrammarCache(cache_size)

    def compile_schema(self, schema: dict[str, Any] | bool, options: GrammarOptions | None = None,
                       digest: str | None = None) -> CompiledGrammar:
        """``digest``: the schema's ``digest``, where the caller has it already (the front computes it once)."""
        options = options or GrammarOptions()
        key = self._key("schema", digest or self.digest(schema), options)
        return self.cache.get_or_compile(key, lambda: self._compile_schema(schema, options))

    def compile_tools(
        self, tools: Any, tool_choice: Any = "auto", parallel: bool = False, options: GrammarOptions | None = None
    ) -> CompiledGrammar:
        options = options or GrammarOptions()
        key = self._key("tools", self.digest({"tools": tools, "tool_choice": tool_choice, "parallel": bool(parallel)}),
                        options)
        return self.cache.get_or_compile(key, lambda: self._compile_tools(tools, tool_choice, bool(parallel), options))

    @staticmethod
    def digest(value: Any) -> str:
        """``schema_digest`` of a caller's schema (or tool list); SchemaError for one too deep to canonicalise
        or not JSON."""
        pointer = json_text.value_too_deep(value)  # canonical JSON recurses: bound the nesting first
        if pointer is not None:
            message = f"schema {json_text.TooDeep(pointer, json_text.MAX_JSON_DEPTH)}"
            raise SchemaError([SchemaIssue(pointer, "", message)], kind="too_deep")
        try:
            return schema_digest(value)
        except (TypeError, ValueError) as exc:
            raise SchemaError([SchemaIssue("", "", f"not JSON: {exc}")], kind="invalid_schema") from exc

    def _key(self, kind: str, digest: str, options: GrammarOptions) -> str:
        return cache_key(kind, digest, self.view.fingerprint, self.backend.name, options)

    def _compile_schema(self, schema: dict[str, Any] | bool, options: GrammarOptions) -> CompiledGrammar:
        start = time.perf_counter()
        text = intake.check_schema(schema, options)
        compiled = intake.for_backends(schema, text)  # the schema serialized once, for both
        grammar = run_with_deadline(lambda: self.backend.compile_json_schema(compiled, options), options.compile_timeout_s)
        return _stamped(grammar, start)

    def _compile_tools(self, tools: Any, tool_choice: Any, parallel: bool, options: GrammarOptions) -> CompiledGrammar:
        start = time.perf_counter()
        parsed = toolcalls.parse_tools(tools)
        choice = toolcalls.parse_tool_choice(tool_choice, parsed)
        size = len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False).encode())
        if size > options.max_schema_bytes:
            raise SchemaError([SchemaIssue("/tools", "", f"{size} bytes, over the budget of {options.max_schema_bytes}")],
                              kind="too_large")
        for tool in parsed:
            intake.check_schema(dict(tool.parameters), options, at=tool.pointer)
        spec = toolcalls.call_grammar(parsed, choice, parallel)
        compiled = None if spec.schema is None else intake.for_backends(spec.schema)
        try:
            grammar = run_with_deadline(
                lambda: self.backend.compile_text_or_json(compiled, spec.allow_text, options),
                options.compile_timeout_s,
            )
        except SchemaError as exc:  # point into the request's tool list, not into the combined schema
            raise SchemaError([_moved(i, spec) for i in exc.issues], kind=exc.kind) from None
        grammar.info = dataclasses.replace(grammar.info, warnings=tuple(_moved(w, spec) for w in grammar.info.warnings))
        return _stamped(grammar, start)


def _moved(issue: SchemaIssue, spec: toolcalls.CallGrammar) -> SchemaIssue:
    return dataclasses.replace(issue, pointer=spec.request_pointer(issue.pointer))


def _stamped(grammar: CompiledGrammar, start: float) -> CompiledGrammar:
    # Set once, before the grammar is cached or shared.
    grammar.info = dataclasses.replace(grammar.info, compile_ms=(time.perf_counter() - start) * 1e3)
    return grammar
