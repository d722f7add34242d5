"""When a call has run out of time: the one rule both the call guard and the result check apply.

A *deadline* is when the caller stops waiting, as a ``time.monotonic()`` value (the engine's clock); None for
none. A call that ended at most ``DEADLINE_TOLERANCE_S`` before its deadline counts as past it: the protocol's
own timer (gRPC's deadline, an HTTP client's timeout) may fire a few milliseconds ahead of this clock, and such an
end is the deadline's (DEADLINE_EXCEEDED), not the caller's leaving (CANCELLED).
"""

from __future__ import annotations

import time

DEADLINE_TOLERANCE_S = 0.005


def deadline_passed(deadline: float | None, now: float | None = None) -> bool:
    """Whether ``deadline`` has passed at ``now`` (default: ``time.monotonic()``), within ``DEADLINE_TOLERANCE_S``;
    never for no deadline."""
    if deadline is None:
        return False
    return (time.monotonic() if now is None else now) >= deadline - DEADLINE_TOLERANCE_S
