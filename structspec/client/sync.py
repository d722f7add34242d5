"""The blocking client."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from structspec.client import convert, stats_decode
from structspec.client.channel import (RetryPolicy, TLSConfig, auth_metadata, channel_options, channel_target,
                                       resolve_tls)
from structspec.client.errors import (DeadlineExceededError, InternalError, UnavailableError, error_from_rpc,
                                     may_have_started)
from structspec.client.results import ChatResult, DraftLoad, ExtractionResult, SchemaInfo, TextDelta, ToolCallResult
from structspec.front.views import RejectedDraft, SchemaStats
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.proto_gen.v1 import structspec_pb2_grpc as pb_grpc


log = logging.getLogger("structspec.client")

def deadline_after(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, "timeout passed before the request could be sent")
    return left


def warn_if_restarted(exc: grpc.RpcError) -> None:
    """Say so when a retry may run a request a second time (never silently)."""
    if may_have_started(exc):
        log.warning("the server dropped a call that may already have started (UNAVAILABLE: %s); retrying it, so "
                    "it may run twice", exc.details() if hasattr(exc, "details") else exc)


def retry_delay(exc: grpc.RpcError, delays: Iterator[float], deadline: float | None) -> float | None:
    """The wait before the next attempt, or None when ``exc`` must be raised."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    delay = next(delays, None)
    if delay is None or (deadline is not None and time.monotonic() + delay >= deadline):
        return None
    return delay


class Client:
    """``Client("host:port", token=..., tls=...)``: extraction, tool calls, schema registry.

    Several replicas: ``Client("dns:///structspec.ns.svc.cluster.local:50051")`` (every address the name resolves
    to) or ``Client(["10.0.0.5:50051", "10.0.0.6:50051"])``; each call goes to the next replica (``round_robin``)
    and an UNAVAILABLE one is retried on another (``structspec.client.channel``).

    ``timeout`` (seconds) is the default per-call deadline, retries included; every method
    takes ``timeout=`` too. Failed RPCs raise ``StructSpecError`` subclasses; truncated or
    schema-violating outputs raise ``TruncatedOutputError``/``SchemaViolationError``.
    """

    def __init__(
        self,
        target: str | Sequence[str] = "localhost:50051",
        *,
        token: str | None = None,
        admin_token: str | None = None,
        tls: bool | TLSConfig | None = None,
        timeout: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        load_balancing: str = "round_robin",
    ):
        self.target = channel_target(target)
        cfg = resolve_tls(tls)
        opts = channel_options(cfg, load_balancing)
        self._channel = (grpc.secure_channel(self.target, cfg.credentials(), opts) if cfg
                         else grpc.insecure_channel(self.target, opts))
        self._stub = pb_grpc.StructSpecStub(self._channel)
        self._metadata = auth_metadata(token)
        self._admin_metadata = auth_metadata(admin_token or token)
        self.timeout = timeout
        self.retry = retry

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any, timeout: float | None, admin: bool = False) -> Any:
        deadline = deadline_after(timeout if timeout is not None else self.timeout)
        delays = self.retry.delays()
        metadata = self._admin_metadata if admin else self._metadata
        while True:
            try:
                return method(request, timeout=remaining(deadline), metadata=metadata)
            except grpc.RpcError as exc:
                delay = retry_delay(exc, delays, deadline)
                if delay is None:
                    raise error_from_rpc(exc) from exc
                warn_if_restarted(exc)
                time.sleep(delay)

    # -- extraction -------------------------------------------------------------------------------

    def extract(self, text: str | None = None, *, model: Any = None, timeout: float | None = None, **kwargs: Any) -> Any:
        """The extracted value: a dict (or other JSON value), or an instance of ``model`` (a
        pydantic model class, whose JSON Schema is sent). Schema: ``schema_id=`` (+ ``version=``),
        ``schema=`` or ``model=``. Input: ``text`` or ``messages=``. Sampling: ``temperature``,
        ``top_p``, ``top_k``, ``seed``, ``max_tokens``; ``speculation="off"``; ``instruction``;
        ``examples=[(text, output), ...]`` worked examples (base models need one)."""
        result = self.extract_result(text, model=model, timeout=timeout, **kwargs)
        return convert.typed_value(result, model)

    def extract_result(self, text: str | None = None, *, timeout: float | None = None, **kwargs: Any) -> ExtractionResult:
        """The full result (usage, timings, finish reason) without raising for truncated or
        schema-violating outputs."""
        req = convert.extract_request(text=text, **kwargs)
        resp = self._call(self._stub.Extract, req, timeout)
        return ExtractionResult.from_pb(resp.result)

    def extract_stream(self, text: str | None = None, *, timeout: float | None = None, **kwargs: Any) -> Iterator[TextDelta | ExtractionResult]:
        """``TextDelta`` items as tokens are committed, then the ``ExtractionResult`` (raises
        ``TruncatedOutputError``/``SchemaViolationError`` instead, after the deltas). Stopping
        early (``break``, ``close()``) cancels the request on the server."""
        req = convert.extract_request(text=text, **kwargs)
        return self._stream(req, timeout)

    def _stream(self, req: Any, timeout: float | None, rpc: str = "ExtractStream",
                result_of: Callable[[Any], Any] = ExtractionResult.from_pb, check: bool = True) -> Iterator[Any]:
        """A streaming RPC's deltas, then its result (``result_of`` the result message; ``check``: raise for a
        truncated or schema-violating one)."""
        deadline = deadline_after(timeout if timeout is not None else self.timeout)
        delays = self.retry.delays()
        while True:
            call = getattr(self._stub, rpc)(req, timeout=remaining(deadline), metadata=self._metadata)
            received = False
            try:
                for resp in call:
                    received = True
                    if resp.HasField("delta"):
                        yield TextDelta(resp.delta.text)
                    else:
                        result = result_of(resp.result)
                        for _ in call:  # read to the end of the stream: the server then ends it OK, not cancelled
                            pass
                        if check:
                            convert.check_output(result)
                        yield result
                        return
                raise InternalError(grpc.StatusCode.INTERNAL, "stream ended without a result")
            except grpc.RpcError as exc:
                delay = None if received else retry_delay(exc, delays, deadline)
                if delay is None:
                    raise error_from_rpc(exc) from exc
                warn_if_restarted(exc)
            finally:
                call.cancel()  # no-op once finished; stops decoding when the caller stopped early
            time.sleep(delay)

    def call_tool(
        self, messages: Iterable[Any], tools: Sequence[Any], *, tool_choice: str = "auto", parallel: bool = False,
        timeout: float | None = None, check: bool = True, **kwargs: Any,
    ) -> ToolCallResult:
        """Tool calls (``.calls``: id, name, arguments dict) and/or a text answer (``.text``). ``tool_choice``:
        "auto", "required", "none" or a tool name. ``answer_schema=`` (a dict, JSON text or pydantic model class):
        a text answer is JSON valid against it (``.answer``). Send the tools' results back as
        ``[..., result.assistant_message(), {"role": "tool", "tool_call_id": call.id, "content": ...}]``.
        ``check=False`` returns truncated results (no calls, no text) instead of raising."""
        req = convert.tool_request(messages=messages, tools=tools, tool_choice=tool_choice, parallel=parallel, **kwargs)
        result = ToolCallResult.from_pb(self._call(self._stub.CallTool, req, timeout))
        if check:
            convert.check_output(result)
        return result

    # -- free text --------------------------------------------------------------------------------

    def chat(self, messages: Iterable[Any], *, stop: str | Sequence[str] | None = None,
             timeout: float | None = None, **kwargs: Any) -> ChatResult:
        """A free-text answer to ``messages`` (no schema, no tools): ``.text``, ``.finish_reason`` ("stop": the model
        ended its turn or wrote one of the ``stop`` strings, left out of the text; "length": ``max_tokens``
        reached, ``.truncated``), ``.usage``. Takes the sampling arguments of ``extract`` and ``speculation``."""
        req = convert.chat_request(messages=messages, stop=stop, **kwargs)
        return ChatResult.from_pb(self._call(self._stub.Chat, req, timeout).result)

    def chat_stream(self, messages: Iterable[Any], *, stop: str | Sequence[str] | None = None,
                    timeout: float | None = None, **kwargs: Any) -> Iterator[TextDelta | ChatResult]:
        """``TextDelta`` items as tokens are committed, then the ``ChatResult`` (a truncated one too). Stopping
        early cancels the request on the server."""
        req = convert.chat_request(messages=messages, stop=stop, **kwargs)
        return self._stream(req, timeout, "ChatStream", ChatResult.from_pb, check=False)

    # -- registry ---------------------------------------------------------------------------------

    def register_schema(self, schema_id: str, schema: Mapping[str, Any] | str | Any, *, description: str = "", timeout: float | None = None) -> SchemaInfo:
        """Register a dict, JSON text or pydantic model class; ``.created`` is False when the
        same content was already registered (its existing version is returned). Needs the admin token."""
        resp = self._call(self._stub.RegisterSchema, convert.register_request(schema_id, schema, description), timeout, admin=True)
        return SchemaInfo.from_pb(resp.schema, resp.created)

    def get_schema(self, schema_id: str, version: int | None = None, *, timeout: float | None = None) -> SchemaInfo:
        req = pb.GetSchemaRequest(schema_id=schema_id)
        if version is not None:
            req.version = version
        return SchemaInfo.from_pb(self._call(self._stub.GetSchema, req, timeout).schema)

    def list_schemas(self, schema_id: str | None = None, *, all_versions: bool = False, omit_content: bool = False, timeout: float | None = None) -> list[SchemaInfo]:
        req = pb.ListSchemasRequest(schema_id=schema_id or "", all_versions=all_versions, omit_content=omit_content)
        return [SchemaInfo.from_pb(s) for s in self._call(self._stub.ListSchemas, req, timeout).schemas]

    def delete_schema(self, schema_id: str, version: int | None = None, *, timeout: float | None = None) -> list[int]:
        """Delete one version (or all); returns the versions deleted. Needs the admin token."""
        req = pb.DeleteSchemaRequest(schema_id=schema_id)
        if version is not None:
            req.version = version
        return list(self._call(self._stub.DeleteSchema, req, timeout, admin=True).deleted_versions)

    def set_schema_speculation(self, schema_id: str, speculation: str, version: int | None = None, *,
                               timeout: float | None = None) -> SchemaInfo:
        """Set the drafting override of one version (the latest by default): "auto" (the policy decides),
        "off" (never draft) or "on" (always draft, the policy bypassed). Needs the admin token."""
        req = convert.set_speculation_request(schema_id, speculation, version)
        return SchemaInfo.from_pb(self._call(self._stub.SetSchemaSpeculation, req, timeout, admin=True).schema)

    def get_schema_stats(
        self, schema_id: str | None = None, version: int | None = None, *, schema_key: str | None = None,
        windows: Sequence[int] = (), model: str | None = None, include_timeline: bool = False,
        timeout: float | None = None,
    ) -> SchemaStats:
        """One schema's statistics on ``model`` (default: the model the server runs); ``include_timeline``: with
        its hourly timeline and the policy's changes over the longest window. Sent with the admin token when there
        is one: where tokens are configured, other tokens read registered schemas' statistics only."""
        req = convert.stats_request(schema_id, version, schema_key, windows, model, include_timeline)
        return stats_decode.schema_stats(self._call(self._stub.GetSchemaStats, req, timeout, admin=True).stats)

    def list_schema_stats(self, windows: Sequence[int] = (), *, model: str | None = None,
                          include_timeline: bool = False, timeout: float | None = None) -> list[SchemaStats]:
        """Every (model, schema) with statistics, sorted by model then key; ``model``: only that one's. Without the
        admin token where tokens are configured: the registered schemas' alone."""
        req = pb.ListSchemaStatsRequest(window_seconds=list(windows), model=model or "",
                                        include_timeline=include_timeline)
        return [stats_decode.schema_stats(s) for s in self._call(self._stub.ListSchemaStats, req, timeout, admin=True).stats]

    def list_rejected_drafts(self, schema_id: str | None = None, version: int | None = None, *,
                             schema_key: str | None = None, model: str | None = None, proposer: str | None = None,
                             limit: int = 20, timeout: float | None = None) -> list[RejectedDraft]:
        """Sampled rejected drafts of a schema (default: every schema), newest first. Needs the admin token."""
        req = convert.rejected_drafts_request(schema_id, version, schema_key, model, proposer, limit)
        return [stats_decode.rejected_draft(r)
                for r in self._call(self._stub.ListRejectedDrafts, req, timeout, admin=True).drafts]

    def load_draft(self, path: str, *, timeout: float | None = None) -> DraftLoad:
        """Make the server draft with the draft model in folder ``path`` (on the server) for requests admitted from
        now on; those in flight finish on theirs. Needs the admin token. Raises ``InvalidArgumentError`` (field
        ``path``) for a folder that is no draft of the served model, ``FailedPreconditionError`` where the server
        drafts without a draft model."""
        return DraftLoad.from_pb(self._call(self._stub.LoadDraft, pb.LoadDraftRequest(path=path), timeout, admin=True))

    def health(self, service: str = "", *, timeout: float | None = 5.0) -> str:
        """"SERVING", "NOT_SERVING", ... of the standard health service (no token needed)."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def wait_until_serving(self, timeout: float, *, poll: float = 0.5) -> None:
        """Block until the server reports SERVING (it answers NOT_SERVING while it loads its model, and
        cannot be reached before it listens). Raises ``UnavailableError`` after ``timeout`` seconds."""
        deadline, status = time.monotonic() + timeout, "unreachable"
        while True:
            try:
                status = self.health(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                if status == "SERVING":
                    return
            except UnavailableError:
                status = "unreachable"
            except DeadlineExceededError:
                status = "not answering"
            if time.monotonic() + poll > deadline:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"not SERVING after {timeout:g} s ({status})",
                                       "NOT_SERVING")
            time.sleep(poll)

