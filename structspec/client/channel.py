"""Channel options shared by the clients: the target (one address or several replicas), TLS, tokens, retry policy.

Several replicas: gRPC keeps one long-lived HTTP/2 connection per channel, so a plain Kubernetes
ClusterIP Service (one virtual IP, balanced per connection) pins a client to one pod. The
clients instead balance each call over every address (``round_robin``): give them a
``dns:///name:port`` target (every address the name resolves to, e.g. a headless Service's pods;
re-resolved when connections fail, so new pods join) or a list of ``host:port`` addresses (one
channel over all of them). A call that fails UNAVAILABLE is retried (``RetryPolicy``), and the
balancer sends the retry to another replica: it picks the next address for each call and skips
those whose connection is down.
"""

from __future__ import annotations

import ipaddress
import json
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

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


LOAD_BALANCING = ("round_robin", "pick_first")


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"address {address!r} must be host:port")
    return host.strip("[]"), int(port)


def channel_target(target: str | Sequence[str]) -> str:
    """The gRPC target for ``target``.

    A string is used as given: ``host:port``, ``dns:///name:port``, ``ipv4:a:p,b:p``, ``unix:/path``. A sequence
    of ``host:port`` addresses becomes one ``ipv4:`` (or ``ipv6:``) target listing their addresses; a host name in
    it is resolved once, here (for a set of replicas that changes, use ``dns:///``). Raises ``ValueError`` for an
    empty list, a malformed address, or a mix of IPv4-only and IPv6-only hosts."""
    if isinstance(target, str):
        return target
    addresses = list(target)
    if not addresses:
        raise ValueError("no address given")
    if len(addresses) == 1:
        return addresses[0]
    v4: list[str] = []
    v6: list[str] = []
    for address in addresses:
        host, port = _host_port(address)
        try:
            ips = [ipaddress.ip_address(host)]
        except ValueError:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            ips = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
        four = [ip for ip in ips if ip.version == 4]
        if four:  # IPv4 where a host has it: one target holds one family
            v4 += [f"{ip}:{port}" for ip in four]
        else:
            v6 += [f"[{ip}]:{port}" for ip in ips]
    if v4 and v6:
        raise ValueError(f"addresses {addresses} mix IPv4-only and IPv6-only hosts: one channel holds one family")
    return ("ipv4:" + ",".join(dict.fromkeys(v4))) if v4 else ("ipv6:" + ",".join(dict.fromkeys(v6)))


def channel_options(tls: TLSConfig | None, load_balancing: str = "round_robin") -> list[tuple[str, object]]:
    """``load_balancing``: ``round_robin`` (each call to the next address: replicas share the load) or
    ``pick_first`` (gRPC's default: one address until it fails)."""
    if load_balancing not in LOAD_BALANCING:
        raise ValueError(f"load_balancing must be one of {', '.join(LOAD_BALANCING)}, got {load_balancing!r}")
    opts: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.service_config", json.dumps({"loadBalancingConfig": [{load_balancing: {}}]})),
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
