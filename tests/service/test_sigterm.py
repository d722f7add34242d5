"""`structspec serve` in a subprocess with the fake engine: NOT_SERVING while loading, then
SIGTERM with requests in flight: the short one completes, new ones are refused, the long one
is cancelled at the end of the grace period, and the process exits 0 in time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from structspec.client import NO_RETRY, Client, ExtractionResult, StructSpecError, TextDelta, UnavailableError
from structspec.service.healthcheck import check

REPO = Path(__file__).resolve().parents[2]
GRACE = 2.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path: Path, *args: str, load_seconds: float = 0.0) -> tuple[subprocess.Popen[str], str, Path]:
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "FAKE_ENGINE_LOAD_SECONDS": str(load_seconds), "PYTHONPATH": str(REPO)}
    env = {k: v for k, v in env.items() if not k.startswith("STRUCTSPEC_")}
    cmd = [sys.executable, "-m", "structspec.cli_serve", "serve", "--port", str(port), "--metrics-port", "-1",
           "--data-dir", str(tmp_path / "data"), "--drain-grace-seconds", str(GRACE), *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    return proc, f"127.0.0.1:{port}", log


def wait_serving(target: str, proc: subprocess.Popen[str], timeout: float = 40.0) -> list[str]:
    seen = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, "server exited early"
        status = check(target, timeout=1.0)
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == "SERVING":
            return seen
        time.sleep(0.05)
    raise AssertionError(f"never SERVING: {seen}")


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    proc, target, log = start(tmp_path, "--engine-factory", "tests.service.fakes:make_fake_engine", load_seconds=1.0)
    try:
        statuses = wait_serving(target, proc)
        assert "NOT_SERVING" in statuses  # while the (fake) model loaded

        # health Watch stream: sees NOT_SERVING when draining starts
        watched: list[int] = []
        channel = grpc.insecure_channel(target)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))

        def follow() -> None:
            try:
                for resp in watch:
                    watched.append(resp.status)
            except grpc.RpcError:
                pass

        threading.Thread(target=follow, daemon=True).start()

        results: dict[str, object] = {}
        started = {name: threading.Event() for name in ("short", "long")}

        def run(name: str, prompt: str) -> None:
            try:
                with Client(target, retry=NO_RETRY) as c:
                    for item in c.extract_stream(prompt, schema_id="contact", request_id=name):
                        if isinstance(item, TextDelta):
                            started[name].set()
                        results[name] = item
            except StructSpecError as exc:
                results[name] = exc
            finally:
                started[name].set()

        threads = [threading.Thread(target=run, args=("short", "[slow=0.06]")),  # ~1.2 s < grace
                   threading.Thread(target=run, args=("long", "[slow=1]"))]  # ~19 s > grace
        for t in threads:
            t.start()
        assert all(e.wait(10) for e in started.values())

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with Client(target, retry=NO_RETRY, timeout=3) as late:
            with pytest.raises(UnavailableError):
                late.extract("x", schema_id="contact")
        for t in threads:
            t.join(GRACE + 5)
        assert isinstance(results["short"], ExtractionResult) and results["short"].outcome == "valid"  # type: ignore[union-attr]
        assert isinstance(results["long"], StructSpecError), results["long"]
        assert results["long"].code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)  # type: ignore[union-attr]
        assert proc.wait(timeout=GRACE + 8) == 0
        assert time.monotonic() - t0 < GRACE + 4
        assert health_pb2.HealthCheckResponse.NOT_SERVING in watched, watched
        channel.close()
        text = log.read_text()
        assert "draining" in text and "stopped" in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_engine_factory_failure_exits_nonzero(tmp_path: Path) -> None:
    proc, target, log = start(tmp_path, "--engine-factory", "no_such_module_xyz:build")
    try:
        assert proc.wait(timeout=40) == 1
        text = log.read_text()
        assert "cannot import 'no_such_module_xyz'" in text and "--engine-factory" in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_signal_cuts_the_drain_short(tmp_path: Path) -> None:
    proc, target, _ = start(tmp_path, "--engine-factory", "tests.service.fakes:make_fake_engine",
                            "--drain-grace-seconds", "60")  # the later flag wins over start()'s GRACE
    try:
        wait_serving(target, proc)
        result: dict[str, object] = {}
        began = threading.Event()

        def run() -> None:
            try:
                with Client(target, retry=NO_RETRY) as c:
                    for item in c.extract_stream("[slow=1]", schema_id="contact"):
                        began.set()
                        result["item"] = item
            except StructSpecError as exc:
                result["item"] = exc
            finally:
                began.set()

        thread = threading.Thread(target=run)
        thread.start()
        assert began.wait(10)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # draining: the request may still finish within 60 s
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0 and time.monotonic() - t0 < 12
        thread.join(10)
        assert isinstance(result["item"], StructSpecError)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
