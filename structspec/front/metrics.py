"""Prometheus metrics of one server, in a private registry (several servers per process in tests); both
fronts observe their calls here (``call.CallGuard``), the gRPC status names as their ``code`` label.

Per RPC: requests, latency, tokens, passes per token, decisions. Per schema (``SchemaCollector``,
read at scrape time from the statistics book's process totals; the ``schema`` label is bounded:
a registered schema's ``id@version``, ``inline`` for every inline schema, ``tools`` for every tool
list): requests by finish reason, output tokens, target passes, drafted and accepted tokens per
proposer and batch bucket, decisions by reason, the policy's state and switches. Server-wide:
the queue, the running batch, KV-cache tokens in use and their peak, grammar compile times and
the time requests wait for their grammar, the time to the first streamed delta and between
deltas; the store: whether it can be reached, what waits to be written, what was dropped and what it
refused (quarantined).
The service README lists every series.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from structspec.engine.api import EngineAPI
from structspec.engine.types import GenerationResult
from structspec.stats.book import StatsBook
from structspec.stats.counters import Series
from structspec.stats.policy_states import OFF, ON
from structspec.stats.totals import SWITCHES, schema_label
from structspec.store.base import BACKLOG_KINDS, Store

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0)
_COMPILE_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DELTA_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# (metric name without _total, help, the series it sums, the labels it keeps)
_SCHEMA_COUNTERS = (
    ("structspec_schema_requests", "requests that ended, per schema and finish reason (stop, length: truncated, "
     "cancelled, error)", Series.FINISH, ("schema", "finish_reason")),
    ("structspec_schema_output_tokens", "output tokens of the requests that ended, per schema", Series.OUTPUT_TOKENS,
     ("schema",)),
    ("structspec_schema_target_passes", "target forward passes of the requests that ended, per schema",
     Series.TARGET_PASSES, ("schema",)),
    ("structspec_schema_forced_tokens", "output tokens forced by the grammar (fast-forward), per schema",
     Series.FORCED_TOKENS, ("schema",)),
    ("structspec_schema_drafted_tokens", "drafted tokens verified, per schema, proposer and running-batch bucket",
     Series.DRAFTED, ("schema", "proposer", "batch_bucket")),
    ("structspec_schema_accepted_tokens", "drafted tokens the target accepted, per schema, proposer and batch bucket",
     Series.ACCEPTED, ("schema", "proposer", "batch_bucket")),
    ("structspec_schema_verifications", "verifications that carried a draft, per schema, proposer and batch bucket",
     Series.VERIFICATIONS, ("schema", "proposer", "batch_bucket")),
    ("structspec_schema_policy_decisions", "drafting-policy decisions, per schema, proposer (\"\" for the request's own "
     "reason) and reason", Series.DECISION, ("schema", "proposer", "reason")),
    ("structspec_schema_policy_switches", "the policy switching a proposer on or off for a schema (state: the one "
     "switched to; a schema's first decision counts)", SWITCHES, ("schema", "proposer", "state")),
)


class SchemaCollector(Collector):
    """The per-schema series, read from a ``StatsBook`` at scrape time (its totals only grow).

    ``model``: the serving engine's model key (None while it loads). The policy's states come from the
    store too (every replica's, every model's: benchmark runs, other draft versions); only this model's
    are this server's state."""

    def __init__(self, book: StatsBook, model: Callable[[], str | None] = lambda: None):
        self.book = book
        self.model = model

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only (the label values are not known before)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        totals = self.book.totals.snapshot()
        for name, doc, series, labels in _SCHEMA_COUNTERS:
            family = CounterMetricFamily(name, doc, labels=labels)
            for k, v in sorted(totals.items()):
                if k.series != series:
                    continue
                values = {"schema": k.schema, "proposer": k.proposer, "batch_bucket": str(k.batch_bucket),
                          "finish_reason": k.label, "reason": k.label, "state": k.label}
                family.add_metric([values[label] for label in labels], v)
            yield family
        states = GaugeMetricFamily(
            "structspec_schema_policy_state", "schemas under the label whose proposer the drafting policy has in this "
            "state (a registered schema: 1 for its current state, 0 for the other)", labels=("schema", "proposer", "state"))
        counts: dict[tuple[str, str, str], int] = {}
        try:
            serving = self.model()
        except Exception:  # noqa: BLE001 - a scrape never fails because the engine is loading or stopping
            serving = None
        for (model, schema_key, proposer), change in self.book.policy.latest().items():
            if model != serving:
                continue
            label = schema_label(schema_key)
            for state in (ON, OFF):
                counts.setdefault((label, proposer, state), 0)
            counts[(label, proposer, change.state)] += 1
        for labels, n in sorted(counts.items()):
            states.add_metric(list(labels), n)
        yield states


class BacklogCollector(Collector):
    """What the store has not written yet and what it dropped, per kind, read from ``Store.backlog`` at scrape time."""

    def __init__(self, store: Store):
        self.store = store

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        backlog = self.store.backlog()
        unwritten = GaugeMetricFamily("structspec_stats_unwritten", "statistics recorded but not yet written to the "
                                      "store, by kind (counters: counter rows; history: outputs; samples; "
                                      "traffic; policy_changes); grows while the store is unreachable", labels=("kind",))
        dropped = CounterMetricFamily("structspec_stats_dropped", "statistics dropped because the store could not "
                                      "be written for so long that a kind's bound was reached, by kind",
                                      labels=("kind",))
        quarantined = CounterMetricFamily("structspec_stats_quarantined", "statistics rows the store refused for what "
                                          "they hold (a value it cannot store, a constraint), kept apart instead of "
                                          "holding back the rows behind them (logged with the reason), by kind",
                                          labels=("kind",))
        for kind in BACKLOG_KINDS:
            unwritten.add_metric([kind], backlog.unwritten.get(kind, 0))
            dropped.add_metric([kind], backlog.dropped.get(kind, 0))
            quarantined.add_metric([kind], backlog.quarantined.get(kind, 0))
        yield unwritten
        yield dropped
        yield quarantined


class DeltaTimer:
    """One stream's deltas: the first observed as the time to it, each later one as the time since the one before."""

    def __init__(self, metrics: "ServiceMetrics", started: float):
        self._metrics = metrics
        self._last: float | None = None
        self._started = started

    def delta(self) -> None:
        now = time.perf_counter()
        if self._last is None:
            self._metrics.first_delta.observe(now - self._started)
        else:
            self._metrics.delta_interval.observe(now - self._last)
        self._last = now


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
        self.delta_interval = Histogram(
            "structspec_stream_delta_interval_seconds", "time between consecutive text deltas of a stream (ExtractStream, "
            "streamed chat completions)", buckets=_DELTA_BUCKETS, registry=r
        )
        self.compile_seconds = Histogram(
            "structspec_grammar_compile_seconds", "grammar compiles (schemas and tool lists; cached afterwards)",
            buckets=_COMPILE_BUCKETS, registry=r
        )
        self.compile_wait = Histogram(
            "structspec_grammar_compile_wait_seconds", "time each request waited for its grammar (about 0 when cached; "
            "a request arriving during another's compile of the same schema waits for that one)",
            buckets=_COMPILE_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("structspec_queue_depth", "requests waiting for a batch slot", registry=r)
        self.running = Gauge("structspec_running_batch_size", "sequences being decoded", registry=r)
        self.kv_tokens = Gauge("structspec_kv_cache_tokens", "tokens held in the KV cache (live sequences and retained "
                               "prompts)", registry=r)
        self.kv_peak = Gauge("structspec_kv_cache_tokens_peak", "the most tokens held in the KV cache at once since "
                             "the model loaded", registry=r)
        self.kv_bytes = Gauge("structspec_kv_cache_allocated_bytes", "bytes of the KV-cache buffers", registry=r)
        self.serving = Gauge("structspec_serving", "1 while the server is SERVING (model loaded, not draining)", registry=r)
        self.store_up = Gauge("structspec_store_up", "1 while the store can be reached (its last write or check "
                              "succeeded); 0: registry writes are refused, statistics wait in memory", registry=r)
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
        self.kv_tokens.set_function(read(lambda e: e.core.executor.cached_tokens()))  # type: ignore[attr-defined]
        self.kv_peak.set_function(read(lambda e: e.core.executor.peak_cached_tokens()))  # type: ignore[attr-defined]
        self.kv_bytes.set_function(read(lambda e: e.core.executor.allocated_bytes()))  # type: ignore[attr-defined]

    def bind_stats(self, book: StatsBook, model: Callable[[], str | None] = lambda: None) -> None:
        """The per-schema series, from the book the engine records into; ``model``: the engine's model key."""
        self.registry.register(SchemaCollector(book, model))

    def bind_store(self, store: Store) -> None:
        """The store's backlog series, read at scrape time."""
        self.registry.register(BacklogCollector(store))

    def watch_engine(self, engine: EngineAPI) -> None:
        """Hear the engine's grammar compiles (an engine without a grammar cache has none to hear)."""
        cache = getattr(getattr(engine, "compiler", None), "cache", None)
        observers = getattr(cache, "observers", None)
        if isinstance(observers, list):
            observers.append(self._grammar_observed)

    def _grammar_observed(self, kind: str, seconds: float) -> None:
        (self.compile_seconds if kind == "compile" else self.compile_wait).observe(seconds)

    def delta_timer(self, started: float) -> DeltaTimer:
        """Time a stream's deltas (``started``: the request's ``time.perf_counter()`` start)."""
        return DeltaTimer(self, started)

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
        return int(server.server_port)

    def stop_http(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(timeout=5)
            self._http = None
