"""Run one-off model work (loading, allocating caches, baseline runs) on a short-lived thread.

Why: the engine computes on its own thread, and with torch's OpenMP runtime a
thread that runs parallel ops is much slower while another live thread owns an
OpenMP pool (one made by any earlier parallel op on that thread). Measured here
(Gemma 3 270M, fp32, 2 threads): a batch-1 decode step takes 42 ms on the engine
thread, 60-65 ms once the main thread has run a single 1000x1000 matmul or a
fill of a KV buffer. A pool dies with its thread, so work done on a thread that
then exits leaves nothing behind; the main thread stays free of pools.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def run_in_worker(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on a fresh thread that exits afterwards; returns its result or raises its error."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"structspec-worker-{getattr(fn, '__name__', 'fn')}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
