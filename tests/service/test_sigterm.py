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
import httpx
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


def start(tmp_path: Path, *args: str, load_seconds: float = 0.0,
          http_port: int = -1) -> tuple[subprocess.Popen[str], str, Path]:
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "FAKE_ENGINE_LOAD_SECONDS": str(load_seconds), "PYTHONPATH": str(REPO)}
    env = {k: v for k, v in env.items() if not k.startswith("STRUCTSPEC_")}
    cmd = [sys.executable, "-m", "structspec.cli_serve", "serve", "--port", str(port), "--metrics-port", "-1",
           "--http-port", str(http_port), "--data-dir", str(tmp_path / "data"), "--drain-grace-seconds", str(GRACE), *args]
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


def test_sigterm_drains_the_http_api_too(tmp_path: Path) -> None:
    """The same drain on the OpenAI-compatible HTTP API: the short request completes, new ones are refused, the
    long stream is cut at the end of the grace period, and the process exits 0 in time."""
    http_port = free_port()
    proc, target, _ = start(tmp_path, "--engine-factory", "tests.service.fakes:make_fake_engine", http_port=http_port)
    url = f"http://127.0.0.1:{http_port}"
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in ("name", "email", "city")}}

    def body(text: str, stream: bool = False) -> dict[str, object]:
        return {"model": "gemma-3-270m", "messages": [{"role": "user", "content": text}], "stream": stream,
                "response_format": {"type": "json_schema", "json_schema": {"name": "contact", "schema": schema}}}

    try:
        wait_serving(target, proc)
        assert httpx.get(url + "/health").json() == {"status": "SERVING"}
        results: dict[str, object] = {}

        def short() -> None:  # 6 chunks at 0.1 s: done within the grace
            r = httpx.post(url + "/v1/chat/completions", json=body("[slow=0.1]"), timeout=GRACE + 10)
            results["short"] = (r.status_code, r.json())

        def long() -> None:  # 6 chunks at 1 s: past the grace
            try:
                with httpx.stream("POST", url + "/v1/chat/completions", json=body("[slow=1]", True),
                                  timeout=GRACE + 10) as r:
                    results["long"] = [line for line in r.iter_lines() if line]
            except httpx.HTTPError as exc:  # the connection cut mid-stream
                results["long"] = exc

        threads = [threading.Thread(target=short), threading.Thread(target=long)]
        for t in threads:
            t.start()
        time.sleep(1.3)  # both admitted (the stream's first delta comes after 1 s)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            late = httpx.post(url + "/v1/chat/completions", json=body("x"), timeout=3)
            assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
        except httpx.ConnectError:
            pass  # or no longer listening
        for t in threads:
            t.join(GRACE + 5)
        status, answer = results["short"]  # type: ignore[misc]
        assert status == 200 and answer["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
        cut = results["long"]
        assert isinstance(cut, httpx.HTTPError) or "data: [DONE]" not in cut or any('"error"' in e for e in cut), cut
        assert proc.wait(timeout=GRACE + 8) == 0
        assert time.monotonic() - t0 < GRACE + 4
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
