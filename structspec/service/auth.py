"""Bearer-token authentication of gRPC calls, as a ``grpc.aio.ServerInterceptor`` (the rules are
``front.auth``'s).

Every RPC but health and reflection is checked; registry writes (RegisterSchema, DeleteSchema,
SetSchemaSpeculation), ListRejectedDrafts (its samples hold the last tokens of callers' inputs) and
LoadDraft (it loads a model from the server's disk) need an admin token. Statistics (GetSchemaStats,
ListSchemaStats) pass here; the servicer decides which schemas' a caller reads.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

import grpc

from structspec.front.auth import AuthConfig, authorize_token, bearer_token
from structspec.front.errors import FrontError
from structspec.service.grpc_status import abort

SERVICE_PREFIX = "/structspec.v1.StructSpec/"
# ListRejectedDrafts: its samples hold the last tokens of callers' inputs
ADMIN_METHODS = frozenset({SERVICE_PREFIX + m for m in ("RegisterSchema", "DeleteSchema", "SetSchemaSpeculation",
                                                        "ListRejectedDrafts", "LoadDraft")})
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")


def authorize(method: str, metadata: Sequence[Any] | None, config: AuthConfig) -> FrontError | None:
    """None when the call may proceed, else the error to answer with."""
    if not config.enabled or method.startswith(EXEMPT_PREFIXES):
        return None
    return authorize_token(bearer_token(metadata), config, admin=method in ADMIN_METHODS)


def _denying_handler(handler: grpc.RpcMethodHandler, err: FrontError) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that fails with ``err``."""

    async def deny(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, err, "")

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, config: AuthConfig, on_denied: Callable[[str, FrontError], None] | None = None):
        self.config = config
        self._on_denied = on_denied

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        err = authorize(handler_call_details.method, handler_call_details.invocation_metadata, self.config)
        if err is None or handler is None:
            return handler
        if self._on_denied is not None:
            self._on_denied(handler_call_details.method, err)
        return _denying_handler(handler, err)
