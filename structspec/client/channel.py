"""Channel options shared by the clients: TLS, tokens, retry policy."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class TLSConfig:
    """``ca_file``: trust this CA (system roots when None); ``cert_file``/``key_file``: client
    certificate for mutual TLS; ``server_name``: override the name checked against the certificate."""

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        read = lambda p: Path(p).read_bytes() if p is not None else None  # noqa: E731
        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file), read(self.cert_file))


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, for UNAVAILABLE only (the server is unreachable,
    loading its model or draining: the request never started, so a retry is safe)."""

    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2  # +-20 %

    def delays(self) -> Iterator[float]:
        delay = self.initial_backoff
        for _ in range(max(0, self.max_attempts - 1)):
            yield delay * (1 + random.uniform(-self.jitter, self.jitter))
            delay = min(self.max_backoff, delay * self.multiplier)


NO_RETRY = RetryPolicy(max_attempts=1)


def channel_options(tls: TLSConfig | None) -> list[tuple[str, object]]:
    opts: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if tls is not None and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return opts


def resolve_tls(tls: bool | TLSConfig | None) -> TLSConfig | None:
    if tls is True:
        return TLSConfig()
    if tls is False or tls is None:
        return None
    return tls


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
