"""The drafting policy's state per (model, schema, proposer): on or off, why, and since when.

The policy decides per request (``structspec.speculation.policy``); a proposer is *on* for a
schema when its latest decision let it draft for the policy's own reasons (drafted, cold, the
owner's ``on``) and *off* when the policy kept it from drafting (low acceptance, no gain, short
outputs, the owner's ``off``, the batch size). Reasons that say nothing about the policy's state
(the request asked for no drafting, a recovery probe of a switched-off proposer, the draft model
left out of a request to keep the other arm measured, a policy error, a server without
proposers) leave the state as it was.

``PolicyStates`` keeps the latest state of each key and records a ``PolicyChange`` each time a
key's (state, reason) changes: the moments the policy switched a proposer off or on are the
changes whose state differs from the one before. The store persists the changes; a restarted
server is seeded with the latest change of each key, so its first decision is not mistaken for a
switch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

from structspec.stats.counters import Reason
from structspec.stats.pending import Pending

ON, OFF = "on", "off"
_STATE = {
    Reason.DRAFTED: ON, Reason.COLD: ON, Reason.SCHEMA_ON: ON,
    Reason.LOW_ACCEPTANCE: OFF, Reason.NO_GAIN: OFF, Reason.SHORT_OUTPUT: OFF, Reason.SCHEMA_OFF: OFF,
    Reason.BATCH_SIZE: OFF, Reason.PRICED_OUT: OFF,
}
KEEP_PER_KEY = 200  # changes the store keeps per (model, schema, proposer), the newest


def state_of(reason: str) -> str | None:
    """``on`` / ``off`` for a reason that shows the policy's state; None for one that does not."""
    return _STATE.get(reason)


@dataclass(frozen=True)
class PolicyChange:
    """A proposer's (state, reason) for a schema changed at ``at``; ``previous`` is the state before ("" at first)."""

    model: str
    schema_key: str
    proposer: str
    at: float  # unix seconds
    state: str  # on | off
    reason: str
    previous: str = ""
    batch_bucket: int = 1  # the running batch's bucket at the decision
    acceptance: float | None = None  # the acceptance the policy read at that bucket (None: no evidence yet)
    threshold: float | None = None  # the acceptance threshold in force

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model, self.schema_key, self.proposer)

    @property
    def is_switch(self) -> bool:
        """The state itself changed (or was first seen), not only its reason."""
        return self.previous != self.state


@dataclass(frozen=True)
class ProposerState:
    """One proposer's state for one schema as its changes tell it."""

    proposer: str
    state: str
    reason: str
    since: float  # when it entered the current state
    changed_at: float  # the latest change (of state or reason)
    last_off: float | None  # the latest switch off, None if never
    last_on: float | None  # the latest switch on
    acceptance: float | None
    threshold: float | None
    batch_bucket: int


def proposer_states(changes: Iterable[PolicyChange]) -> dict[tuple[str, str, str], ProposerState]:
    """Each key's current state from its changes (any order)."""
    by_key: dict[tuple[str, str, str], list[PolicyChange]] = {}
    for c in changes:
        by_key.setdefault(c.key, []).append(c)
    out = {}
    for key, rows in by_key.items():
        rows.sort(key=lambda c: c.at)
        last = rows[-1]
        switches = [c for c in rows if c.is_switch]
        since = next((c.at for c in reversed(switches) if c.state == last.state), rows[0].at)
        last_off = next((c.at for c in reversed(switches) if c.state == OFF), None)
        last_on = next((c.at for c in reversed(switches) if c.state == ON), None)
        out[key] = ProposerState(last.proposer, last.state, last.reason, since, last.at, last_off, last_on,
                                 last.acceptance, last.threshold, last.batch_bucket)
    return out


class PolicyStates:
    """The latest state per key (at most ``max_keys``, the least recently decided forgotten first) and the changes
    not yet in the store (at most ``max_pending``, the oldest dropped first). Thread-safe."""

    def __init__(self, max_keys: int = 4096, max_pending: int = 10_000):
        self.max_keys = max_keys
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._latest: OrderedDict[tuple[str, str, str], PolicyChange] = OrderedDict()
        self._pending: Pending[PolicyChange] = Pending(max_pending)

    @property
    def dropped(self) -> int:
        """Changes dropped because the store was not written for too long."""
        return self._pending.dropped

    def observe(self, model: str, schema_key: str, proposer: str, reason: str, at: float, batch_bucket: int = 1,
                acceptance: float | None = None, threshold: float | None = None) -> PolicyChange | None:
        """One decision's reason for one proposer; the change it makes, if any."""
        state = state_of(reason)
        if state is None:
            return None
        key = (model, schema_key, proposer)
        with self._lock:
            last = self._latest.get(key)
            if last is not None:
                self._latest.move_to_end(key)
                if (last.state, last.reason) == (state, reason):
                    return None
            change = PolicyChange(model, schema_key, proposer, at, state, reason, last.state if last else "",
                                  batch_bucket, acceptance, threshold)
            self._latest[key] = change
            while len(self._latest) > self.max_keys:
                self._latest.popitem(last=False)
            self._pending.put([change])
            return change

    def seed(self, changes: Iterable[PolicyChange]) -> None:
        """The store's latest change per key, for the keys this process has not decided yet."""
        newest: dict[tuple[str, str, str], PolicyChange] = {}
        for c in changes:
            if c.key not in newest or c.at >= newest[c.key].at:
                newest[c.key] = c
        with self._lock:
            for key, c in newest.items():
                if key not in self._latest and len(self._latest) < self.max_keys:
                    self._latest[key] = c
                    self._latest.move_to_end(key, last=False)  # decided before anything this process decided

    def get(self, model: str, schema_key: str, proposer: str) -> PolicyChange | None:
        """The latest change of one key (None: never decided here nor seeded)."""
        with self._lock:
            return self._latest.get((model, schema_key, proposer))

    def latest(self) -> dict[tuple[str, str, str], PolicyChange]:
        with self._lock:
            return dict(self._latest)

    def take(self) -> list[PolicyChange]:
        return self._pending.take()

    def restore(self, rows: list[PolicyChange]) -> None:
        self._pending.restore(rows, trim=False)  # the bound is applied at the next change

    def pending(self) -> list[PolicyChange]:
        return self._pending.pending()
