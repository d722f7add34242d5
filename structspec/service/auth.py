"""Bearer-token authentication as a ``grpc.aio.ServerInterceptor``.

- No token configured: everything is open (the server logs a warning).
- Auth tokens configured: every RPC but health and reflection needs one of them (an admin
  token works too) in ``authorization: Bearer <token>`` metadata -> UNAUTHENTICATED otherwise.
- Registry writes (RegisterSchema, DeleteSchema, SetSchemaSpeculation), ListRejectedDrafts (its samples
  hold the last tokens of callers' inputs) and LoadDraft (it loads a model from the server's disk) need an admin token
  whenever any token is configured -> PERMISSION_DENIED for a valid non-admin token. With auth
  tokens but no admin token, registry writes are refused: secure by default.
- Statistics (GetSchemaStats, ListSchemaStats): any caller may call them, but with tokens configured only an
  admin token reads every schema's (``reads_every_schema``); another caller reads the registered schemas' alone
  (the servicer filters and refuses): an inline schema's or a tool list's statistics are keyed by their content,
  shared by every caller that sends the same one, so they cannot be told apart per tenant.

Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

import grpc

from structspec.service.errors import ServiceError, details_metadata

SERVICE_PREFIX = "/structspec.v1.StructSpec/"
# ListRejectedDrafts: its samples hold the last tokens of callers' inputs
ADMIN_METHODS = frozenset({SERVICE_PREFIX + m for m in ("RegisterSchema", "DeleteSchema", "SetSchemaSpeculation",
                                                        "ListRejectedDrafts", "LoadDraft")})
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")


@dataclass(frozen=True)
class AuthConfig:
    tokens: frozenset[str] = frozenset()
    admin_tokens: frozenset[str] = frozenset()

    @property
    def enabled(self) -> bool:
        return bool(self.tokens or self.admin_tokens)

    def __repr__(self) -> str:  # never show tokens
        return f"AuthConfig(tokens={len(self.tokens)}, admin_tokens={len(self.admin_tokens)})"


def bearer_token(metadata: Sequence[Any] | None) -> str | None:
    for item in metadata or ():
        key, value = item[0], item[1]
        if key.lower() == "authorization":
            value = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def _matches(token: str, accepted: frozenset[str]) -> bool:
    # check every entry so the time does not depend on which one matches
    found = False
    for candidate in accepted:
        found |= hmac.compare_digest(token.encode(), candidate.encode())
    return found


def authorize(method: str, metadata: Sequence[Any] | None, config: AuthConfig) -> ServiceError | None:
    """None when the call may proceed, else the error to answer with."""
    if not config.enabled or method.startswith(EXEMPT_PREFIXES):
        return None
    return authorize_token(bearer_token(metadata), config, admin=method in ADMIN_METHODS)


def authorize_token(token: str | None, config: AuthConfig, admin: bool = False) -> ServiceError | None:
    """The rules above for one bearer token (``None``: none sent) on a call that needs an admin token or not;
    the HTTP API calls it with its ``Authorization`` header's token."""
    if not config.enabled:
        return None
    is_admin = token is not None and _matches(token, config.admin_tokens)
    if admin:
        if is_admin:
            return None
        if token is None or not (_matches(token, config.tokens)):
            return ServiceError(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid admin token (authorization: Bearer <token>)", "UNAUTHENTICATED")
        if not config.admin_tokens:
            return ServiceError(grpc.StatusCode.PERMISSION_DENIED, "this call (a registry write, loading a draft model, or reading rejected-draft samples, which hold callers' input) needs an admin token and none is configured", "ADMIN_TOKEN_REQUIRED")
        return ServiceError(grpc.StatusCode.PERMISSION_DENIED, "this call (a registry write, loading a draft model, or reading rejected-draft samples, which hold callers' input) needs the admin token", "ADMIN_TOKEN_REQUIRED")
    if not config.tokens or is_admin or (token is not None and _matches(token, config.tokens)):
        return None
    return ServiceError(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid token (authorization: Bearer <token>)", "UNAUTHENTICATED")


def reads_every_schema(token: str | None, config: AuthConfig) -> bool:
    """Whether a caller holding ``token`` may read every schema's statistics: auth off, or an admin token."""
    return not config.enabled or (token is not None and _matches(token, config.admin_tokens))


def _denying_handler(handler: grpc.RpcMethodHandler, err: ServiceError) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that fails with ``err``."""

    async def deny(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(err.code, err.message, trailing_metadata=details_metadata(err, ""))

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, config: AuthConfig, on_denied: Callable[[str, ServiceError], None] | None = None):
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
