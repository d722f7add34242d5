"""Finished outputs waiting to be written to the store's schema history: bounded, drops counted.

The decode path appends (never blocks on I/O); a flush ``take``s what is there and, when its
write fails, ``restore``s it in front of what was appended meanwhile. While the store cannot be
written the buffer holds at most ``limit`` outputs: past it the oldest are dropped (the history
proposer drafts from recent outputs, so the newest are the ones worth keeping) and counted in
``dropped``.
"""

from __future__ import annotations

import threading
from collections import deque

HistoryRow = tuple[str, str, str, float]  # (model, history key, text, unix seconds)


class HistoryBuffer:
    """Thread-safe. ``limit`` >= 1."""

    def __init__(self, limit: int = 100_000):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.dropped = 0  # outputs dropped because the buffer was full
        self._rows: deque[HistoryRow] = deque()
        self._lock = threading.Lock()

    def append(self, model: str, history_key: str, text: str, now: float) -> None:
        with self._lock:
            self._rows.append((model, history_key, text, now))
            self._trim()

    def take(self) -> list[HistoryRow]:
        """Everything appended since the last take, oldest first."""
        with self._lock:
            rows, self._rows = list(self._rows), deque()
        return rows

    def restore(self, rows: list[HistoryRow]) -> None:
        """A write of ``rows`` failed: put them back before what was appended since (the bound still holds)."""
        with self._lock:
            self._rows.extendleft(reversed(rows))
            self._trim()

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def _trim(self) -> None:
        while len(self._rows) > self.limit:
            self._rows.popleft()
            self.dropped += 1
