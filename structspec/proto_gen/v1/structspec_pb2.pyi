import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class SpeculationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPECULATION_MODE_UNSPECIFIED: _ClassVar[SpeculationMode]
    SPECULATION_MODE_AUTO: _ClassVar[SpeculationMode]
    SPECULATION_MODE_OFF: _ClassVar[SpeculationMode]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_VALID: _ClassVar[Outcome]
    OUTCOME_TRUNCATED: _ClassVar[Outcome]
    OUTCOME_SCHEMA_VIOLATION: _ClassVar[Outcome]
    OUTCOME_INTERNAL_ERROR: _ClassVar[Outcome]
    OUTCOME_TEXT: _ClassVar[Outcome]
    OUTCOME_NOT_CHECKED: _ClassVar[Outcome]

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]

class SchemaSpeculation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEMA_SPECULATION_UNSPECIFIED: _ClassVar[SchemaSpeculation]
    SCHEMA_SPECULATION_AUTO: _ClassVar[SchemaSpeculation]
    SCHEMA_SPECULATION_OFF: _ClassVar[SchemaSpeculation]
    SCHEMA_SPECULATION_ON: _ClassVar[SchemaSpeculation]
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
SPECULATION_MODE_UNSPECIFIED: SpeculationMode
SPECULATION_MODE_AUTO: SpeculationMode
SPECULATION_MODE_OFF: SpeculationMode
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_VALID: Outcome
OUTCOME_TRUNCATED: Outcome
OUTCOME_SCHEMA_VIOLATION: Outcome
OUTCOME_INTERNAL_ERROR: Outcome
OUTCOME_TEXT: Outcome
OUTCOME_NOT_CHECKED: Outcome
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
SCHEMA_SPECULATION_UNSPECIFIED: SchemaSpeculation
SCHEMA_SPECULATION_AUTO: SchemaSpeculation
SCHEMA_SPECULATION_OFF: SchemaSpeculation
SCHEMA_SPECULATION_ON: SchemaSpeculation

class SchemaRef(_message.Message):
    __slots__ = ("schema_id", "version")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    schema_id: str
    version: int
    def __init__(self, schema_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "max_tokens")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "output_tokens", "target_forward_passes", "forced_tokens", "drafted_tokens", "accepted_tokens", "cached_prompt_tokens")
    class DraftedTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AcceptedTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    output_tokens: int
    target_forward_passes: int
    forced_tokens: int
    drafted_tokens: _containers.ScalarMap[str, int]
    accepted_tokens: _containers.ScalarMap[str, int]
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., target_forward_passes: _Optional[int] = ..., forced_tokens: _Optional[int] = ..., drafted_tokens: _Optional[_Mapping[str, int]] = ..., accepted_tokens: _Optional[_Mapping[str, int]] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queued_ms", "prefill_ms", "decode_ms", "total_ms")
    QUEUED_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queued_ms: float
    prefill_ms: float
    decode_ms: float
    total_ms: float
    def __init__(self, queued_ms: _Optional[float] = ..., prefill_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class SpeculationReport(_message.Message):
    __slots__ = ("drafted", "reason", "probe", "max_draft", "proposer_reasons", "arm")
    class MaxDraftEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ProposerReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_REASONS_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    drafted: bool
    reason: str
    probe: bool
    max_draft: _containers.ScalarMap[str, int]
    proposer_reasons: _containers.ScalarMap[str, str]
    arm: str
    def __init__(self, drafted: _Optional[bool] = ..., reason: _Optional[str] = ..., probe: _Optional[bool] = ..., max_draft: _Optional[_Mapping[str, int]] = ..., proposer_reasons: _Optional[_Mapping[str, str]] = ..., arm: _Optional[str] = ...) -> None: ...

class ExtractRequest(_message.Message):
    __slots__ = ("schema_ref", "json_schema", "text", "messages", "instruction", "sampling", "speculation", "disable_fast_forward", "request_id", "examples")
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    DISABLE_FAST_FORWARD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    schema_ref: SchemaRef
    json_schema: str
    text: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    instruction: str
    sampling: SamplingParams
    speculation: SpeculationMode
    disable_fast_forward: bool
    request_id: str
    examples: _containers.RepeatedCompositeFieldContainer[Example]
    def __init__(self, schema_ref: _Optional[_Union[SchemaRef, _Mapping]] = ..., json_schema: _Optional[str] = ..., text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., instruction: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationMode, str]] = ..., disable_fast_forward: _Optional[bool] = ..., request_id: _Optional[str] = ..., examples: _Optional[_Iterable[_Union[Example, _Mapping]]] = ...) -> None: ...

class Example(_message.Message):
    __slots__ = ("text", "output_json")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    text: str
    output_json: str
    def __init__(self, text: _Optional[str] = ..., output_json: _Optional[str] = ...) -> None: ...

class ExtractResult(_message.Message):
    __slots__ = ("request_id", "json", "object", "value", "finish_reason", "outcome", "truncated", "usage", "timings", "error", "schema_key", "speculation", "model", "draft_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_KEY_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    json: str
    object: _struct_pb2.Struct
    value: _struct_pb2.Value
    finish_reason: FinishReason
    outcome: Outcome
    truncated: bool
    usage: Usage
    timings: Timings
    error: str
    schema_key: str
    speculation: SpeculationReport
    model: str
    draft_version: str
    def __init__(self, request_id: _Optional[str] = ..., json: _Optional[str] = ..., object: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., truncated: _Optional[bool] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., error: _Optional[str] = ..., schema_key: _Optional[str] = ..., speculation: _Optional[_Union[SpeculationReport, _Mapping]] = ..., model: _Optional[str] = ..., draft_version: _Optional[str] = ...) -> None: ...

class ExtractResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: ExtractResult
    def __init__(self, result: _Optional[_Union[ExtractResult, _Mapping]] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ExtractStreamResponse(_message.Message):
    __slots__ = ("delta", "result")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    delta: TextDelta
    result: ExtractResult
    def __init__(self, delta: _Optional[_Union[TextDelta, _Mapping]] = ..., result: _Optional[_Union[ExtractResult, _Mapping]] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "tool_name")
    MODE_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    tool_name: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., tool_name: _Optional[str] = ...) -> None: ...

class CallToolRequest(_message.Message):
    __slots__ = ("messages", "tools", "tool_choice", "parallel_tool_calls", "sampling", "speculation", "disable_fast_forward", "request_id", "examples", "answer_schema_json")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    DISABLE_FAST_FORWARD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    sampling: SamplingParams
    speculation: SpeculationMode
    disable_fast_forward: bool
    request_id: str
    examples: _containers.RepeatedCompositeFieldContainer[Example]
    answer_schema_json: str
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationMode, str]] = ..., disable_fast_forward: _Optional[bool] = ..., request_id: _Optional[str] = ..., examples: _Optional[_Iterable[_Union[Example, _Mapping]]] = ..., answer_schema_json: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("name", "arguments_json", "arguments", "id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    arguments: _struct_pb2.Struct
    id: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., arguments: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., id: _Optional[str] = ...) -> None: ...

class CallToolResponse(_message.Message):
    __slots__ = ("request_id", "tool_calls", "text", "finish_reason", "outcome", "truncated", "usage", "timings", "error", "raw_output", "speculation", "model", "draft_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RAW_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    text: str
    finish_reason: FinishReason
    outcome: Outcome
    truncated: bool
    usage: Usage
    timings: Timings
    error: str
    raw_output: str
    speculation: SpeculationReport
    model: str
    draft_version: str
    def __init__(self, request_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., truncated: _Optional[bool] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., error: _Optional[str] = ..., raw_output: _Optional[str] = ..., speculation: _Optional[_Union[SpeculationReport, _Mapping]] = ..., model: _Optional[str] = ..., draft_version: _Optional[str] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("messages", "stop", "sampling", "speculation", "disable_fast_forward", "request_id")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    DISABLE_FAST_FORWARD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    stop: _containers.RepeatedScalarFieldContainer[str]
    sampling: SamplingParams
    speculation: SpeculationMode
    disable_fast_forward: bool
    request_id: str
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., stop: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationMode, str]] = ..., disable_fast_forward: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class ChatResult(_message.Message):
    __slots__ = ("request_id", "text", "finish_reason", "outcome", "truncated", "usage", "timings", "speculation", "model", "draft_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    finish_reason: FinishReason
    outcome: Outcome
    truncated: bool
    usage: Usage
    timings: Timings
    speculation: SpeculationReport
    model: str
    draft_version: str
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., truncated: _Optional[bool] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationReport, _Mapping]] = ..., model: _Optional[str] = ..., draft_version: _Optional[str] = ...) -> None: ...

class ChatResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: ChatResult
    def __init__(self, result: _Optional[_Union[ChatResult, _Mapping]] = ...) -> None: ...

class ChatStreamResponse(_message.Message):
    __slots__ = ("delta", "result")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    delta: TextDelta
    result: ChatResult
    def __init__(self, delta: _Optional[_Union[TextDelta, _Mapping]] = ..., result: _Optional[_Union[ChatResult, _Mapping]] = ...) -> None: ...

class SchemaVersion(_message.Message):
    __slots__ = ("schema_id", "version", "schema_json", "sha256", "description", "created_at", "source", "speculation")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    schema_id: str
    version: int
    schema_json: str
    sha256: str
    description: str
    created_at: _timestamp_pb2.Timestamp
    source: str
    speculation: SchemaSpeculation
    def __init__(self, schema_id: _Optional[str] = ..., version: _Optional[int] = ..., schema_json: _Optional[str] = ..., sha256: _Optional[str] = ..., description: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[str] = ..., speculation: _Optional[_Union[SchemaSpeculation, str]] = ...) -> None: ...

class RegisterSchemaRequest(_message.Message):
    __slots__ = ("schema_id", "schema_json", "description")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    schema_id: str
    schema_json: str
    description: str
    def __init__(self, schema_id: _Optional[str] = ..., schema_json: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class RegisterSchemaResponse(_message.Message):
    __slots__ = ("schema", "created")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    schema: SchemaVersion
    created: bool
    def __init__(self, schema: _Optional[_Union[SchemaVersion, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetSchemaRequest(_message.Message):
    __slots__ = ("schema_id", "version")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    schema_id: str
    version: int
    def __init__(self, schema_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetSchemaResponse(_message.Message):
    __slots__ = ("schema",)
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    schema: SchemaVersion
    def __init__(self, schema: _Optional[_Union[SchemaVersion, _Mapping]] = ...) -> None: ...

class ListSchemasRequest(_message.Message):
    __slots__ = ("schema_id", "all_versions", "omit_content")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    OMIT_CONTENT_FIELD_NUMBER: _ClassVar[int]
    schema_id: str
    all_versions: bool
    omit_content: bool
    def __init__(self, schema_id: _Optional[str] = ..., all_versions: _Optional[bool] = ..., omit_content: _Optional[bool] = ...) -> None: ...

class ListSchemasResponse(_message.Message):
    __slots__ = ("schemas",)
    SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    schemas: _containers.RepeatedCompositeFieldContainer[SchemaVersion]
    def __init__(self, schemas: _Optional[_Iterable[_Union[SchemaVersion, _Mapping]]] = ...) -> None: ...

class DeleteSchemaRequest(_message.Message):
    __slots__ = ("schema_id", "version")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    schema_id: str
    version: int
    def __init__(self, schema_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class DeleteSchemaResponse(_message.Message):
    __slots__ = ("deleted_versions",)
    DELETED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    deleted_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, deleted_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class SetSchemaSpeculationRequest(_message.Message):
    __slots__ = ("schema_ref", "speculation")
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    schema_ref: SchemaRef
    speculation: SchemaSpeculation
    def __init__(self, schema_ref: _Optional[_Union[SchemaRef, _Mapping]] = ..., speculation: _Optional[_Union[SchemaSpeculation, str]] = ...) -> None: ...

class SetSchemaSpeculationResponse(_message.Message):
    __slots__ = ("schema",)
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    schema: SchemaVersion
    def __init__(self, schema: _Optional[_Union[SchemaVersion, _Mapping]] = ...) -> None: ...

class LoadDraftRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class LoadDraftResponse(_message.Message):
    __slots__ = ("draft_version", "model", "loaded", "previous_draft_version", "previous_model")
    DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_MODEL_FIELD_NUMBER: _ClassVar[int]
    draft_version: str
    model: str
    loaded: bool
    previous_draft_version: str
    previous_model: str
    def __init__(self, draft_version: _Optional[str] = ..., model: _Optional[str] = ..., loaded: _Optional[bool] = ..., previous_draft_version: _Optional[str] = ..., previous_model: _Optional[str] = ...) -> None: ...

class ProposerStats(_message.Message):
    __slots__ = ("proposer", "batch_bucket", "drafted", "accepted", "events", "acceptance_rate", "probe_verifications", "reached", "accepted_at", "acceptance_by_position")
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    BATCH_BUCKET_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    PROBE_VERIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    REACHED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_AT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_BY_POSITION_FIELD_NUMBER: _ClassVar[int]
    proposer: str
    batch_bucket: int
    drafted: int
    accepted: int
    events: int
    acceptance_rate: float
    probe_verifications: int
    reached: _containers.RepeatedScalarFieldContainer[int]
    accepted_at: _containers.RepeatedScalarFieldContainer[int]
    acceptance_by_position: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, proposer: _Optional[str] = ..., batch_bucket: _Optional[int] = ..., drafted: _Optional[int] = ..., accepted: _Optional[int] = ..., events: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., probe_verifications: _Optional[int] = ..., reached: _Optional[_Iterable[int]] = ..., accepted_at: _Optional[_Iterable[int]] = ..., acceptance_by_position: _Optional[_Iterable[float]] = ...) -> None: ...

class DecisionCount(_message.Message):
    __slots__ = ("proposer", "reason", "requests")
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    proposer: str
    reason: str
    requests: int
    def __init__(self, proposer: _Optional[str] = ..., reason: _Optional[str] = ..., requests: _Optional[int] = ...) -> None: ...

class HistogramBucket(_message.Message):
    __slots__ = ("upper_bound", "count")
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    upper_bound: float
    count: int
    def __init__(self, upper_bound: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class StatsWindow(_message.Message):
    __slots__ = ("window_seconds", "proposers", "requests", "output_tokens", "target_passes", "forced_tokens", "finish_reasons", "output_tokens_p50", "output_tokens_p95", "latency_ms_p50", "latency_ms_p99", "latency_ms_mean", "passes_per_token", "decisions", "output_length", "latency_ms", "names", "estimated_speedup", "speedup_costs_measured")
    class FinishReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class NamesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROPOSERS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASSES_FIELD_NUMBER: _ClassVar[int]
    FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASONS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_P50_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_P95_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_P50_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_P99_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_MEAN_FIELD_NUMBER: _ClassVar[int]
    PASSES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_COSTS_MEASURED_FIELD_NUMBER: _ClassVar[int]
    window_seconds: int
    proposers: _containers.RepeatedCompositeFieldContainer[ProposerStats]
    requests: int
    output_tokens: int
    target_passes: int
    forced_tokens: int
    finish_reasons: _containers.ScalarMap[str, int]
    output_tokens_p50: float
    output_tokens_p95: float
    latency_ms_p50: float
    latency_ms_p99: float
    latency_ms_mean: float
    passes_per_token: float
    decisions: _containers.RepeatedCompositeFieldContainer[DecisionCount]
    output_length: _containers.RepeatedCompositeFieldContainer[HistogramBucket]
    latency_ms: _containers.RepeatedCompositeFieldContainer[HistogramBucket]
    names: _containers.ScalarMap[str, int]
    estimated_speedup: float
    speedup_costs_measured: bool
    def __init__(self, window_seconds: _Optional[int] = ..., proposers: _Optional[_Iterable[_Union[ProposerStats, _Mapping]]] = ..., requests: _Optional[int] = ..., output_tokens: _Optional[int] = ..., target_passes: _Optional[int] = ..., forced_tokens: _Optional[int] = ..., finish_reasons: _Optional[_Mapping[str, int]] = ..., output_tokens_p50: _Optional[float] = ..., output_tokens_p95: _Optional[float] = ..., latency_ms_p50: _Optional[float] = ..., latency_ms_p99: _Optional[float] = ..., latency_ms_mean: _Optional[float] = ..., passes_per_token: _Optional[float] = ..., decisions: _Optional[_Iterable[_Union[DecisionCount, _Mapping]]] = ..., output_length: _Optional[_Iterable[_Union[HistogramBucket, _Mapping]]] = ..., latency_ms: _Optional[_Iterable[_Union[HistogramBucket, _Mapping]]] = ..., names: _Optional[_Mapping[str, int]] = ..., estimated_speedup: _Optional[float] = ..., speedup_costs_measured: _Optional[bool] = ...) -> None: ...

class ProposerPolicyState(_message.Message):
    __slots__ = ("proposer", "state", "reason", "since", "changed_at", "last_switch_off", "last_switch_on", "acceptance", "threshold", "batch_bucket")
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_SWITCH_OFF_FIELD_NUMBER: _ClassVar[int]
    LAST_SWITCH_ON_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BATCH_BUCKET_FIELD_NUMBER: _ClassVar[int]
    proposer: str
    state: str
    reason: str
    since: float
    changed_at: float
    last_switch_off: float
    last_switch_on: float
    acceptance: float
    threshold: float
    batch_bucket: int
    def __init__(self, proposer: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., changed_at: _Optional[float] = ..., last_switch_off: _Optional[float] = ..., last_switch_on: _Optional[float] = ..., acceptance: _Optional[float] = ..., threshold: _Optional[float] = ..., batch_bucket: _Optional[int] = ...) -> None: ...

class PolicyChange(_message.Message):
    __slots__ = ("proposer", "at", "state", "reason", "previous", "batch_bucket", "acceptance", "threshold")
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    BATCH_BUCKET_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    proposer: str
    at: float
    state: str
    reason: str
    previous: str
    batch_bucket: int
    acceptance: float
    threshold: float
    def __init__(self, proposer: _Optional[str] = ..., at: _Optional[float] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., previous: _Optional[str] = ..., batch_bucket: _Optional[int] = ..., acceptance: _Optional[float] = ..., threshold: _Optional[float] = ...) -> None: ...

class ProposerHour(_message.Message):
    __slots__ = ("proposer", "drafted", "accepted", "examined", "accepted_examined")
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    EXAMINED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_EXAMINED_FIELD_NUMBER: _ClassVar[int]
    proposer: str
    drafted: int
    accepted: int
    examined: int
    accepted_examined: int
    def __init__(self, proposer: _Optional[str] = ..., drafted: _Optional[int] = ..., accepted: _Optional[int] = ..., examined: _Optional[int] = ..., accepted_examined: _Optional[int] = ...) -> None: ...

class HourStats(_message.Message):
    __slots__ = ("hour_start", "requests", "output_tokens", "target_passes", "latency_ms_p50", "latency_ms_p99", "proposers")
    HOUR_START_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASSES_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_P50_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_P99_FIELD_NUMBER: _ClassVar[int]
    PROPOSERS_FIELD_NUMBER: _ClassVar[int]
    hour_start: int
    requests: int
    output_tokens: int
    target_passes: int
    latency_ms_p50: float
    latency_ms_p99: float
    proposers: _containers.RepeatedCompositeFieldContainer[ProposerHour]
    def __init__(self, hour_start: _Optional[int] = ..., requests: _Optional[int] = ..., output_tokens: _Optional[int] = ..., target_passes: _Optional[int] = ..., latency_ms_p50: _Optional[float] = ..., latency_ms_p99: _Optional[float] = ..., proposers: _Optional[_Iterable[_Union[ProposerHour, _Mapping]]] = ...) -> None: ...

class SchemaStats(_message.Message):
    __slots__ = ("schema_key", "windows", "model", "policy", "policy_changes", "timeline", "pricing")
    SCHEMA_KEY_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_CHANGES_FIELD_NUMBER: _ClassVar[int]
    TIMELINE_FIELD_NUMBER: _ClassVar[int]
    PRICING_FIELD_NUMBER: _ClassVar[int]
    schema_key: str
    windows: _containers.RepeatedCompositeFieldContainer[StatsWindow]
    model: str
    policy: _containers.RepeatedCompositeFieldContainer[ProposerPolicyState]
    policy_changes: _containers.RepeatedCompositeFieldContainer[PolicyChange]
    timeline: _containers.RepeatedCompositeFieldContainer[HourStats]
    pricing: _containers.RepeatedCompositeFieldContainer[DraftPricing]
    def __init__(self, schema_key: _Optional[str] = ..., windows: _Optional[_Iterable[_Union[StatsWindow, _Mapping]]] = ..., model: _Optional[str] = ..., policy: _Optional[_Iterable[_Union[ProposerPolicyState, _Mapping]]] = ..., policy_changes: _Optional[_Iterable[_Union[PolicyChange, _Mapping]]] = ..., timeline: _Optional[_Iterable[_Union[HourStats, _Mapping]]] = ..., pricing: _Optional[_Iterable[_Union[DraftPricing, _Mapping]]] = ...) -> None: ...

class DraftPrice(_message.Message):
    __slots__ = ("k", "step_seconds", "propose_seconds", "expected_accepted", "seconds_per_token", "step_source")
    K_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_SOURCE_FIELD_NUMBER: _ClassVar[int]
    k: int
    step_seconds: float
    propose_seconds: float
    expected_accepted: float
    seconds_per_token: float
    step_source: str
    def __init__(self, k: _Optional[int] = ..., step_seconds: _Optional[float] = ..., propose_seconds: _Optional[float] = ..., expected_accepted: _Optional[float] = ..., seconds_per_token: _Optional[float] = ..., step_source: _Optional[str] = ...) -> None: ...

class DraftPricing(_message.Message):
    __slots__ = ("proposer", "batch_bucket", "evidence_tokens", "min_evidence_tokens", "acceptance", "cold", "chosen", "gain_margin", "prices", "reason", "replayed_tokens", "replayed_acceptance", "restricted_chosen")
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    BATCH_BUCKET_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_EVIDENCE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    COLD_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    GAIN_MARGIN_FIELD_NUMBER: _ClassVar[int]
    PRICES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    RESTRICTED_CHOSEN_FIELD_NUMBER: _ClassVar[int]
    proposer: str
    batch_bucket: int
    evidence_tokens: float
    min_evidence_tokens: int
    acceptance: float
    cold: bool
    chosen: int
    gain_margin: float
    prices: _containers.RepeatedCompositeFieldContainer[DraftPrice]
    reason: str
    replayed_tokens: float
    replayed_acceptance: float
    restricted_chosen: int
    def __init__(self, proposer: _Optional[str] = ..., batch_bucket: _Optional[int] = ..., evidence_tokens: _Optional[float] = ..., min_evidence_tokens: _Optional[int] = ..., acceptance: _Optional[float] = ..., cold: _Optional[bool] = ..., chosen: _Optional[int] = ..., gain_margin: _Optional[float] = ..., prices: _Optional[_Iterable[_Union[DraftPrice, _Mapping]]] = ..., reason: _Optional[str] = ..., replayed_tokens: _Optional[float] = ..., replayed_acceptance: _Optional[float] = ..., restricted_chosen: _Optional[int] = ...) -> None: ...

class GetSchemaStatsRequest(_message.Message):
    __slots__ = ("schema_ref", "schema_key", "window_seconds", "model", "include_timeline")
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_KEY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TIMELINE_FIELD_NUMBER: _ClassVar[int]
    schema_ref: SchemaRef
    schema_key: str
    window_seconds: _containers.RepeatedScalarFieldContainer[int]
    model: str
    include_timeline: bool
    def __init__(self, schema_ref: _Optional[_Union[SchemaRef, _Mapping]] = ..., schema_key: _Optional[str] = ..., window_seconds: _Optional[_Iterable[int]] = ..., model: _Optional[str] = ..., include_timeline: _Optional[bool] = ...) -> None: ...

class GetSchemaStatsResponse(_message.Message):
    __slots__ = ("stats",)
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: SchemaStats
    def __init__(self, stats: _Optional[_Union[SchemaStats, _Mapping]] = ...) -> None: ...

class ListSchemaStatsRequest(_message.Message):
    __slots__ = ("window_seconds", "model", "include_timeline")
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TIMELINE_FIELD_NUMBER: _ClassVar[int]
    window_seconds: _containers.RepeatedScalarFieldContainer[int]
    model: str
    include_timeline: bool
    def __init__(self, window_seconds: _Optional[_Iterable[int]] = ..., model: _Optional[str] = ..., include_timeline: _Optional[bool] = ...) -> None: ...

class ListRejectedDraftsRequest(_message.Message):
    __slots__ = ("schema_ref", "schema_key", "model", "proposer", "limit")
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_KEY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    schema_ref: SchemaRef
    schema_key: str
    model: str
    proposer: str
    limit: int
    def __init__(self, schema_ref: _Optional[_Union[SchemaRef, _Mapping]] = ..., schema_key: _Optional[str] = ..., model: _Optional[str] = ..., proposer: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class RejectedDraft(_message.Message):
    __slots__ = ("model", "schema_key", "proposer", "created_at", "batch_bucket", "context_tokens", "context_text", "draft_tokens", "draft_text", "position", "rejected_token", "rejected_text", "target_token", "target_text", "grammatical")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_KEY_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BATCH_BUCKET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TEXT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TEXT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TEXT_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TARGET_TEXT_FIELD_NUMBER: _ClassVar[int]
    GRAMMATICAL_FIELD_NUMBER: _ClassVar[int]
    model: str
    schema_key: str
    proposer: str
    created_at: float
    batch_bucket: int
    context_tokens: _containers.RepeatedScalarFieldContainer[int]
    context_text: str
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_text: str
    position: int
    rejected_token: int
    rejected_text: str
    target_token: int
    target_text: str
    grammatical: bool
    def __init__(self, model: _Optional[str] = ..., schema_key: _Optional[str] = ..., proposer: _Optional[str] = ..., created_at: _Optional[float] = ..., batch_bucket: _Optional[int] = ..., context_tokens: _Optional[_Iterable[int]] = ..., context_text: _Optional[str] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., draft_text: _Optional[str] = ..., position: _Optional[int] = ..., rejected_token: _Optional[int] = ..., rejected_text: _Optional[str] = ..., target_token: _Optional[int] = ..., target_text: _Optional[str] = ..., grammatical: _Optional[bool] = ...) -> None: ...

class ListRejectedDraftsResponse(_message.Message):
    __slots__ = ("drafts",)
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    drafts: _containers.RepeatedCompositeFieldContainer[RejectedDraft]
    def __init__(self, drafts: _Optional[_Iterable[_Union[RejectedDraft, _Mapping]]] = ...) -> None: ...

class ListSchemaStatsResponse(_message.Message):
    __slots__ = ("stats",)
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.RepeatedCompositeFieldContainer[SchemaStats]
    def __init__(self, stats: _Optional[_Iterable[_Union[SchemaStats, _Mapping]]] = ...) -> None: ...

class FieldViolation(_message.Message):
    __slots__ = ("field", "description", "json_pointer", "keyword")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    JSON_POINTER_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_FIELD_NUMBER: _ClassVar[int]
    field: str
    description: str
    json_pointer: str
    keyword: str
    def __init__(self, field: _Optional[str] = ..., description: _Optional[str] = ..., json_pointer: _Optional[str] = ..., keyword: _Optional[str] = ...) -> None: ...

class ErrorDetails(_message.Message):
    __slots__ = ("reason", "request_id", "field_violations")
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIELD_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    request_id: str
    field_violations: _containers.RepeatedCompositeFieldContainer[FieldViolation]
    def __init__(self, reason: _Optional[str] = ..., request_id: _Optional[str] = ..., field_violations: _Optional[_Iterable[_Union[FieldViolation, _Mapping]]] = ...) -> None: ...
