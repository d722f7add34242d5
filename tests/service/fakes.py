"""A fake ``EngineAPI`` that behaves like the real one at its boundary.

It makes a schema-valid instance, streams it in chunks (one "token" per chunk, ``token_delay``
apart), honours deadlines (ends with CANCELLED), records cancellation of the awaiting task,
bounds concurrency (``max_running``) and its queue (``max_queue`` -> ``QueueFull``), and
validates requests with their own ``validate`` (as the engine does). Magic markers steer it:

in the schema, anywhere: key ``x-fake-unsupported``   -> SchemaError(kind="unsupported")
Its drafting decision (``GenerationResult.speculation``) follows the request's and the schema's
overrides: request OFF -> request_off, schema off -> schema_off, schema on -> schema_on, else
drafted; it "drafts" (usage, statistics) only when the decision says so.

in the text (or last message):
    ``[length]``      finish LENGTH (max_tokens forced to half the output)
    ``[violation]``   outcome SCHEMA_VIOLATION
    ``[crash]``       the engine raises RuntimeError (a model failure)
    ``[error]``       finish ERROR
    ``[internal]``    outcome INTERNAL_ERROR
    ``[too-long]``    ContextTooLong
    ``[stopped]``     EngineStopped
    ``[over-budget]`` OverBudget (the request alone needs more KV cache than the server has)
    ``[slow]``        0.1 s per token;  ``[slow=0.5]`` 0.5 s per token
    ``[preamble]``    a tool request's calls come after ``PREAMBLE`` (text a native format writes before its calls)
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from typing import Any, AsyncIterator

from structspec.engine.api import ExtractionRequest, ToolCallRequest
from structspec.engine.types import (
    ContextTooLong,
    EngineStopped,
    FinishReason,
    GenerationResult,
    Outcome,
    OverBudget,
    QueueFull,
    SchemaSpeculation,
    SpeculationMode,
    SpeculationReport,
    TextDelta,
    Timings,
    ToolCall,
    ToolCallResult,
    Usage,
)
from structspec.grammar.base import SchemaError, SchemaIssue

MAGIC_KEYWORD = "x-fake-unsupported"
PREAMBLE = "Let me look that up."
_SLOW_RE = re.compile(r"\[slow(?:=([0-9.]+))?\]")


def find_keyword(schema: Any, keyword: str, pointer: str = "") -> str | None:
    if isinstance(schema, dict):
        if keyword in schema:
            return pointer
        for k, v in schema.items():
            found = find_keyword(v, keyword, f"{pointer}/{k}")
            if found is not None:
                return found
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            found = find_keyword(v, keyword, f"{pointer}/{i}")
            if found is not None:
                return found
    return None


def instance_for(schema: Any, root: Any = None) -> Any:
    """A small instance valid against common schemas (objects, arrays, enums, $ref to $defs)."""
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return instance_for(target, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return instance_for(schema[key][0], root)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance_for(sub, root) for name, sub in props.items()}
    if kind == "array":
        return [instance_for(schema.get("items", {}), root) for _ in range(max(1, schema.get("minItems", 1)))]
    if kind == "string":
        fmt = schema.get("format")
        return {"date": "2024-05-01", "email": "ada@example.com", "date-time": "2024-05-01T10:00:00Z"}.get(fmt, "text")
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    return None


class FakeEngine:
    def __init__(
        self,
        *,
        token_delay: float = 0.0,
        chunk_chars: int = 8,
        max_running: int = 8,
        max_queue: int = 32,
        store: Any = None,
        max_tokens_cap: int = 4096,
        model_key: str = "fake",
    ):
        self.store = store  # a Store: its book records each finished request, like the engine's recorder
        self.model_key = model_key
        self.token_delay = token_delay
        self.chunk_chars = chunk_chars
        self.max_running = max_running
        self.max_queue = max_queue
        self.max_tokens_cap = max_tokens_cap
        self.requests: list[ExtractionRequest | ToolCallRequest] = []
        self.started: list[str] = []  # request ids that began decoding
        self.cancelled: list[str] = []  # request ids whose awaiting task was cancelled
        self.finished: list[str] = []  # request ids that ran to a STOP/LENGTH/ERROR end
        self.deadline_hits: list[str] = []  # request ids the fake ended itself at their deadline
        self.closed = False
        self.honour_deadlines = True  # False: ignore request.deadline (tests the server's guard)
        self._running = 0
        self._waiting = 0
        self._slots: asyncio.Semaphore | None = None

    # -- EngineAPI --------------------------------------------------------------------------------

    def queue_depth(self) -> int:
        return self._waiting

    def running(self) -> int:
        return self._running

    @property
    def last_request(self) -> ExtractionRequest | ToolCallRequest:
        return self.requests[-1]

    async def extract(self, request: ExtractionRequest) -> GenerationResult:
        result = None
        async for item in self.extract_stream(request):
            if isinstance(item, GenerationResult):
                result = item
        assert result is not None
        return result

    async def extract_stream(self, request: ExtractionRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        self._admit(request)
        pointer = find_keyword(request.schema, MAGIC_KEYWORD)
        if pointer is not None:
            raise SchemaError([SchemaIssue(pointer, MAGIC_KEYWORD, "not supported by the fake grammar")], kind="unsupported")
        prompt = request.text or (request.messages[-1].content if request.messages else "")
        self._check_prompt(prompt)
        text = json.dumps(instance_for(request.schema), separators=(",", ":"))
        async for item in self._decode(
            request.request_id, prompt, text, request.sampling.max_tokens, request.deadline, schema_key=request.schema_key,
            decision=decision_for(request),
        ):
            yield item

    async def call_tool(self, request: ToolCallRequest) -> ToolCallResult:
        self._admit(request)
        prompt = request.messages[-1].content if request.messages else ""
        self._check_prompt(prompt)
        calls: list[ToolCall] = []
        answer: str | None = None
        if request.tool_choice == "none":
            answer = "I can answer without tools."
            text = answer
        else:
            tools = [t["function"] for t in request.tools]
            if request.tool_choice not in ("auto", "required"):
                tools = [t for t in tools if t["name"] == request.tool_choice]
            chosen = tools[:2] if request.parallel_calls else tools[:1]
            calls = [ToolCall(t["name"], instance_for(t.get("parameters", {}))) for t in chosen]
            text = json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], separators=(",", ":"))
            if "[preamble]" in prompt:  # the engine's text beside its calls (the raw output stays the calls' JSON)
                answer = PREAMBLE
        result = None
        async for item in self._decode(request.request_id, prompt, text, request.sampling.max_tokens, request.deadline,
                                       bool(calls), decision=decision_for(request)):
            if isinstance(item, GenerationResult):
                result = item
        assert result is not None
        if result.finish_reason is not FinishReason.STOP:
            calls, answer = [], None
        return ToolCallResult(result=result, calls=calls, text=answer)

    # -- behaviour --------------------------------------------------------------------------------

    def _admit(self, request: ExtractionRequest | ToolCallRequest) -> None:
        request.validate(self.max_tokens_cap)
        if self._running + self._waiting >= self.max_running + self.max_queue:
            raise QueueFull(f"{self._waiting} requests queued (max {self.max_queue})")
        self.requests.append(request)

    @staticmethod
    def _check_prompt(prompt: str) -> None:
        if "[too-long]" in prompt:
            raise ContextTooLong("prompt (5000 tokens) + max_tokens exceed the context (4096)", field="text")
        if "[over-budget]" in prompt:
            raise OverBudget("request needs 70000 KV-cache tokens; the server's budget is 65536", field="max_tokens")
        if "[stopped]" in prompt:
            raise EngineStopped("engine is shutting down")
        if "[crash]" in prompt:
            raise RuntimeError("CUDA error: an illegal memory access (fake)")

    async def _decode(
        self, request_id: str, prompt: str, text: str, max_tokens: int, deadline: float | None, is_json: bool = True,
        schema_key: str = "", decision: SpeculationReport | None = None,
    ) -> AsyncIterator[TextDelta | GenerationResult]:
        slow = _SLOW_RE.search(prompt)
        delay = (float(slow.group(1)) if slow.group(1) else 0.1) if slow else self.token_delay
        chunks = [text[i : i + self.chunk_chars] for i in range(0, len(text), self.chunk_chars)] or [""]
        if "[length]" in prompt:
            max_tokens = min(max_tokens, max(1, len(chunks) // 2))
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_running)
        t0 = time.perf_counter()
        self._waiting += 1
        try:
            await self._slots.acquire()
        except BaseException:
            self._waiting -= 1
            if request_id:
                self.cancelled.append(request_id)
            raise
        self._waiting -= 1
        self._running += 1
        queued_ms = (time.perf_counter() - t0) * 1000
        self.started.append(request_id)
        emitted: list[str] = []
        finish = FinishReason.STOP
        try:
            for i, chunk in enumerate(chunks):
                if self.honour_deadlines and deadline is not None and time.monotonic() >= deadline:
                    finish = FinishReason.CANCELLED
                    break
                if i >= max_tokens:
                    finish = FinishReason.LENGTH
                    break
                if delay:
                    await asyncio.sleep(delay)
                emitted.append(chunk)
                yield TextDelta(request_id, chunk)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(request_id)
            raise
        finally:
            self._running -= 1
            self._slots.release()
        if finish is FinishReason.CANCELLED:
            self.deadline_hits.append(request_id)
        else:
            self.finished.append(request_id)
        out = "".join(emitted)
        n = len(emitted)
        drafts = decision is not None and decision.drafted and n > 0
        usage = Usage(
            prompt_tokens=max(1, len(prompt) // 4) + 20,
            output_tokens=n,
            target_forward_passes=math.ceil(n / 2) if drafts else n,
            forced_tokens=n // 3,
            drafted={"draft_model": n} if drafts else {},
            accepted={"draft_model": n // 2} if drafts else {},
        )
        timings = Timings(queued_ms=queued_ms, decode_ms=(time.perf_counter() - t0) * 1000 - queued_ms, total_ms=(time.perf_counter() - t0) * 1000)
        if self.store is not None and schema_key:
            recorder = self.store.stats.recorder(self.model_key)
            if decision is not None:
                recorder.record_decision(schema_key, decision.reason, decision.reasons)
            if drafts:  # one verification of the whole output as a draft
                recorder.record_verification(schema_key, "draft_model", self._running + 1, n, n // 2, probe=False)
            recorder.record_request(schema_key, n, usage.target_forward_passes, usage.forced_tokens, finish.value,
                                    timings.total_ms)
        outcome, value, error = Outcome.VALID, None, None
        if finish is FinishReason.LENGTH:
            outcome = Outcome.TRUNCATED
        elif finish is FinishReason.CANCELLED:
            outcome, error = Outcome.NOT_CHECKED, "deadline exceeded"
        elif "[error]" in prompt:
            finish, outcome, error = FinishReason.ERROR, Outcome.NOT_CHECKED, "NaN in logits (fake)"
        elif "[internal]" in prompt:
            outcome, error = Outcome.INTERNAL_ERROR, "output did not parse (fake bug)"
        elif not is_json:
            outcome = Outcome.TEXT
        else:
            value = json.loads(out)
            if "[violation]" in prompt:
                outcome, error = Outcome.SCHEMA_VIOLATION, "/total: multipleOf: 0.01 is post-checked and failed (fake)"
        yield GenerationResult(request_id, out, list(range(n)), finish, outcome, usage, timings, value=value, error=error,
                               speculation=decision)

    async def aclose(self) -> None:
        self.closed = True


def decision_for(request: ExtractionRequest | ToolCallRequest) -> SpeculationReport:
    """The fake policy: the overrides, else draft with the one fake proposer."""
    if request.speculation is SpeculationMode.OFF:
        return SpeculationReport(False, "request_off", reasons={"draft_model": "request_off"})
    if request.schema_speculation is SchemaSpeculation.OFF:
        return SpeculationReport(False, "schema_off", reasons={"draft_model": "schema_off"})
    reason = "schema_on" if request.schema_speculation is SchemaSpeculation.ON else "drafted"
    return SpeculationReport(True, reason, max_draft={"draft_model": 8}, reasons={"draft_model": reason})


def make_fake_engine(settings: Any, store: Any = None) -> FakeEngine:
    """Engine factory for ``structspec serve --engine-factory tests.service.fakes:make_fake_engine``.
    With the server's ``store`` it records speculation statistics like the real engine will.

    Env: FAKE_ENGINE_LOAD_SECONDS (blocking "model load"), FAKE_ENGINE_TOKEN_DELAY."""
    time.sleep(float(os.environ.get("FAKE_ENGINE_LOAD_SECONDS", "0")))
    return FakeEngine(
        token_delay=float(os.environ.get("FAKE_ENGINE_TOKEN_DELAY", "0")),
        max_running=settings.max_batch,
        max_queue=settings.max_queue,
        store=store,
    )


def failing_engine_factory(settings: Any) -> FakeEngine:
    raise RuntimeError("weights file is corrupt (fake)")
