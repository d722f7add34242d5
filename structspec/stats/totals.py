"""Process-lifetime totals of what this process recorded, per bounded schema label: what Prometheus scrapes.

The book's hourly counters are windows (they age out, and a refresh replaces them with every
replica's), so they cannot back Prometheus counters, which must only grow. ``ProcessTotals``
adds each recorded row of the exported series to a sum kept for the life of the process, with
the schema key mapped to a label whose number of values cannot grow with traffic: a registered
schema keeps its ``id@version``, every inline schema shares ``inline`` and every tool list
``tools``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Iterable

from structspec.stats.counters import CounterKey, Series

INLINE_LABEL = "inline"
TOOLS_LABEL = "tools"
_REGISTERED = re.compile(r"^[^@:\s]{1,128}@\d{1,9}$")  # registered_stats_key: <id>@<version>

EXPORTED = frozenset({Series.REQUESTS, Series.OUTPUT_TOKENS, Series.TARGET_PASSES, Series.FORCED_TOKENS, Series.FINISH,
                      Series.DECISION, Series.VERIFICATIONS, Series.DRAFTED, Series.ACCEPTED})
SWITCHES = "policy_switches"  # the series of ``add_switch`` (label: the state switched to)


def schema_label(schema_key: str) -> str:
    """The metrics label of a schema key: ``id@version`` for a registered schema, else ``inline`` or ``tools``."""
    if _REGISTERED.match(schema_key):
        return schema_key
    return TOOLS_LABEL if schema_key.startswith("tools:") else INLINE_LABEL


@dataclass(frozen=True, order=True)
class TotalKey:
    series: str
    schema: str  # ``schema_label``
    proposer: str = ""
    batch_bucket: int = 0
    label: str = ""


class ProcessTotals:
    """Thread-safe monotonic sums. Cost: one dict update per exported row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[TotalKey, float] = {}
        self._labels: dict[str, str] = {}  # schema key -> label, memoised (bounded: cleared when large)

    def _label(self, schema_key: str) -> str:
        label = self._labels.get(schema_key)
        if label is None:
            if len(self._labels) > 4096:
                self._labels.clear()
            label = self._labels[schema_key] = schema_label(schema_key)
        return label

    def add(self, rows: Iterable[tuple[CounterKey, float]]) -> None:
        with self._lock:
            for key, value in rows:
                if key.series not in EXPORTED or not key.schema_key:
                    continue
                k = TotalKey(key.series, self._label(key.schema_key), key.proposer, key.batch_bucket, key.label)
                self._sums[k] = self._sums.get(k, 0.0) + value

    def add_switch(self, schema_key: str, proposer: str, state: str) -> None:
        with self._lock:
            k = TotalKey(SWITCHES, self._label(schema_key), proposer, 0, state)
            self._sums[k] = self._sums.get(k, 0.0) + 1.0

    def snapshot(self) -> dict[TotalKey, float]:
        with self._lock:
            return dict(self._sums)
