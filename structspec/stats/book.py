"""The statistics book: every counter of the recent past in memory, and what is not yet in the store.

The decode path only adds to in-memory counters (``Recorder``: a dict update under a
lock, no I/O). The server's flush task ``take``s the counters added since the last flush,
writes them and marks them ``committed`` (or ``restore``s them after a failed write).
The policy reads ``rows`` from the book: what this process recorded plus, after each
``replace_persisted``, what the store holds (every replica's traffic when several share
one store). A reload (``begin_reload`` at the moment the store is read, ``replace_persisted`` with
what it read) builds the new rows outside the book's lock and swaps them in under it: the
decode path never waits on the store's counters being re-read.

While the store cannot be written the unwritten counters wait here, at most ``max_unwritten``
keys of them: a record adds to a key already waiting at no cost, and a record of a new key past
the bound is dropped from what will be written (still counted in ``rows``, so the policy sees it)
and counted in ``dropped``.

Beside the counters the book holds what the decode path records that is not a sum: the
rejected-draft samples (``samples``), completed requests' token ids (``traffic``), the drafting
policy's state per proposer and schema (``policy``), and the process-lifetime totals Prometheus
scrapes (``totals``).

Thread-safe. Cost: ``add`` is O(counters added); ``rows_for`` is O(counters of one
(model, schema)) through an index.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Callable, Iterable, Mapping, Sequence

from structspec.stats.counters import (
    LATENCY_BOUNDS_MS,
    LENGTH_BOUNDS,
    RESTRICTED_HEAD,
    CounterKey,
    Series,
    batch_bucket,
    histogram_label,
    hour_of,
)
from structspec.stats.pending import Pending
from structspec.stats.policy_states import PolicyStates
from structspec.stats.samples import CONTEXT_TOKENS, RejectedDraft, RejectedDraftReservoir
from structspec.stats.totals import ProcessTotals
from structspec.stats.traffic import FINISHES, TrafficSample, TrafficSampler

Counters = dict[CounterKey, float]


@dataclass
class Reload:
    """One reload of the book from the store (``StatsBook.begin_reload``): the unwritten counters at the moment the
    store was read, and what was recorded since (kept by the book until ``replace_persisted``)."""

    unflushed: Counters
    added: Counters = field(default_factory=dict)


def merge_into(into: Counters, rows: Mapping[CounterKey, float] | Iterable[tuple[CounterKey, float]]) -> Counters:
    items = rows.items() if isinstance(rows, Mapping) else rows
    for key, value in items:
        into[key] = into.get(key, 0.0) + value
    return into


class StatsBook:
    def __init__(self, horizon_seconds: float = 7 * 86400, clock: Callable[[], float] = time.time,
                 samples_per_hour: int = 8, max_unwritten: int = 100_000, traffic_per_hour: int = 8):
        if max_unwritten < 1:
            raise ValueError("max_unwritten must be >= 1")
        self.horizon_seconds = horizon_seconds  # how far back ``rows`` keeps counters (the policy's reach)
        self.clock = clock
        self.max_unwritten = max_unwritten  # unwritten counter keys kept (pending and in flight together)
        self.samples = RejectedDraftReservoir(samples_per_hour)
        self.traffic = TrafficSampler(traffic_per_hour, writer=self.samples.writer)  # one writer: this book
        self.policy = PolicyStates()
        self.totals = ProcessTotals()
        self._lock = threading.Lock()
        self._rows: Counters = {}  # persisted (as of the last replace) + everything recorded here since
        self._by_schema: dict[tuple[str, str], set[CounterKey]] = defaultdict(set)
        # recorded, not yet taken by a flush: a key already waiting adds up; a new one past the bound is dropped
        self._pending: Pending[tuple[CounterKey, float]] = Pending(
            max_unwritten, drop="new", key=itemgetter(0), merge=lambda old, new: (old[0], old[1] + new[1]))
        self._in_flight: list[Counters] = []  # taken by a flush, not yet committed
        self._reloads: list[Reload] = []  # reloads under way: each keeps what is recorded meanwhile

    @property
    def dropped(self) -> int:
        """Counter rows not written because ``max_unwritten`` keys were already waiting."""
        return self._pending.dropped

    # -- recording -------------------------------------------------------------------------------
    def add(self, rows: Iterable[tuple[CounterKey, float]]) -> None:
        with self._lock:
            rows = list(rows)
            self._pending.put(rows, held=sum(len(r) for r in self._in_flight))
            for key, value in rows:
                self._put(key, value)
                for reload in self._reloads:
                    reload.added[key] = reload.added.get(key, 0.0) + value
        self.totals.add(rows)

    def _put(self, key: CounterKey, value: float) -> None:
        self._rows[key] = self._rows.get(key, 0.0) + value
        self._by_schema[(key.model, key.schema_key)].add(key)

    def recorder(self, model: str) -> "Recorder":
        return Recorder(self, model)

    # -- flushing ---------------------------------------------------------------------------------
    def take(self) -> Counters:
        """The counters recorded since the last take; they stay ``unflushed`` until committed."""
        with self._lock:
            rows = dict(self._pending.take())
            if rows:
                self._in_flight.append(rows)
            return rows

    def committed(self, rows: Counters) -> None:
        """The write of ``rows`` is in the store (call it under the store's lock, so no reader counts them twice)."""
        with self._lock:
            self._in_flight = [r for r in self._in_flight if r is not rows]

    def split(self, rows: Counters, parts: Iterable[Counters]) -> None:
        """``rows`` (taken) are written in ``parts`` that make them up: each is then committed or restored alone."""
        with self._lock:
            self._in_flight = [r for r in self._in_flight if r is not rows] + [p for p in parts if p]

    def restore(self, rows: Counters) -> None:
        """A write failed: put the rows back so the next flush writes them."""
        with self._lock:
            self._in_flight = [r for r in self._in_flight if r is not rows]
            self._pending.restore(rows.items())

    def unflushed(self) -> Counters:
        """Counters not yet in the store: pending plus in flight."""
        with self._lock:
            return self._unflushed()

    def unwritten_keys(self) -> int:
        """How many counter keys wait for the store (pending and in flight; at most ``max_unwritten`` after adds)."""
        with self._lock:
            return len(self._pending) + sum(len(r) for r in self._in_flight)

    def _unflushed(self) -> Counters:
        out: Counters = {}
        merge_into(out, self._pending.pending())
        for part in self._in_flight:
            merge_into(out, part)
        return out

    def begin_reload(self) -> Reload:
        """Start a reload: call it at the moment the store's counters are read (under the store's lock, so that no
        flush commits in between); ``replace_persisted`` then takes what was read. O(unwritten keys)."""
        with self._lock:
            reload = Reload(self._unflushed())
            self._reloads.append(reload)
            return reload

    def replace_persisted(self, stored: Iterable[tuple[CounterKey, float]], reload: Reload | None = None) -> None:
        """Make ``rows`` the store's counters of the horizon (every replica's) plus what is not yet written.

        ``stored``: what the store held when ``reload`` began (without one: now). The new rows are built outside the
        lock; the lock is held only to add what was recorded since the reload began and swap them in."""
        if reload is None:
            reload = self.begin_reload()
        try:
            cutoff = hour_of(self.clock() - self.horizon_seconds)
            rows: Counters = {}
            by_schema: dict[tuple[str, str], set[CounterKey]] = defaultdict(set)
            for part in ((kv for kv in stored if kv[0].hour >= cutoff), reload.unflushed.items()):
                for key, value in part:
                    rows[key] = rows.get(key, 0.0) + value
                    by_schema[(key.model, key.schema_key)].add(key)
        except BaseException:
            self.cancel_reload(reload)
            raise
        with self._lock:  # a record added meanwhile is in ``reload.added``: in the new rows once
            self._reloads = [r for r in self._reloads if r is not reload]
            for key, value in reload.added.items():
                rows[key] = rows.get(key, 0.0) + value
                by_schema[(key.model, key.schema_key)].add(key)
            self._rows, self._by_schema = rows, by_schema

    def cancel_reload(self, reload: Reload) -> None:
        """The store could not be read after ``begin_reload``: the book stops keeping what is recorded for it."""
        with self._lock:
            self._reloads = [r for r in self._reloads if r is not reload]

    # -- reading ----------------------------------------------------------------------------------
    def rows_for(self, model: str, schema_key: str, since_hour: int = 0) -> Counters:
        with self._lock:
            return {k: self._rows[k] for k in self._by_schema.get((model, schema_key), ()) if k.hour >= since_hour}

    def rows(self) -> Counters:
        with self._lock:
            return dict(self._rows)


class Recorder:
    """A ``StatsBook`` seen by one model's engine: the calls the decode path makes (no I/O, never raises)."""

    def __init__(self, book: StatsBook, model: str):
        self.book = book
        self.model = model

    @property
    def clock(self) -> Callable[[], float]:
        return self.book.clock

    def _keys(self, schema_key: str) -> Callable[..., CounterKey]:
        """Keys of one record: the clock is read once, so every row of a record lands in the same hour."""
        hour = hour_of(self.book.clock())

        def key(series: str, proposer: str = "", bucket: int = 0, label: str = "") -> CounterKey:
            return CounterKey(self.model, schema_key, hour, series, proposer, bucket, label)

        return key

    def record_request(self, schema_key: str, output_tokens: int, target_passes: int, forced_tokens: int, finish: str,
                       latency_ms: float, arm: str = "", decode_ms: float = 0.0, batch_size: int = 1) -> None:
        """One request ended (``finish``: stop | length | cancelled | error). ``arm`` (``Arm``), when the policy chose
        one, with the decode time and the batch size at the decision: the end-to-end comparison of the arms."""
        k = self._keys(schema_key)
        rows = [
            (k(Series.REQUESTS), 1.0),
            (k(Series.OUTPUT_TOKENS), float(output_tokens)),
            (k(Series.TARGET_PASSES), float(target_passes)),
            (k(Series.FORCED_TOKENS), float(forced_tokens)),
            (k(Series.FINISH, label=finish), 1.0),
            (k(Series.LATENCY_MS, label=histogram_label(latency_ms, LATENCY_BOUNDS_MS)), 1.0),
            (k(Series.LATENCY_MS_SUM), float(latency_ms)),
        ]
        if finish in ("stop", "length"):  # a truncated output is a long one; a cancelled one says nothing
            rows.append((k(Series.OUTPUT_LENGTH, label=histogram_label(output_tokens, LENGTH_BOUNDS)), 1.0))
            if arm and output_tokens > 0:
                b = batch_bucket(batch_size)
                rows += [(k(Series.ARM_REQUESTS, "", b, arm), 1.0),
                         (k(Series.ARM_DECODE_MS, "", b, arm), float(decode_ms)),
                         (k(Series.ARM_TOKENS, "", b, arm), float(output_tokens))]
        self.book.add(rows)

    def record_decision(self, schema_key: str, reason: str, reasons: Mapping[str, str]) -> None:
        """The policy decided for one request: its own ``reason`` and each proposer's (``reasons``)."""
        k = self._keys(schema_key)
        rows = [(k(Series.DECISION, label=reason), 1.0)]
        rows += [(k(Series.DECISION, p, label=r), 1.0) for p, r in reasons.items()]
        self.book.add(rows)

    def record_name(self, schema_key: str, name: str) -> None:
        """One request named the (inline) schema ``name``: a readable label for the schema's content key."""
        self.book.add([(self._keys(schema_key)(Series.NAME, label=name), 1.0)])

    def record_verification(self, schema_key: str, proposer: str, batch_size: int, drafted: int, accepted: int,
                            probe: bool) -> None:
        """One verification of a ``drafted``-token draft kept ``accepted`` tokens.

        The verifier examined positions 1..accepted+1 (the first rejection ends it), so position i is
        ``reached`` when i <= min(drafted, accepted + 1) and accepted there when i <= accepted.
        """
        b = batch_bucket(batch_size)
        k = self._keys(schema_key)
        rows = [
            (k(Series.VERIFICATIONS, proposer, b), 1.0),
            (k(Series.DRAFTED, proposer, b), float(drafted)),
            (k(Series.ACCEPTED, proposer, b), float(accepted)),
        ]
        if probe:
            rows.append((k(Series.PROBE_VERIFICATIONS, proposer, b), 1.0))
        for i in range(1, min(drafted, accepted + 1) + 1):
            rows.append((k(Series.REACHED, proposer, b, str(i)), 1.0))
            if i <= accepted:
                rows.append((k(Series.ACCEPTED_AT, proposer, b, str(i)), 1.0))
        self.book.add(rows)

    def record_replay(self, schema_key: str, proposer: str, batch_size: int,
                      verdicts: Sequence[tuple[int, int]]) -> None:
        """Drafts replayed on a finished output (``speculation.replay``): (drafted, accepted) each, counted by
        draft position as ``record_verification`` counts a verification, under the ``REPLAYED_*`` series."""
        if not verdicts:
            return
        b = batch_bucket(batch_size)
        k = self._keys(schema_key)
        reached: dict[int, int] = defaultdict(int)
        accepted_at: dict[int, int] = defaultdict(int)
        for drafted, accepted in verdicts:
            for i in range(1, min(drafted, accepted + 1) + 1):
                reached[i] += 1
                accepted_at[i] += i <= accepted
        self.book.add([(k(Series.REPLAYED, proposer, b), float(len(verdicts))),
                       (k(Series.REPLAYED_DRAFTED, proposer, b), float(sum(d for d, _ in verdicts))),
                       *((k(Series.REPLAYED_REACHED, proposer, b, str(i)), float(n)) for i, n in reached.items()),
                       *((k(Series.REPLAYED_ACCEPTED_AT, proposer, b, str(i)), float(n))
                         for i, n in accepted_at.items() if n)])

    def record_proposal(self, proposer: str, asked: int, seconds: float, made: bool = True) -> None:
        """One ask of ``proposer`` for ``asked`` tokens, ``seconds`` long; ``made``: it returned a draft."""
        k = self._keys("")
        self.book.add([(k(Series.PROPOSALS, proposer, 0, str(asked)), 1.0),
                       (k(Series.PROPOSE_SECONDS, proposer, 0, str(asked)), float(seconds)),
                       *([] if made else [(k(Series.PROPOSALS_EMPTY, proposer, 0, str(asked)), 1.0)])])

    def record_step(self, batch_size: int, rows: int, seconds: float, restricted: bool = False) -> None:
        """One target forward over ``batch_size`` sequences, the longest scoring ``rows`` drafted tokens past its
        first row (as a step profile's k-row step does); ``restricted``: every row it scored had a small allowed set
        (no output layer ran)."""
        b, k = batch_bucket(batch_size), self._keys("")
        head = RESTRICTED_HEAD if restricted else ""
        self.book.add([(k(Series.STEPS, head, b, str(rows)), 1.0),
                       (k(Series.STEP_SECONDS, head, b, str(rows)), float(seconds))])

    def record_profile(self, steps: Mapping[tuple[str, int, int], float]) -> None:
        """The executor's step profile measured at start: (head, batch bucket, k) -> seconds, head ``full``,
        ``restricted`` or ``draft`` (``models.step_profile``). Kept as a count and a sum, so restarts and replicas
        add up to a mean."""
        k = self._keys("")
        rows: list[tuple[CounterKey, float]] = []
        for (head, bucket, length), seconds in steps.items():
            rows += [(k(Series.PROFILE_STEPS, head, bucket, str(length)), 1.0),
                     (k(Series.PROFILE_SECONDS, head, bucket, str(length)), float(seconds))]
        self.book.add(rows)

    def record_policy(self, schema_key: str, reasons: Mapping[str, str], batch_size: int,
                      acceptance: Mapping[str, float | None], threshold: float | None) -> None:
        """The policy's per-proposer reasons of one decision, with the acceptance it read per proposer: the
        changes of each proposer's state (``PolicyStates``), and its switches counted in the totals."""
        now, b = self.book.clock(), batch_bucket(batch_size)
        for proposer, reason in reasons.items():
            change = self.book.policy.observe(self.model, schema_key, proposer, reason, now, b,
                                              acceptance.get(proposer), threshold)
            if change is not None and change.is_switch:
                self.book.totals.add_switch(schema_key, proposer, change.state)

    def record_rejection(self, schema_key: str, proposer: str, batch_size: int, context: Sequence[int],
                         draft: Sequence[int], position: int, target_token: int, grammatical: bool,
                         decode: Callable[[Sequence[int]], str]) -> bool:
        """Offer one rejected draft (``draft[position]`` refused, the target chose ``target_token``) to the schema's
        sample; ``decode`` (token ids -> text) runs only when it is kept. Whether it was kept; never raises."""
        try:
            if not 0 <= position < len(draft) or draft[position] == target_token:
                return False  # nothing was refused (an EOS the grammar walk cut and the target chose too)
            now = self.book.clock()
            hour = hour_of(now)
            slot = self.book.samples.slot(self.model, schema_key, proposer, hour)
            if slot is None:
                return False
            ctx = tuple(int(t) for t in context[-CONTEXT_TOKENS:])
            tokens = tuple(int(t) for t in draft)
            self.book.samples.put(RejectedDraft(
                self.model, schema_key, proposer, hour, slot, now, batch_bucket(batch_size), ctx, decode(ctx), tokens,
                decode(tokens), position, tokens[position], decode(tokens[position:position + 1]), int(target_token),
                decode([int(target_token)]), grammatical, self.book.samples.writer))
            return True
        except Exception:  # noqa: BLE001 - a sample is never worth a request
            return False

    def record_traffic(self, schema_key: str, prompt: Sequence[int], output: Sequence[int], finish: str) -> bool:
        """Offer one finished request's prompt and output ids to the schema's traffic sample (only ``stop`` and
        ``length`` are sampled); the ids are copied only when it is kept. Whether it was kept; never raises."""
        try:
            if finish not in FINISHES or not output:
                return False
            now = self.book.clock()
            hour = hour_of(now)
            slot = self.book.traffic.slot(self.model, schema_key, hour)
            if slot is None:
                return False
            self.book.traffic.put(TrafficSample(self.model, schema_key, hour, slot, now,
                                                tuple(int(t) for t in prompt), tuple(int(t) for t in output), finish,
                                                self.book.traffic.writer))
            return True
        except Exception:  # noqa: BLE001 - a sample is never worth a request
            return False
