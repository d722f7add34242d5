"""Traffic samples: a bounded sample, per (model, schema), of completed requests' prompt and output token ids.

What ``structspec draft align`` learns from beside the rejected drafts: the whole context a
request's output was decoded in, so the target's distribution can be recomputed at every
output position. A sample holds callers' whole input (the prompt), so it is read only by
whoever may read the store itself.

Each hour of each (model, schema) keeps a uniform sample (a reservoir) of at most ``per_hour``
of its finished requests (``stop`` or ``length``; a cancelled or failed request's output is no
evidence of what the target writes), as the rejected drafts do; the store keeps the newest
``KEEP_PER_KEY`` per (model, schema); each writer (process) fills reservoirs of its own. The
decode path asks ``slot`` first and copies the ids only when it got one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from structspec.stats.samples import SampleReservoir

KEEP_PER_KEY = 500  # traffic samples the store keeps per (model, schema), the newest
MAX_PENDING = 1000  # unwritten ones kept while the store cannot be written (each holds a whole prompt)
FINISHES = ("stop", "length")  # the finish reasons that are sampled


@dataclass(frozen=True)
class TrafficSample:
    model: str
    schema_key: str
    hour: int  # the hour whose reservoir holds it (unix seconds)
    slot: int  # its place in that reservoir, 0..per_hour-1
    created_at: float  # unix seconds
    prompt_tokens: tuple[int, ...]  # the whole prompt, as the target saw it
    output_tokens: tuple[int, ...]  # the whole output (forced tokens included)
    finish: str  # stop | length
    writer: str = ""  # the sampler whose reservoir holds it (``SampleReservoir.writer``)

    @property
    def key(self) -> tuple[str, str, int, str, int]:
        return (self.model, self.schema_key, self.hour, self.writer, self.slot)

    @property
    def ids(self) -> tuple[int, ...]:
        """Prompt and output, one sequence (the output starts at ``len(prompt_tokens)``)."""
        return self.prompt_tokens + self.output_tokens


class TrafficSampler(SampleReservoir["TrafficSample"]):
    """Reservoirs of finished requests per (model, schema, hour), and those not yet in the store.

    The rejected drafts' reservoir with the proposer left out of the key; thread-safe; ``per_hour`` 0
    samples nothing."""

    def __init__(self, per_hour: int = 8, max_keys: int = 1024, rng: random.Random | None = None,
                 max_pending: int = MAX_PENDING, writer: str | None = None):
        super().__init__(per_hour, max_keys, rng, max_pending, writer)

    def slot(self, model: str, schema_key: str, hour: int) -> int | None:  # type: ignore[override]
        """Count one finished request; the reservoir slot its sample goes to, or None when it is not sampled."""
        return super().slot(model, schema_key, "", hour)
