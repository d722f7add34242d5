"""The engine seam as a caller sees it: ``EngineAPI`` and what a caller sends it (extraction and tool-call requests).

The rule between the two boundary modules: this one holds the seam and the requests; ``types`` holds the values both
sides share and what comes back (sampling parameters, results, deltas, typed errors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

from structspec.engine.types import (
    GenerationResult,
    ToolCall,
    InvalidRequest,
    SamplingParams,
    SchemaSpeculation,
    SpeculationMode,
    TextDelta,
    ToolCallResult,
)
from structspec.prompts import FewShotExample

MAX_INPUT_CHARS = 1_000_000


MAX_STOP_STRINGS = 4  # OpenAI's limit on ``stop``
MAX_STOP_CHARS = 64


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation. An assistant turn may carry the calls it made (``tool_calls``, with the ids
    the caller knows them by, ``tool_call_ids``); a tool turn says which call it answers (``tool_call_id``) and the
    tool's ``name`` where the caller gave them."""

    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_ids: tuple[str, ...] = ()  # one per call, "" where the caller gave none
    tool_call_id: str = ""
    name: str = ""


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
    schema_digest: str = ""  # SHA-256 of the schema's canonical JSON, as the front computed it ("": computed here)
    history_scope: str = ""  # whose earlier outputs the schema history drafts from ("": everyone's)
    schema_speculation: SchemaSpeculation = SchemaSpeculation.AUTO  # the schema owner's override
    tenant: str = ""  # whose request ("": the one tenant): another tenant's cached prompt is reused only where public
    # The schema is public (registered: every tenant may read it): with the server's worked examples and no
    # instruction, the prompt before the input text is no caller's data and any tenant may reuse its cache
    public_template: bool = False

    @property
    def input_text(self) -> str:
        """The document the prompt shows: ``text``, or the messages as ``role: content`` lines."""
        return self.text or "\n".join(f"{m.role}: {m.content}" for m in self.messages)

    def validate(self, max_tokens_cap: int) -> None:
        """Raises: InvalidRequest naming the field (``text``, ``messages`` or a sampling field)."""
        if bool(self.text) == bool(self.messages):
            raise InvalidRequest("exactly one of text and messages must be set", field="text")
        if not (self.text or "".join(m.content for m in self.messages)).strip():
            raise InvalidRequest("text (or messages) must not be empty", field="text")
        if len(self.input_text) > MAX_INPUT_CHARS:
            raise InvalidRequest(f"text is longer than {MAX_INPUT_CHARS} characters", field="text")
        _validate_sampling(self.sampling, max_tokens_cap)


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
    history_scope: str = ""  # whose earlier outputs the schema history drafts from ("": everyone's)
    schema_speculation: SchemaSpeculation = SchemaSpeculation.AUTO  # the tool list's override (none registered yet)
    tenant: str = ""  # whose request ("": the one tenant): its prompt (the caller's tool list first) is its own
    # A final answer, where the model answers instead of calling, is JSON valid against this schema (None: text)
    answer_schema: dict[str, Any] | None = None

    def validate(self, max_tokens_cap: int) -> None:
        """Raises: InvalidRequest naming the field (``messages``, ``tools[i].name``, ``tools`` or a sampling field)."""
        if not self.messages:
            raise InvalidRequest("at least one message is needed", field="messages")
        seen: set[str] = set()
        for i, tool in enumerate(self.tools):
            name = tool.get("function", {}).get("name", "")
            if not name:
                raise InvalidRequest("a tool needs a name", field=f"tools[{i}].name")
            if name in seen:
                raise InvalidRequest(f"duplicate tool name {name!r}", field=f"tools[{i}].name")
            seen.add(name)
        if not self.tools and self.tool_choice != "none":
            raise InvalidRequest("at least one tool is needed unless tool_choice is none", field="tools")
        if self.tool_choice not in ("auto", "required", "none") and self.tool_choice not in seen:
            raise InvalidRequest(f"{self.tool_choice!r} is not one of the request's tools", field="tool_choice")
        _validate_sampling(self.sampling, max_tokens_cap)


@dataclass(frozen=True)
class TextRequest:
    """Answer ``messages`` with free text: a chat turn without a schema or tools (no grammar beyond the model's
    own end of turn). The text ends at the model's end of turn, at the first of the ``stop`` strings (not
    included in the text), or at ``max_tokens`` (finish reason length)."""

    messages: tuple[ChatMessage, ...]
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()
    speculation: SpeculationMode = SpeculationMode.AUTO
    fast_forward: bool = True
    deadline: float | None = None
    request_id: str = ""
    history_scope: str = ""  # whose earlier outputs the history drafts from ("": everyone's)
    tenant: str = ""

    def validate(self, max_tokens_cap: int) -> None:
        """Raises: InvalidRequest naming the field (``messages``, ``stop`` or a sampling field)."""
        if not self.messages:
            raise InvalidRequest("at least one message is needed", field="messages")
        if sum(len(m.content) for m in self.messages) > MAX_INPUT_CHARS:
            raise InvalidRequest(f"messages are longer than {MAX_INPUT_CHARS} characters", field="messages")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}", field="stop")
        for i, s in enumerate(self.stop):
            if not s or len(s) > MAX_STOP_CHARS:
                raise InvalidRequest(f"a stop string is 1 to {MAX_STOP_CHARS} characters", field=f"stop[{i}]")
        _validate_sampling(self.sampling, max_tokens_cap)


def _validate_sampling(params: SamplingParams, max_tokens_cap: int) -> None:
    params.validate()
    if params.max_tokens > max_tokens_cap:
        raise InvalidRequest(f"must be <= {max_tokens_cap} (the server's cap)", field="max_tokens")


class EngineAPI(Protocol):
    """The engine as the gRPC servicer sees it. Requests are validated up front by their own
    ``validate`` (the one owner of request validation) and the engine (context length, schema, queue),
    raising ``InvalidRequest``/``ContextTooLong``/``SchemaError``/``QueueFull``; cancelling the awaiting
    task cancels decoding and frees the sequence's memory at once."""

    async def extract(self, request: ExtractionRequest) -> GenerationResult: ...

    def extract_stream(self, request: ExtractionRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        """Text deltas as tokens are committed, then the final result (last item)."""

    async def call_tool(self, request: ToolCallRequest) -> ToolCallResult: ...

    async def chat(self, request: TextRequest) -> GenerationResult:
        """Free text (outcome TEXT when it ended by itself or at a stop string; TRUNCATED at max_tokens)."""

    def chat_stream(self, request: TextRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        """Text deltas as tokens are committed (never a part of a stop string), then the final result."""

    def queue_depth(self) -> int: ...

    def running(self) -> int: ...

    @property
    def model_key(self) -> str:
        """The model statistics are kept under (``structspec.stats.counters.model_key``)."""
