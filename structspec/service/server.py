"""The asyncio gRPC server and, beside it in the same loop, the OpenAI-compatible HTTP API: wiring (store,
registry, servicer, health, reflection, auth, TLS, metrics) and the lifecycle (load the engine while
NOT_SERVING, drain both on SIGTERM; write the statistics periodically and ride out a store that cannot be
reached: health service ``structspec.store`` NOT_SERVING, everything else serving from memory).

    server = StructSpecServer(settings, engine=my_engine)   # dependency injection (tests)
    await server.start(); ...; await server.stop(grace=5)

    run_server(settings, engine_factory)                    # `structspec serve`
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import ipaddress
import logging
import signal
import threading
import time
from typing import Any, Awaitable, Callable, Mapping, Union

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from structspec.engine.api import EngineAPI
from structspec.front.auth import AuthConfig
from structspec.front.call import EngineSlot
from structspec.front.errors import FrontError
from structspec.front.metrics import ServiceMetrics
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc
from structspec.service.auth import AuthInterceptor
from structspec.front.limits import Limits
from structspec.service.http.app import OpenAIApp
from structspec.service.http.server import HttpServer
from structspec.service.pb_decode_guard import DecodeGuardInterceptor
from structspec.front.registry import SchemaRegistry, register_builtins
from structspec.service.servicer import StructSpecServicer
from structspec.service.settings import ServiceSettings
from structspec.service.tls import server_credentials
from structspec.stats.book import StatsBook
from structspec.store import Store, StoreError, StoreUnavailable, open_store

log = logging.getLogger("structspec.service")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["StructSpec"].full_name
# Its own health entry: NOT_SERVING while the store cannot be reached, when registry writes are refused (UNAVAILABLE
# STORE_UNAVAILABLE) and statistics wait in memory, and while the statistics' flushes fail for another reason; the
# server's own ("" and SERVICE_NAME) stays SERVING, since extraction goes on.
STORE_HEALTH_SERVICE = "structspec.store"
# gRPC itself refuses messages above this multiple of max_message_bytes (RESOURCE_EXHAUSTED);
# between 1x and this, the servicer answers INVALID_ARGUMENT with a readable message.
TRANSPORT_LIMIT_FACTOR = 2
PRUNE_INTERVAL_S = 3600  # statistics past the retention are pruned this often

# Called once, in a worker thread, with the settings (and ``store=`` when it takes that keyword);
# may return the engine or an awaitable of it. An engine with ``start()`` has it called (and
# awaited) on the server's loop; ``aclose()``/``close()`` is called after draining.
EngineFactory = Callable[..., Union[EngineAPI, Awaitable[EngineAPI]]]


class EngineUnavailable(RuntimeError):
    """The engine factory cannot be imported (e.g. the engine is not part of this build)."""


def load_factory(spec: str) -> Callable[..., Any]:
    """'module:callable' -> the callable, with a clear error when it is missing."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise EngineUnavailable(f"engine factory {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise EngineUnavailable(
            f"cannot import {module_name!r} ({exc}); the decoding engine is not available in this build. "
            "Use --engine-factory module:callable to plug one in."
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise EngineUnavailable(f"{module_name} has no callable {attr!r}")
    return factory


def accepts_store(factory: Callable[..., Any]) -> bool:
    """Whether ``factory`` takes a ``store`` keyword (then it gets the server's ``Store``)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "store" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def call_factory(factory: Callable[..., Any], settings: ServiceSettings, store: Store | None) -> Any:
    return factory(settings, store=store) if store is not None and accepts_store(factory) else factory(settings)


def chosen_engine_factory(settings: ServiceSettings, assembly: EngineFactory) -> EngineFactory:
    """The factory the server builds its engine with: ``assembly`` (``structspec serve`` passes
    ``structspec.assembly.build_engine``, through ``cli_serve.assembly_engine``), unless ``settings.engine_factory`` plugs another in as
    'module:callable' (a fake engine in tests), imported when it is called."""
    if not settings.engine_factory:
        return assembly

    def plugged(settings: ServiceSettings, store: Store | None = None) -> EngineAPI | Awaitable[EngineAPI]:
        return call_factory(load_factory(settings.engine_factory), settings, store)

    return plugged


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _logged(what: str, step: Awaitable[Any]) -> bool:
    """Await one statistics step; a failure is logged (the next period retries) and returns False."""
    try:
        await step
        return True
    except Exception:
        log.exception("%s failed (will retry)", what)
        return False


class StructSpecServer:
    def __init__(
        self,
        settings: ServiceSettings,
        engine: EngineAPI | None = None,
        *,
        store: Store | None = None,
        metrics: ServiceMetrics | None = None,
        builtin_schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        self.settings = settings
        self._slot = EngineSlot(None)
        self._initial_engine = engine
        self._owns_store = store is None
        self.store: Store = store if store is not None else open_store(
            settings.store_url, settings.data_dir,
            StatsBook(samples_per_hour=settings.rejection_samples_per_hour, max_unwritten=settings.stats_buffer_limit,
                      traffic_per_hour=settings.traffic_samples_per_hour),
            pool_size=settings.store_pool_size, timeout=settings.store_timeout_seconds,
            history_limit=settings.stats_buffer_limit)
        self.registry = SchemaRegistry(self.store)
        self.metrics = metrics or ServiceMetrics()
        self.metrics.bind_engine(lambda: self._slot.engine)
        self.metrics.bind_stats(self.store.stats,
                                lambda: self._slot.engine.model_key if self._slot.engine is not None else None)
        self.metrics.bind_store(self.store)
        self.store_up = True  # the store's last write or check succeeded
        self._dropped_seen = 0
        self._builtin_schemas = builtin_schemas
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._flusher: list[asyncio.Task[None]] = []  # the statistics' tasks: flush, refresh, prune
        self._stopped = asyncio.Event()
        self._stopping = False
        self._http: HttpServer | None = None
        self.port = 0
        self.metrics_port: int | None = None
        self.http_port: int | None = None  # the OpenAI-compatible HTTP API's, when it listens

    @property
    def engine(self) -> EngineAPI | None:
        return self._slot.engine

    async def start(self) -> None:
        s = self.settings
        await self.store.open()
        # the policy starts from what the store holds (before the engine loads, so it drafts informed)
        await _logged("loading statistics", self.store.refresh_stats())
        if s.register_builtin_schemas:
            if self._builtin_schemas is None:
                from structspec.schemas import SCHEMAS_DIR, load_builtin_schemas

                self._builtin_schemas = load_builtin_schemas()
                if not self._builtin_schemas:
                    log.warning("no built-in schemas found in %s (is the package installed from a checkout?)", SCHEMAS_DIR)
            for record, created in await register_builtins(self.registry, self._builtin_schemas):
                if created:
                    log.info("built-in schema %s registered as version %d", record.schema_id, record.version)
        await _logged("reading the registry", self.registry.warm())  # what extraction resolves during an outage

        auth = AuthConfig(s.tokens(), s.admin_tokens())
        # Auth first (a denied call is denied whatever its bytes), then the guard that answers
        # undecodable requests with INVALID_ARGUMENT instead of the runtime's UNKNOWN.
        interceptors: list[grpc.aio.ServerInterceptor] = [AuthInterceptor(auth, self._on_denied)] if auth.enabled else []
        interceptors.append(DecodeGuardInterceptor(self._on_malformed))
        if not auth.enabled and not _is_loopback(s.host):
            log.warning("no auth token configured and listening on %s: every client can call every RPC", s.host)
        transport_limit = s.max_message_bytes * TRANSPORT_LIMIT_FACTOR
        options = [
            ("grpc.max_receive_message_length", transport_limit),
            ("grpc.max_send_message_length", transport_limit),
            ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
        ]
        if s.max_connection_age_seconds > 0:  # clients reconnect, and re-resolve a dns:/// target, this often
            options += [("grpc.max_connection_age_ms", int(s.max_connection_age_seconds * 1000)),
                        ("grpc.max_connection_age_grace_ms", int(s.drain_grace_seconds * 1000))]
        server = grpc.aio.server(
            interceptors=interceptors, options=options, maximum_concurrent_rpcs=s.max_concurrent_rpcs or None
        )
        limits = Limits(s.max_tokens_cap, s.max_message_bytes,
                        history_per_token=s.history_scope == "per_token" and auth.enabled, tenants=auth.enabled)
        servicer = StructSpecServicer(self._slot, self.registry, self.store, self.metrics, limits, auth=auth,
                                      policy=s.engine_config().policy)  # the statistics price drafts as it does
        pb_grpc.add_StructSpecServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        await self._set_health(False)
        await self._health.set(STORE_HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self.metrics.store_up.set(1)

        address = _bind_address(s.host, s.port)
        if s.tls_cert_file is not None and s.tls_key_file is not None:
            creds = server_credentials(s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file)
            self.port = server.add_secure_port(address, creds)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        try:
            if s.http_port >= 0:
                app = OpenAIApp(self._slot, self.registry, self.store, self.metrics, limits, auth, s.served_name,
                                max_in_flight=s.max_concurrent_rpcs).build()
                self._http = HttpServer(app, s.host, s.http_port, cert_file=s.tls_cert_file, key_file=s.tls_key_file,
                                        client_ca_file=s.tls_client_ca_file)
                self.http_port = await self._http.start()
            if s.metrics_port >= 0:
                self.metrics_port = self.metrics.start_http(s.host, s.metrics_port)
        except BaseException:  # a port already taken: nothing stays listening
            await server.stop(0)
            if self._http is not None:
                await self._http.stop(0)
            raise
        self._flusher = [asyncio.create_task(self._flush_loop(), name="structspec-stats-flush"),
                         asyncio.create_task(self._refresh_loop(), name="structspec-stats-refresh"),
                         asyncio.create_task(self._prune_loop(), name="structspec-stats-prune")]
        log.info(
            "structspec listening on %s (tls=%s, mtls=%s, auth=%s, OpenAI HTTP port=%s, metrics port=%s)",
            _bind_address(s.host, self.port), s.tls_enabled, s.tls_client_ca_file is not None, auth.enabled,
            self.http_port, self.metrics_port,
        )
        if self._initial_engine is not None:
            await self.set_engine(self._initial_engine)

    async def set_engine(self, engine: EngineAPI) -> None:
        start = getattr(engine, "start", None)
        if callable(start):
            await _maybe_await(start())
        self._slot.engine = engine
        self.metrics.watch_engine(engine)
        watch = getattr(engine, "watch_health", None)
        if callable(watch):  # an engine that can die on its own (vLLM's engine core): NOT_SERVING once it has
            watch(self._on_engine_dead)
        if not self._stopping:
            await self._set_health(True)
            log.info("engine ready: SERVING")

    def _on_engine_dead(self) -> None:
        """Called on the event loop by an engine whose core has died."""
        self._died = asyncio.get_running_loop().create_task(self._engine_died())

    async def _engine_died(self) -> None:
        log.error("the engine died: NOT_SERVING")
        await self._set_health(False)

    async def load_engine(self, factory: EngineFactory) -> EngineAPI:
        """Build the engine in a daemon thread (model loading blocks; health stays NOT_SERVING
        meanwhile and a SIGTERM during loading does not wait for it), then serve. The factory
        gets ``store=self.store`` if it takes that keyword: speculation statistics recorded
        there are flushed by the server periodically and at shutdown."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, error: BaseException | None) -> None:
            if not future.done():
                future.set_result(value) if error is None else future.set_exception(error)

        def build() -> None:
            value: Any = None
            error: BaseException | None = None
            try:
                value = call_factory(factory, self.settings, self.store)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop
                error = exc
            try:
                loop.call_soon_threadsafe(settle, value, error)
            except RuntimeError:  # the loop closed while loading (shutdown during load)
                pass

        started = time.perf_counter()
        threading.Thread(target=build, name="structspec-engine-load", daemon=True).start()
        engine = await _maybe_await(await future)
        log.info("engine built in %.1f s", time.perf_counter() - started)
        await self.set_engine(engine)
        return engine

    async def _set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self._health.set(name, status)
        self.metrics.serving.set(1 if serving else 0)

    def _on_denied(self, method: str, err: FrontError) -> None:
        self.metrics.requests.labels(method.rsplit("/", 1)[-1], err.code.name, "").inc()

    def _on_malformed(self, method: str) -> None:
        rpc = method.rsplit("/", 1)[-1]
        self.metrics.requests.labels(rpc, grpc.StatusCode.INVALID_ARGUMENT.name, "").inc()
        self.metrics.malformed.labels(rpc).inc()

    async def _flush_loop(self) -> None:
        """Every interval, write what was recorded (or, with nothing to write, check that the store answers). Its
        own task: a refresh or a prune, however long, never delays it (what a SIGKILL loses is one interval)."""
        s = self.settings
        while True:
            started = time.monotonic()
            self._report_drops()
            if await self._store_step("writing statistics", self.store.flush(), writes=True):
                await self._store_step("checking the store", self.store.check())
            # the next flush one interval after this one started (at once when this one took longer)
            await asyncio.sleep(max(0.0, s.stats_flush_interval_seconds - (time.monotonic() - started)))

    async def _refresh_loop(self) -> None:
        """Every refresh period, reload the store's counters into the book the drafting policy reads (every
        replica's traffic) and the registry's records; skipped while the store cannot be reached."""
        while True:
            await asyncio.sleep(self.settings.stats_refresh_seconds)  # start() loaded the counters already
            if self.store_up and await self._store_step("reloading statistics", self.store.refresh_stats()):
                await self._store_step("reading the registry", self.registry.warm())

    async def _prune_loop(self) -> None:
        """Hourly (from the start), drop statistics past the retention; retried each refresh period after a
        failure or while the store cannot be reached."""
        s = self.settings
        while True:
            if self.store_up and await self._store_step(
                    "pruning statistics", self.store.prune(time.time() - s.stats_retention_days * 86400)):
                await asyncio.sleep(PRUNE_INTERVAL_S)
            else:
                await asyncio.sleep(s.stats_refresh_seconds)

    async def _store_step(self, what: str, step: Awaitable[Any], writes: bool = False) -> bool:
        """Await one store step; an unreachable store is reported once (``_set_store_up``), another failure logged
        each time (the next period retries); a flush (``writes``) that fails otherwise marks the store down too, until
        one succeeds: statistics wait in memory as when it cannot be reached. Whether it succeeded."""
        try:
            await step
        except StoreUnavailable as exc:
            await self._set_store_up(False, str(exc))
            return False
        except Exception as exc:
            log.exception("%s failed (will retry)", what)
            if writes:
                await self._set_store_up(False, f"{what} failed: {exc}", unreachable=False)
            return False
        await self._set_store_up(True)
        return True

    async def _set_store_up(self, up: bool, why: str = "", unreachable: bool = True) -> None:
        if up == self.store_up:
            return
        self.store_up = up
        self.metrics.store_up.set(1 if up else 0)
        if not self._stopping:
            await self._health.set(STORE_HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING if up
                                   else health_pb2.HealthCheckResponse.NOT_SERVING)
        if up:
            log.info("store reachable again: the statistics kept meanwhile are written; registry writes accepted")
        elif unreachable:
            log.warning("store unreachable (%s): serving from memory (known schemas, the policy's statistics), "
                        "registry writes answer UNAVAILABLE, statistics wait in memory (at most %d counter rows; "
                        "structspec_stats_unwritten)", why, self.settings.stats_buffer_limit)
        else:
            log.warning("store cannot be written (%s): statistics wait in memory (at most %d counter rows; "
                        "structspec_stats_unwritten) and the flush is retried each interval", why,
                        self.settings.stats_buffer_limit)

    def _report_drops(self) -> None:
        """Log statistics dropped since the last report (a kind's bound reached while the store was unreachable)."""
        dropped = self.store.backlog().dropped
        total = sum(dropped.values())
        if total > self._dropped_seen:
            log.warning("statistics dropped, the store unreachable too long for the buffers: %s in all since start "
                        "(structspec_stats_dropped_total)", {k: v for k, v in dropped.items() if v})
            self._dropped_seen = total

    def cut_drain_short(self) -> None:
        """Cancel the in-flight requests now instead of at the end of the grace period (a second signal)."""
        if self._stopping and self._server is not None:
            log.info("second signal: cancelling the in-flight requests now")
            asyncio.get_running_loop().create_task(self._server.stop(0))
            if self._http is not None:
                self._http.cut_short()

    async def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new RPCs and HTTP requests, let in-flight ones finish within ``grace``
        seconds (default: settings), cancel the rest, then close the engine and flush the store."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.settings.drain_grace_seconds if grace is None else grace
        self._slot.draining = True
        await self._health.enter_graceful_shutdown()
        self.metrics.serving.set(0)
        log.info("draining: up to %.1f s for in-flight requests", grace)
        try:
            # both protocols drain at once, within the same grace
            await asyncio.gather(*([self._server.stop(grace)] if self._server is not None else []),
                                 *([self._http.stop(grace)] if self._http is not None else []))
            for task in self._flusher:
                task.cancel()
            await asyncio.gather(*self._flusher, return_exceptions=True)
            engine = self._slot.engine
            for name in ("aclose", "close"):
                closer = getattr(engine, name, None)
                if callable(closer):
                    try:
                        await asyncio.wait_for(_maybe_await(closer()), timeout=10)
                    except Exception:
                        log.exception("closing the engine failed")
                    break
            try:
                if self._owns_store:
                    await self.store.close()
                else:
                    await self.store.flush()
            except StoreUnavailable as exc:
                log.error("the store is unreachable at shutdown, so these statistics are lost: %s (%s)",
                          {k: v for k, v in self.store.backlog().unwritten.items() if v}, exc)
            except Exception:
                log.exception("flushing the store failed")
            self.metrics.stop_http()
            log.info("stopped")
        finally:
            self._stopped.set()

    async def __aenter__(self) -> "StructSpecServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop(grace=0)


def configure_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("structspec").setLevel(level)
    # psycopg's pool warns at each reconnection attempt while the database is away; the server says so once
    # ("store unreachable", then "store reachable again") and structspec_store_up shows it
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


async def serve(settings: ServiceSettings, engine_factory: EngineFactory) -> int:
    """Run until SIGTERM/SIGINT; 0 after a clean drain, 1 if the engine failed to load. ``engine_factory``: the
    assembly's (``settings.engine_factory`` replaces it where set)."""
    factory = chosen_engine_factory(settings, engine_factory)
    server = StructSpecServer(settings)
    try:
        await server.start()
    except StoreError as exc:  # the store must be reachable at start: its schema is checked there
        log.error("cannot open the store: %s", exc)
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loader = asyncio.create_task(server.load_engine(factory), name="structspec-engine-load")
    stopper = asyncio.create_task(stop.wait())
    rc = 0
    try:
        done, _ = await asyncio.wait({loader, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if loader in done and loader.exception() is not None:
            failure = loader.exception()
            log.error("engine failed to load: %s", failure, exc_info=not isinstance(failure, EngineUnavailable))
            rc = 1
        elif loader in done:
            await stopper
            log.info("signal received")
        else:
            log.info("signal received while the engine was loading")
            loader.cancel()
    finally:
        stopper.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal cuts the drain short
            loop.remove_signal_handler(sig)
            loop.add_signal_handler(sig, server.cut_drain_short)
        try:
            await server.stop(settings.drain_grace_seconds)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return rc


def run_server(settings: ServiceSettings, engine_factory: EngineFactory) -> int:
    """Blocking entry point of ``structspec serve``; returns the process exit code."""
    configure_logging(settings.log_level)
    log.info("settings: %s", settings.public_dict())
    return asyncio.run(serve(settings, engine_factory))
