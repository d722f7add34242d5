"""The facade the engine calls: intake -> backend compile under a deadline -> cache."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from structspec.grammar import call_formats, intake
from structspec.grammar import tools as toolcalls
from structspec.grammar.base import (
    CompiledGrammar,
    GrammarBackend,
    GrammarOptions,
    SchemaError,
    SchemaIssue,
)
from structspec.grammar.cache import GrammarCache, cache_key, caller_canonical_json, canonical_json, text_digest
from structspec.grammar.deadline import run_with_deadline
from structspec.grammar.number_bounds import bound_numbers
from structspec.grammar.llguidance_backend import LLGuidanceBackend, json_overrides
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

    def compile_text(self, options: GrammarOptions | None = None) -> CompiledGrammar:
        """Free text: any text the model writes, ending at its end of turn (its special tokens are not text)."""
        options = options or GrammarOptions()
        return self.cache.get_or_compile(self._key("text", "", options),
                                         lambda: self.backend.compile_text_or_json(None, True, options))

    def compile_tools(self, tools: toolcalls.ToolSet, options: GrammarOptions | None = None, *,
                      call_format: call_formats.CallFormat = call_formats.JSON,
                      answer_schema: dict[str, Any] | None = None,
                      refused_text: tuple[str, ...] = ()) -> CompiledGrammar:
        """``tools``: a request's tool list as ``ToolSet.parse`` parsed and keyed it; ``call_format``: how the model
        writes calls (``call_formats``); ``answer_schema``: a final answer is JSON valid against it, not text;
        ``refused_text``: text a text answer never holds (a prompt format's call heading).
        The generic JSON form's text under none opening no call, and ``refused_text``, need the llguidance backend
        (on another, that text is any text). Raises: SchemaError (``unsupported`` where the backend compiles only
        the generic JSON form)."""
        options = options or GrammarOptions()
        lark = getattr(self.backend, "compile_lark", None) is not None
        if call_format.family == "json" and answer_schema is None and not (
                lark and (tools.choice.mode == "none" or refused_text)):
            key = self._key("tools", tools.grammar_digest, options)
            return self.cache.get_or_compile(key, lambda: self._compile_tools(tools, options))
        answer = "" if answer_schema is None else caller_canonical_json(answer_schema, at="/answer_schema")
        said = [tools.grammar_digest, call_format.family, text_digest(answer) if answer else ""]
        key = self._key("tools-format", text_digest(canonical_json(said + ([list(refused_text)] if refused_text
                                                                             else []))), options)
        return self.cache.get_or_compile(key, lambda: self._compile_call_format(tools, options, call_format,
                                                                                answer_schema, refused_text))

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
        spec = toolcalls.call_grammar(self._checked_tools(tools, options), tools.choice, tools.parallel)
        try:
            grammar = run_with_deadline(
                lambda: self.backend.compile_text_or_json(spec.schema, spec.allow_text, options),
                options.compile_timeout_s,
            )
        except SchemaError as exc:  # point into the request's tool list, not into the combined schema
            raise SchemaError([_moved(i, spec) for i in exc.issues], kind=exc.kind) from None
        grammar.info = dataclasses.replace(grammar.info, warnings=tuple(_moved(w, spec) for w in grammar.info.warnings))
        return _stamped(grammar, start)

    def _compile_call_format(self, tools: toolcalls.ToolSet, options: GrammarOptions, fmt: call_formats.CallFormat,
                             answer_schema: dict[str, Any] | None,
                             refused_text: tuple[str, ...] = ()) -> CompiledGrammar:
        start = time.perf_counter()
        compile_lark = getattr(self.backend, "compile_lark", None)
        special_token = getattr(self.backend, "special_token", None)  # llguidance's, as compile_lark
        if compile_lark is None or special_token is None:
            what = "an answer schema beside tools" if fmt.family == "json" else f"this model's {fmt.family} tool calls"
            raise SchemaError([SchemaIssue("/tools", "", f"the {self.backend.name} grammar backend writes only the "
                                                         f"generic JSON call; {what} need the llguidance backend")],
                              kind="unsupported")
        checked = self._checked_tools(tools, options)
        answer = None
        if answer_schema is not None:  # through the intake as ``compile_schema`` takes a schema
            answer = intake.for_backends(answer_schema, intake.check_schema(answer_schema, options, at="/answer_schema"))
        # the combined call schema (and the answer's), for pointing warnings and errors into the request: tool i's
        # parameters sit at /$defs/tool<i> (every tool: the choice "required"), the answer at /$defs/answer
        spec = toolcalls.call_grammar(checked, toolcalls.ToolChoice("required"), tools.parallel)
        assert spec.schema is not None  # "required": a call is possible
        if answer is not None:
            spec = dataclasses.replace(spec, schema={**spec.schema, "$defs": {**spec.schema["$defs"], "answer": answer}},
                                       placements=(*spec.placements, ("/$defs/answer", "/answer_schema")))

        def lark_of(embed: Callable[[dict[str, Any], str], dict[str, Any]]) -> str:
            spelled = tuple(dataclasses.replace(t, parameters=embed(dict(t.parameters), f"/$defs/tool{i}"))
                            for i, t in enumerate(checked))
            return call_formats.lark_grammar(fmt, spelled, tools.choice, tools.parallel, json_overrides(options),
                                             special_token,
                                             embed(answer, "/$defs/answer") if answer is not None else None,
                                             refused_text)

        try:
            grammar = run_with_deadline(lambda: compile_lark(lark_of, spec.schema, options), options.compile_timeout_s)
        except SchemaError as exc:
            raise SchemaError([_moved(i, spec) for i in exc.issues], kind=exc.kind) from None
        grammar.info = dataclasses.replace(grammar.info, warnings=tuple(_moved(w, spec) for w in grammar.info.warnings))
        return _stamped(grammar, start)

    @staticmethod
    def _checked_tools(tools: toolcalls.ToolSet, options: GrammarOptions) -> tuple[toolcalls.Tool, ...]:
        """The tool list through the intake, the one way every call format's grammar takes it: the size budget,
        each parameters schema checked where it sits in the request, then spelled as the backends compile it
        (``intake.for_backends``: integer-valued counts as integers, bounds no float holds rounded inward), its
        numbers bounded so that each ends (``number_bounds``). The output is read and post-checked against the
        caller's own schemas (``tools``)."""
        if tools.size > options.max_schema_bytes:
            raise SchemaError([SchemaIssue("/tools", "", f"{tools.size} bytes, over the budget of "
                                                         f"{options.max_schema_bytes}")], kind="too_large")
        checked = []
        for tool in tools.tools:
            text = intake.check_schema(dict(tool.parameters), options, at=tool.pointer)
            checked.append(dataclasses.replace(tool, parameters=bound_numbers(intake.for_backends(tool.parameters, text))))
        return tuple(checked)


def _moved(issue: SchemaIssue, spec: toolcalls.CallGrammar) -> SchemaIssue:
    return dataclasses.replace(issue, pointer=spec.request_pointer(issue.pointer))


def _stamped(grammar: CompiledGrammar, start: float) -> CompiledGrammar:
    # Set once, before the grammar is cached or shared.
    grammar.info = dataclasses.replace(grammar.info, compile_ms=(time.perf_counter() - start) * 1e3)
    return grammar
