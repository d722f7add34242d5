"""The batch-size rule on vLLM: a draft length per batch bucket, from the policy's per-bucket evidence.

vLLM's scheduler takes one draft length per range of running batch sizes
(``SpeculativeConfig.num_speculative_tokens_per_batch_size``: ``[(first, last, k), ...]``, read when the engine
is built). structspec fills it from what its statistics book holds for the model the engine serves (every
schema's verifications, and the step times measured on that engine: ``steps``), bucket by bucket, with the
drafting policy's own rules (``structspec.speculation.policy``):

- cold (under ``min_evidence_tokens`` drafted tokens at the bucket, pooled over buckets where it has too few):
  the configured length, measuring;
- step costs not measured at the bucket (or ``acceptance_guard = "always"``): 0 where acceptance is under
  ``acceptance_threshold`` (the guard), else the configured length (or the cost model's where measured);
- measured: ``best_draft_length``, the k minimising the time per committed token, 0 where no k beats plain
  decoding by ``gain_margin`` (off above the break-even).

Terms: a bucket ``b`` (1, 2, 4, ...) covers the batch sizes ``b/2 + 1 .. b`` (1 alone); the last covers up to
the engine's ``max_num_seqs``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from structspec.engine.config import PolicyConfig
from structspec.speculation.policy import best_draft_length
from structspec.stats.book import Counters
from structspec.stats.counters import CounterKey, hour_of
from structspec.stats.evidence import cost_evidence, schema_evidence

ALL_SCHEMAS = "*"  # the key every schema's rows are pooled under here


@dataclass(frozen=True)
class BucketLength:
    """The draft length chosen for one batch bucket, and why."""

    first: int  # batch sizes first..last
    last: int
    bucket: int
    draft_length: int
    reason: str  # cold | unmeasured_cost | low_acceptance | cost_model
    acceptance: float | None  # per examined token, at the bucket (pooled where thin); None: nothing drafted
    drafted: float  # weighted drafted tokens behind it
    plain_step_ms: float | None  # a step without a draft at the bucket, measured
    step_ms: float | None  # a step with the chosen draft length, measured (or interpolated)

    def as_entry(self) -> tuple[int, int, int]:
        return (self.first, self.last, self.draft_length)


def batch_schedule(counters: Counters, model: str, proposer: str, max_length: int, max_batch: int,
                   config: PolicyConfig = PolicyConfig(), now: float = 0.0) -> list[BucketLength]:
    """The draft length per batch bucket of ``model``'s ``proposer`` (vLLM's method), at most ``max_length``.
    ``counters``: the book's rows (every model's; this one's are read); ``now``: unix seconds."""
    now_hour = hour_of(now)
    pooled: Counters = {}
    own: Counters = {}
    for key, value in counters.items():
        if key.model != model:
            continue
        if key.schema_key == "":
            own[key] = own.get(key, 0.0) + value
        else:
            pooled_key = CounterKey(key.model, ALL_SCHEMAS, key.hour, key.series, key.proposer, key.batch_bucket,
                                    key.label)
            pooled[pooled_key] = pooled.get(pooled_key, 0.0) + value
    evidence = schema_evidence(pooled, now_hour, config.half_life_hours, config.evidence_window_tokens,
                               config.evidence_max_age_hours)
    costs = cost_evidence(own, now_hour, config.half_life_hours)
    capped = replace(config, max_draft=max_length)
    out: list[BucketLength] = []
    bucket, first = 1, 1
    while first <= max_batch:
        last = min(bucket, max_batch)
        ev = evidence.at_bucket(proposer, bucket, config.min_evidence_tokens)
        plain = costs.step_seconds(bucket, 0)
        acceptance = ev.acceptance if ev is not None and ev.drafted > 0 else None
        drafted = ev.drafted if ev is not None else 0.0
        if ev is None or ev.drafted < config.min_evidence_tokens:
            k, reason = max_length, "cold"
        elif plain is None or config.acceptance_guard == "always":
            ok = acceptance is not None and acceptance >= config.acceptance_threshold
            if not ok:
                k, reason = 0, "low_acceptance"
            elif plain is None:
                k, reason = max_length, "unmeasured_cost"
            else:
                k, reason = best_draft_length(ev, costs, proposer, bucket, capped), "cost_model"
        else:
            k, reason = best_draft_length(ev, costs, proposer, bucket, capped), "cost_model"
        step = costs.step_seconds(bucket, k)
        out.append(BucketLength(first, last, bucket, k, reason, acceptance, drafted,
                                plain * 1000 if plain is not None else None, step * 1000 if step is not None else None))
        first, bucket = last + 1, bucket * 2
    return out


def schedule_entries(lengths: list[BucketLength]) -> list[tuple[int, int, int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size``: the buckets' ranges, neighbours of one length merged."""
    entries: list[tuple[int, int, int]] = []
    for b in lengths:
        if entries and entries[-1][2] == b.draft_length:
            entries[-1] = (entries[-1][0], b.last, b.draft_length)
        else:
            entries.append(b.as_entry())
    return entries
