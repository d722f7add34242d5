"""Run a real ``StructSpecServer`` on 127.0.0.1 in a background thread with its own event loop,
so tests can call it with the blocking ``Client`` or an ``AsyncClient`` in another loop."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from structspec.service.server import StructSpecServer
from structspec.service.settings import ServiceSettings
from tests.service.fakes import FakeEngine

T = TypeVar("T")


def settings_for(data_dir: Path, **overrides: Any) -> ServiceSettings:
    base = ServiceSettings(
        host="127.0.0.1", port=0, metrics_port=-1, http_port=-1, data_dir=data_dir, drain_grace_seconds=1.0, stats_flush_interval_seconds=0.2
    )
    return replace(base, **overrides).validate()


class ServerThread:
    def __init__(self, settings: ServiceSettings, engine: FakeEngine | None = None, **server_kwargs: Any):
        self.settings = settings
        self.engine = engine
        self._kwargs = server_kwargs
        self.loop = asyncio.new_event_loop()
        self.server: StructSpecServer | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)

    def start(self) -> "ServerThread":
        self._thread.start()

        async def start() -> StructSpecServer:
            server = StructSpecServer(self.settings, self.engine, **self._kwargs)
            await server.start()
            return server

        self.server = self.run(start())
        return self

    def run(self, coro: Awaitable[T], timeout: float = 30) -> T:
        """Run a coroutine on the server's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def call(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the server's loop (to touch loop-bound state safely)."""

        async def wrap() -> T:
            return fn()

        return self.run(wrap())

    @property
    def target(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def stop(self, grace: float = 0.0) -> None:
        if self.server is not None:
            self.run(self.server.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def make_certs(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, via the
    openssl CLI (the ``cryptography`` package is not installed here)."""
    d = directory
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=structspec-test-ca")
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{name}.ext").write_text(ext)
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {n: d / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}
