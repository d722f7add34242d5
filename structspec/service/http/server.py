"""uvicorn inside the structspec server's event loop, beside grpc.aio: one process, one engine.

``HttpServer.start`` binds the socket itself (so a taken port fails at start-up with an ``OSError``
rather than uvicorn's ``sys.exit``, and port 0 reports the port it got), then runs
``uvicorn.Server.serve`` as a task of the running loop. uvicorn installs no signal handlers of its
own here: the structspec server's SIGTERM/SIGINT drain calls ``stop(grace)``, which stops accepting
connections, lets the requests in flight finish within ``grace`` seconds and cancels the rest;
``cut_short`` (a second signal) cancels them at once. TLS and mutual TLS use the gRPC server's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from pathlib import Path
from typing import Any, Iterator

import uvicorn

log = logging.getLogger("structspec.service.http")
BACKLOG = 2048


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers (the structspec server owns SIGTERM/SIGINT and their drain)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (IPv6 when the host is an IPv6 address)."""
    family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only: a listening port still fails
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class HttpServer:
    def __init__(self, app: Any, host: str, port: int, *, cert_file: Path | None = None, key_file: Path | None = None,
                 client_ca_file: Path | None = None):
        self.host = host
        self._requested_port = port
        tls: dict[str, Any] = {}
        if cert_file is not None and key_file is not None:
            tls = {"ssl_certfile": str(cert_file), "ssl_keyfile": str(key_file)}
            if client_ca_file is not None:
                tls |= {"ssl_ca_certs": str(client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        self.tls = bool(tls)
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", server_header=False, proxy_headers=False,
                                timeout_graceful_shutdown=0, **tls)
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None
        self.port: int | None = None

    async def start(self) -> int:
        """Listen and serve; returns the bound port."""
        sock = bind(self.host, self._requested_port)
        self.port = int(sock.getsockname()[1])
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="structspec-http")
        while not self._server.started:
            if self._task.done():
                sock.close()
                self._task.result()  # raises uvicorn's start-up error
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop accepting connections; requests in flight get ``grace`` seconds, then are cancelled."""
        if self._task is None:
            return
        # a tick for idle connections to close; ignore: typed int | None, uvicorn waits on it as a float timeout
        self._server.config.timeout_graceful_shutdown = max(grace, 0.1)  # type: ignore[assignment]
        self._server.should_exit = True
        try:
            await self._task
        except Exception:
            log.exception("the HTTP server failed while stopping")
        finally:
            self._task = None

    def cut_short(self) -> None:
        """Cancel the requests in flight now (a second signal during the drain)."""
        self._server.force_exit = True
        for task in list(self._server.server_state.tasks):
            task.cancel()
