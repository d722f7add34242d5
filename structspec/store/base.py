"""The embedded store's seam: schema registry rows and speculation statistics.

One ``Store`` serves a server process: SQLite (``sqlite.py``) for one server, PostgreSQL
(``postgres.py``) for several replicas sharing one database. Nothing here assumes either:
timestamps are passed in (unix seconds, never the database's clock), versions are allocated by
the store atomically (so two replicas registering at once cannot both get version 3), and
statistics are aggregated per hour with plain add-upserts of each process's deltas
(``structspec.stats.counters``), so the replicas' counts add up.

What is recorded but not yet written (counters, history outputs, samples, traffic, policy changes) waits
in memory, each kind within a bound; past it new records are dropped and counted (``backlog``),
never silently. A row the store refuses for what it holds is quarantined (``quarantine``), counted
and logged, and holds back none of the rows behind it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, runtime_checkable

from structspec.stats.book import Counters, StatsBook
from structspec.stats.counters import CounterKey, hour_of
from structspec.stats.legacy_keys import Claim
from structspec.stats.policy_states import PolicyChange
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import TrafficSample
from structspec.stats.pending import Pending

_PASSWORD_IN_URL = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/?#@]*):[^@/?#]*@", re.I)
_PASSWORD_IN_QUERY = re.compile(r"((?:^|[?&\s])password=)[^&\s]*", re.I)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and messages)."""
    return _PASSWORD_IN_QUERY.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1:***@", url))


@dataclass(frozen=True)
class SchemaRecord:
    """One schema version: its content is immutable; the owner's drafting override may change."""

    schema_id: str
    version: int
    schema_json: str  # canonical JSON text
    sha256: str  # of schema_json
    description: str
    created_at: float  # unix seconds
    source: str  # "builtin" | "api"
    speculation: str = "auto"  # the owner's override of the drafting policy: auto | off | on


SPECULATION_MODES = ("auto", "off", "on")  # SchemaRecord.speculation


class StoreError(RuntimeError):
    """The store failed (I/O, corruption, a bug in a statement): the caller maps it to INTERNAL."""


class StoreUnavailable(StoreError):
    """The store cannot be reached now (connection refused or lost, a timeout, the database shutting down): the
    caller serves from memory where it can and answers UNAVAILABLE where it cannot; retrying later may succeed."""


BACKLOG_KINDS = ("counters", "history", "samples", "traffic", "policy_changes")


@dataclass(frozen=True)
class Backlog:
    """What a store holds in memory, not yet written, per kind (``BACKLOG_KINDS``), what it dropped (since the
    process started) because a kind's bound was reached while the store could not be written, and the rows the
    store refused for what they hold (quarantined, ``structspec.store.quarantine``)."""

    unwritten: dict[str, int]
    dropped: dict[str, int]
    quarantined: dict[str, int] = field(default_factory=dict)


HistoryRow = tuple[str, str, str, float]  # a finished output: (model, history key, text, unix seconds)


class HistoryBuffer(Pending[HistoryRow]):
    """Finished outputs waiting to be written to the schema history; past ``limit`` (>= 1) the oldest are dropped
    (the history proposer drafts from recent outputs) and counted. Thread-safe."""

    def __init__(self, limit: int = 100_000):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        super().__init__(limit)

    def append(self, model: str, history_key: str, text: str, now: float) -> None:
        self.put([(model, history_key, text, now)])


@runtime_checkable
class Store(Protocol):
    """Persistent state shared by the registry and the speculation statistics.

    Every coroutine may do I/O; the plain methods never do.
    """

    async def open(self) -> None:
        """Connect and create or migrate the tables (idempotent)."""

    async def close(self) -> None:
        """Flush buffered statistics and release the connection."""

    async def check(self) -> None:
        """Reach the store once (a trivial query); raises ``StoreUnavailable`` when it cannot be reached now."""

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

    async def set_schema_speculation(self, schema_id: str, version: int, mode: str) -> SchemaRecord | None:
        """Set the owner's drafting override (auto | off | on) of one version; the updated record, None if absent."""

    # -- statistics ------------------------------------------------------------------------
    # ``stats`` is the process's StatsBook: the decode path records into it (no I/O), ``flush``
    # writes what it recorded, ``refresh_stats`` loads every replica's counters into it.

    stats: StatsBook

    async def flush(self) -> None:
        """Write what was recorded since the last flush: counters, schema history, rejected-draft samples, traffic
        samples and the policy's changes."""

    async def read_counters(self, since: float, until: float | None = None, model: str | None = None,
                            schema_key: str | None = None) -> Counters:
        """Counters of the hours overlapping ``[since, until)``, unflushed ones included, each exactly once."""

    async def refresh_stats(self) -> None:
        """Load the store's counters of the book's horizon into ``stats`` (the policy then sees every replica), and
        seed ``stats.policy`` with each proposer's latest persisted state."""

    async def prune(self, before: float) -> int:
        """Drop counters, rejected-draft and traffic samples, policy changes and history outputs from before
        ``before`` (samples by their hour); returns the rows removed."""

    def backlog(self) -> Backlog:
        """Unwritten and dropped records per kind (no I/O)."""

    # -- what schema owners read beside the counters ------------------------------------------

    async def read_rejected_drafts(self, model: str | None = None, schema_key: str | None = None,
                                   proposer: str | None = None, limit: int = 100) -> list[RejectedDraft]:
        """The newest ``limit`` rejected-draft samples (unwritten ones included), newest first."""

    async def read_policy_changes(self, model: str | None = None, schema_key: str | None = None) -> list[PolicyChange]:
        """Every kept change of the policy's per-proposer state (unwritten ones included), oldest first."""

    async def read_traffic_samples(self, model: str | None = None, schema_key: str | None = None,
                                   limit: int = 1000) -> list[TrafficSample]:
        """The newest ``limit`` traffic samples (completed requests' prompt and output ids; unwritten ones
        included), newest first."""

    async def claim(self, found: Callable[[Iterable[str]], list[Claim]]) -> list[Claim]:
        """In one transaction: the claims ``found`` makes among the stored model keys (``legacy_keys.claims``),
        each carried out (its old key's counters summed into the new key's, samples moved where the new key holds
        no row in their slot, policy changes and history outputs moved); returns them."""

    # -- schema history (what the history proposer drafts from) ------------------------------

    def append_history(self, model: str, history_key: str, text: str, now: float) -> None:
        """Buffer one finished output (written by ``flush``; never blocks)."""

    async def load_history(self, model: str, per_key: int, max_keys: int) -> list[tuple[str, str]]:
        """The last ``per_key`` outputs of the ``max_keys`` most recent keys, as (key, text), oldest first."""


def sum_counters(rows: Iterable[tuple[CounterKey, float]], since: float, until: float | None) -> Counters:
    """Sum rows whose hour overlaps ``[since, until)``."""
    lo = hour_of(since)
    out: Counters = {}
    for key, value in rows:
        if key.hour < lo or (until is not None and key.hour >= until):
            continue
        out[key] = out.get(key, 0.0) + value
    return out
