"""The asyncio client (same methods as ``Client``, as coroutines)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from structspec.client import convert, stats_decode
from structspec.client.channel import (RetryPolicy, TLSConfig, auth_metadata, channel_options, channel_target,
                                       resolve_tls)
from structspec.client.errors import DeadlineExceededError, InternalError, UnavailableError, error_from_rpc
from structspec.client.results import ChatResult, DraftLoad, ExtractionResult, SchemaInfo, TextDelta, ToolCallResult
from structspec.client.sync import deadline_after, remaining, retry_delay, warn_if_restarted
from structspec.front.views import RejectedDraft, SchemaStats
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc


class AsyncClient:
    """``AsyncClient("host:port", token=..., tls=...)``; see ``Client`` for the semantics.
    Create it inside the event loop that uses it."""

    def __init__(
        self,
        target: str | Sequence[str] = "localhost:50051",
        *,
        token: str | None = None,
        admin_token: str | None = None,
        tls: bool | TLSConfig | None = None,
        timeout: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        load_balancing: str = "round_robin",
    ):
        self.target = channel_target(target)
        cfg = resolve_tls(tls)
        opts = channel_options(cfg, load_balancing)
        self._channel = (grpc.aio.secure_channel(self.target, cfg.credentials(), opts) if cfg
                         else grpc.aio.insecure_channel(self.target, opts))
        self._stub = pb_grpc.StructSpecStub(self._channel)
        self._metadata = auth_metadata(token)
        self._admin_metadata = auth_metadata(admin_token or token)
        self.timeout = timeout
        self.retry = retry

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Any], request: Any, timeout: float | None, admin: bool = False) -> Any:
        deadline = deadline_after(timeout if timeout is not None else self.timeout)
        delays = self.retry.delays()
        metadata = self._admin_metadata if admin else self._metadata
        while True:
            try:
                return await method(request, timeout=remaining(deadline), metadata=metadata)
            except grpc.RpcError as exc:
                delay = retry_delay(exc, delays, deadline)
                if delay is None:
                    raise error_from_rpc(exc) from exc
                warn_if_restarted(exc)
                await asyncio.sleep(delay)

    # -- extraction -------------------------------------------------------------------------------

    async def extract(self, text: str | None = None, *, model: Any = None, timeout: float | None = None, **kwargs: Any) -> Any:
        result = await self.extract_result(text, model=model, timeout=timeout, **kwargs)
        return convert.typed_value(result, model)

    async def extract_result(self, text: str | None = None, *, timeout: float | None = None, **kwargs: Any) -> ExtractionResult:
        req = convert.extract_request(text=text, **kwargs)
        resp = await self._call(self._stub.Extract, req, timeout)
        return ExtractionResult.from_pb(resp.result)

    def extract_stream(self, text: str | None = None, *, timeout: float | None = None, **kwargs: Any) -> AsyncIterator[TextDelta | ExtractionResult]:
        """``async for item in client.extract_stream(...)``: ``TextDelta``s, then the result.
        Leaving the loop early (or ``aclose()``) cancels the request on the server."""
        req = convert.extract_request(text=text, **kwargs)
        return self._stream(req, timeout)

    async def _stream(self, req: Any, timeout: float | None, rpc: str = "ExtractStream",
                      result_of: Callable[[Any], Any] = ExtractionResult.from_pb,
                      check: bool = True) -> AsyncIterator[Any]:
        deadline = deadline_after(timeout if timeout is not None else self.timeout)
        delays = self.retry.delays()
        while True:
            call = getattr(self._stub, rpc)(req, timeout=remaining(deadline), metadata=self._metadata)
            received = False
            try:
                async for resp in call:
                    received = True
                    if resp.HasField("delta"):
                        yield TextDelta(resp.delta.text)
                    else:
                        result = result_of(resp.result)
                        async for _ in call:  # read to the end: the server then ends the stream OK, not cancelled
                            pass
                        if check:
                            convert.check_output(result)
                        yield result
                        return
                raise InternalError(grpc.StatusCode.INTERNAL, "stream ended without a result")
            except grpc.RpcError as exc:
                delay = None if received else retry_delay(exc, delays, deadline)
                if delay is None:
                    raise error_from_rpc(exc) from exc
                warn_if_restarted(exc)
            finally:
                call.cancel()
            await asyncio.sleep(delay)

    async def call_tool(
        self, messages: Iterable[Any], tools: Sequence[Any], *, tool_choice: str = "auto", parallel: bool = False,
        timeout: float | None = None, check: bool = True, **kwargs: Any,
    ) -> ToolCallResult:
        req = convert.tool_request(messages=messages, tools=tools, tool_choice=tool_choice, parallel=parallel, **kwargs)
        result = ToolCallResult.from_pb(await self._call(self._stub.CallTool, req, timeout))
        if check:
            convert.check_output(result)
        return result

    # -- free text --------------------------------------------------------------------------------

    async def chat(self, messages: Iterable[Any], *, stop: str | Sequence[str] | None = None,
                   timeout: float | None = None, **kwargs: Any) -> ChatResult:
        """Like ``Client.chat``, as a coroutine."""
        req = convert.chat_request(messages=messages, stop=stop, **kwargs)
        return ChatResult.from_pb((await self._call(self._stub.Chat, req, timeout)).result)

    def chat_stream(self, messages: Iterable[Any], *, stop: str | Sequence[str] | None = None,
                    timeout: float | None = None, **kwargs: Any) -> AsyncIterator[TextDelta | ChatResult]:
        """``async for item in client.chat_stream(...)``: ``TextDelta``s, then the ``ChatResult``."""
        req = convert.chat_request(messages=messages, stop=stop, **kwargs)
        return self._stream(req, timeout, "ChatStream", ChatResult.from_pb, check=False)

    # -- registry ---------------------------------------------------------------------------------

    async def register_schema(self, schema_id: str, schema: Mapping[str, Any] | str | Any, *, description: str = "", timeout: float | None = None) -> SchemaInfo:
        resp = await self._call(self._stub.RegisterSchema, convert.register_request(schema_id, schema, description), timeout, admin=True)
        return SchemaInfo.from_pb(resp.schema, resp.created)

    async def get_schema(self, schema_id: str, version: int | None = None, *, timeout: float | None = None) -> SchemaInfo:
        req = pb.GetSchemaRequest(schema_id=schema_id)
        if version is not None:
            req.version = version
        return SchemaInfo.from_pb((await self._call(self._stub.GetSchema, req, timeout)).schema)

    async def list_schemas(self, schema_id: str | None = None, *, all_versions: bool = False, omit_content: bool = False, timeout: float | None = None) -> list[SchemaInfo]:
        req = pb.ListSchemasRequest(schema_id=schema_id or "", all_versions=all_versions, omit_content=omit_content)
        return [SchemaInfo.from_pb(s) for s in (await self._call(self._stub.ListSchemas, req, timeout)).schemas]

    async def delete_schema(self, schema_id: str, version: int | None = None, *, timeout: float | None = None) -> list[int]:
        req = pb.DeleteSchemaRequest(schema_id=schema_id)
        if version is not None:
            req.version = version
        return list((await self._call(self._stub.DeleteSchema, req, timeout, admin=True)).deleted_versions)

    async def set_schema_speculation(self, schema_id: str, speculation: str, version: int | None = None, *,
                                     timeout: float | None = None) -> SchemaInfo:
        req = convert.set_speculation_request(schema_id, speculation, version)
        return SchemaInfo.from_pb((await self._call(self._stub.SetSchemaSpeculation, req, timeout, admin=True)).schema)

    async def get_schema_stats(
        self, schema_id: str | None = None, version: int | None = None, *, schema_key: str | None = None,
        windows: Sequence[int] = (), model: str | None = None, include_timeline: bool = False,
        timeout: float | None = None,
    ) -> SchemaStats:
        req = convert.stats_request(schema_id, version, schema_key, windows, model, include_timeline)
        return stats_decode.schema_stats((await self._call(self._stub.GetSchemaStats, req, timeout, admin=True)).stats)

    async def list_schema_stats(self, windows: Sequence[int] = (), *, model: str | None = None,
                                include_timeline: bool = False, timeout: float | None = None) -> list[SchemaStats]:
        req = pb.ListSchemaStatsRequest(window_seconds=list(windows), model=model or "",
                                        include_timeline=include_timeline)
        return [stats_decode.schema_stats(s)
                for s in (await self._call(self._stub.ListSchemaStats, req, timeout, admin=True)).stats]

    async def list_rejected_drafts(self, schema_id: str | None = None, version: int | None = None, *,
                                   schema_key: str | None = None, model: str | None = None,
                                   proposer: str | None = None, limit: int = 20,
                                   timeout: float | None = None) -> list[RejectedDraft]:
        req = convert.rejected_drafts_request(schema_id, version, schema_key, model, proposer, limit)
        return [stats_decode.rejected_draft(r)
                for r in (await self._call(self._stub.ListRejectedDrafts, req, timeout, admin=True)).drafts]

    async def load_draft(self, path: str, *, timeout: float | None = None) -> DraftLoad:
        req = pb.LoadDraftRequest(path=path)
        return DraftLoad.from_pb(await self._call(self._stub.LoadDraft, req, timeout, admin=True))

    async def health(self, service: str = "", *, timeout: float | None = 5.0) -> str:
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    async def wait_until_serving(self, timeout: float, *, poll: float = 0.5) -> None:
        """Like ``Client.wait_until_serving``, as a coroutine."""
        deadline, status = time.monotonic() + timeout, "unreachable"
        while True:
            try:
                status = await self.health(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                if status == "SERVING":
                    return
            except UnavailableError:
                status = "unreachable"
            except DeadlineExceededError:
                status = "not answering"
            if time.monotonic() + poll > deadline:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"not SERVING after {timeout:g} s ({status})",
                                       "NOT_SERVING")
            await asyncio.sleep(poll)


