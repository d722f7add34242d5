"""Finished outputs waiting to be written to the store's schema history: bounded, drops counted.

The decode path appends (never blocks on I/O); a flush ``take``s what is there and, when its write fails,
``restore``s it in front of what was appended meanwhile. While the store cannot be written the buffer holds at
most ``limit`` outputs: past it the oldest are dropped (the history proposer drafts from recent outputs, so the
newest are the ones worth keeping) and counted in ``dropped``.
"""

from __future__ import annotations

from structspec.stats.pending import Pending

HistoryRow = tuple[str, str, str, float]  # (model, history key, text, unix seconds)


class HistoryBuffer(Pending[HistoryRow]):
    """Thread-safe. ``limit`` >= 1."""

    def __init__(self, limit: int = 100_000):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        super().__init__(limit)

    def append(self, model: str, history_key: str, text: str, now: float) -> None:
        self.put([(model, history_key, text, now)])
