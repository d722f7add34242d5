"""Bearer tokens: who may call what, for both fronts (gRPC ``authorization`` metadata, HTTP ``Authorization``).

- No token configured: everything is open (the server logs a warning).
- Auth tokens configured: every call (on gRPC, all but health and reflection) needs one of them (an admin
  token works too) in ``authorization: Bearer <token>`` -> UNAUTHENTICATED otherwise.
- Calls that need an admin token (on gRPC: registry writes, ListRejectedDrafts, whose samples hold the last
  tokens of callers' inputs, and LoadDraft, which loads a model from the server's disk; ``service.auth``
  names them) need it whenever any token is configured -> PERMISSION_DENIED for a valid non-admin token.
  With auth tokens but no admin token, they are refused: secure by default.
- Statistics: any caller may read them, but with tokens configured only an admin token reads every schema's
  (``reads_every_schema``); another caller reads the registered schemas' alone (the servicer filters and
  refuses): an inline schema's or a tool list's statistics are keyed by their content, shared by every
  caller that sends the same one, so they cannot be told apart per tenant.

Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Sequence

from structspec.front.errors import Code, FrontError


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
    """The token of the first ``authorization`` entry of (key, value) pairs (gRPC metadata, HTTP headers)."""
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


def authorize_token(token: str | None, config: AuthConfig, admin: bool = False) -> FrontError | None:
    """The rules above for one bearer token (``None``: none sent) on a call that needs an admin token or not:
    None when the call may proceed, else the error to answer with."""
    if not config.enabled:
        return None
    is_admin = token is not None and _matches(token, config.admin_tokens)
    if admin:
        if is_admin:
            return None
        if token is None or not (_matches(token, config.tokens)):
            return FrontError(Code.UNAUTHENTICATED, "missing or invalid admin token (authorization: Bearer <token>)", "UNAUTHENTICATED")
        if not config.admin_tokens:
            return FrontError(Code.PERMISSION_DENIED, "this call (a registry write, loading a draft model, or reading rejected-draft samples, which hold callers' input) needs an admin token and none is configured", "ADMIN_TOKEN_REQUIRED")
        return FrontError(Code.PERMISSION_DENIED, "this call (a registry write, loading a draft model, or reading rejected-draft samples, which hold callers' input) needs the admin token", "ADMIN_TOKEN_REQUIRED")
    if not config.tokens or is_admin or (token is not None and _matches(token, config.tokens)):
        return None
    return FrontError(Code.UNAUTHENTICATED, "missing or invalid token (authorization: Bearer <token>)", "UNAUTHENTICATED")


def reads_every_schema(token: str | None, config: AuthConfig) -> bool:
    """Whether a caller holding ``token`` may read every schema's statistics: auth off, or an admin token."""
    return not config.enabled or (token is not None and _matches(token, config.admin_tokens))
