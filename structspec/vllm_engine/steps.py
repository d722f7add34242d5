"""What vLLM says of its steps and requests, as the statistics book's records.

vLLM reports, per request and at its end, the tokens drafted and accepted at each verification step
(``RequestSpecDecodeMetrics.per_step_drafted`` / ``per_step_accepted``, with ``per_request_spec_decode_metrics
= "detailed"``), and, per engine step, its scheduler's statistics (``SchedulerStats``: the running requests and
that step's drafts) to every stat logger. It does not say which step of a request ran at which batch size, so:

- the batch size of a request's verifications is the median running count of the engine steps while it ran
  (``StepLog.median_running``: the steps from its first output to its last; in a steady stream that is every
  one of its steps' size);
- a step's time is the time between two consecutive steps the front saw while the engine was busy (both with
  running requests): the step as the server sees it, output processing included; its draft length is that
  step's drafted tokens per draft, rounded up.

Cost: ``StepLog.record`` is O(1); ``median_running`` is O(steps of the request), at most ``window`` steps.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from structspec.engine.types import Usage


@dataclass(frozen=True)
class Step:
    number: int
    running: int
    waiting: int


class StepLog:
    """The engine steps the front saw (one ``record`` each), and their costs recorded to ``stats``.
    Thread-safe; ``record`` never raises."""

    def __init__(self, stats: Any = None, window: int = 4096):
        self.stats = stats  # a ``Recorder`` (None: nothing recorded)
        self._steps: deque[Step] = deque(maxlen=window)
        self._lock = threading.Lock()
        self._number = 0
        self._last: tuple[float, int] | None = None  # (when, running) of the previous step

    @property
    def number(self) -> int:
        """Steps seen so far (the next step's number)."""
        return self._number

    @property
    def running(self) -> int:
        with self._lock:
            return self._steps[-1].running if self._steps else 0

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._steps[-1].waiting if self._steps else 0

    def record(self, when: float, running: int, waiting: int, drafts: int = 0, drafted_tokens: int = 0) -> None:
        """One engine step at monotonic time ``when``: ``running`` requests (``waiting`` queued), ``drafts`` of them
        verifying ``drafted_tokens`` drafted tokens in all."""
        try:
            with self._lock:
                self._steps.append(Step(self._number, running, waiting))
                self._number += 1
                last, self._last = self._last, (when, running)
            if self.stats is not None and last is not None and last[1] > 0 and running > 0:
                k = math.ceil(drafted_tokens / drafts) if drafts else 0
                self.stats.record_step(running, k, max(0.0, when - last[0]))
        except Exception:  # noqa: BLE001 - statistics are never worth a step
            pass

    def median_running(self, since: int, until: int | None = None) -> int:
        """The median running count of the steps numbered ``since`` .. ``until`` (now: every later one); 1 when none
        of them is still in the window."""
        with self._lock:
            sizes = [s.running for s in self._steps if s.number >= since and (until is None or s.number <= until)]
        return max(1, int(statistics.median_low(sizes))) if sizes else 1


def record_verifications(stats: Any, schema_key: str, proposer: str, batch_size: int, drafted: Sequence[int],
                         accepted: Sequence[int], usage: Usage) -> int:
    """Record one request's verification steps (``drafted[i]`` tokens, ``accepted[i]`` kept) under ``proposer``,
    add them to ``usage``; the accepted tokens in all."""
    total = 0
    for d, a in zip(drafted, accepted):
        if d <= 0:
            continue
        a = max(0, min(int(a), int(d)))
        total += a
        usage.drafted[proposer] = usage.drafted.get(proposer, 0) + int(d)
        usage.accepted[proposer] = usage.accepted.get(proposer, 0) + a
        usage.draft_steps[proposer] = usage.draft_steps.get(proposer, 0) + 1
        if stats is not None:
            stats.record_verification(schema_key, proposer, batch_size, int(d), a, probe=False)
    return total
