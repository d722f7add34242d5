"""The gRPC servicer: convert -> engine/registry -> convert. Errors are mapped in one place
(``_rpc``) and recorded in the metrics; nothing here knows about sockets, TLS or tokens.

The generation RPCs: Extract/ExtractStream (a schema's instance), CallTool (tool calls or a text answer),
Chat/ChatStream (free text, no schema). A stream relays the engine's text deltas, then its final result."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, TypeVar

import grpc
from google.protobuf.message import Message

from structspec.engine.api import ExtractionRequest
from structspec.engine.config import PolicyConfig
from structspec.engine.types import GenerationResult, TextDelta
from structspec.front import errors, failures, requests, stats
from structspec.front.auth import AuthConfig, bearer_token, reads_every_schema
from structspec.front.call import REQUEST_ID_KEY, Call, CallGuard, EngineSlot, caller_scopes, guarded, request_id_from
from structspec.front.errors import Code, FrontError, message_too_large
from structspec.front.limits import Limits
from structspec.front.metrics import ServiceMetrics
from structspec.front.keys import registered_stats_key
from structspec.front.registry import ResolvedSchema, SchemaRegistry
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc
from structspec.service import convert, stats_convert
from structspec.service.grpc_status import abort
from structspec.store.base import Store

log = logging.getLogger("structspec.service")
T = TypeVar("T")


@dataclass
class _Call(Call):
    delivered: bool = False  # a stream handed its final message to gRPC: closing it now is the normal end


def request_id_of(context: grpc.aio.ServicerContext, requested: str = "") -> str:
    sent = [value for key, value in context.invocation_metadata() or () if key == REQUEST_ID_KEY]
    return request_id_from([*sent, requested])


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The client's gRPC deadline as a ``time.monotonic()`` value (the engine's clock)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + max(0.0, remaining)


class StructSpecServicer(pb_grpc.StructSpecServicer):
    def __init__(
        self,
        engine: EngineSlot,
        registry: SchemaRegistry,
        store: Store,
        metrics: ServiceMetrics,
        limits: Limits,
        clock: Callable[[], float] = time.time,
        auth: AuthConfig = AuthConfig(),
        policy: PolicyConfig | None = None,  # the drafting policy's configuration the statistics' draft pricing reads
    ):
        self._engine = engine
        self._registry = registry
        self._store = store
        self._metrics = metrics
        self._calls = CallGuard(metrics)
        self._limits = limits
        self._clock = clock
        self._auth = auth
        self._policy = policy

    # -- the one place errors are mapped ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _rpc(self, rpc: str, request: Message, context: grpc.aio.ServicerContext) -> AsyncIterator[_Call]:
        tenant, history_scope = caller_scopes(bearer_token(context.invocation_metadata()), self._limits)
        call = _Call(rpc, request_id_of(context, getattr(request, "request_id", "")), deadline_of(context),
                     tenant=tenant, history_scope=history_scope)
        code = Code.OK
        try:
            size = request.ByteSize()
            if size > self._limits.max_message_bytes:
                raise message_too_large(size, self._limits.max_message_bytes)
            yield call
        except (asyncio.CancelledError, GeneratorExit):
            if call.delivered:  # the client read the final message and closed the stream: a success
                raise
            # the client cancelled or its deadline passed: the awaiting task (and so the
            # engine's decoding) is cancelled with us
            code = self._calls.cancelled(call)
            raise
        except grpc.aio.AbortError:
            code = Code.UNKNOWN
            raise
        except Exception as exc:
            err = self._calls.failed(call, exc)
            code = err.code
            await abort(context, err, call.request_id)
        finally:
            self._calls.finish(call, code)

    async def _guarded(self, call: _Call, awaitable: Awaitable[T]) -> T:
        return await guarded(call.deadline, awaitable)

    async def _extraction(self, request: pb.ExtractRequest, call: _Call) -> tuple[ExtractionRequest, ResolvedSchema]:
        source = convert.schema_source(request)
        if isinstance(source, requests.SchemaRef):
            call.schema_field = "schema_ref"
        schema = await requests.resolve_schema(self._registry, source)
        return await requests.extraction(convert.extraction_input(request), schema, call, self._limits), schema

    # -- generation -------------------------------------------------------------------------------

    async def Extract(self, request: pb.ExtractRequest, context: grpc.aio.ServicerContext) -> pb.ExtractResponse:
        async with self._rpc("Extract", request, context) as call:
            engine = self._engine.require()
            req, schema = await self._extraction(request, call)
            call.result = await self._guarded(call, engine.extract(req))
            failures.check_result(call.result, call.deadline, schema_field=call.schema_field)
            return pb.ExtractResponse(result=convert.extract_result(call.result, schema.key, engine.model_key))
        raise AssertionError("unreachable")  # _rpc aborts on every error

    async def ExtractStream(
        self, request: pb.ExtractRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ExtractStreamResponse]:
        async with self._rpc("ExtractStream", request, context) as call:
            engine = self._engine.require()
            req, schema = await self._extraction(request, call)
            async with contextlib.aclosing(self._relay(call, engine.extract_stream(req))) as items:
                async for item in items:
                    if isinstance(item, TextDelta):
                        yield pb.ExtractStreamResponse(delta=pb.TextDelta(text=item.text))
                        continue
                    failures.check_result(item, call.deadline, schema_field=call.schema_field)
                    response = pb.ExtractStreamResponse(result=convert.extract_result(item, schema.key, engine.model_key))
                    call.delivered = True
                    yield response

    async def _relay(self, call: _Call, stream: Any) -> AsyncGenerator[TextDelta | GenerationResult, None]:
        """The engine stream's deltas (timed in the metrics), then its final result (set as ``call.result``),
        each awaited within the call's deadline; the engine's generator is closed when this one is."""
        items = stream.__aiter__()
        deltas = self._metrics.delta_timer(call.started)
        try:
            while True:
                try:
                    item = await self._guarded(call, items.__anext__())
                except StopAsyncIteration:
                    break
                if isinstance(item, GenerationResult):
                    call.result = item
                    yield item
                    return
                deltas.delta()
                yield item
        finally:
            # release the engine's generator now (a no-op once it finished) rather than at GC
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        raise FrontError(Code.INTERNAL, "engine stream ended without a result", "MODEL_FAILURE")

    async def CallTool(self, request: pb.CallToolRequest, context: grpc.aio.ServicerContext) -> pb.CallToolResponse:
        async with self._rpc("CallTool", request, context) as call:
            call.schema_field = "tools"
            engine = self._engine.require()
            req = requests.tool_request(convert.tool_call_input(request), call, self._limits)
            res = await self._guarded(call, engine.call_tool(req))
            call.result = res.result
            failures.check_result(res.result, call.deadline, schema_field=call.schema_field)
            return convert.tool_result(res, engine.model_key)
        raise AssertionError("unreachable")

    async def Chat(self, request: pb.ChatRequest, context: grpc.aio.ServicerContext) -> pb.ChatResponse:
        async with self._rpc("Chat", request, context) as call:
            engine = self._engine.require()
            req = requests.text_request(convert.text_input(request), call, self._limits)
            call.result = await self._guarded(call, engine.chat(req))
            failures.check_result(call.result, call.deadline)
            return pb.ChatResponse(result=convert.chat_result(call.result, engine.model_key))
        raise AssertionError("unreachable")

    async def ChatStream(self, request: pb.ChatRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ChatStreamResponse]:
        async with self._rpc("ChatStream", request, context) as call:
            engine = self._engine.require()
            req = requests.text_request(convert.text_input(request), call, self._limits)
            async with contextlib.aclosing(self._relay(call, engine.chat_stream(req))) as items:
                async for item in items:
                    if isinstance(item, TextDelta):
                        yield pb.ChatStreamResponse(delta=pb.TextDelta(text=item.text))
                        continue
                    failures.check_result(item, call.deadline)
                    response = pb.ChatStreamResponse(result=convert.chat_result(item, engine.model_key))
                    call.delivered = True
                    yield response

    # -- registry ---------------------------------------------------------------------------------

    async def RegisterSchema(self, request: pb.RegisterSchemaRequest, context: grpc.aio.ServicerContext) -> pb.RegisterSchemaResponse:
        async with self._rpc("RegisterSchema", request, context):
            record, created = await self._registry.register(request.schema_id, request.schema_json, request.description)
            if created:
                log.info("registered schema %s version %d", record.schema_id, record.version)
            return pb.RegisterSchemaResponse(schema=convert.schema_version(record), created=created)
        raise AssertionError("unreachable")

    async def GetSchema(self, request: pb.GetSchemaRequest, context: grpc.aio.ServicerContext) -> pb.GetSchemaResponse:
        async with self._rpc("GetSchema", request, context):
            version = request.version if request.HasField("version") else None
            record = await self._registry.get(request.schema_id, version)
            return pb.GetSchemaResponse(schema=convert.schema_version(record))
        raise AssertionError("unreachable")

    async def ListSchemas(self, request: pb.ListSchemasRequest, context: grpc.aio.ServicerContext) -> pb.ListSchemasResponse:
        async with self._rpc("ListSchemas", request, context):
            records = await self._registry.list(request.schema_id or None, request.all_versions)
            return pb.ListSchemasResponse(schemas=[convert.schema_version(r, request.omit_content) for r in records])
        raise AssertionError("unreachable")

    async def DeleteSchema(self, request: pb.DeleteSchemaRequest, context: grpc.aio.ServicerContext) -> pb.DeleteSchemaResponse:
        async with self._rpc("DeleteSchema", request, context):
            version = request.version if request.HasField("version") else None
            deleted = await self._registry.delete(request.schema_id, version)
            log.info("deleted schema %s versions %s", request.schema_id, deleted)
            return pb.DeleteSchemaResponse(deleted_versions=deleted)
        raise AssertionError("unreachable")

    async def SetSchemaSpeculation(self, request: pb.SetSchemaSpeculationRequest,
                                   context: grpc.aio.ServicerContext) -> pb.SetSchemaSpeculationResponse:
        async with self._rpc("SetSchemaSpeculation", request, context):
            mode = convert.schema_speculation(request.speculation)
            ref = request.schema_ref
            record = await self._registry.set_speculation(ref.schema_id, ref.version if ref.HasField("version") else None, mode)
            log.info("schema %s version %d: speculation %s", record.schema_id, record.version, record.speculation)
            return pb.SetSchemaSpeculationResponse(schema=convert.schema_version(record))
        raise AssertionError("unreachable")

    # -- statistics -------------------------------------------------------------------------------

    async def _schema_key(self, which: str | None,
                          request: pb.GetSchemaStatsRequest | pb.ListRejectedDraftsRequest) -> str:
        """The statistics key a request names (``schema_ref`` resolved through the registry, or ``schema_key``)."""
        if which == "schema_ref":
            ref = request.schema_ref
            record = await self._registry.get(ref.schema_id, ref.version if ref.HasField("version") else None)
            return registered_stats_key(record.schema_id, record.version)
        if which == "schema_key" and request.schema_key:
            return request.schema_key
        raise errors.invalid("target", "set schema_ref or schema_key")

    def _reads_every_schema(self, context: grpc.aio.ServicerContext) -> bool:
        """The admin token, or no tokens configured (``stats.readable_by_tenants`` says what others read)."""
        return reads_every_schema(bearer_token(context.invocation_metadata()), self._auth)

    async def GetSchemaStats(self, request: pb.GetSchemaStatsRequest, context: grpc.aio.ServicerContext) -> pb.GetSchemaStatsResponse:
        async with self._rpc("GetSchemaStats", request, context):
            windows = stats.windows(request.window_seconds)
            key = await self._schema_key(request.WhichOneof("target"), request)
            if not stats.readable_by_tenants(key) and not self._reads_every_schema(context):
                raise FrontError(Code.PERMISSION_DENIED, "the statistics of an inline schema or a tool "
                                 "list (keyed by content, shared by every caller sending it) need the admin token; "
                                 "other tokens read registered schemas' (schema_ref, or a key <id>@<version>)",
                                 "ADMIN_TOKEN_REQUIRED")
            model = request.model or self._engine.model_key()
            (found,) = await stats.read_stats(self._store, windows, model=model, schema_key=key,
                                              include_timeline=request.include_timeline, now=self._clock(),
                                              policy=self._policy)
            return pb.GetSchemaStatsResponse(stats=stats_convert.schema_stats(found, windows))
        raise AssertionError("unreachable")

    async def ListSchemaStats(self, request: pb.ListSchemaStatsRequest, context: grpc.aio.ServicerContext) -> pb.ListSchemaStatsResponse:
        async with self._rpc("ListSchemaStats", request, context):
            windows = stats.windows(request.window_seconds)
            found = await stats.read_stats(self._store, windows, model=request.model or None,
                                           include_timeline=request.include_timeline, now=self._clock(),
                                           policy=self._policy)
            if not self._reads_every_schema(context):
                found = [s for s in found if stats.readable_by_tenants(s.schema_key)]
            return pb.ListSchemaStatsResponse(stats=[stats_convert.schema_stats(s, windows) for s in found])
        raise AssertionError("unreachable")

    async def ListRejectedDrafts(self, request: pb.ListRejectedDraftsRequest,
                                 context: grpc.aio.ServicerContext) -> pb.ListRejectedDraftsResponse:
        async with self._rpc("ListRejectedDrafts", request, context):
            which = request.WhichOneof("target")
            key = await self._schema_key(which, request) if which is not None else None
            if request.limit > stats.MAX_REJECTED:
                raise errors.invalid("limit", f"at most {stats.MAX_REJECTED}")
            drafts = await stats.read_rejected_drafts(self._store, model=request.model or None, schema_key=key,
                                                      proposer=request.proposer or None, limit=request.limit)
            return pb.ListRejectedDraftsResponse(drafts=[stats_convert.rejected_draft(r) for r in drafts])
        raise AssertionError("unreachable")

    # -- draft models -----------------------------------------------------------------------------

    async def LoadDraft(self, request: pb.LoadDraftRequest, context: grpc.aio.ServicerContext) -> pb.LoadDraftResponse:
        async with self._rpc("LoadDraft", request, context):
            engine = self._engine.require()
            if not request.path:
                raise errors.invalid("path", "the draft model's folder on the server is required")
            load = getattr(engine, "load_draft", None)  # an engine without it takes no draft model
            if load is None:
                raise FrontError(Code.FAILED_PRECONDITION, "this engine cannot load draft models", "DRAFT_UNSUPPORTED")
            swap = await load(request.path)
            if swap.loaded:
                log.info("draft %s loaded from %s: model %s (was %s)", swap.draft_version, request.path,
                         swap.model_key, swap.previous_model_key)
            return pb.LoadDraftResponse(draft_version=swap.draft_version, model=swap.model_key, loaded=swap.loaded,
                                        previous_draft_version=swap.previous_draft_version,
                                        previous_model=swap.previous_model_key)
        raise AssertionError("unreachable")
