"""Prometheus metrics of one server, in a private registry (several servers per process in tests)."""

from __future__ import annotations

import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

from structspec.engine.api import EngineAPI
from structspec.engine.types import GenerationResult

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0)


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # the process's memory (process_resident_memory_bytes), CPU time and open files, as on any Prometheus target
        ProcessCollector(registry=r)
        self.requests = Counter(
            "structspec_requests", "RPCs finished, by method, status code and finish reason", ["rpc", "code", "finish_reason"], registry=r
        )
        self.latency = Histogram(
            "structspec_request_latency_seconds", "RPC latency, by method and status code", ["rpc", "code"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.malformed = Counter(
            "structspec_malformed_requests", "requests whose bytes did not decode (answered INVALID_ARGUMENT)", ["rpc"], registry=r
        )
        self.first_delta = Histogram(
            "structspec_stream_first_delta_seconds", "time to the first text delta of a stream (ExtractStream, streamed chat completions)", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter("structspec_prompt_tokens", "prompt tokens of finished requests", ["rpc"], registry=r)
        self.output_tokens = Counter("structspec_output_tokens", "output tokens of finished requests", ["rpc"], registry=r)
        self.forced_tokens = Counter("structspec_forced_tokens", "output tokens forced by the grammar (fast-forward)", ["rpc"], registry=r)
        self.passes_per_token = Histogram(
            "structspec_target_forward_passes_per_token",
            "target forward passes per output token, per request (below 1: speculation/fast-forward pay off)",
            ["rpc"],
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.drafted = Counter("structspec_drafted_tokens", "tokens drafted, by proposer", ["proposer"], registry=r)
        self.accepted = Counter("structspec_accepted_tokens", "drafted tokens accepted, by proposer", ["proposer"], registry=r)
        self.decisions = Counter(
            "structspec_speculation_decisions",
            "finished requests by the drafting policy's reason (drafted, cold, short_output, low_acceptance, ...)",
            ["rpc", "reason"],
            registry=r,
        )
        self.queue_depth = Gauge("structspec_queue_depth", "requests waiting for a batch slot", registry=r)
        self.running = Gauge("structspec_running_batch_size", "sequences being decoded", registry=r)
        self.serving = Gauge("structspec_serving", "1 while the server is SERVING (model loaded, not draining)", registry=r)
        self._http: tuple[object, threading.Thread] | None = None

    def bind_engine(self, engine: Callable[[], EngineAPI | None]) -> None:
        """Gauges read the engine at scrape time (0 while it loads)."""

        def read(fn: Callable[[EngineAPI], int]) -> Callable[[], float]:
            def value() -> float:
                e = engine()
                try:
                    return float(fn(e)) if e is not None else 0.0
                except Exception:  # a scrape must never fail because the engine is mid-shutdown
                    return 0.0

            return value

        self.queue_depth.set_function(read(lambda e: e.queue_depth()))
        self.running.set_function(read(lambda e: e.running()))

    def observe(self, rpc: str, code: str, seconds: float, result: GenerationResult | None = None) -> None:
        finish = result.finish_reason.value if result is not None else ""
        self.requests.labels(rpc, code, finish).inc()
        self.latency.labels(rpc, code).observe(seconds)
        if result is None:
            return
        u = result.usage
        self.prompt_tokens.labels(rpc).inc(u.prompt_tokens)
        self.output_tokens.labels(rpc).inc(u.output_tokens)
        self.forced_tokens.labels(rpc).inc(u.forced_tokens)
        if u.output_tokens > 0:
            self.passes_per_token.labels(rpc).observe(u.target_forward_passes / u.output_tokens)
        for name, n in u.drafted.items():
            self.drafted.labels(name).inc(n)
        for name, n in u.accepted.items():
            self.accepted.labels(name).inc(n)
        if result.speculation is not None:
            self.decisions.labels(rpc, result.speculation.reason).inc()

    def start_http(self, host: str, port: int) -> int:
        """Serve /metrics; returns the bound port."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = (server, thread)
        return int(server.server_port)  # type: ignore[attr-defined]

    def stop_http(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(timeout=5)
            self._http = None
