"""Rows a store refused for what they hold: kept apart from the rows behind them, counted and logged, never retried.

A write fails for one of two reasons. Either the store cannot be written now (the connection is lost, the
database is locked, a disk error, a table missing): every write would fail alike, so the rows wait and the next
flush retries them. Or the store refuses these rows (a value out of its column's range, text it cannot hold, a
constraint; ``refused``): retried, they would fail forever and hold back every row behind them. A store then
writes the refused write's rows in halves (``halves``) until each refused row is alone, writes the others, and
puts each refused row here (``Quarantine``): the newest ``limit`` kept in memory (``rows``, for whoever debugs
it), every one counted per kind (``counts``; the metric ``structspec_stats_quarantined``), and the first of each
kind and error logged with the reason (not the row: rows hold callers' text; the others at debug level); past
``limit`` the oldest kept row is dropped, counted in ``dropped``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, TypeVar

from structspec.store.base import StoreError, StoreUnavailable

log = logging.getLogger("structspec.store")

# Raised while a row is turned into a statement's parameters: the row's own values (an int past 64 bits, a string
# the driver cannot encode), whatever the store.
DATA_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, OverflowError)

P = TypeVar("P", list, dict)


def refused(exc: BaseException, driver_errors: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc``, raised by a write, says the store refuses the written rows (``driver_errors``: the driver's
    exceptions that say so, e.g. a data error or a constraint), rather than that it cannot be written now."""
    if isinstance(exc, StoreUnavailable):
        return False
    cause = exc.__cause__ if isinstance(exc, StoreError) else exc
    return isinstance(cause, driver_errors + DATA_ERRORS)


def halves(part: P) -> tuple[P, P]:
    """A list's or a dict's first and second half (in order)."""
    if isinstance(part, dict):
        items = list(part.items())
        return dict(items[:len(items) // 2]), dict(items[len(items) // 2:])
    return part[:len(part) // 2], part[len(part) // 2:]


@dataclass(frozen=True)
class Refused:
    kind: str  # a backlog kind: counters | history | samples | traffic | policy_changes
    row: Any  # as the store was given it (a counter: its (key, value))
    reason: str  # the store's error
    at: float  # unix seconds


class Quarantine:
    """Thread-safe; ``limit`` >= 1 rows kept."""

    def __init__(self, limit: int = 1000):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.dropped = 0  # refused rows no longer kept because ``limit`` newer ones were
        self._rows: deque[Refused] = deque()
        self._counts: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()  # (kind, error type) logged at error level
        self._lock = threading.Lock()

    def add(self, kind: str, row: Any, exc: BaseException) -> None:
        error = type(exc.__cause__ or exc).__name__
        reason = f"{error}: {exc}"
        with self._lock:
            self._rows.append(Refused(kind, row, reason, time.time()))
            self._counts[kind] = self._counts.get(kind, 0) + 1
            while len(self._rows) > self.limit:
                self._rows.popleft()
                self.dropped += 1
            first = (kind, error) not in self._logged
            self._logged.add((kind, error))
        log.log(logging.ERROR if first else logging.DEBUG, "the store refused a %s row: quarantined, not retried (the "
                "rows after it are written; structspec_stats_quarantined counts them): %s", kind, reason)

    def counts(self) -> dict[str, int]:
        """Rows refused per kind since the process started."""
        with self._lock:
            return dict(self._counts)

    def rows(self) -> list[Refused]:
        """The newest ``limit`` refused rows, oldest first."""
        with self._lock:
            return list(self._rows)
