"""The facade the engine calls: intake -> backend compile under a deadline -> cache."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from structspec.grammar import intake
from structspec.grammar import tools as toolcalls
from structspec.grammar.base import (
    CompiledGrammar,
    GrammarBackend,
    GrammarOptions,
    SchemaError,
    SchemaIssue,
)
from structspec.grammar.cache import GrammarCache, cache_key, caller_canonical_json, text_digest
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

    def compile_tools(self, tools: toolcalls.ToolSet, options: GrammarOptions | None = None) -> CompiledGrammar:
        """``tools``: a request's tool list as ``ToolSet.parse`` parsed and keyed it."""
        options = options or GrammarOptions()
        key = self._key("tools", tools.grammar_digest, options)
        return self.cache.get_or_compile(key, lambda: self._compile_tools(tools, options))

    @staticmethod
    def digest(value: Any) -> str:
        """``schema_digest`` of a caller's schema; SchemaError for one too deep to canonicalise or not JSON."""
        return text_digest(caller_canonical_json(value))

    def _key(self, kind: str, digest: str, options: GrammarOptions) -> str:
        return cache_key(kind, digest, self.view.fingerprint, self.backend.name, options)

    def _compile_schema(self, schema: dict[str, Any] | bool, options: GrammarOptions) -> CompiledGrammar:
        start = time.perf_counter()
        text = intake.check_schema(schema, options)
        compiled = intake.for_backends(schema, text)  # the schema serialized once, for both
        grammar = run_with_deadline(lambda: self.backend.compile_json_schema(compiled, options), options.compile_timeout_s)
        return _stamped(grammar, start)

    def _compile_tools(self, tools: toolcalls.ToolSet, options: GrammarOptions) -> CompiledGrammar:
        start = time.perf_counter()
        if tools.size > options.max_schema_bytes:
            raise SchemaError([SchemaIssue("/tools", "", f"{tools.size} bytes, over the budget of "
                                                         f"{options.max_schema_bytes}")], kind="too_large")
        for tool in tools.tools:
            intake.check_schema(dict(tool.parameters), options, at=tool.pointer)
        spec = toolcalls.call_grammar(tools.tools, tools.choice, tools.parallel)
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
