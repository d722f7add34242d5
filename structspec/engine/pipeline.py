"""What every engine does around decoding: requests -> prompts + grammars -> sequences, outputs -> checked results.

``RequestPipeline`` is written once for every engine behind ``EngineAPI``: it validates a request, compiles its
grammar (cached), renders its prompt (the model's chat template or the plain format, with worked examples), builds
the sequence, and reads the output back (finish reasons, the post-check against the caller's schema, the tool-call
format's parse). An engine says how a sequence runs (``_run``: text deltas, then the result) and what it serves
(``model_key``, ``queue_depth``, ``running``): structspec's own decode loop (``engine.Engine``) or vLLM
(``structspec.vllm_engine``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any, AsyncIterator, Callable

from structspec.chat_template import ChatTemplateError, PlainPrompts, Prompt, PromptFormat, call_family
from structspec.engine.api import ExtractionRequest, TextRequest, ToolCallRequest
from structspec.engine.default_examples import ExampleBook, fill_examples
from structspec.engine.postcheck import CheckResult, check_instance, check_json_text, too_deep
from structspec.engine.prefix_cache import common_prefix
from structspec.engine.sequence import EngineSequence
from structspec.engine.stop import StopFilter, cut_at_stop
from structspec.engine.types import (ContextTooLong, EngineError, EngineStopped, FinishReason, GenerationResult,
                                     InvalidRequest, Outcome, SchemaSpeculation, TextDelta, ToolCall, ToolCallResult)
from structspec.grammar import GrammarCompiler
from structspec.grammar import call_formats
from structspec.grammar.base import CompiledGrammar
from structspec.grammar.copy_guard import CopyGuard, GuardTokens, guarded_values
from structspec.grammar.tools import ToolSet
from structspec.prompts import FewShotExample

log = logging.getLogger(__name__)

# The statistics key of free-text answers (a chat turn without a schema or tools): acceptance on prose is kept
# apart from every schema's, and the policy decides for it as for a schema.
FREE_TEXT_KEY = "chat"


class RequestPipeline:
    """The part of ``EngineAPI`` every engine shares; a subclass implements ``_run`` (and the lifecycle)."""

    def __init__(self, tokenizer: Any, compiler: GrammarCompiler, max_context: int, max_tokens_cap: int = 4096,
                 examples: ExampleBook | None = None, fast_forward: bool = True, prompts: PromptFormat | None = None,
                 copy_guard: bool = True):
        self.prompts = prompts or PlainPrompts(tokenizer)  # the model's chat template, or the plain format
        self.examples = examples or ExampleBook()  # worked examples for requests that bring none
        self.tokenizer = tokenizer
        self.compiler = compiler
        self.max_context = max_context
        self.max_tokens_cap = max_tokens_cap  # a request may not ask for more
        self.fast_forward = fast_forward  # the server's switch; a request may turn it off for itself
        # an output never writes a value of the server's worked examples past what its input holds
        # (``grammar.copy_guard``)
        self.copy_guard = copy_guard
        self.internal_errors = 0  # outputs that failed the post-check on an enforced keyword (bugs)
        self._stopping = False

    def _run(self, seq: EngineSequence, stream: bool) -> AsyncIterator[TextDelta | GenerationResult]:
        """Decode ``seq``: its text deltas (when ``stream``), then its result (finish reason set, not checked).
        Cancelling the consumer cancels decoding."""
        raise NotImplementedError

    # -- requests --------------------------------------------------------------------------------
    async def extract(self, request: ExtractionRequest) -> GenerationResult:
        result: GenerationResult | None = None
        async for item in self._generate_extraction(request, stream=False):
            result = item  # type: ignore[assignment]
        assert result is not None
        return result

    async def extract_stream(self, request: ExtractionRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        async for item in self._generate_extraction(request, stream=True):
            yield item

    def prepare_extraction(self, request: ExtractionRequest) -> EngineSequence:
        """Validate, compile the grammar (cached), build the prompt: a sequence ready to submit."""
        request.validate(self.max_tokens_cap)
        text = request.input_text
        digest = request.schema_digest or self.compiler.digest(request.schema)  # the grammar's and the examples' key
        grammar = self.compiler.compile_schema(request.schema, digest=digest)
        server = self.examples.for_schema(request.schema, digest)
        examples = fill_examples(request.examples, server)
        key = request.schema_key or digest
        # a caller's instruction or examples come first in the prompt, so nothing of it is public then
        public = request.public_template and request.instruction is None and not request.examples
        try:
            prompt = self.prompts.extraction(request.schema, text, request.instruction, examples,
                                             schema_id=key.rpartition("@")[0], public=public)  # "id@version"
        except ChatTemplateError as exc:
            raise EngineError(str(exc)) from exc
        seq = self._sequence(request, prompt, grammar, key, request.schema)
        if self.copy_guard and server:
            self._guard(seq, [ex for ex in examples if any(ex is s for s in server)], request)
        return seq

    def _guard(self, seq: EngineSequence, shown: list[FewShotExample], request: ExtractionRequest) -> None:
        """Wrap ``seq``'s matcher in a copy guard over the values of the server's examples it is ``shown`` that
        the input does not hold (none: left as is)."""
        try:
            guarded = guarded_values((ex.output for ex in shown), request.input_text, request.schema,
                                     shown_elsewhere=(ex.output for ex in request.examples),
                                     example_texts=(ex.text for ex in shown))
        except Exception:  # noqa: BLE001 - a bug here must cost the guard, not the request
            log.exception("request %s: the copy guard's values could not be read; decoding without it",
                          seq.request_id)
            return
        if guarded:
            seq.matcher = CopyGuard(seq.matcher, guarded, GuardTokens.for_view(self.compiler.view))

    async def _generate_extraction(self, request: ExtractionRequest, stream: bool
                                   ) -> AsyncIterator[TextDelta | GenerationResult]:
        seq = await asyncio.to_thread(self.prepare_extraction, request)  # compiles can take seconds
        post_check = seq.grammar.info.post_check_keywords
        async for item in self._run(seq, stream):
            if isinstance(item, GenerationResult):
                # off the event loop: the post-check runs the caller's schema over the output
                yield await asyncio.to_thread(self._finalize, item, lambda t: check_json_text(t, request.schema, post_check))
            else:
                yield item

    def prepare_toolcall(self, request: ToolCallRequest) -> EngineSequence:
        """Validate, parse the tool list, compile its grammar (cached), build the prompt: a sequence ready to submit."""
        return self._prepare_toolcall(request)[0]

    def _prepare_toolcall(self, request: ToolCallRequest) -> tuple[EngineSequence, ToolSet]:
        request.validate(self.max_tokens_cap)
        # Parsed and keyed once: the grammar, the prompt, the worked examples, the statistics and the output read it
        tools = ToolSet.parse(request.tools, request.tool_choice, request.parallel_calls, request.answer_schema)
        none = tools.choice.mode == "none"
        # the model's own call format (its chat template's), the generic JSON call for the plain format; under none
        # the answer never opens a call, nor the format's own call turn
        grammar = self.compiler.compile_tools(tools, call_format=self.call_format, answer_schema=request.answer_schema,
                                              refused_text=tuple(self.prompts.call_headings) if none else ())
        examples = request.examples or self.examples.for_tools(tools.entries, tools.digest,
                                                               forced=tools.choice.mode in ("required", "named"))
        try:
            # the whole conversation: an agent's earlier calls and the tools' results are turns of it
            # a final answer's schema is said where the format says one (the chat templates' system message)
            said = {"answer_schema": request.answer_schema} if request.answer_schema is not None else {}
            prompt = self.prompts.toolcall(tools.tools, list(request.messages), examples,
                                           may_answer=tools.choice.mode == "auto", may_call=not none, **said)
        except ChatTemplateError as exc:  # the caller's conversation (its roles' order) or the template itself
            raise InvalidRequest(str(exc), field="messages") from exc
        # a text answer ends where the format's next turn would begin (the plain format's turn headings), as free
        # text does; a call's JSON never holds one (a newline in a JSON string is escaped)
        stop = tuple(self.prompts.text_stop) if tools.choice.mode in ("auto", "none") else ()
        return self._sequence(request, prompt, grammar, tools.statistics_key, None, stop=stop), tools

    @property
    def call_format(self) -> call_formats.CallFormat:
        """How this engine's model writes tool calls: its chat template's family, else the generic JSON call."""
        return call_formats.BY_FAMILY[call_family(getattr(self.prompts, "tool_template", None))]

    async def call_tool(self, request: ToolCallRequest) -> ToolCallResult:
        seq, tools = await asyncio.to_thread(self._prepare_toolcall, request)
        parsed: dict[str, Any] = {}
        post_check = seq.grammar.info.post_check_keywords
        fmt, answer = self.call_format, request.answer_schema

        def check(text: str) -> CheckResult:
            deep = too_deep(text)
            if deep is not None:
                return deep
            try:
                out = fmt.parse(text, tools.tools, tools.choice, tools.parallel, answer=answer)
            except ValueError as exc:
                return CheckResult(Outcome.INTERNAL_ERROR, None, f"tool output failed its check: {exc}")
            parsed["out"] = out
            if out.text is not None and not out.calls:
                if answer is not None:  # a final answer: JSON valid against the answer schema
                    return check_json_text(out.text, answer, post_check)
                return CheckResult(Outcome.TEXT, None)
            for call in out.calls:  # arguments against their tool's parameters schema
                checked = check_instance(call.arguments, dict(tools.parameters(call.name)), post_check)
                if checked.outcome is not Outcome.VALID:
                    return CheckResult(checked.outcome, None, f"tool {call.name}: {checked.error}")
            return CheckResult(Outcome.VALID, [{"name": c.name, "arguments": c.arguments} for c in out.calls])

        result = None
        async for item in self._run(seq, stream=False):
            if seq.stop and isinstance(item, GenerationResult):
                item.text, cut = cut_at_stop(item.text, seq.stop)
                if cut:  # the answer ended at the format's next turn: a whole answer, not a cut one
                    item.finish_reason = FinishReason.STOP
            result = await asyncio.to_thread(self._finalize, item, check)  # type: ignore[arg-type]
        assert result is not None
        out = parsed.get("out")
        if result.outcome is Outcome.TRUNCATED:  # a cut call is neither a call nor content; cut text stays text
            text = result.text if tools.choice.mode == "none" else fmt.partial_text(result.text)
            return ToolCallResult(result=result, calls=[], text=text)
        calls = [ToolCall(c.name, c.arguments) for c in out.calls] if out else []
        return ToolCallResult(result=result, calls=calls, text=out.text if out else None)

    async def chat(self, request: TextRequest) -> GenerationResult:
        result: GenerationResult | None = None
        async for item in self._generate_text(request, stream=False):
            result = item  # type: ignore[assignment]
        assert result is not None
        return result

    async def chat_stream(self, request: TextRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        async for item in self._generate_text(request, stream=True):
            yield item

    def prepare_text(self, request: TextRequest) -> EngineSequence:
        """Validate, build the prompt: a free-text sequence ready to submit. Its statistics and history are kept
        under ``FREE_TEXT_KEY``, apart from every schema's."""
        request.validate(self.max_tokens_cap)
        try:
            prompt = self.prompts.text(request.messages)
        except ChatTemplateError as exc:  # the caller's conversation (its roles' order) or the template itself
            raise InvalidRequest(str(exc), field="messages") from exc
        stop = tuple(dict.fromkeys((*request.stop, *self.prompts.text_stop)))
        seq = self._sequence(request, prompt, self.compiler.compile_text(), FREE_TEXT_KEY, None, stop=stop)
        seq.prose = True
        return seq

    async def _generate_text(self, request: TextRequest, stream: bool) -> AsyncIterator[TextDelta | GenerationResult]:
        seq = await asyncio.to_thread(self.prepare_text, request)
        shown = StopFilter(seq.stop)
        async for item in self._run(seq, stream):
            if isinstance(item, TextDelta):
                text = shown.feed(item.text)
                if text:
                    yield TextDelta(item.request_id, text)
                continue
            item.text, cut = cut_at_stop(item.text, seq.stop)
            if cut:  # the output went on past the stop string within the step that wrote it: not a cut answer
                item.finish_reason = FinishReason.STOP
            item.outcome = {FinishReason.STOP: Outcome.TEXT,
                            FinishReason.LENGTH: Outcome.TRUNCATED}.get(item.finish_reason, Outcome.NOT_CHECKED)
            if stream:
                rest = shown.finish(item.text)
                if rest:
                    yield TextDelta(item.request_id, rest)
            yield item

    # -- plumbing --------------------------------------------------------------------------------
    def _sequence(self, request: ExtractionRequest | ToolCallRequest | TextRequest, prompt: Prompt,
                  grammar: CompiledGrammar, schema_key: str, schema: dict[str, Any] | None,
                  stop: tuple[str, ...] = ()) -> EngineSequence:
        if self._stopping:
            raise EngineStopped("the engine is shutting down")
        params = request.sampling
        ids = prompt.ids
        if len(ids) + params.max_tokens > self.max_context:
            raise ContextTooLong(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                                 f"model's context of {self.max_context} tokens", field="max_tokens")
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(7), "little")
        return EngineSequence(
            request_id=request.request_id or uuid.uuid4().hex,
            prompt=ids, grammar=grammar, matcher=grammar.matcher(), params=params, seed=seed,
            deadline=request.deadline, fast_forward=self.fast_forward and request.fast_forward,
            speculate=request.speculation.value != "off", schema_key=schema_key, schema=schema, on_event=lambda *_: None,
            history_scope=request.history_scope, stop=stop,
            schema_speculation=getattr(request, "schema_speculation", SchemaSpeculation.AUTO),
            tenant=request.tenant, public_prefix=common_prefix(prompt.public_ids, ids) if prompt.public_ids else 0,
        )

    def _finalize(self, result: GenerationResult, check: Callable[[str], CheckResult]) -> GenerationResult:
        if result.finish_reason is FinishReason.LENGTH:
            result.outcome = Outcome.TRUNCATED
        elif result.finish_reason is FinishReason.STOP:
            checked = check(result.text)
            result.outcome, result.value = checked.outcome, checked.value
            if checked.error:
                result.error = checked.error
            if checked.outcome is Outcome.INTERNAL_ERROR:
                self.internal_errors += 1
                log.error("request %s: %s; output %r", result.request_id, checked.error, result.text[:2000])
        return result
