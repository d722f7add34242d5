"""Compile under a time budget, so that a pathological schema cannot stall a request.

The compile runs on a compile worker, a daemon thread (llguidance releases the GIL while it
builds a matcher); past the budget the caller gets ``SchemaError(kind="timeout")`` and the
worker is abandoned: it finishes on its own, bounded by llguidance's fuel and size limits, and
its result is dropped. outlines-core has no such limits: its builds run in a worker process
that is killed at the same deadline (``outlines_worker``). ``abandoned()`` counts the abandoned
compiles still running.

Workers are kept for the next compile (up to ``IDLE_WORKERS`` idle ones): starting a thread
for each compile costs a start handshake on top of the hand-over (about 140 us against 35 us
on a quiet CPU, milliseconds on a busy one), a tenth of a typical llguidance compile.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from structspec.grammar.base import SchemaError, SchemaIssue

T = TypeVar("T")

IDLE_WORKERS = 4  # a burst of concurrent compiles starts more; past this many idle ones they end

_lock = threading.Lock()
_abandoned = 0
_idle: list[_Worker] = []


class _Job:
    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.outcome: dict[str, Any] = {}
        self.done = threading.Event()
        self.finished = False  # under _lock: the caller and the worker agree on who was late
        self.late = False

    def run(self) -> None:
        global _abandoned
        try:
            self.outcome["value"] = self.fn()
        except BaseException as exc:  # handed over to the caller's thread
            self.outcome["error"] = exc
        finally:
            with _lock:
                self.finished = True
                if self.late:
                    _abandoned -= 1
            self.done.set()


class _Worker:
    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="grammar-compile", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self.inbox.get()
            job.run()
            del job  # nothing of a finished compile stays alive on an idle worker
            with _lock:
                if len(_idle) >= IDLE_WORKERS:
                    return
                _idle.append(self)


def run_with_deadline(fn: Callable[[], T], timeout_s: float) -> T:
    global _abandoned
    job = _Job(fn)
    with _lock:
        worker = _idle.pop() if _idle else None
    (worker or _Worker()).inbox.put(job)
    job.done.wait(timeout_s)
    with _lock:
        if not job.finished:
            job.late = True
            _abandoned += 1
    if job.late:
        raise SchemaError([SchemaIssue("", "", f"compile took longer than {timeout_s:g} s")], kind="timeout")
    if "error" in job.outcome:
        raise job.outcome["error"]
    return cast(T, job.outcome["value"])  # what fn returned


def abandoned() -> int:
    """Compiles that timed out and are still running."""
    return _abandoned
