"""The embedded store's seam: schema registry rows and speculation statistics.

One ``Store`` serves a server process; SQLite is the default, a PostgreSQL implementation will
serve several replicas later. Nothing here assumes SQLite: timestamps are passed in (unix
seconds, never the database's clock), versions are allocated by the store atomically (so two
replicas registering at once cannot both get version 3), and statistics are aggregated per
time bucket with plain upserts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class SchemaRecord:
    """One immutable schema version."""

    schema_id: str
    version: int
    schema_json: str  # canonical JSON text
    sha256: str  # of schema_json
    description: str
    created_at: float  # unix seconds
    source: str  # "builtin" | "api"


@dataclass(frozen=True)
class AcceptanceTotals:
    """Drafting counts of one (schema key, proposer, batch bucket) summed over a window."""

    schema_key: str
    proposer: str
    batch_bucket: int
    drafted: int
    accepted: int
    events: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class StoreError(RuntimeError):
    """The store failed (I/O, corruption, lost connection): the caller maps it to INTERNAL/UNAVAILABLE."""


@runtime_checkable
class Store(Protocol):
    """Persistent state shared by the registry and the speculation statistics.

    Every method but ``record_acceptance`` may do I/O and is a coroutine.
    """

    async def open(self) -> None:
        """Connect and create or migrate the tables (idempotent)."""

    async def close(self) -> None:
        """Flush buffered statistics and release the connection."""

    # -- schema registry -------------------------------------------------------------------

    async def put_schema(
        self, schema_id: str, schema_json: str, sha256: str, description: str, source: str, now: float
    ) -> tuple[SchemaRecord, bool]:
        """Store ``schema_json`` under ``schema_id``, atomically.

        If a live version of the id has the same ``sha256``, returns it and False; otherwise
        allocates the next version number (never reusing a deleted one) and returns the new
        record and True.
        """

    async def get_schema(self, schema_id: str, version: int | None = None) -> SchemaRecord | None:
        """One version, or the latest live one when ``version`` is None; None if absent."""

    async def list_schemas(self, schema_id: str | None = None, all_versions: bool = False) -> list[SchemaRecord]:
        """Latest live version of each id (or every live version), sorted by id then version."""

    async def delete_schema(self, schema_id: str, version: int | None = None) -> list[int]:
        """Delete one version (or every version); returns the versions deleted."""

    # -- speculation statistics ------------------------------------------------------------

    def record_acceptance(
        self, schema_key: str, proposer: str, batch_bucket: int, drafted: int, accepted: int, ts: float
    ) -> None:
        """Count one verification step. Never blocks and never does I/O: it is called from the
        decoding loop. Counts are buffered in memory and written by ``flush`` (also called
        periodically by the server and at shutdown). Thread-safe."""

    async def flush(self) -> None:
        """Write buffered statistics."""

    async def acceptance_totals(
        self, since: float, until: float | None = None, schema_key: str | None = None
    ) -> list[AcceptanceTotals]:
        """Sums per (schema key, proposer, batch bucket) of steps in ``[since, until)``,
        buffered ones included; one key or all. Resolution is the store's bucket width
        (60 s for SQLite): a window may include up to one bucket more."""

    async def prune_acceptance(self, before: float) -> int:
        """Drop statistics older than ``before``; returns the rows removed."""


STATS_BUCKET_SECONDS = 60


def stats_bucket(ts: float) -> int:
    """Start (unix seconds) of the statistics bucket holding ``ts``."""
    return int(ts // STATS_BUCKET_SECONDS) * STATS_BUCKET_SECONDS


def batch_bucket(batch_size: int) -> int:
    """Round a running batch size up to a power of two (1, 2, 4, 8, ...): the statistics'
    ``batch_bucket``. Shared here so the engine and the reports agree."""
    size = max(1, int(batch_size))
    return 1 << (size - 1).bit_length()


class AcceptanceBuffer:
    """In-memory aggregation of ``record_acceptance`` calls between flushes (thread-safe).

    A flush ``take``s the rows, writes them, then marks them ``committed`` (or ``restore``s them after a
    failed write). Until then they are in flight and ``snapshot`` still counts them, so a reader that
    sums the database and the snapshot (under the store's lock, which the write holds until
    ``committed``) sees every count exactly once, mid-flush included.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, int, int], list[int]] = {}
        self._in_flight: list[dict[tuple[str, str, int, int], list[int]]] = []

    def add(self, schema_key: str, proposer: str, batch_bucket: int, drafted: int, accepted: int, ts: float) -> None:
        key = (schema_key, proposer, int(batch_bucket), stats_bucket(ts))
        with self._lock:
            row = self._rows.setdefault(key, [0, 0, 0])
            row[0] += int(drafted)
            row[1] += int(accepted)
            row[2] += 1

    def take(self) -> dict[tuple[str, str, int, int], list[int]]:
        """Everything buffered, emptying the buffer; the rows stay counted (in flight) until committed."""
        with self._lock:
            rows, self._rows = self._rows, {}
            if rows:
                self._in_flight.append(rows)
        return rows

    def committed(self, rows: dict[tuple[str, str, int, int], list[int]]) -> None:
        """The write of ``rows`` (from ``take``) is in the database: stop counting them here."""
        with self._lock:
            self._in_flight = [r for r in self._in_flight if r is not rows]

    def restore(self, rows: dict[tuple[str, str, int, int], list[int]]) -> None:
        """Put rows back after a failed write, so no count is lost."""
        with self._lock:
            self._in_flight = [r for r in self._in_flight if r is not rows]
            for (key, proposer, bucket, start), (drafted, accepted, events) in rows.items():
                row = self._rows.setdefault((key, proposer, bucket, start), [0, 0, 0])
                row[0] += drafted
                row[1] += accepted
                row[2] += events

    def snapshot(self) -> dict[tuple[str, str, int, int], tuple[int, int, int]]:
        """Counts not yet in the database: buffered plus in flight."""
        with self._lock:
            out: dict[tuple[str, str, int, int], list[int]] = {}
            for part in (self._rows, *self._in_flight):
                for k, v in part.items():
                    row = out.setdefault(k, [0, 0, 0])
                    for i in range(3):
                        row[i] += v[i]
            return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def sum_totals(
    rows: Sequence[tuple[str, str, int, int, int, int, int]], since: float, until: float | None
) -> list[AcceptanceTotals]:
    """Sum (key, proposer, bucket, bucket_start, drafted, accepted, events) rows whose bucket
    overlaps ``[since, until)``, sorted by key, proposer, batch bucket."""
    sums: dict[tuple[str, str, int], list[int]] = {}
    lo = stats_bucket(since)
    for key, proposer, bucket, start, drafted, accepted, events in rows:
        if start < lo or (until is not None and start >= until):
            continue
        s = sums.setdefault((key, proposer, bucket), [0, 0, 0])
        s[0] += drafted
        s[1] += accepted
        s[2] += events
    return [AcceptanceTotals(k, p, b, *v) for (k, p, b), v in sorted(sums.items())]
