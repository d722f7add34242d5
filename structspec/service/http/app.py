"""The OpenAI-compatible routes, as a FastAPI application over the gRPC service's engine slot, registry,
store, metrics, limits and tokens: parse -> engine/registry -> render, errors mapped in one place.

- ``POST /v1/chat/completions``: ``translate.plan`` decides (extraction, tool calls or free text) and
  refuses what structspec cannot do; the engine runs it (``stream: true``: server-sent events, text
  deltas token by token, a tool-call message as deltas per call; ending with ``data: [DONE]``).
- ``POST /v1/responses``: the Responses API (``responses.plan``: the same plans, so the same engine
  calls), rendered as a response object or its stream of typed events.
- ``GET /v1/models``: the served model's name (``--served-model-name``, else the profile's or the path's).
  ``GET /health``: 200 ``{"status": "SERVING"}`` once the engine is loaded, 503 ``NOT_SERVING`` while it loads
  or drains (no token needed).

Each request to the first two is one exchange (``_run``): bearer token (``Authorization: Bearer``,
the gRPC tokens), request id (``x-request-id``, echoed), metrics under ``rpc`` = the route
(``POST /v1/chat/completions``, ``GET /v1/models``; ``code`` = the ``front.errors.Code`` name, as on gRPC),
logging, and every failure turned into the front's ``FrontError`` (``front.call.CallGuard``), then into
OpenAI's error shape (``status.render``). A request whose client disconnects, or whose deadline
(``structspec.timeout_seconds``) passes, is cancelled in the engine, as on gRPC.

Errors before a stream's first event get their HTTP status; a failure after it (a deadline passing
mid-stream) arrives as one ``data: {"error": {...}}`` event before ``[DONE]``, which the openai SDK raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from structspec.engine.api import EngineAPI, ExtractionRequest, TextRequest, ToolCallRequest
from structspec.engine.types import GenerationResult, TextDelta, ToolCallResult
from structspec.front import failures, requests
from structspec.front.auth import AuthConfig, authorize_token, bearer_token
from structspec.front.call import (
    REQUEST_ID_KEY,
    Call,
    CallGuard,
    EngineSlot,
    caller_scopes,
    cancelled_code,
    guarded,
    request_id_from,
)
from structspec.front.errors import Code, FieldViolation, FrontError, message_too_large
from structspec.front.limits import Limits
from structspec.front.metrics import ServiceMetrics
from structspec.front.registry import ResolvedSchema, SchemaRegistry
from structspec.service.http import body as http_body
from structspec.service.http import render, responses, status, translate
from structspec.service.http.status import ParamNames
from structspec.store.base import Store

log = logging.getLogger("structspec.service.http")
T = TypeVar("T")

CHAT_ROUTE = "POST /v1/chat/completions"
RESPONSES_ROUTE = "POST /v1/responses"
MODELS_ROUTE = "GET /v1/models"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class ClientGone(Exception):
    """The client disconnected before the response: its request was cancelled in the engine."""


@dataclass
class _Exchange(Call):
    arrived: float = field(default_factory=time.monotonic)
    names: ParamNames = field(default_factory=ParamNames)
    streaming: bool = False  # the response is a stream: the exchange ends with it
    counted: bool = False  # holds one of the in-flight slots


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is read by then, so ``receive`` only reports that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _aclose(stream: object) -> None:
    """Close an engine stream now (a no-op once it finished), even from a task being cancelled."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    with contextlib.suppress(BaseException):
        await asyncio.shield(asyncio.ensure_future(aclose()))


class _EventStream(StreamingResponse):
    """Server-sent events whose exchange is finished however the response ends, even when the client left
    before the first event was sent (the events' generator then never runs)."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], request_id: str):
        super().__init__(events, media_type="text/event-stream", headers={**_SSE_HEADERS, REQUEST_ID_KEY: request_id})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


class OpenAIApp:
    def __init__(self, slot: EngineSlot, registry: SchemaRegistry, store: Store, metrics: ServiceMetrics,
                 limits: Limits, auth: AuthConfig, profile: str, max_in_flight: int = 0,
                 clock: Callable[[], float] = time.time):
        self._slot = slot
        self._registry = registry
        self._store = store
        self._metrics = metrics
        self._calls = CallGuard(metrics, log)
        self._limits = limits
        self._auth = auth
        self._profile = profile
        self._max_in_flight = max_in_flight  # 0: unlimited (the gRPC server's max_concurrent_rpcs)
        self._in_flight = 0
        self._clock = clock
        self._started = int(clock())

    def build(self) -> FastAPI:
        app = FastAPI(title="structspec", docs_url=None, redoc_url=None, openapi_url=None)
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])
        app.add_api_route("/v1/responses", self.responses, methods=["POST"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_exception_handler(StarletteHTTPException, self._http_exception)  # type: ignore[arg-type]
        return app

    # -- routes -----------------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        return await self._run(CHAT_ROUTE, request, lambda ex: self._chat(ex, request))

    async def models(self, request: Request) -> Response:
        async def answer(ex: _Exchange) -> Response:
            engine = self._slot.engine
            data = [{"id": self._profile, "object": "model", "created": self._started, "owned_by": "structspec",
                     render.EXTENSION: {"model_key": engine.model_key if engine is not None else None,
                                        "serving": engine is not None and not self._slot.draining}}]
            return JSONResponse({"object": "list", "data": data})

        return await self._run(MODELS_ROUTE, request, answer)

    async def health(self, request: Request) -> Response:
        serving = self._slot.engine is not None and not self._slot.draining
        return JSONResponse({"status": "SERVING" if serving else "NOT_SERVING"}, 200 if serving else 503)

    async def _http_exception(self, request: Request, exc: StarletteHTTPException) -> Response:
        """Unknown routes and methods, in OpenAI's error shape too."""
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                       "code": str(exc.detail).lower().replace(" ", "_")}},
                            exc.status_code, headers=getattr(exc, "headers", None))

    # -- the exchange: auth, metrics, errors --------------------------------------------------------

    async def _run(self, rpc: str, request: Request, handler: Callable[[_Exchange], Awaitable[Response]]) -> Response:
        ex = _Exchange(rpc, request_id_from([request.headers.get(REQUEST_ID_KEY)]))
        try:
            err = authorize_token(bearer_token(request.headers.items()), self._auth)
            if err is not None:
                raise err
            response = await handler(ex)
        except (asyncio.CancelledError, ClientGone) as exc:
            self._finish(ex, self._calls.cancelled(ex))
            if isinstance(exc, asyncio.CancelledError):
                raise
            return Response(status_code=499)  # nobody reads it: the client has gone
        except Exception as exc:
            return self._error_response(ex, exc)
        if not ex.streaming:
            self._finish(ex, Code.OK)
        response.headers[REQUEST_ID_KEY] = ex.request_id
        return response

    def _front_error(self, ex: _Exchange, exc: Exception) -> FrontError:
        return self._calls.failed(ex, exc)

    def _error_response(self, ex: _Exchange, exc: Exception) -> Response:
        err = self._front_error(ex, exc)
        self._finish(ex, err.code)
        rendered = status.render(err, ex.request_id, ex.names)
        return JSONResponse(rendered.body, rendered.status, headers=rendered.headers)

    def _finish(self, ex: _Exchange, code: Code) -> None:
        if ex.done:
            return
        if ex.counted:
            self._in_flight -= 1
        self._calls.finish(ex, code)

    async def _unless_gone(self, request: Request, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``, cancelling it if the client disconnects first (then ``ClientGone``)."""
        work = asyncio.ensure_future(awaitable)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            gone.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise ClientGone()

    async def _read_body(self, request: Request) -> bytes:
        limit = self._limits.max_message_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise message_too_large(int(declared), limit)
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise message_too_large(limit, limit, exact=False)
                chunks.append(chunk)
        except ClientDisconnect as exc:  # gone mid-upload: a cancelled request, not a server failure
            raise ClientGone() from exc
        return b"".join(chunks)

    # -- chat completions and responses: one path, two renderings --------------------------------------

    async def responses(self, request: Request) -> Response:
        return await self._run(RESPONSES_ROUTE, request, lambda ex: self._respond(ex, request))

    async def _chat(self, ex: _Exchange, request: Request) -> Response:
        self._admit(ex)
        parsed = await asyncio.to_thread(http_body.parse, await self._read_body(request))  # JSON and validation
        plan = translate.plan(parsed)
        target = plan.target
        ex.names = ParamNames(plan.max_tokens_param,
                              target.schema_param if isinstance(target, translate.ExtractionTarget) else "tools")

        def rendering(created: int, fingerprint: str) -> render.Rendering:
            return render.ChatRendering(ex.request_id, plan.model, created, fingerprint, plan.include_usage)

        return await self._serve(ex, request, plan, rendering)

    async def _respond(self, ex: _Exchange, request: Request) -> Response:
        self._admit(ex)
        parsed = await asyncio.to_thread(http_body.parse, await self._read_body(request), responses.ResponsesRequest)
        plan = responses.plan(parsed)
        ex.names = ParamNames("max_output_tokens", responses.SCHEMA_PARAM, "input", "")

        def rendering(created: int, fingerprint: str) -> render.Rendering:
            return responses.ResponsesRendering(ex.request_id, parsed, created)

        return await self._serve(ex, request, plan, rendering)

    def _admit(self, ex: _Exchange) -> None:
        if self._max_in_flight and self._in_flight >= self._max_in_flight:
            raise FrontError(Code.RESOURCE_EXHAUSTED, f"{self._in_flight} requests in flight (the "
                             "server's max_concurrent_rpcs)", "TOO_MANY_REQUESTS")
        self._in_flight += 1
        ex.counted = True

    async def _serve(self, ex: _Exchange, request: Request, plan: translate.ChatPlan,
                     rendering: Callable[[int, str], render.Rendering]) -> Response:
        """The engine request the plan names, run once (a body) or streamed (server-sent events)."""
        target = plan.target
        engine = self._slot.require()
        self._check_model(plan.model, engine)
        if plan.timeout_seconds is not None:
            ex.deadline = ex.arrived + plan.timeout_seconds
        if plan.user:
            log.debug("rpc=%s request_id=%s user=%s", ex.rpc, ex.request_id, plan.user)
        ex.tenant, ex.history_scope = caller_scopes(bearer_token(request.headers.items()), self._limits)
        schema: ResolvedSchema | None = None
        req: ExtractionRequest | ToolCallRequest | TextRequest
        if isinstance(target, translate.ToolTarget):
            ex.schema_field = "tools"
            req = requests.tool_request(target.input, ex, self._limits)
        elif isinstance(target, translate.TextTarget):
            req = requests.text_request(target.input, ex, self._limits)
        else:
            schema = await self._schema(ex, target)
            req = await requests.extraction(target.input, schema, ex, self._limits)
        name = target.name if isinstance(target, translate.ExtractionTarget) else None
        out = rendering(int(self._clock()), engine.model_key)
        if plan.stream:
            return await self._stream(ex, request, engine, req, schema, name, out)
        item = await self._unless_gone(request, guarded(ex.deadline, _once(engine, req)))
        return JSONResponse(out.body(self._finished(ex, engine, item, schema, name)))

    def _finished(self, ex: _Exchange, engine: EngineAPI, item: GenerationResult | ToolCallResult,
                  schema: ResolvedSchema | None, name: str | None) -> render.Finished:
        """The engine's last item, checked (failures raise) and recorded."""
        calls = item if isinstance(item, ToolCallResult) else None
        result = item.result if isinstance(item, ToolCallResult) else item
        ex.result = result
        if schema is not None:
            self._record_name(engine, schema, name)
        failures.check_result(result, ex.deadline, schema_field=ex.schema_field)
        return render.Finished(result, calls, schema.key if schema is not None else None,
                               result.model_key or engine.model_key)

    def _check_model(self, model: str, engine: EngineAPI) -> None:
        if model not in (self._profile, engine.model_key):
            message = f"model {model!r} is not served here; this server serves {self._profile!r} (GET /v1/models)"
            raise FrontError(Code.NOT_FOUND, message, "MODEL_NOT_FOUND", [FieldViolation("model", message)])

    async def _schema(self, ex: _Exchange, target: translate.ExtractionTarget) -> ResolvedSchema:
        if isinstance(target.schema, requests.SchemaRef):
            ex.schema_field = "schema_id"
        return await requests.resolve_schema(self._registry, target.schema)

    def _record_name(self, engine: EngineAPI, schema: ResolvedSchema, name: str | None) -> None:
        """An inline schema's statistics stay keyed by its content; its json_schema.name is kept as their label."""
        if name and schema.record is None:
            self._store.stats.recorder(engine.model_key).record_name(schema.key, name)

    async def _stream(self, ex: _Exchange, request: Request, engine: EngineAPI,
                      req: ExtractionRequest | ToolCallRequest | TextRequest, schema: ResolvedSchema | None,
                      name: str | None, out: render.Rendering) -> Response:
        stream = _items(engine, req)
        items = stream.__aiter__()

        async def next_item() -> TextDelta | GenerationResult | ToolCallResult | None:
            try:
                return await guarded(ex.deadline, items.__anext__())
            except StopAsyncIteration:
                return None

        async def close(code: Code) -> None:
            await _aclose(stream)
            self._finish(ex, code)

        try:  # the first item before the response: errors up to prefill get their HTTP status
            first = await self._unless_gone(request, next_item())
        except BaseException:
            await _aclose(stream)
            raise
        ex.streaming = True

        async def events() -> AsyncIterator[bytes]:
            code = Code.OK
            try:
                for event in out.start():
                    yield event
                item, deltas = first, self._metrics.delta_timer(ex.started)
                while isinstance(item, TextDelta) or item is None:
                    if item is None:
                        raise FrontError(Code.INTERNAL, "engine stream ended without a result", "MODEL_FAILURE")
                    deltas.delta()
                    for event in out.delta(item.text) if item.text else ():
                        yield event
                    item = await next_item()
                for event in out.end(self._finished(ex, engine, item, schema, name)):
                    yield event
            except (asyncio.CancelledError, GeneratorExit):
                code = self._calls.cancelled(ex)
                raise
            except Exception as exc:
                err = self._front_error(ex, exc)
                code = err.code
                for event in out.error(status.render(err, ex.request_id, ex.names).body):
                    yield event
            finally:
                await close(code)

        return _EventStream(events(), lambda: close(cancelled_code(ex.deadline)), ex.request_id)


async def _once(engine: EngineAPI, req: ExtractionRequest | ToolCallRequest | TextRequest) \
        -> GenerationResult | ToolCallResult:
    if isinstance(req, ExtractionRequest):
        return await engine.extract(req)
    if isinstance(req, TextRequest):
        return await engine.chat(req)
    return await engine.call_tool(req)


def _items(engine: EngineAPI, req: ExtractionRequest | ToolCallRequest | TextRequest) \
        -> AsyncIterator[TextDelta | GenerationResult | ToolCallResult]:
    """The engine's stream: text deltas, then the last item (a tool-call request is decoded whole: one item)."""
    if isinstance(req, ExtractionRequest):
        return engine.extract_stream(req)
    if isinstance(req, TextRequest):
        return engine.chat_stream(req)

    async def whole() -> AsyncIterator[ToolCallResult]:
        yield await engine.call_tool(req)
    return whole()
