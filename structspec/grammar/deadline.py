"""Compile under a time budget, so that a pathological schema cannot stall a request.

The compile runs in a daemon thread (llguidance releases the GIL while it builds a
matcher); past the budget the caller gets ``SchemaError(kind="timeout")`` and the
thread is abandoned: it finishes on its own, bounded by llguidance's fuel and size
limits, and its result is dropped. outlines-core has no such limits: its builds run
in a worker process that is killed at the same deadline (``outlines_worker``).
``abandoned()`` counts the abandoned threads still running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from structspec.grammar.base import SchemaError, SchemaIssue

T = TypeVar("T")

_lock = threading.Lock()
_abandoned = 0


def run_with_deadline(fn: Callable[[], T], timeout_s: float) -> T:
    global _abandoned
    outcome: dict[str, object] = {}
    state = {"done": False, "late": False}

    def work() -> None:
        global _abandoned
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed over to the caller's thread
            outcome["error"] = exc
        finally:
            with _lock:
                state["done"] = True
                if state["late"]:
                    _abandoned -= 1

    thread = threading.Thread(target=work, name="grammar-compile", daemon=True)
    thread.start()
    thread.join(timeout_s)
    with _lock:
        if not state["done"]:
            state["late"] = True
            _abandoned += 1
    if state["late"]:
        raise SchemaError([SchemaIssue("", "", f"compile took longer than {timeout_s:g} s")], kind="timeout")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def abandoned() -> int:
    """Compiles that timed out and are still running."""
    return _abandoned
