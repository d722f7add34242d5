"""One call through either front, guarded the same way whatever its protocol.

- request id: the first well-formed id the caller offered (``x-request-id`` metadata or header, then the
  request's own field), else a new one; logged with every line about the call and sent back.
- deadline: when the caller stops waiting, as a ``time.monotonic()`` value (the engine's clock); None for none.
  Whether it has passed is ``deadlines.deadline_passed``; ``guarded`` cancels an engine call just after it.
- ``Call``: what one call carries while it runs (its rpc name, which labels metrics and logs: a gRPC method or
  an HTTP route; its request id, deadline, the caller's tenant and history scope, the engine's result).
- ``CallGuard``: how a call ends: cancelled (the caller left or its deadline passed), failed (any exception,
  mapped to a ``FrontError`` and logged), or done; each call is observed in the metrics once.
- ``EngineSlot``: the engine once loaded; a call before that, or while the server drains, gets UNAVAILABLE.

The protocol fronts wrap this: the gRPC servicer's ``_rpc`` aborts with the error's status, HTTP's ``_run``
renders it in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Awaitable, Iterable, TypeVar

from structspec.engine.api import EngineAPI
from structspec.engine.types import GenerationResult
from structspec.front.deadlines import deadline_passed
from structspec.front.errors import Code, FrontError, deadline_exceeded
from structspec.front.failures import from_exception
from structspec.front.limits import Limits
from structspec.front.metrics import ServiceMetrics

log = logging.getLogger("structspec.service")
T = TypeVar("T")

REQUEST_ID_KEY = "x-request-id"
# The engine ends a request at its deadline by itself; this guard cancels it shortly after in
# case it does not, so no decoding outlives the caller's deadline.
DEADLINE_SLACK_S = 0.05
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class EngineSlot:
    """The engine once loaded; requests before that, or while draining, get UNAVAILABLE."""

    def __init__(self, engine: EngineAPI | None = None):
        self.engine = engine
        self.draining = False

    def require(self) -> EngineAPI:
        if self.draining:
            raise FrontError(Code.UNAVAILABLE, "server is shutting down", "DRAINING")
        if self.engine is None:
            raise FrontError(Code.UNAVAILABLE, "model is loading; retry shortly", "MODEL_LOADING")
        return self.engine

    def model_key(self) -> str:
        """The model the engine keeps statistics under (known once it is loaded; draining or not)."""
        if self.engine is None:
            raise FrontError(Code.UNAVAILABLE, "model is loading, so the server's model is not known yet; set model "
                             "to read a model's statistics, or retry shortly", "MODEL_LOADING")
        return self.engine.model_key


@dataclass
class Call:
    rpc: str
    request_id: str
    deadline: float | None = None
    started: float = field(default_factory=time.perf_counter)
    result: GenerationResult | None = None
    schema_field: str = "json_schema"  # the request field a schema error names (json_schema, schema_ref, tools)
    tenant: str = ""  # the caller's tenant ("": the one tenant of a server without tokens)
    history_scope: str = ""  # the caller's scope for the schema history ("": shared)
    done: bool = False  # observed in the metrics


def history_scope_of_token(token: str | None) -> str:
    """A stable name of a bearer token (never the token itself): ``t:<16 hex of its SHA-256>``; "" for none."""
    return f"t:{hashlib.sha256(token.encode()).hexdigest()[:16]}" if token else ""


def caller_scopes(token: str | None, limits: Limits) -> tuple[str, str]:
    """The caller's tenant (its token's name with auth tokens configured, else "") and its schema-history scope
    (its tenant with ``history_scope = per_token``, else "": shared)."""
    tenant = history_scope_of_token(token) if limits.tenants else ""
    return tenant, tenant if limits.history_per_token else ""


def request_id_from(offered: Iterable[str | None]) -> str:
    """The first well-formed request id offered (metadata or header first, then the request's own), else a new one."""
    for value in offered:
        if isinstance(value, str) and _REQUEST_ID_RE.match(value):
            return value
    return uuid.uuid4().hex[:16]


def cancelled_code(deadline: float | None) -> Code:
    """Why a call ended while it waited: its deadline passed, or it was cancelled (the client left)."""
    return Code.DEADLINE_EXCEEDED if deadline_passed(deadline) else Code.CANCELLED


async def guarded(deadline: float | None, awaitable: Awaitable[T]) -> T:
    """Await an engine call, cancelling it just after ``deadline`` (a ``time.monotonic()`` value)."""
    if deadline is None:
        return await awaitable
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic()) + DEADLINE_SLACK_S):
            return await awaitable
    except TimeoutError:
        raise deadline_exceeded() from None


class CallGuard:
    """How calls end: each is classified and logged here, and observed in ``metrics`` once."""

    def __init__(self, metrics: ServiceMetrics, ends_log: logging.Logger = log):
        self.metrics = metrics
        self.ends_log = ends_log  # the front's own logger for its cancelled and per-call lines; failures go to ``log``

    def cancelled(self, call: Call) -> Code:
        """The code of a call that ended while it waited (the caller left, or its deadline passed), logged."""
        code = cancelled_code(call.deadline)
        self.ends_log.info("rpc=%s request_id=%s %s", call.rpc, call.request_id, code.name.lower())
        return code

    def failed(self, call: Call, exc: Exception) -> FrontError:
        """The error to answer ``exc`` with (``failures.from_exception``; INTERNAL for anything unexpected), logged."""
        err = from_exception(exc, call.schema_field)
        if err is None:
            log.error("rpc=%s request_id=%s internal error", call.rpc, call.request_id, exc_info=exc)
            err = FrontError(Code.INTERNAL, f"internal error (request id {call.request_id})", "INTERNAL")
        elif err.code is Code.INTERNAL:
            log.error("rpc=%s request_id=%s %s: %s", call.rpc, call.request_id, err.reason, err.message)
        else:
            log.info("rpc=%s request_id=%s %s: %s", call.rpc, call.request_id, err.code.name, err.message)
        return err

    def finish(self, call: Call, code: Code) -> None:
        """Observe the call in the metrics (only the first time: a stream may end on several paths)."""
        if call.done:
            return
        call.done = True
        seconds = time.perf_counter() - call.started
        self.metrics.observe(call.rpc, code.name, seconds, call.result)
        self.ends_log.debug("rpc=%s request_id=%s code=%s ms=%.1f", call.rpc, call.request_id, code.name,
                            seconds * 1000)
