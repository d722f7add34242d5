"""Aligning a draft to the traffic a server recorded: ``structspec draft align``.

    structspec draft align --data-dir DIR [--schema invoice] [--since 6h] --out aligned-draft

1. **Traffic.** The store's traffic samples of one model key (``TrafficSample``: completed
   requests' whole prompt and output ids) of one schema or all (recorded since a time, with
   ``since``: the traffic whose acceptance fell), and its rejected drafts of the
   draft model (``RejectedDraft``: the last 32 tokens of context, the drafted tokens, the refused
   position): extra short examples ending at the refused position, weighted ``rejected_weight``.
2. **Split.** A share ``holdout`` of the requests is held out, chosen by a hash of the request's
   ids (the same request is on the same side in every run, whatever else was recorded; duplicates
   too). A rejected-draft sample whose tokens occur in a held-out request is dropped, so nothing
   held out is learned.
3. **Targets.** The target's top-k next-token distributions at every learned position
   (``distill.target_topk``), recomputed from the ids (no logits are stored).
4. **Agreement before, training, agreement after** on the held-out requests, at the positions
   counted (``positions``: ``free-text``, where the router drafts with the draft model, or ``all``
   output positions; every position of a schema the store does not hold, an inline one or a tool
   list), per schema. The traffic not aligned to, the *kept* traffic (the other schemas', with
   ``--schema``; the earlier, with ``--since``: the style the draft served well before the shift),
   is a guard against forgetting (``max_forgetting``, on its held-out requests), and its training
   share is replayed (``replay_weight``): what the draft agreed on before is kept while it learns
   the new traffic.
5. **Verdict.** The new draft is written only when its held-out top-1 agreement and overlap are
   not below the source draft's and the kept traffic's top-1 fell by at most ``max_forgetting``; it is
   measured as written (rounded to the dtype on disk).

Each run writes a JSON report (``AlignReport``). Runs on the CPU by default (``device``).
"""

from __future__ import annotations

import array
import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from structspec.draft.distill import (Agreement, DistillConfig, DistillExample, agreement, distill, free_text_mask,
                                      target_topk)
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import TrafficSample

POSITIONS = ("free-text", "all")
DRAFT_PROPOSER = "draft"  # ``DraftModelProposer.name``: the rejections the draft model itself drafted
REPORT_FILE = "align_report.json"
_WEIGHT_FILES = {"config.json", "generation_config.json", "model.safetensors", "pytorch_model.bin"}


class AlignError(Exception):
    """Bad input (no traffic, an unreadable store, a missing draft folder): the message says what to fix."""


@dataclass(frozen=True)
class AlignConfig:
    holdout: float = 0.2  # share of requests held out
    steps: int = 300
    lr: float = 5e-4
    batch: int = 8
    top_k: int = 16
    positions: str = "free-text"  # free-text | all
    rejected_weight: float = 0.5  # a rejected-draft example's weight against a request's
    max_forgetting: float = 0.02  # the kept traffic's held-out top-1 may fall by at most this
    replay_weight: float = 0.5  # the kept traffic's training requests, at this weight (0: none)
    max_requests: int = 2000  # traffic samples read at most
    seed: int = 0
    window: int = 512

    def __post_init__(self):
        if not 0.0 < self.holdout < 1.0:
            raise ValueError("holdout must be in (0, 1)")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}")
        if self.steps < 0 or self.lr <= 0 or self.batch < 1 or self.top_k < 1:
            raise ValueError("steps >= 0, lr > 0, batch >= 1 and top_k >= 1")


@dataclass(frozen=True)
class Measure:
    """Agreement over one set of held-out positions."""

    requests: int
    positions: int
    top1: float
    overlap: float

    @classmethod
    def of(cls, requests: int, a: Agreement) -> "Measure":
        return cls(requests, a.positions, a.top1, a.overlap)


@dataclass(frozen=True)
class Comparison:
    before: Measure
    after: Measure

    @property
    def top1_gain(self) -> float:
        return self.after.top1 - self.before.top1

    @property
    def overlap_gain(self) -> float:
        return self.after.overlap - self.before.overlap


@dataclass
class AlignReport:
    model: str
    schema: str  # the schema key aligned to, "" for all
    source_draft: str
    out: str
    config: dict[str, Any]
    since: float | None = None  # unix seconds: traffic recorded from then on was aligned to, the earlier kept
    train_requests: int = 0
    train_rejected: int = 0
    train_replayed: int = 0  # kept traffic's requests (other schemas', earlier ones)
    train_positions: int = 0
    heldout: Comparison | None = None
    by_schema: dict[str, Comparison] = field(default_factory=dict)  # held-out, per schema key
    guard: Comparison | None = None  # the kept traffic's held-out requests
    written: bool = False
    verdict: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    losses: list[tuple[int, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def request_hash(sample: TrafficSample) -> float:
    """A request's place in [0, 1): a hash of its ids (the held-out split)."""
    digest = hashlib.sha256(array.array("q", sample.ids).tobytes()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def split(traffic: Sequence[TrafficSample], holdout: float) -> tuple[list[TrafficSample], list[TrafficSample]]:
    """(train, held out), duplicates (the same ids) counted once."""
    seen: dict[tuple[int, ...], TrafficSample] = {}
    for t in traffic:
        seen.setdefault(t.ids, t)
    train: list[TrafficSample] = []
    held: list[TrafficSample] = []
    for t in seen.values():
        (held if request_hash(t) < holdout else train).append(t)
    return train, held


def _as_bytes(ids: Sequence[int]) -> bytes:
    return array.array("q", ids).tobytes()


def rejected_examples(samples: Sequence[RejectedDraft], held: Sequence[TrafficSample], weight: float,
                      proposer: str = DRAFT_PROPOSER) -> list[DistillExample]:
    """The draft model's rejected drafts as short examples: context, the accepted drafted tokens and the target's
    token, learning the accepted positions and the refused one. Samples whose tokens occur in a held-out request
    are left out."""
    held_bytes = [_as_bytes(t.ids) for t in held]
    out = []
    for r in samples:
        if r.proposer != proposer or not r.context_tokens:
            continue
        ids = tuple(r.context_tokens) + tuple(r.draft_tokens[: r.position]) + (r.target_token,)
        needle = _as_bytes(ids)
        # 8-byte ids: a match off a multiple of 8 would be a false positive, which only drops a sample
        if any(needle in h for h in held_bytes):
            continue
        out.append(DistillExample(ids, len(r.context_tokens), weight, tag=r.schema_key))
    return out


def traffic_examples(traffic: Sequence[TrafficSample], mask_of: Callable[[TrafficSample], tuple[bool, ...] | None],
                     weight: float = 1.0) -> list[DistillExample]:
    """One example per request: the prompt, then every output position learned (``mask_of``: which count)."""
    return [DistillExample(t.ids, len(t.prompt_tokens), weight, mask_of(t), t.schema_key)
            for t in traffic if t.prompt_tokens and t.output_tokens]


def _counted(examples: Sequence[DistillExample]) -> list[DistillExample]:
    return [e for e in examples if e.mask is None or any(e.mask)]


def _measure(draft, examples: Sequence[DistillExample], targets, vocab, window: int) -> Measure:
    pairs = [(e, t) for e, t in zip(examples, targets) if e.mask is None or any(e.mask)]
    if not pairs:
        return Measure(0, 0, 0.0, 0.0)
    ex, tg = zip(*pairs)
    return Measure.of(len(ex), agreement(draft, ex, tg, vocab, window=window))


def _round_trip(model, dtype: torch.dtype) -> None:
    """The weights as they will be on disk (a bf16 folder keeps bf16 weights): measured as shipped."""
    device_dtype = next(model.parameters()).dtype
    if dtype != device_dtype:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).to(device_dtype))


@dataclass
class AlignInputs:
    """What ``align_draft`` works on, already read and loaded."""

    target_executor: Any  # a ForwardStep over the target (``target_topk``)
    draft: Any  # the source draft, a transformers causal LM (trained in place)
    vocab: Any  # its DraftVocab, or None
    tokenizer: Any
    traffic: list[TrafficSample]  # the aligned schema's (or every schema's)
    others: list[TrafficSample]  # the kept traffic (the forgetting guard): other schemas', earlier; may be empty
    rejected: list[RejectedDraft]
    schemas: dict[str, dict | None]  # schema key -> its JSON Schema where known (the free-text positions)


def align_draft(inputs: AlignInputs, config: AlignConfig, report: AlignReport, save_dtype: torch.dtype,
                log: Callable[[str], None] = lambda _: None) -> bool:
    """Measure, train and measure again (in place on ``inputs.draft``), filling ``report``; whether the aligned
    draft may be written. Raises: AlignError (nothing to train on or to measure)."""
    t0 = time.monotonic()
    train, held = split(inputs.traffic, config.holdout)
    guard_train, guard_held = split(inputs.others, config.holdout)
    if not train or not held:
        raise AlignError(f"{len(train) + len(held)} distinct requests: too few to hold {config.holdout:.0%} out "
                         "and train on the rest (record more traffic)")

    def mask_of(t: TrafficSample) -> tuple[bool, ...] | None:
        schema = inputs.schemas.get(t.schema_key)
        if config.positions == "all" or schema is None:  # an inline schema's or tool list's: every position
            return None
        return free_text_mask(inputs.tokenizer, schema, t.output_tokens)

    train_ex = traffic_examples(train, mask_of)
    rej_ex = rejected_examples(inputs.rejected, held, config.rejected_weight)
    held_ex = _counted(traffic_examples(held, mask_of))
    guard_ex = _counted(traffic_examples(guard_held, mask_of))
    if not held_ex:
        raise AlignError(f"no held-out request has a {config.positions} position to measure agreement at "
                         "(try --positions all)")
    replay = traffic_examples(guard_train, mask_of, config.replay_weight) if config.replay_weight > 0 else []
    learn = [e for e in train_ex + rej_ex + replay if e.mask is None or any(e.mask)]
    if not learn:
        raise AlignError(f"no training request has a {config.positions} position to learn (try --positions all)")
    report.train_requests, report.train_rejected, report.train_replayed = len(train_ex), len(rej_ex), len(replay)
    report.train_positions = sum(e.learned if e.mask is None else sum(e.mask) for e in learn)
    log(f"{len(train_ex)} training requests, {len(rej_ex)} rejected drafts, {len(held_ex)} held-out requests"
        + (f"; kept traffic: {len(replay)} replayed, {len(guard_ex)} held out" if inputs.others else ""))

    everything = learn + held_ex + guard_ex
    targets = target_topk(inputs.target_executor, everything, config.top_k)
    t_learn = targets[: len(learn)]
    t_held = targets[len(learn): len(learn) + len(held_ex)]
    t_guard = targets[len(learn) + len(held_ex):]
    report.seconds["targets"] = time.monotonic() - t0

    def measure_all() -> tuple[Measure, dict[str, Measure], Measure | None]:
        per = {}
        for key in sorted({e.tag for e in held_ex}):
            idx = [i for i, e in enumerate(held_ex) if e.tag == key]
            per[key] = _measure(inputs.draft, [held_ex[i] for i in idx], [t_held[i] for i in idx], inputs.vocab,
                                config.window)
        guard = _measure(inputs.draft, guard_ex, t_guard, inputs.vocab, config.window) if guard_ex else None
        return _measure(inputs.draft, held_ex, t_held, inputs.vocab, config.window), per, guard

    before, per_before, guard_before = measure_all()
    log(f"before: held-out top-1 {before.top1:.3f}, overlap {before.overlap:.3f} ({before.positions} positions)")
    t1 = time.monotonic()
    result = distill(inputs.draft, learn, t_learn, inputs.vocab,
                     DistillConfig(steps=config.steps, lr=config.lr, batch=config.batch, window=config.window,
                                   warmup=min(50, max(1, config.steps // 10)), seed=config.seed,
                                   log_every=max(1, min(50, config.steps))), log)
    report.seconds["train"] = time.monotonic() - t1
    report.losses = result.losses
    _round_trip(inputs.draft, save_dtype)
    after, per_after, guard_after = measure_all()
    log(f"after:  held-out top-1 {after.top1:.3f}, overlap {after.overlap:.3f}")
    report.heldout = Comparison(before, after)
    report.by_schema = {k: Comparison(per_before[k], per_after[k]) for k in per_before}
    report.guard = Comparison(guard_before, guard_after) if guard_before is not None and guard_after is not None else None
    problems = []
    if after.top1 < before.top1:
        problems.append(f"held-out top-1 agreement fell {before.top1:.3f} -> {after.top1:.3f}")
    if after.overlap < before.overlap:
        problems.append(f"held-out overlap fell {before.overlap:.3f} -> {after.overlap:.3f}")
    if report.guard is not None and report.guard.top1_gain < -config.max_forgetting:
        problems.append(f"the kept traffic's held-out top-1 fell {report.guard.before.top1:.3f} -> {report.guard.after.top1:.3f} "
                        f"(more than {config.max_forgetting})")
    report.verdict = "; ".join(problems) if problems else "held-out agreement did not drop"
    report.seconds["total"] = time.monotonic() - t0
    return not problems


def write_draft(model, source: Path, out: Path, dtype: torch.dtype) -> None:
    """The aligned draft as a folder like ``source``: its weights (in ``dtype``) and config, and every other file
    of the source (``draft_vocab.json`` or the tokenizer files) copied. Written beside ``out`` and renamed."""
    tmp = out.parent / f".{out.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.to(dtype).save_pretrained(tmp)
    for f in source.iterdir():
        if f.is_file() and f.name not in _WEIGHT_FILES and f.name != REPORT_FILE and not f.name.endswith(".safetensors"):
            shutil.copy2(f, tmp / f.name)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


# -- the command's body -------------------------------------------------------------------------------


def since_text(since: float | None) -> str:
    """`` since <UTC time>`` for messages, or "" without a time."""
    return f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(since))} UTC" if since is not None else ""


async def read_traffic(store: Any, model: str, schema: str | None, max_requests: int, since: float | None = None
                       ) -> tuple[list[TrafficSample], list[TrafficSample], list[RejectedDraft], dict[str, dict | None]]:
    """(the traffic aligned to: of the schema or of all, recorded at or after ``since`` if given; the kept traffic:
    every other sample; the schema's rejected drafts, since ``since``; the schemas' JSON by key) from an open store.
    ``schema``: a registered id (its latest version), id@version or a statistics key; ``since``: unix seconds.
    Raises: AlignError (no such schema, no traffic)."""
    key = await _schema_key(store, schema)
    everything = await store.read_traffic_samples(model=model, limit=max_requests)
    if not everything:
        models = sorted({t.model for t in await store.read_traffic_samples(limit=max_requests)})
        hint = f"; traffic is recorded under {', '.join(models)} (--model)" if models else \
            " (a server records it with traffic_samples_per_hour > 0)"
        raise AlignError(f"no traffic samples of model {model} in the store{hint}")
    aligned = lambda t: (key is None or t.schema_key == key) and (since is None or t.created_at >= since)  # noqa: E731
    traffic = [t for t in everything if aligned(t)]
    if not traffic:
        keys = sorted({t.schema_key for t in everything if since is None or t.created_at >= since})
        what = f"schema {key}" if key is not None else "any schema"
        when = since_text(since)
        raise AlignError(f"no traffic samples of {what}{when} for model {model}; recorded"
                         f"{when}: {', '.join(keys) or 'none'}")
    others = [t for t in everything if not aligned(t)]
    rejected = await store.read_rejected_drafts(model=model, schema_key=key, proposer=DRAFT_PROPOSER, limit=100_000)
    if since is not None:
        rejected = [r for r in rejected if r.created_at >= since]
    schemas: dict[str, dict | None] = {}
    for k in {t.schema_key for t in everything}:
        schemas[k] = await _schema_json(store, k)
    return traffic, others, rejected, schemas


async def _schema_key(store: Any, schema: str | None) -> str | None:
    if schema is None or ":" in schema:
        return schema
    sid, sep, version = schema.partition("@")
    if sep and not version.isdigit():
        raise AlignError(f"--schema {schema!r}: a version after @ is a number (id@3)")
    record = await store.get_schema(sid, int(version) if sep else None)
    if record is None:
        raise AlignError(f"no registered schema {schema} in the store")
    return f"{record.schema_id}@{record.version}"


async def _schema_json(store: Any, key: str) -> dict | None:
    """A registered schema's JSON by its statistics key ``id@version``; None for inline schemas and tool lists."""
    sid, sep, version = key.rpartition("@")
    if not sep or not version.isdigit() or ":" in key:
        return None
    record = await store.get_schema(sid, int(version))
    return json.loads(record.schema_json) if record is not None else None
