"""What the SQLite and the PostgreSQL stores do alike: ``SQLStore``, the reads of one statement each, the history
buffer and the backlog, over ``statements`` and ``rows``. A subclass owns the connection (``_fetch`` runs one
statement on it) and does what truly differs: opening and migrating, transactions, flushing, snapshots."""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from structspec.stats.book import Counters, Reload, StatsBook
from structspec.stats.counters import CounterKey
from structspec.stats.policy_states import PolicyChange
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import TrafficSample
from structspec.store import rows, statements
from structspec.store.base import BACKLOG_KINDS, Backlog, SchemaRecord, backlog_of, matches, newest_samples, sum_counters
from structspec.store.dialect import Dialect
from structspec.store.history_buffer import HistoryBuffer
from structspec.store.quarantine import Quarantine
from structspec.store.statements import CHANGE_COLS, SAMPLE_COLS, TRAFFIC_COLS, matching, select
from structspec.store.text import decode

R = TypeVar("R")


def _as_is(row: rows.Row) -> Any:
    return row


class SQLStore:
    """The ``Store`` methods both stores run alike (a subclass sets ``dialect`` and implements ``_fetch``)."""

    dialect: Dialect
    HISTORY_KEEP = statements.HISTORY_KEEP

    def __init__(self, stats: StatsBook | None, history_limit: int):
        self.stats = stats or StatsBook()
        self._history = HistoryBuffer(history_limit)  # appended, not yet written
        self.quarantine = Quarantine()  # rows the store refused

    async def _fetch(self, sql: str, args: Sequence[Any] = (), row: Callable[[rows.Row], R] = _as_is) -> list[R]:
        """The rows of one statement (``?`` placeholders) run alone, each made a record by ``row``."""
        raise NotImplementedError

    def _unwritten(self, kind: str) -> list[Any]:
        """Rows of a backlog kind taken from their buffer, not yet written, that the store keeps itself."""
        return []

    async def check(self) -> None:
        await self._fetch("SELECT 1")

    async def get_schema(self, schema_id: str, version: int | None = None) -> SchemaRecord | None:
        sql, args = ((statements.LATEST_SCHEMA, (schema_id,)) if version is None
                     else (statements.SCHEMA_AT_VERSION, (schema_id, version)))
        found = await self._fetch(sql, args, rows.schema)
        return found[0] if found else None

    async def list_schemas(self, schema_id: str | None = None, all_versions: bool = False) -> list[SchemaRecord]:
        return await self._fetch(*statements.list_schemas(schema_id, all_versions), rows.schema)

    @staticmethod
    def _counted(stored: list[tuple[CounterKey, float]], reload: Reload, since: float, until: float | None,
                 model: str | None, schema_key: str | None) -> Counters:
        """``read_counters``: the ``stored`` counters and the reload's unwritten ones of ``model`` and ``schema_key``."""
        pending = [(k, v) for k, v in reload.unflushed.items() if matches(k, model, schema_key)]
        return sum_counters(stored + pending, since, until)

    def backlog(self) -> Backlog:
        out = backlog_of(self.stats, self._history, self.quarantine.counts())
        for kind in BACKLOG_KINDS[1:]:  # taken, still unwritten (counters: in the book's count)
            out.unwritten[kind] += len(self._unwritten(kind))
        return out

    # -- what schema owners read beside the counters ------------------------------------------------

    async def read_rejected_drafts(self, model: str | None = None, schema_key: str | None = None,
                                   proposer: str | None = None, limit: int = 100) -> list[RejectedDraft]:
        sql, args = select(SAMPLE_COLS, "rejected_drafts", matching(model, schema_key, proposer),
                           "ORDER BY created_at DESC LIMIT ?")
        stored = await self._fetch(sql, [*args, limit], lambda r: rows.sample(self.dialect, r))
        unwritten = self._unwritten("samples") + self.stats.samples.pending()
        return newest_samples(stored, unwritten, model, schema_key, limit, proposer)

    async def read_traffic_samples(self, model: str | None = None, schema_key: str | None = None,
                                   limit: int = 1000) -> list[TrafficSample]:
        sql, args = select(TRAFFIC_COLS, "traffic_samples", matching(model, schema_key),
                           "ORDER BY created_at DESC LIMIT ?")
        stored = await self._fetch(sql, [*args, limit], lambda r: rows.traffic(self.dialect, r))
        unwritten = self._unwritten("traffic") + self.stats.traffic.pending()
        return newest_samples(stored, unwritten, model, schema_key, limit)

    async def read_policy_changes(self, model: str | None = None, schema_key: str | None = None) -> list[PolicyChange]:
        sql, args = select(CHANGE_COLS, "policy_changes", matching(model, schema_key), "ORDER BY at, id")
        stored = await self._fetch(sql, args, rows.change)
        unwritten = self._unwritten("policy_changes") + self.stats.policy.pending()
        return stored + [r for r in unwritten if matches(r, model, schema_key)]

    # -- schema history ------------------------------------------------------------------------

    def append_history(self, model: str, history_key: str, text: str, now: float) -> None:
        self._history.append(model, history_key, text, now)

    async def load_history(self, model: str, per_key: int, max_keys: int) -> list[tuple[str, str]]:
        return await self._fetch(statements.LOAD_HISTORY, (model, model, max_keys, per_key),
                                 lambda r: (decode(r[0]), decode(r[1])))
