"""The protobuf decode guard: requests whose bytes do not decode get INVALID_ARGUMENT, as a
``grpc.aio.ServerInterceptor``.

gRPC's runtime deserializes a request before any handler runs; when the bytes are not a
valid message (truncated, wrong wire types, invalid UTF-8 in a ``string`` field) it answers
UNKNOWN "Unexpected DecodeError". This interceptor swaps in a deserializer that never raises
(it hands the handler an ``Undecodable`` instead) and a handler that answers such a request
with INVALID_ARGUMENT (reason MALFORMED_REQUEST) and the decoder's words, and counts it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from structspec.front.errors import Code, FieldViolation, FrontError
from structspec.service.grpc_status import abort


@dataclass(frozen=True)
class Undecodable:
    """What the safe deserializer returns for bytes that are not a valid message."""

    message_type: str
    reason: str

    def error(self) -> FrontError:
        text = f"request is not a valid {self.message_type} message: {self.reason}"
        return FrontError(Code.INVALID_ARGUMENT, text, "MALFORMED_REQUEST", [FieldViolation("request", text)])


def safe_deserializer(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    name = getattr(getattr(deserialize, "__self__", None), "__name__", "request")

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError, UnicodeDecodeError, ...: all the caller's bytes
            return Undecodable(name, str(exc)[:200] or type(exc).__name__)

    return decode


def _refusing(handler: grpc.RpcMethodHandler, on_refused: Callable[[str], None], method: str) -> grpc.RpcMethodHandler:
    """The same handler, with a deserializer that never raises and a check before the behaviour."""

    async def refuse(request: Undecodable, context: grpc.aio.ServicerContext) -> None:
        on_refused(method)
        await abort(context, request.error(), "")

    kwargs = {"request_deserializer": safe_deserializer(handler.request_deserializer),
              "response_serializer": handler.response_serializer}
    if handler.response_streaming:
        behaviour = handler.unary_stream
        if not inspect.isasyncgenfunction(behaviour):  # a coroutine that writes with context.write (health Watch)
            async def writer(request: Any, context: grpc.aio.ServicerContext) -> None:
                if isinstance(request, Undecodable):
                    return await refuse(request, context)
                await behaviour(request, context)

            return grpc.unary_stream_rpc_method_handler(writer, **kwargs)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await refuse(request, context)
                return
            async for item in behaviour(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    behaviour = handler.unary_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            return await refuse(request, context)
        return await behaviour(request, context)

    return grpc.unary_unary_rpc_method_handler(unary, **kwargs)


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every unary-request handler; streaming-request RPCs (none in structspec.v1) pass through."""

    def __init__(self, on_refused: Callable[[str], None] = lambda method: None):
        self._on_refused = on_refused

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        return _refusing(handler, self._on_refused, handler_call_details.method)
