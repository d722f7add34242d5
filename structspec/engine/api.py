"""What the service layer calls: typed extraction and tool-call requests, and the engine seam."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol

from structspec.prompts import FewShotExample
from structspec.engine.types import GenerationResult, SamplingParams, SpeculationMode, TextDelta


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant | tool
    content: str


@dataclass(frozen=True)
class ExtractionRequest:
    """Extract one JSON instance of ``schema`` from ``text`` (or from chat ``messages``)."""

    schema: dict[str, Any]
    text: str = ""
    messages: tuple[ChatMessage, ...] = ()
    instruction: str | None = None
    examples: tuple[FewShotExample, ...] = ()  # worked examples shown first (base models need them)
    sampling: SamplingParams = SamplingParams()
    speculation: SpeculationMode = SpeculationMode.AUTO
    fast_forward: bool = True  # debug switch: off makes every token a model decision
    deadline: float | None = None  # time.monotonic() value after which the request is cancelled
    request_id: str = ""
    schema_key: str = ""  # stable name for stats ("invoice@3"); defaults to the schema's hash


@dataclass(frozen=True)
class ToolCallRequest:
    """Answer ``messages`` with tool calls (and/or text, where ``tool_choice`` allows it)."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[dict[str, Any], ...]  # OpenAI-style: {"type": "function", "function": {name, description, parameters}}
    tool_choice: str = "auto"  # auto | required | none | <tool name>
    parallel_calls: bool = False
    examples: tuple[FewShotExample, ...] = ()  # worked request -> call examples shown first
    sampling: SamplingParams = SamplingParams()
    speculation: SpeculationMode = SpeculationMode.AUTO
    fast_forward: bool = True
    deadline: float | None = None
    request_id: str = ""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallResult:
    result: GenerationResult
    calls: list[ToolCall] = field(default_factory=list)
    text: str | None = None  # a plain-text answer, where tool_choice allowed one


class EngineAPI(Protocol):
    """The engine as the gRPC servicer sees it. Requests are validated up front (raising
    ``InvalidRequest``/``ContextTooLong``/``SchemaError``/``QueueFull``); cancelling the awaiting task
    cancels decoding and frees the sequence's memory at once."""

    async def extract(self, request: ExtractionRequest) -> GenerationResult: ...

    def extract_stream(self, request: ExtractionRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        """Text deltas as tokens are committed, then the final result (last item)."""

    async def call_tool(self, request: ToolCallRequest) -> ToolCallResult: ...

    def queue_depth(self) -> int: ...

    def running(self) -> int: ...
