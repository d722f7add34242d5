"""Records waiting for the store: the one bounded buffer every kind of unwritten statistics waits in.

The decode path ``put``s (a dict update under a lock, never I/O); a flush ``take``s what waits and, when its write
fails, ``restore``s it in front of what was put meanwhile. While the store cannot be written a buffer holds at
most ``limit`` records (its owner may count others it holds elsewhere against the bound: ``held``); past it each
kind drops by its own rule (``drop``), and counts each record dropped in ``dropped``:

- ``"oldest"``: the oldest waiting record goes (history outputs, rejected drafts, traffic samples, the policy's
  changes: the newest are the ones worth keeping);
- ``"new"``: a record of a key not waiting yet is not kept (counters: a key already waiting still takes more, so
  every key that is written is written whole).

Keyed (``key``): one record per key waits; a record of a key already waiting takes its place in the order
(``merge`` given: is merged into it). Unkeyed, every record waits on its own. Thread-safe.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Generic, Hashable, Iterable, Literal, TypeVar

T = TypeVar("T")


class Pending(Generic[T]):
    """``limit`` >= 0 (0: nothing waits)."""

    def __init__(self, limit: int, *, drop: Literal["oldest", "new"] = "oldest",
                 key: Callable[[T], Hashable] | None = None, merge: Callable[[T, T], T] | None = None):
        self.limit = limit
        self.drop = drop
        self.dropped = 0  # records not kept because ``limit`` were already waiting
        serial = itertools.count()
        self._key = key or (lambda _: next(serial))  # unkeyed: every record a key of its own
        self._merge = merge
        self._rows: dict[Hashable, T] = {}  # insertion order: oldest first
        self._lock = threading.Lock()

    def put(self, rows: Iterable[T], held: int = 0) -> None:
        """Add ``rows`` (oldest first); ``held``: records of this kind its owner holds elsewhere (taken, unwritten)."""
        with self._lock:
            waiting, key_of, merge, drop_new = self._rows, self._key, self._merge, self.drop == "new"
            for row in rows:
                key = key_of(row)
                if key in waiting:
                    waiting[key] = row if merge is None else merge(waiting[key], row)
                elif drop_new and len(waiting) + held >= self.limit:
                    self.dropped += 1
                else:
                    waiting[key] = row
            self._trim()

    def take(self) -> list[T]:
        """Everything waiting, oldest first; the buffer is then empty."""
        with self._lock:
            rows, self._rows = list(self._rows.values()), {}
        return rows

    def restore(self, rows: Iterable[T], trim: bool = True) -> None:
        """A write of ``rows`` (taken) failed: they wait again, before what was put since (a record put since wins
        its key). ``trim``: the bound is applied now (otherwise at the next ``put``)."""
        with self._lock:
            waiting, self._rows = self._rows, {}
            for row in rows:
                self._rows[self._key(row)] = row
            for key, row in waiting.items():  # restored rows were counted against the bound: none is new
                old = self._rows.get(key)
                self._rows[key] = row if old is None or self._merge is None else self._merge(old, row)
            if trim:
                self._trim()

    def pending(self) -> list[T]:
        """What waits, oldest first."""
        with self._lock:
            return list(self._rows.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def _trim(self) -> None:
        if self.drop == "oldest":
            while len(self._rows) > self.limit:
                del self._rows[next(iter(self._rows))]
                self.dropped += 1
