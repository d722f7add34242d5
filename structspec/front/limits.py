"""What the server allows one request: its size, its output tokens, and how its caller's token scopes it.

Both fronts hold requests to the same ``Limits`` (``structspec serve`` builds them from its settings).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_tokens_cap: int = 4096  # output tokens a request may ask for (and the default's ceiling)
    max_message_bytes: int = 4 * 1024 * 1024  # a request's encoded size (the gRPC message, the HTTP body)
    history_per_token: bool = False  # the schema history drafts only from the same auth token's outputs
    tenants: bool = False  # auth tokens configured: each bearer token is a tenant (whose cached prompts it reuses)
