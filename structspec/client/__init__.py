"""Python client of the structspec service.

    from structspec.client import Client
    with Client("localhost:50051", token="...") as c:
        invoice = c.extract(text=email, schema_id="invoice")          # -> dict
        contact = c.extract(text=card, model=Contact)                  # -> Contact (pydantic)
        for item in c.extract_stream(text=email, schema_id="invoice"):
            ...                                                        # TextDelta..., ExtractionResult
        calls = c.call_tool(messages=[{"role": "user", "content": "weather in Oslo?"}], tools=tools).calls
        answer = c.chat([{"role": "user", "content": "Say hello"}], stop=["\n"], max_tokens=64).text

``AsyncClient`` has the same methods as coroutines. The statistics methods return the statistics views
(``structspec.front.views``, re-exported here: ``SchemaStats``, ``RejectedDraft``, ...).
"""

from structspec.client.aio import AsyncClient
from structspec.client.channel import NO_RETRY, RetryPolicy, TLSConfig
from structspec.client.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InternalError,
    InvalidArgumentError,
    ModelValidationError,
    NotFoundError,
    OutputError,
    PermissionDeniedError,
    RequestCancelledError,
    ResourceExhaustedError,
    SchemaViolationError,
    StructSpecError,
    TruncatedOutputError,
    UnauthenticatedError,
    UnavailableError,
)
from structspec.client.results import (
    ChatResult,
    DraftLoad,
    ExtractionResult,
    SchemaInfo,
    SpeculationReport,
    TextDelta,
    Timings,
    ToolCall,
    ToolCallResult,
    Usage,
)
from structspec.client.sync import Client
from structspec.front.views import (
    DecisionCount,
    HistogramBucket,
    HourStats,
    PolicyChange,
    ProposerHour,
    ProposerPolicyState,
    ProposerStats,
    RejectedDraft,
    SchemaStats,
    StatsWindow,
)

__all__ = [
    "AsyncClient", "ChatResult", "Client", "DeadlineExceededError", "DecisionCount", "DraftLoad", "ExtractionResult",
    "FailedPreconditionError", "FieldViolation",
    "HistogramBucket", "HourStats", "InternalError", "InvalidArgumentError", "ModelValidationError", "NO_RETRY", "NotFoundError",
    "OutputError", "PermissionDeniedError", "PolicyChange", "ProposerHour", "ProposerPolicyState", "ProposerStats",
    "RejectedDraft", "RequestCancelledError", "ResourceExhaustedError",
    "RetryPolicy", "SchemaInfo", "SchemaStats", "SchemaViolationError", "SpeculationReport", "StatsWindow",
    "StructSpecError", "TLSConfig", "TextDelta", "Timings", "ToolCall", "ToolCallResult", "TruncatedOutputError",
    "UnauthenticatedError", "UnavailableError", "Usage",
]
