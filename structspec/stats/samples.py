"""Rejected drafts: a bounded sample, per (model, schema, proposer), of where the target disagreed with a draft.

A sample holds the context's last tokens, the drafted continuation, the position the first
drafted token was refused at, that token and what the target chose there: the material a
draft-alignment job learns from, and what a schema's owner reads to see what the model rejects.

Each hour of each key keeps a uniform sample (a reservoir) of at most ``per_hour`` of its
rejections, so the sample spreads over the day instead of filling with one burst; the store
keeps the newest ``KEEP_PER_KEY`` per key. A reservoir is one writer's (``writer``: a random id
per sampler, so per process): replicas sharing a store, and a process restarted within the hour,
fill reservoirs of their own, never each other's slots; each is a uniform sample of what its
writer saw. The decode path asks ``slot`` first (a dict lookup and
one random draw under a lock) and builds the sample, decoding its text, only when it got a slot.
"""

from __future__ import annotations

import random
import threading
import uuid
from dataclasses import dataclass
from typing import Generic, Hashable, Protocol, TypeVar

from structspec.stats.pending import Pending

CONTEXT_TOKENS = 32  # the context's last tokens kept with a sample
KEEP_PER_KEY = 200  # samples the store keeps per (model, schema, proposer), the newest


@dataclass(frozen=True)
class RejectedDraft:
    model: str
    schema_key: str
    proposer: str
    hour: int  # the hour whose reservoir holds it (unix seconds)
    slot: int  # its place in that reservoir, 0..per_hour-1
    created_at: float  # unix seconds
    batch_bucket: int  # the running batch's bucket at the verification
    context_tokens: tuple[int, ...]  # the last CONTEXT_TOKENS committed tokens before the draft (prompt included)
    context_text: str
    draft_tokens: tuple[int, ...]  # the whole drafted continuation
    draft_text: str
    position: int  # 0-based: the drafted tokens before it were accepted
    rejected_token: int  # draft_tokens[position]
    rejected_text: str
    target_token: int  # what the target chose at that position
    target_text: str
    grammatical: bool  # False: the grammar refused the drafted token (the target could not choose it)
    writer: str = ""  # the sampler whose reservoir holds it ("": written before reservoirs were per writer)

    @property
    def key(self) -> tuple[str, str, str, int, str, int]:
        return (self.model, self.schema_key, self.proposer, self.hour, self.writer, self.slot)


class _Sample(Protocol):
    @property
    def key(self) -> Hashable: ...  # its slot: a later sample for the same slot replaces an unwritten one


S = TypeVar("S", bound=_Sample)


class SampleReservoir(Generic[S]):
    """Reservoirs of rejected drafts per (model, schema, proposer, hour), and those not yet in the store.

    Thread-safe. ``per_hour`` 0 samples nothing. At most ``max_keys`` keys are tracked within an
    hour (a flood of new inline schemas gets no more samples, never more memory), and at most
    ``max_pending`` samples wait for the store (while it cannot be written): past that the oldest
    waiting one is dropped and counted in ``dropped``. ``writer``: the id its samples carry (random by default)."""

    def __init__(self, per_hour: int = 8, max_keys: int = 1024, rng: random.Random | None = None,
                 max_pending: int = 10_000, writer: str | None = None):
        if per_hour < 0:
            raise ValueError("per_hour must be >= 0")
        self.per_hour = per_hour
        self.writer = uuid.uuid4().hex if writer is None else writer
        self.max_keys = max_keys
        self.max_pending = max_pending
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str, str], tuple[int, int]] = {}  # key -> (hour, rejections seen in it)
        # unwritten samples, one per slot: a replaced slot overwrites the unwritten one
        self._pending: Pending[S] = Pending(max_pending, key=lambda r: r.key)

    @property
    def dropped(self) -> int:
        """Samples dropped because ``max_pending`` were already waiting."""
        return self._pending.dropped

    def slot(self, model: str, schema_key: str, proposer: str, hour: int) -> int | None:
        """Count one rejection; the reservoir slot its sample goes to, or None when it is not sampled."""
        if self.per_hour <= 0:
            return None
        key = (model, schema_key, proposer)
        with self._lock:
            last_hour, seen = self._seen.get(key, (hour, 0))
            if last_hour != hour:
                seen = 0
            if key not in self._seen and len(self._seen) >= self.max_keys:
                self._seen = {k: v for k, v in self._seen.items() if v[0] >= hour}  # forget past hours
                if len(self._seen) >= self.max_keys:
                    return None
            seen += 1
            self._seen[key] = (hour, seen)
            if seen <= self.per_hour:
                return seen - 1
            j = self._rng.randrange(seen)  # reservoir sampling: each of the hour's rejections kept with equal odds
            return j if j < self.per_hour else None

    def put(self, sample: S) -> None:
        self._pending.put([sample])

    def take(self) -> list[S]:
        """The samples put since the last take (the store writes them; ``restore`` puts them back on failure)."""
        return self._pending.take()

    def restore(self, rows: list[S]) -> None:
        """The restored ones are older than those put since: they go first (and first when the bound drops)."""
        self._pending.restore(rows)

    def pending(self) -> list[S]:
        return self._pending.pending()


class RejectedDraftReservoir(SampleReservoir[RejectedDraft]):
    """The rejected drafts' reservoirs (``SampleReservoir``)."""
