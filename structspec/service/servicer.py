"""The gRPC servicer: convert -> engine/registry -> convert. Errors are mapped in one place
(``_rpc``) and recorded in the metrics; nothing here knows about sockets, TLS or tokens."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterable, TypeVar

import grpc
from google.protobuf.message import Message

from structspec.engine.api import EngineAPI
from structspec.engine.types import GenerationResult
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc
from structspec.service import convert, errors, stats_views
from structspec.service.auth import AuthConfig, bearer_token, reads_every_schema
from structspec.service.errors import ServiceError
from structspec.service.metrics import ServiceMetrics
from structspec.service.registry import ResolvedSchema, SchemaRegistry, registered_stats_key
from structspec.store.base import Store

log = logging.getLogger("structspec.service")
T = TypeVar("T")

REQUEST_ID_KEY = "x-request-id"
# The engine ends a request at its deadline by itself; this guard cancels it shortly after in
# case it does not, so no decoding outlives the caller's deadline.
DEADLINE_SLACK_S = 0.05
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class EngineSlot:
    """The engine once loaded; requests before that, or while draining, get UNAVAILABLE."""

    def __init__(self, engine: EngineAPI | None = None):
        self.engine = engine
        self.draining = False

    def require(self) -> EngineAPI:
        if self.draining:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "server is shutting down", "DRAINING")
        if self.engine is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "model is loading; retry shortly", "MODEL_LOADING")
        return self.engine

    def model_key(self) -> str:
        """The model the engine keeps statistics under (known once it is loaded; draining or not)."""
        if self.engine is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "model is loading, so the server's model is not known "
                               "yet; set model to read a model's statistics, or retry shortly", "MODEL_LOADING")
        return self.engine.model_key


@dataclass
class _Call:
    rpc: str
    request_id: str
    deadline: float | None
    started: float = field(default_factory=time.perf_counter)
    result: GenerationResult | None = None
    schema_field: str = "json_schema"
    tenant: str = ""  # the caller's tenant ("": the one tenant of a server without tokens)
    history_scope: str = ""  # the caller's scope for the schema history ("": shared)
    delivered: bool = False  # a stream handed its final message to gRPC: closing it now is the normal end


def history_scope_of_token(token: str | None) -> str:
    """A stable name of a bearer token (never the token itself): ``t:<16 hex of its SHA-256>``; "" for none."""
    return f"t:{hashlib.sha256(token.encode()).hexdigest()[:16]}" if token else ""


def caller_scopes(token: str | None, limits: convert.Limits) -> tuple[str, str]:
    """The caller's tenant (its token's name with auth tokens configured, else "") and its schema-history scope
    (its tenant with ``history_scope = per_token``, else "": shared)."""
    tenant = history_scope_of_token(token) if limits.tenants else ""
    return tenant, tenant if limits.history_per_token else ""


def request_id_from(offered: Iterable[str | None]) -> str:
    """The first well-formed request id offered (metadata or header first, then the request's own), else a new one."""
    for value in offered:
        if isinstance(value, str) and _REQUEST_ID_RE.match(value):
            return value
    return uuid.uuid4().hex[:16]


def request_id_of(context: grpc.aio.ServicerContext, requested: str = "") -> str:
    sent = [value for key, value in context.invocation_metadata() or () if key == REQUEST_ID_KEY]
    return request_id_from([*sent, requested])


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The client's gRPC deadline as a ``time.monotonic()`` value (the engine's clock)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + max(0.0, remaining)


def cancelled_code(deadline: float | None) -> grpc.StatusCode:
    """Why a call ended while it waited: its deadline passed, or it was cancelled (the client left)."""
    late = deadline is not None and time.monotonic() >= deadline - 0.005
    return grpc.StatusCode.DEADLINE_EXCEEDED if late else grpc.StatusCode.CANCELLED


def service_error(exc: Exception, rpc: str, request_id: str, schema_field: str = "json_schema") -> ServiceError:
    """The error to answer ``exc`` with (``errors.from_exception``; INTERNAL for anything unexpected), logged."""
    err = errors.from_exception(exc, schema_field)
    if err is None:
        log.exception("rpc=%s request_id=%s internal error", rpc, request_id)
        err = ServiceError(grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})", "INTERNAL")
    elif err.code is grpc.StatusCode.INTERNAL:
        log.error("rpc=%s request_id=%s %s: %s", rpc, request_id, err.reason, err.message)
    else:
        log.info("rpc=%s request_id=%s %s: %s", rpc, request_id, err.code.name, err.message)
    return err


async def guarded(deadline: float | None, awaitable: Awaitable[T]) -> T:
    """Await an engine call, cancelling it just after ``deadline`` (a ``time.monotonic()`` value)."""
    if deadline is None:
        return await awaitable
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic()) + DEADLINE_SLACK_S):
            return await awaitable
    except TimeoutError:
        raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded during decoding", "DEADLINE_EXCEEDED") from None


class StructSpecServicer(pb_grpc.StructSpecServicer):
    def __init__(
        self,
        engine: EngineSlot,
        registry: SchemaRegistry,
        store: Store,
        metrics: ServiceMetrics,
        limits: convert.Limits,
        clock: Callable[[], float] = time.time,
        auth: AuthConfig = AuthConfig(),
    ):
        self._engine = engine
        self._registry = registry
        self._store = store
        self._metrics = metrics
        self._limits = limits
        self._clock = clock
        self._auth = auth

    # -- the one place errors are mapped ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _rpc(self, rpc: str, request: Message, context: grpc.aio.ServicerContext) -> AsyncIterator[_Call]:
        tenant, history_scope = caller_scopes(bearer_token(context.invocation_metadata()), self._limits)
        call = _Call(rpc, request_id_of(context, getattr(request, "request_id", "")), deadline_of(context),
                     tenant=tenant, history_scope=history_scope)
        code = grpc.StatusCode.OK
        try:
            size = request.ByteSize()
            if size > self._limits.max_message_bytes:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request is {size} bytes; the limit is {self._limits.max_message_bytes}",
                    "MESSAGE_TOO_LARGE",
                    [errors.FieldViolation("request", "message too large")],
                )
            yield call
        except (asyncio.CancelledError, GeneratorExit):
            if call.delivered:  # the client read the final message and closed the stream: a success
                raise
            # the client cancelled or its deadline passed: the awaiting task (and so the
            # engine's decoding) is cancelled with us
            code = cancelled_code(call.deadline)
            log.info("rpc=%s request_id=%s %s", rpc, call.request_id, code.name.lower())
            raise
        except grpc.aio.AbortError:
            code = grpc.StatusCode.UNKNOWN
            raise
        except Exception as exc:
            err = service_error(exc, rpc, call.request_id, call.schema_field)
            code = err.code
            await context.abort(err.code, err.message, trailing_metadata=errors.details_metadata(err, call.request_id))
        finally:
            seconds = time.perf_counter() - call.started
            self._metrics.observe(rpc, code.name, seconds, call.result)
            log.debug("rpc=%s request_id=%s code=%s ms=%.1f", rpc, call.request_id, code.name, seconds * 1000)

    async def _guarded(self, call: _Call, awaitable: Awaitable[T]) -> T:
        return await guarded(call.deadline, awaitable)

    async def _schema(self, request: pb.ExtractRequest, call: _Call) -> ResolvedSchema:
        which = request.WhichOneof("schema")
        if which == "schema_ref":
            call.schema_field = "schema_ref"
            ref = request.schema_ref
            return await self._registry.resolve(ref.schema_id, ref.version if ref.HasField("version") else None)
        if which == "json_schema":
            return SchemaRegistry.inline(request.json_schema)
        raise errors.invalid("schema", "set schema_ref or json_schema")

    async def _extraction_request(self, request: pb.ExtractRequest, schema: ResolvedSchema, call: _Call):
        # Off the event loop: checking worked examples runs the caller's schema over the caller's data.
        return await asyncio.to_thread(convert.extraction_request, request, schema, call.request_id, call.deadline,
                                       self._limits, call.history_scope, call.tenant)

    # -- generation -------------------------------------------------------------------------------

    async def Extract(self, request: pb.ExtractRequest, context: grpc.aio.ServicerContext) -> pb.ExtractResponse:
        async with self._rpc("Extract", request, context) as call:
            engine = self._engine.require()
            schema = await self._schema(request, call)
            req = await self._extraction_request(request, schema, call)
            call.result = await self._guarded(call, engine.extract(req))
            errors.check_result(call.result, call.deadline, schema_field=call.schema_field)
            return pb.ExtractResponse(result=convert.extract_result(call.result, schema.key, engine.model_key))
        raise AssertionError("unreachable")  # _rpc aborts on every error

    async def ExtractStream(
        self, request: pb.ExtractRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ExtractStreamResponse]:
        async with self._rpc("ExtractStream", request, context) as call:
            engine = self._engine.require()
            schema = await self._schema(request, call)
            req = await self._extraction_request(request, schema, call)
            stream = engine.extract_stream(req)
            items = stream.__aiter__()
            final: GenerationResult | None = None
            deltas = self._metrics.delta_timer(call.started)
            try:
                while True:
                    try:
                        item = await self._guarded(call, items.__anext__())
                    except StopAsyncIteration:
                        break
                    if isinstance(item, GenerationResult):
                        final = item
                        break
                    deltas.delta()
                    yield pb.ExtractStreamResponse(delta=pb.TextDelta(text=item.text))
            finally:
                # release the engine's generator now (a no-op once it finished) rather than at GC
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()
            if final is None:
                raise ServiceError(grpc.StatusCode.INTERNAL, "engine stream ended without a result", "MODEL_FAILURE")
            call.result = final
            errors.check_result(final, call.deadline, schema_field=call.schema_field)
            response = pb.ExtractStreamResponse(result=convert.extract_result(final, schema.key, engine.model_key))
            call.delivered = True
            yield response

    async def CallTool(self, request: pb.CallToolRequest, context: grpc.aio.ServicerContext) -> pb.CallToolResponse:
        async with self._rpc("CallTool", request, context) as call:
            call.schema_field = "tools"
            engine = self._engine.require()
            req = convert.tool_request(request, call.request_id, call.deadline, self._limits, call.history_scope,
                                       call.tenant)
            res = await self._guarded(call, engine.call_tool(req))
            call.result = res.result
            errors.check_result(res.result, call.deadline, schema_field=call.schema_field)
            return convert.tool_result(res, engine.model_key)
        raise AssertionError("unreachable")

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

    async def _schema_key(self, which: str | None, request: Message) -> str:
        """The statistics key a request names (``schema_ref`` resolved through the registry, or ``schema_key``)."""
        if which == "schema_ref":
            ref = request.schema_ref
            record = await self._registry.get(ref.schema_id, ref.version if ref.HasField("version") else None)
            return registered_stats_key(record.schema_id, record.version)
        if which == "schema_key" and request.schema_key:
            return request.schema_key
        raise errors.invalid("target", "set schema_ref or schema_key")

    def _reads_every_schema(self, context: grpc.aio.ServicerContext) -> bool:
        """The admin token, or no tokens configured (``stats_views.readable_by_tenants`` says what others read)."""
        return reads_every_schema(bearer_token(context.invocation_metadata()), self._auth)

    async def GetSchemaStats(self, request: pb.GetSchemaStatsRequest, context: grpc.aio.ServicerContext) -> pb.GetSchemaStatsResponse:
        async with self._rpc("GetSchemaStats", request, context):
            windows = convert.windows(request.window_seconds)
            key = await self._schema_key(request.WhichOneof("target"), request)
            if not stats_views.readable_by_tenants(key) and not self._reads_every_schema(context):
                raise ServiceError(grpc.StatusCode.PERMISSION_DENIED, "the statistics of an inline schema or a tool "
                                   "list (keyed by content, shared by every caller sending it) need the admin token; "
                                   "other tokens read registered schemas' (schema_ref, or a key <id>@<version>)",
                                   "ADMIN_TOKEN_REQUIRED")
            model = request.model or self._engine.model_key()
            (stats,) = await stats_views.read_stats(self._store, windows, model=model, schema_key=key,
                                                    include_timeline=request.include_timeline, now=self._clock())
            return pb.GetSchemaStatsResponse(stats=stats)
        raise AssertionError("unreachable")

    async def ListSchemaStats(self, request: pb.ListSchemaStatsRequest, context: grpc.aio.ServicerContext) -> pb.ListSchemaStatsResponse:
        async with self._rpc("ListSchemaStats", request, context):
            windows = convert.windows(request.window_seconds)
            stats = await stats_views.read_stats(self._store, windows, model=request.model or None,
                                                 include_timeline=request.include_timeline, now=self._clock())
            if not self._reads_every_schema(context):
                stats = [s for s in stats if stats_views.readable_by_tenants(s.schema_key)]
            return pb.ListSchemaStatsResponse(stats=stats)
        raise AssertionError("unreachable")

    async def ListRejectedDrafts(self, request: pb.ListRejectedDraftsRequest,
                                 context: grpc.aio.ServicerContext) -> pb.ListRejectedDraftsResponse:
        async with self._rpc("ListRejectedDrafts", request, context):
            which = request.WhichOneof("target")
            key = await self._schema_key(which, request) if which is not None else None
            if request.limit > stats_views.MAX_REJECTED:
                raise errors.invalid("limit", f"at most {stats_views.MAX_REJECTED}")
            drafts = await stats_views.read_rejected_drafts(self._store, model=request.model or None, schema_key=key,
                                                            proposer=request.proposer or None, limit=request.limit)
            return pb.ListRejectedDraftsResponse(drafts=drafts)
        raise AssertionError("unreachable")

    # -- draft models -----------------------------------------------------------------------------

    async def LoadDraft(self, request: pb.LoadDraftRequest, context: grpc.aio.ServicerContext) -> pb.LoadDraftResponse:
        async with self._rpc("LoadDraft", request, context):
            engine = self._engine.require()
            if not request.path:
                raise errors.invalid("path", "the draft model's folder on the server is required")
            load = getattr(engine, "load_draft", None)  # an engine without it takes no draft model
            if load is None:
                raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, "this engine cannot load draft models",
                                   "DRAFT_UNSUPPORTED")
            swap = await load(request.path)
            if swap.loaded:
                log.info("draft %s loaded from %s: model %s (was %s)", swap.draft_version, request.path,
                         swap.model_key, swap.previous_model_key)
            return pb.LoadDraftResponse(draft_version=swap.draft_version, model=swap.model_key, loaded=swap.loaded,
                                        previous_draft_version=swap.previous_draft_version,
                                        previous_model=swap.previous_model_key)
        raise AssertionError("unreachable")
