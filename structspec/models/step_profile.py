"""What a verification costs on this executor and model: measured once, before the first request is priced.

Terms:
- a *k-row step* at batch b: b sequences each appending ``k + 1`` tokens (the pending token and a k-token draft)
  and scoring all ``k + 1`` rows, what a verification of a k-token draft costs; k = 0 is a plain decode step;
- the *full* head scores every row over the whole vocabulary; the *restricted* head scores each row over a small
  allowed set (``ForwardStep.restricted_logits_max``: where the grammar allows few tokens, an executor may skip
  the rest of the output layer; with Gemma's 262k vocabulary that layer is most of a step);
- the *draft token* time: the draft model's decode step at batch b, per drafted token.

``measure_step_profile`` times them on synthetic sequences (the fastest of ``reps`` rounds over every k: interference
only adds time; then made non-decreasing in k), bucket by bucket until its time budget is spent; ``StepProfileCache`` keeps a profile per (model, executor, device, dtype, threads, machine), so
only the first start of a model on a machine measures. The drafting policy prices a draft with it from the first
request (``structspec.stats.evidence.CostEvidence``): on llama.cpp with Gemma 3 270M a k-row step costs about
k + 1 decode steps, on a GPU barely more than one, and a cold schema drafts accordingly.

Cost: about ``reps + 1`` steps per (bucket, k); ``budget_seconds`` bounds the whole measurement: a bucket is
measured only where twice the previous bucket's time still fits (the buckets left out are priced from the largest
measured one, ``CostEvidence``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from structspec.models.executor import ForwardStep, StepInput

log = logging.getLogger(__name__)

PROFILE_VERSION = 2  # the measurement's method: a new one measures again
DRAFT_LENGTHS = (0, 1, 2, 3, 4, 6, 8)  # k; lengths between are interpolated
RESTRICTED_ROWS = 16  # allowed ids per row in the restricted measurement
PROMPT_TOKENS = 64  # each synthetic sequence's context before the timed steps


@dataclass(frozen=True)
class StepProfile:
    """Seconds per step, keyed by (batch bucket, draft length k). Immutable; JSON round-trips."""

    key: str  # what was measured: model, executor, device, dtype, threads, machine (``profile_key``)
    full: dict[tuple[int, int], float] = field(default_factory=dict)
    restricted: dict[tuple[int, int], float] = field(default_factory=dict)  # empty: the executor has no such head
    draft_token: dict[int, float] = field(default_factory=dict)  # bucket -> the draft model's seconds per token
    measured_at: float = 0.0
    seconds_spent: float = 0.0

    @property
    def buckets(self) -> list[int]:
        return sorted({b for b, _ in self.full})

    def ratio(self, bucket: int, k: int) -> float | None:
        """A k-row step's cost in plain decode steps at ``bucket`` (full head), or None where not measured."""
        step, plain = self.full.get((bucket, k)), self.full.get((bucket, 0))
        return step / plain if step is not None and plain else None

    def to_json(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "key": self.key, "measured_at": self.measured_at,
                "seconds_spent": self.seconds_spent,
                "full": [[b, k, s] for (b, k), s in sorted(self.full.items())],
                "restricted": [[b, k, s] for (b, k), s in sorted(self.restricted.items())],
                "draft_token": [[b, s] for b, s in sorted(self.draft_token.items())]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepProfile:
        """Raises: ValueError (another version, or not a profile)."""
        if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
            raise ValueError("not a step profile of this version")
        try:
            return cls(str(data["key"]), {(int(b), int(k)): float(s) for b, k, s in data["full"]},
                       {(int(b), int(k)): float(s) for b, k, s in data.get("restricted", [])},
                       {int(b): float(s) for b, s in data.get("draft_token", [])},
                       float(data.get("measured_at", 0.0)), float(data.get("seconds_spent", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed step profile: {exc}") from exc


def profile_key(model: str, executor: str, device: str, dtype: str) -> str:
    """Where a profile holds: the model (its statistics key), the executor, device, dtype, intra-op threads and the
    machine (a profile measured on one CPU or GPU does not price another)."""
    threads = torch.get_num_threads()
    machine = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() \
        else f"{platform.machine()}/{os.cpu_count()}cpu"
    return f"{model}|{executor}|{device}|{dtype}|threads={threads}|{machine}"


def measure_step_profile(executor: ForwardStep, key: str, buckets: Sequence[int] = (1, 2, 4, 8, 16),
                         lengths: Sequence[int] = DRAFT_LENGTHS, draft: ForwardStep | None = None,
                         budget_seconds: float = 20.0, reps: int = 5) -> StepProfile:
    """Time k-row steps (full head, and restricted where the executor has it) and the draft's decode steps at each
    bucket in turn, until ``budget_seconds`` is spent (the smallest bucket is always measured whole). Each
    sequence is freed after. Raises: whatever the executor raises (the caller starts without a profile)."""
    started = time.perf_counter()
    full: dict[tuple[int, int], float] = {}
    restricted: dict[tuple[int, int], float] = {}
    draft_token: dict[int, float] = {}
    fits = [k for k in lengths if PROMPT_TOKENS + k + 1 < executor.max_context]
    last = 0.0  # the previous bucket's measuring time: a bucket twice the batch takes about twice as long
    for i, b in enumerate(sorted(buckets)):
        elapsed = time.perf_counter() - started
        if i > 0 and elapsed + 2 * last > budget_seconds:
            break
        full.update(_time_rows(executor, b, fits, reps, False))
        if executor.restricted_logits_max >= RESTRICTED_ROWS:
            restricted.update(_time_rows(executor, b, fits, reps, True))
        if draft is not None:
            draft_token[b] = _time_rows(draft, b, [0], reps, False)[(b, 0)]
        last = time.perf_counter() - started - elapsed
    spent = time.perf_counter() - started
    return StepProfile(key, full, restricted, draft_token, time.time(), spent)


def _time_rows(executor: ForwardStep, batch: int, lengths: Sequence[int], reps: int,
               restricted: bool) -> dict[tuple[int, int], float]:
    vocab = min(executor.vocab_size, 1000)
    gen = torch.Generator().manual_seed(batch)
    seqs = [executor.new_sequence() for _ in range(batch)]
    try:
        executor.step([StepInput(s, torch.randint(10, vocab, (PROMPT_TOKENS,), generator=gen).tolist())
                       for s in seqs])
        times: dict[int, list[float]] = {k: [] for k in lengths}
        # round by round (every k once, then again), so a burst of interference slows one round of every k, not
        # every rep of one k: the fastest rep of each k is then one the burst missed
        for r in range(reps + 1):  # the first round is a warm-up (allocations, a new shape)
            for k in lengths:
                rows = tuple(range(k + 1))
                allowed = [torch.arange(10, 10 + RESTRICTED_ROWS)] * (k + 1) if restricted else None
                tokens = [10 + (r + j) % (vocab - 10) for j in range(k + 1)]
                t0 = time.perf_counter()
                executor.step([StepInput(s, tokens, rows, allowed) for s in seqs])
                if r:
                    times[k].append(time.perf_counter() - t0)
                for s in seqs:
                    executor.rollback(s, k + 1)
        # noise only adds time (a neighbour, a page fault, a collection): the fastest rep
        out = {(batch, k): min(times[k]) for k in lengths}
        for a, b in zip(lengths, lengths[1:]):  # a step scoring more rows is never cheaper than one scoring fewer
            out[(batch, b)] = max(out[(batch, b)], out[(batch, a)])
        return out
    finally:
        for s in seqs:
            executor.free(s)


class StepProfileCache:
    """Profiles as JSON files in a directory, one per key. A file that cannot be read counts as absent."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"

    def get(self, key: str) -> StepProfile | None:
        """The profile stored for ``key``, or None. Raises: Never."""
        try:
            profile = StepProfile.from_json(json.loads(self._path(key).read_text()))
        except (OSError, ValueError):
            return None
        return profile if profile.key == key else None

    def put(self, profile: StepProfile) -> None:
        """Store ``profile`` (atomically: a reader sees the old file or the new one). Raises: Never (logged)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self._path(profile.key)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(profile.to_json(), indent=1))
            tmp.replace(path)
        except OSError:
            log.exception("the step profile could not be stored in %s; it is measured again next start",
                          self.directory)


def cached_step_profile(executor: ForwardStep, key: str, cache: StepProfileCache | None,
                        draft: ForwardStep | None = None, buckets: Sequence[int] = (1, 2, 4, 8, 16),
                        budget_seconds: float = 20.0) -> StepProfile:
    """The profile for ``key``: from ``cache`` (or this process's memory), else measured now and stored."""
    profile = _MEMORY.get(key) or (cache.get(key) if cache is not None else None)
    if profile is None:
        profile = measure_step_profile(executor, key, buckets, draft=draft, budget_seconds=budget_seconds)
        log.info("step costs measured in %.1fs for %s: %s", profile.seconds_spent, key, describe(profile))
        if cache is not None:
            cache.put(profile)
    _MEMORY[key] = profile
    return profile


_MEMORY: dict[str, StepProfile] = {}  # key -> profile: engines built again in one process (benchmarks) measure once


def describe(profile: StepProfile) -> str:
    """One line: each bucket's plain step and its k-row steps in plain steps (``b1: 14.2 ms, k=1 1.9x ...``)."""
    parts = []
    for b in profile.buckets:
        plain = profile.full.get((b, 0))
        ratios = " ".join(f"k={k} {r:.2f}x" for k in sorted(k for bb, k in profile.full if bb == b and k)
                          if (r := profile.ratio(b, k)) is not None)
        parts.append(f"b{b}: {plain * 1000:.1f} ms, {ratios}" if plain else f"b{b}: -")
    return "; ".join(parts)
