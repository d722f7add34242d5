"""What the drafting policy reads: a schema's recent acceptance and the model's step costs.

The acceptance window. Counters are hourly, so acceptance is measured over whole hours: the
newest hours (of the last ``max_age_hours``) whose drafted tokens add up to ``window_tokens``,
newest first, the oldest of them taken in proportion to fit. Within one hour old and new
evidence cannot be told apart: an hour holding 20,000 tokens at 0.8 and then 1,000 at 0.1 reads
its mean (0.767); the change shows in full once the hours after it hold ``window_tokens``. However
old the evidence, it stays until newer evidence replaces it: a proposer that drafts rarely (one
switched off, probed now and then) is judged on its last ``window_tokens`` whenever they were drafted.

Output lengths, step costs and the arms' times per token of an hour ``age`` hours old weigh
``2^(-age / half_life)``; the arms' request counts (``ArmEvidence.count``) are not weighted: a
measured arm stays measured however quiet the schema. Cost: one pass over the counters of one
(model, schema) and of the model's own series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from structspec.stats.book import Counters
from structspec.stats.counters import (HOUR, LENGTH_BOUNDS, RESTRICTED_HEAD, Reason, Series, batch_bucket,
                                       histogram_quantile, proposer_of)


@dataclass(frozen=True)
class ProposerEvidence:
    """Weighted drafting counts of one proposer (at one batch bucket, or pooled)."""

    drafted: float = 0.0
    accepted: float = 0.0
    reached: tuple[float, ...] = ()  # [i]: drafts whose position i+1 was examined
    accepted_at: tuple[float, ...] = ()  # [i]: of those, accepted

    @property
    def acceptance(self) -> float:
        """Drafted tokens accepted per token the verifier examined (a draft's tokens after its first rejection
        were never examined): the per-token acceptance, whatever length the drafts had."""
        examined = sum(self.reached)
        if examined > 0:
            return sum(self.accepted_at) / examined
        return self.accepted / self.drafted if self.drafted else 0.0

    def expected_accepted(self, k: int) -> float:
        """E[accepted tokens | a k-token draft] = sum_{i<=k} prod_{j<=i} P(accept j | examined j).

        A position never examined takes the last measured conditional rate (0 when none was measured)."""
        total, chain, last = 0.0, 1.0, 0.0
        for i in range(k):
            if i < len(self.reached) and self.reached[i] > 0:
                last = self.accepted_at[i] / self.reached[i]
            chain *= last
            total += chain
        return total

    def with_pooled_depth(self, strength: float) -> ProposerEvidence:
        """The evidence with ``strength`` examined tokens added at each position after the first, accepted at the
        proposer's own pooled rate over those positions (a Beta prior shared across depth): a deep position read
        from a handful of examinations (0 of 2) no longer caps every deeper one, while one measured often keeps
        its own rate. The first position and the drafted totals are left as measured. Raises: Never."""
        examined, accepted = sum(self.reached[1:]), sum(self.accepted_at[1:])
        if strength <= 0 or examined <= 0:
            return self
        rate = accepted / examined
        return ProposerEvidence(self.drafted, self.accepted,
                                self.reached[:1] + tuple(r + strength for r in self.reached[1:]),
                                self.accepted_at[:1] + tuple(a + rate * strength for a in self.accepted_at[1:]))

    def plus(self, other: ProposerEvidence | None) -> ProposerEvidence:
        """Both counts added, position by position."""
        if other is None:
            return self
        n = max(len(self.reached), len(other.reached))

        def at(values: tuple[float, ...], i: int) -> float:
            return values[i] if i < len(values) else 0.0

        return ProposerEvidence(self.drafted + other.drafted, self.accepted + other.accepted,
                                tuple(at(self.reached, i) + at(other.reached, i) for i in range(n)),
                                tuple(at(self.accepted_at, i) + at(other.accepted_at, i) for i in range(n)))

    def with_prior(self, first: float, strength: float, depth: int, later: float | None = None) -> ProposerEvidence:
        """The evidence with ``strength`` examined tokens added at each of the first ``depth`` positions, accepted at
        ``first`` at position 1 and ``later`` (default ``first``) after it (a Beta prior on each position's
        acceptance given the one before): what a cold proposer is priced with. Thin evidence moves it little;
        ``strength`` tokens of evidence move it halfway."""
        n = max(depth, len(self.reached))
        rate = [first] + [first if later is None else later] * (n - 1)
        reached = tuple((self.reached[i] if i < len(self.reached) else 0.0) + (strength if i < depth else 0.0)
                        for i in range(n))
        accepted_at = tuple((self.accepted_at[i] if i < len(self.accepted_at) else 0.0)
                            + (rate[i] * strength if i < depth else 0.0) for i in range(n))
        return ProposerEvidence(self.drafted, self.accepted, reached, accepted_at)


@dataclass(frozen=True)
class ArmEvidence:
    """Complete requests decoded in one arm (with or without the draft model): weighted by age, and counted."""

    requests: float = 0.0
    decode_ms: float = 0.0
    tokens: float = 0.0
    count: float = 0.0  # the same requests, not weighted

    @property
    def ms_per_token(self) -> float:
        return self.decode_ms / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class SchemaEvidence:
    by_bucket: dict[tuple[str, int], ProposerEvidence] = field(default_factory=dict)  # (proposer, bucket)
    pooled: dict[str, ProposerEvidence] = field(default_factory=dict)  # proposer, every bucket
    output_p50: float | None = None  # complete outputs, in tokens
    finished: float = 0.0  # weighted complete outputs behind output_p50
    arms: dict[tuple[str, int], ArmEvidence] = field(default_factory=dict)  # (arm, bucket)
    arms_pooled: dict[str, ArmEvidence] = field(default_factory=dict)
    last_measured: dict[str, int] = field(default_factory=dict)  # proposer -> the newest hour it drafted or was probed
    hour: int = 0  # the hour the evidence was read at
    replayed: dict[str, ProposerEvidence] = field(default_factory=dict)  # proposer -> drafts replayed on finished
    # outputs it did not draft in (``speculation.replay``), pooled over buckets: a cold proposer's prior

    def arm_at(self, arm: str, batch_size: int, min_requests: float) -> ArmEvidence:
        """The arm at ``batch_size``'s bucket; pooled over buckets where that bucket has too few requests."""
        own = self.arms.get((arm, batch_bucket(batch_size)))
        if own is not None and own.count >= min_requests:
            return own
        return self.arms_pooled.get(arm, own or ArmEvidence())

    def at_bucket(self, proposer: str, batch_size: int, min_drafted: float) -> ProposerEvidence | None:
        """The proposer's evidence at the batch bucket of ``batch_size``; where that bucket has under
        ``min_drafted`` tokens, pooled over every bucket (acceptance barely depends on the batch)."""
        own = self.by_bucket.get((proposer, batch_bucket(batch_size)))
        if own is not None and own.drafted >= min_drafted:
            return own
        return self.pooled.get(proposer, own)


@dataclass(frozen=True)
class CostEvidence:
    """Mean measured seconds: target steps per (batch bucket, longest draft), drafting per (proposer, k), measured
    while serving; beside them the executor's step profile (``profile``: (bucket, k) -> seconds of a k-row step,
    measured before serving, ``structspec.models.step_profile``) and the draft model's seconds per token
    (``draft_token``: bucket -> seconds), which price what serving has not measured yet."""

    steps: dict[tuple[int, int], float] = field(default_factory=dict)
    proposals: dict[tuple[str, int], float] = field(default_factory=dict)
    profile: dict[tuple[int, int], float] = field(default_factory=dict)
    draft_token: dict[int, float] = field(default_factory=dict)
    # the same two for forwards whose every scored row had a small allowed set (the *restricted* head: no output
    # layer, ``ForwardStep.restricted_logits_max``): served steps measured so, and the profile's restricted rows
    restricted_steps: dict[tuple[int, int], float] = field(default_factory=dict)
    restricted_profile: dict[tuple[int, int], float] = field(default_factory=dict)
    # proposer -> the share of its lookups that made a draft (measured while serving; absent: taken as 1)
    proposal_hits: dict[str, float] = field(default_factory=dict)

    def step_seconds(self, batch_size: int, k: int) -> float | None:
        """A step at ``batch_size``'s bucket with a k-token draft: measured while serving; else the profile's, fitted
        to serving (``_served_profile``); else between measured lengths, interpolated. None where neither says."""
        b = batch_bucket(batch_size)
        if (b, k) in self.steps:
            return self.steps[(b, k)]
        profiled = self._profiled(b, k)
        if profiled is not None:
            return self._served_profile(b, k, profiled)
        return _between(self.steps, b, k)  # not extrapolated: an unmeasured length is not chosen

    def _served_profile(self, bucket: int, k: int, profiled: float) -> float:
        """The profile's k-row step as serving would time it. The profile times forwards alone; a served step is timed
        whole (``EngineCore._record_step``), so it carries more: per step (the next position's mask, sampling, the
        commit) and per drafted row (its grammar mask and allowed set, its verification). So the served plain step
        stands for the profile's, and each drafted row adds the profile's cost of a row scaled by what a row cost
        served: the served drafted steps' rows over the profile's at the same lengths. With no drafted step served
        the whole profile is scaled by the plain steps' ratio; with no plain step served it is taken as measured.
        (Gemma 3 270M on llama.cpp, restricted head: a 1-row draft's step cost 11.2 ms served, 2.9 ms over a
        plain one, where its forward added 1.4 ms.)"""
        plain, served = self._profiled(bucket, 0), self.steps.get((bucket, 0))
        if served is None or not plain:
            return profiled
        served_rows = profile_rows = 0.0
        for (bb, kk), seconds in self.steps.items():
            at = self._profiled(bucket, kk) if bb == bucket and kk > 0 else None
            if at is not None and at > plain:
                served_rows += seconds - served
                profile_rows += at - plain
        row_scale = served_rows / profile_rows if profile_rows > 0 and served_rows > 0 else served / plain
        return served + (profiled - plain) * row_scale

    def _profiled(self, bucket: int, k: int) -> float | None:
        """The profile's seconds for a k-row step at ``bucket``; past the largest measured bucket, that bucket's cost
        scaled by the batch (a CPU's step grows with it; the ratio to a plain step is kept); None where the profile
        has nothing at or under ``bucket``, or nothing around k."""
        under = [bb for bb in {bb for bb, _ in self.profile} if bb <= bucket]
        if not under:
            return None
        at = max(under)
        seconds = _between(self.profile, at, k)
        return seconds * bucket / at if seconds is not None else None

    def propose_seconds(self, proposer: str, k: int) -> float:
        """Drafting time per ``k``-token draft made: a lookup's time (measured, or scaled from the nearest measured
        length) over the share of lookups that made a draft (``proposal_hits``). A proposer is asked at every
        position it may draft at, and a lookup that finds nothing costs its step as much: charged to the drafts
        made, the switch is exact (drafting pays iff (T(k) + lookup / hits) / (1 + E[accepted]) < T(0)). The draft
        model's from the profile's per-token time where serving measured none; 0 for the others before any is
        measured. A draft key (``counters.draft_keys``: a long match's) costs its proposer's lookup."""
        proposer = proposer_of(proposer)
        hits = max(self.proposal_hits.get(proposer, 1.0), MIN_HIT_RATE)
        if (proposer, k) in self.proposals:
            return self.proposals[(proposer, k)] / hits
        ks = [kk for p, kk in self.proposals if p == proposer]
        if not ks:
            if proposer == DRAFT_PROPOSER and self.draft_token:
                return k * self.draft_token[min(self.draft_token)]
            return 0.0
        near = min(ks, key=lambda kk: abs(kk - k))
        return self.proposals[(proposer, near)] * k / max(near, 1) / hits

    def with_profile(self, profile: dict[tuple[int, int], float], draft_token: dict[int, float],
                     restricted: dict[tuple[int, int], float] | None = None) -> CostEvidence:
        return CostEvidence(self.steps, self.proposals, dict(profile), dict(draft_token), self.restricted_steps,
                            dict(restricted) if restricted is not None else self.restricted_profile,
                            self.proposal_hits)

    def restricted(self) -> CostEvidence | None:
        """The costs of forwards that score small allowed sets alone, as a ``CostEvidence`` of their own (its plain
        step a restricted decode step, which is what a draft at such positions saves); None where neither serving
        nor the profile measured one (the executor has no restricted head)."""
        if not self.restricted_steps and not self.restricted_profile:
            return None
        return CostEvidence(self.restricted_steps, self.proposals, self.restricted_profile, self.draft_token,
                            proposal_hits=self.proposal_hits)


DRAFT_PROPOSER = "draft"  # the draft model's proposer name (``DraftModelProposer.name``)
MIN_HIT_RATE = 0.01  # a proposer whose lookups (almost) never draft is charged 100 lookups per draft, not infinity


def _between(table: dict[tuple[int, int], float], bucket: int, k: int) -> float | None:
    """``table``'s seconds at (bucket, k), or interpolated between the nearest lengths measured on either side of k
    at that bucket; None where k has no measured neighbour on one side."""
    if (bucket, k) in table:
        return table[(bucket, k)]
    ks = sorted(kk for bb, kk in table if bb == bucket)
    lower = [kk for kk in ks if kk < k]
    upper = [kk for kk in ks if kk > k]
    if not lower or not upper:
        return None
    lo, hi = lower[-1], upper[0]
    t_lo, t_hi = table[(bucket, lo)], table[(bucket, hi)]
    return t_lo + (t_hi - t_lo) * (k - lo) / (hi - lo)


def _weight(hour: int, now_hour: int, half_life_hours: float) -> float:
    return float(0.5 ** (max(0, now_hour - hour) / HOUR / half_life_hours))


def schema_evidence(counters: Counters, now_hour: int, half_life_hours: float,
                    window_tokens: float = 1000.0, max_age_hours: float = 168.0) -> SchemaEvidence:
    """From one (model, schema)'s counters. Drafting evidence older than ``max_age_hours`` is not read."""
    oldest = now_hour - max_age_hours * HOUR
    hourly: dict[tuple[str, int], dict[int, list[Any]]] = {}  # (proposer, bucket) -> hour -> counts
    lengths: dict[str, float] = {}
    arms: dict[tuple[str, int], list[float]] = {}
    last_measured: dict[str, int] = {}
    replayed: dict[str, dict[int, list[Any]]] = {}  # proposer -> hour -> counts (every bucket)
    for key, value in counters.items():
        s = key.series
        if s == Series.OUTPUT_LENGTH:
            w = _weight(key.hour, now_hour, half_life_hours) * value
            lengths[key.label] = lengths.get(key.label, 0.0) + w
            continue
        if s in _ARM_SERIES:
            row: list[Any] = arms.setdefault((key.label, key.batch_bucket), [0.0, 0.0, 0.0, 0.0])
            row[_ARM_SERIES[s]] += _weight(key.hour, now_hour, half_life_hours) * value
            if s == Series.ARM_REQUESTS:
                row[3] += value
            continue
        if key.hour < oldest:
            continue
        if (s == Series.DRAFTED or (s == Series.DECISION and key.label == Reason.PROBE)) and value > 0 \
                and key.proposer and key.hour > last_measured.get(key.proposer, -1):
            last_measured[key.proposer] = key.hour
        if s in _REPLAYED_SERIES:
            row = replayed.setdefault(key.proposer, {}).setdefault(key.hour, [0.0, 0.0, {}, {}])
            _add(row, _REPLAYED_SERIES[s], key.label, value)
            if s == Series.REPLAYED_ACCEPTED_AT:
                row[1] += value
            continue
        if s not in (Series.DRAFTED, Series.ACCEPTED, Series.REACHED, Series.ACCEPTED_AT):
            continue
        row = hourly.setdefault((key.proposer, key.batch_bucket), {}).setdefault(key.hour, [0.0, 0.0, {}, {}])
        _add(row, s, key.label, value)
    pooled: dict[str, dict[int, list[Any]]] = {}
    for (proposer, _), hours in hourly.items():
        for hour, (dr, ac, reached, acc_at) in hours.items():
            row = pooled.setdefault(proposer, {}).setdefault(hour, [0.0, 0.0, {}, {}])
            row[0] += dr
            row[1] += ac
            for src, dst in ((reached, row[2]), (acc_at, row[3])):
                for pos, v in src.items():
                    dst[pos] = dst.get(pos, 0.0) + v
    arms_pooled: dict[str, list[float]] = {}
    for (arm, _), row in arms.items():
        total = arms_pooled.setdefault(arm, [0.0, 0.0, 0.0, 0.0])
        for i in range(4):
            total[i] += row[i]
    return SchemaEvidence({k: _recent(h, window_tokens) for k, h in hourly.items()},
                          {p: _recent(h, window_tokens) for p, h in pooled.items()},
                          histogram_quantile(lengths, 0.5, LENGTH_BOUNDS), sum(lengths.values()),
                          {k: ArmEvidence(*v) for k, v in arms.items()}, {a: ArmEvidence(*v) for a, v in arms_pooled.items()},
                          last_measured, now_hour, {p: _recent(h, window_tokens) for p, h in replayed.items()})


_REPLAYED_SERIES = {Series.REPLAYED_DRAFTED: Series.DRAFTED, Series.REPLAYED_REACHED: Series.REACHED,
                    Series.REPLAYED_ACCEPTED_AT: Series.ACCEPTED_AT}
_ARM_SERIES = {Series.ARM_REQUESTS: 0, Series.ARM_DECODE_MS: 1, Series.ARM_TOKENS: 2}


def _add(row: list[Any], series: str, label: str, value: float) -> None:
    if series == Series.DRAFTED:
        row[0] += value
    elif series == Series.ACCEPTED:
        row[1] += value
    else:
        target = row[2] if series == Series.REACHED else row[3]
        pos = int(label)
        target[pos] = target.get(pos, 0.0) + value


def _recent(hours: dict[int, list[Any]], window_tokens: float) -> ProposerEvidence:
    """The newest hours' counts up to ``window_tokens`` drafted tokens, the oldest of them taken in proportion (the
    newest alone when it holds the window: its mean, its hour's old and new evidence mixed)."""
    drafted = accepted = 0.0
    reached: dict[int, float] = {}
    acc_at: dict[int, float] = {}
    for hour in sorted(hours, reverse=True):
        dr, ac, r, a = hours[hour]
        if dr <= 0:
            continue
        share = min(1.0, (window_tokens - drafted) / dr)
        drafted += dr * share
        accepted += ac * share
        for src, dst in ((r, reached), (a, acc_at)):
            for pos, v in src.items():
                dst[pos] = dst.get(pos, 0.0) + v * share
        if drafted >= window_tokens - 1e-9:
            break
    return _evidence(drafted, accepted, reached, acc_at)


def _evidence(drafted: float, accepted: float, reached: dict[int, float], acc_at: dict[int, float]) -> ProposerEvidence:
    depth = max([*reached, *acc_at, 0])
    return ProposerEvidence(drafted, accepted, tuple(reached.get(i, 0.0) for i in range(1, depth + 1)),
                            tuple(acc_at.get(i, 0.0) for i in range(1, depth + 1)))


def cost_evidence(counters: Counters, now_hour: int, half_life_hours: float, min_samples: float = 5.0) -> CostEvidence:
    """From the model's own series (schema key ""): means with at least ``min_samples`` weighted samples, and the step
    profile the engine recorded at start (``stored_profile``)."""
    sums: dict[tuple[str, str, int, int], list[float]] = {}
    lookups: dict[str, list[float]] = {}  # proposer -> [lookups, empty ones], weighted
    for key, value in counters.items():
        if key.series in (Series.PROPOSALS, Series.PROPOSALS_EMPTY):
            lookups.setdefault(key.proposer, [0.0, 0.0])[key.series == Series.PROPOSALS_EMPTY] += \
                _weight(key.hour, now_hour, half_life_hours) * value
        if key.series not in (Series.STEPS, Series.STEP_SECONDS, Series.PROPOSALS, Series.PROPOSE_SECONDS):
            continue
        w = _weight(key.hour, now_hour, half_life_hours) * value
        kind = "step" if key.series in (Series.STEPS, Series.STEP_SECONDS) else "proposal"
        row = sums.setdefault((kind, key.proposer, key.batch_bucket, int(key.label)), [0.0, 0.0])
        row[0 if key.series in (Series.STEPS, Series.PROPOSALS) else 1] += w
    steps, restricted, proposals = {}, {}, {}
    for (kind, proposer, bucket, k), (n, seconds) in sums.items():
        if n < min_samples:
            continue
        if kind == "proposal":
            proposals[(proposer, k)] = seconds / n
        elif proposer == RESTRICTED_HEAD:  # (a step's "proposer" is its head: "" full, or restricted)
            restricted[(bucket, k)] = seconds / n
        else:
            steps[(bucket, k)] = seconds / n
    full, draft_token, restricted_profile = stored_profile(counters)
    hits = {p: 1.0 - empty / n for p, (n, empty) in lookups.items() if n >= min_samples}
    return CostEvidence(steps, proposals, full, draft_token, restricted, restricted_profile, hits)


def stored_profile(counters: Counters) -> tuple[dict[tuple[int, int], float], dict[int, float],
                                                dict[tuple[int, int], float]]:
    """The step profile an engine recorded at start (``Series.PROFILE_STEPS``/``PROFILE_SECONDS``, the model's own
    rows; ``Recorder.record_profile``): the full head's k-row steps, {(batch bucket, k): mean seconds}, the draft
    model's decode step, {batch bucket: seconds per token}, and the restricted head's k-row steps; the means over
    every start the rows hold (restarts and replicas add up)."""
    sums: dict[tuple[str, int, int], list[float]] = {}
    for key, value in counters.items():
        if key.series not in (Series.PROFILE_STEPS, Series.PROFILE_SECONDS) \
                or key.proposer not in ("full", "draft", RESTRICTED_HEAD):
            continue
        try:
            k = int(key.label)
        except ValueError:
            continue
        row = sums.setdefault((key.proposer, key.batch_bucket, k), [0.0, 0.0])
        row[0 if key.series == Series.PROFILE_STEPS else 1] += value
    full: dict[tuple[int, int], float] = {}
    restricted: dict[tuple[int, int], float] = {}
    draft_token: dict[int, float] = {}
    for (head, bucket, k), (n, seconds) in sums.items():
        if n <= 0:
            continue
        if head == "full":
            full[(bucket, k)] = seconds / n
        elif head == RESTRICTED_HEAD:
            restricted[(bucket, k)] = seconds / n
        else:  # the draft model's rows: k tokens (recorded as one)
            draft_token[bucket] = seconds / n / max(k, 1)
    return full, draft_token, restricted
