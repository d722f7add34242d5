"""Distilling a draft from its target: the target's next-token distributions at chosen positions,
a draft trained to match them, and the agreement that predicts acceptance.

A draft pays in proportion to how often the target keeps its tokens. Under greedy
verification a drafted token is kept exactly when it is the target's argmax, so the
measure is **top-1 agreement**; under sampling it is the overlap sum_x min(p(x), q(x))
(= 1 - TV(p, q), the acceptance of rejection sampling). Both are measured here on the
positions a draft actually drafts at (``DistillExample.mask``: the router drafts with the
draft model inside free-text strings only).

Training minimises the cross-entropy of the draft against the target's top-k probabilities
(forward KL up to a constant), renormalised over the ids the draft covers: a restricted
draft (``DraftVocab``) has q = 0 elsewhere and cannot win that mass back. The targets are
computed once (``target_topk``, through any ``ForwardStep`` executor, so llama.cpp's quantized
target serves as well as transformers') and reused every epoch.

Each example is fed as a window: at most ``window`` tokens before its first learned position,
then the learned ones. A draft whose layers all attend within a sliding window of that size
(the gemma draft) sees exactly what it sees when serving; RoPE makes the absolute offset irrelevant.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from structspec.models.draft_vocab import DraftVocab
from structspec.models.executor import ForwardStep, StepInput
from structspec.speculation.json_position import is_free_text, scan


@dataclass(frozen=True)
class DistillExample:
    """Target ids (prompt + output); the next-token distributions at positions ``start - 1`` ..
    ``len(ids) - 2`` are learned (those of ``ids[start:]``, the output). ``mask``: per learned position,
    whether it counts (None: all)."""

    ids: tuple[int, ...]
    start: int
    weight: float = 1.0
    mask: tuple[bool, ...] | None = None
    tag: str = ""  # where it came from (a schema key, "corpus"...): agreement is reported per tag

    def __post_init__(self):
        if not 1 <= self.start < len(self.ids):
            raise ValueError(f"start {self.start} outside 1..{len(self.ids) - 1}")
        if self.mask is not None and len(self.mask) != self.learned:
            raise ValueError(f"mask has {len(self.mask)} entries for {self.learned} learned positions")

    @property
    def learned(self) -> int:
        return len(self.ids) - self.start


@dataclass(frozen=True)
class TargetTopK:
    """The target's ``k`` most likely next tokens at each learned position of one example, best first."""

    ids: torch.Tensor  # [n, k] long
    logprobs: torch.Tensor  # [n, k] float32, log-probabilities under the target's whole distribution


def target_topk(executor: ForwardStep, examples: Sequence[DistillExample], top_k: int = 16,
                rows_per_step: int = 64, prefill_chunk: int = 512,
                progress: Callable[[int, int], None] | None = None) -> list[TargetTopK]:
    """The target's top-``top_k`` at every learned position of each example.

    Examples are visited in the order of their ids, and each starts from the cache of the one before
    it for the prefix they share (``copy_prefix``): prompts of one schema share their worked examples,
    most of their length. Cost: one forward over each example's unshared tokens (in ``prefill_chunk``
    pieces) and, per ``rows_per_step`` learned positions, a full-vocabulary log-softmax (262k ids: ~67 MB
    of logits)."""
    out: list[TargetTopK | None] = [None] * len(examples)
    order = sorted(range(len(examples)), key=lambda i: examples[i].ids)
    previous: tuple[int, list[int]] | None = None  # (sequence id, the prefix it caches)
    try:
        for n, i in enumerate(order):
            ex = examples[i]
            prefix = list(ex.ids[: ex.start - 1])
            sid = executor.new_sequence()
            shared = 0
            if previous is not None:
                shared = _common_prefix(previous[1], prefix)
                if shared > 0:
                    executor.copy_prefix(sid, previous[0], shared)
                executor.free(previous[0])
            previous = (sid, prefix)
            for lo in range(shared, len(prefix), prefill_chunk):
                executor.step([StepInput(sid, prefix[lo: lo + prefill_chunk], logits_at=(-1,))])
            rest = list(ex.ids[ex.start - 1: -1])  # learned positions: each row predicts the next id
            ids, logps = [], []
            for lo in range(0, len(rest), rows_per_step):
                chunk = rest[lo: lo + rows_per_step]
                (logits,) = executor.step([StepInput(sid, chunk, logits_at=tuple(range(len(chunk))))])
                top = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
                ids.append(top.indices)
                logps.append(top.values)
            executor.rollback(sid, len(rest))  # keep the prefix only: the next example may share it
            out[i] = TargetTopK(torch.cat(ids), torch.cat(logps))
            if progress is not None:
                progress(n + 1, len(examples))
    finally:
        if previous is not None:
            executor.free(previous[0])
    return out  # type: ignore[return-value]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 1000
    lr: float = 3e-4
    batch: int = 8  # examples per step
    window: int = 512  # tokens of context before the first learned position
    warmup: int = 50
    weight_decay: float = 0.0
    seed: int = 0
    log_every: int = 50
    max_seconds: float = math.inf  # stop early past this (the schedule is cut, not stretched)


@dataclass
class DistillLog:
    steps: int = 0
    seconds: float = 0.0
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss since the last entry)


@dataclass(frozen=True)
class Agreement:
    """Draft/target agreement over the counted positions of a set of examples."""

    positions: int
    top1: float  # share where the draft's argmax is the target's (greedy acceptance)
    overlap: float  # mean sum_k min(p, q) over the target's top-k (a lower bound on 1 - TV: sampled acceptance)
    by_tag: dict[str, tuple[int, float]] = field(default_factory=dict)  # tag -> (positions, top1)


@dataclass(frozen=True)
class _Batch:
    input_ids: torch.Tensor  # [B, T] draft ids, right-padded
    attention: torch.Tensor  # [B, T]
    where_b: torch.Tensor  # [P] row of each counted position
    where_t: torch.Tensor  # [P] its column
    target_ids: torch.Tensor  # [P, k] the target's top-k, as draft ids
    target_logprobs: torch.Tensor  # [P, k]
    target_best: torch.Tensor  # [P] the target's argmax, as a target id
    weights: torch.Tensor  # [P]
    tags: list[str]  # [P]


class _Batcher:
    """Windows of examples as padded draft-id tensors, learned positions and soft targets."""

    def __init__(self, examples: Sequence[DistillExample], targets: Sequence[TargetTopK],
                 vocab: DraftVocab | None, window: int, draft_vocab: int):
        if len(examples) != len(targets):
            raise ValueError(f"{len(examples)} examples, {len(targets)} targets")
        self.examples, self.targets, self.window = examples, targets, window
        self.table = vocab.to_draft_table() if vocab is not None else None
        self.invalid = vocab.unknown if vocab is not None else draft_vocab  # a draft id no target token maps to

    def _map(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids] if self.table is not None else ids

    def batch(self, indices: Sequence[int], device: torch.device) -> _Batch:
        rows, spans, tgt_ids, tgt_logp, best, weights, tags = [], [], [], [], [], [], []
        for i in indices:
            ex, tg = self.examples[i], self.targets[i]
            lo = max(0, ex.start - 1 - self.window)
            rows.append(self._map(torch.tensor(ex.ids[lo:-1], dtype=torch.long)))
            keep = torch.ones(ex.learned, dtype=torch.bool) if ex.mask is None else torch.tensor(ex.mask)
            first = ex.start - 1 - lo
            spans.append((first, keep))
            tgt_ids.append(self._map(tg.ids)[keep])
            tgt_logp.append(tg.logprobs[keep])
            best.append(tg.ids[keep, 0])
            weights.append(torch.full((int(keep.sum()),), ex.weight))
            tags.extend([ex.tag] * int(keep.sum()))
        width = max(len(r) for r in rows)
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        where_b, where_t = [], []
        for b, (row, (first, keep)) in enumerate(zip(rows, spans)):
            input_ids[b, : len(row)] = row
            attention[b, : len(row)] = 1
            t = torch.arange(first, first + len(keep))[keep]
            where_b.append(torch.full_like(t, b))
            where_t.append(t)
        return _Batch(input_ids.to(device), attention.to(device), torch.cat(where_b).to(device),
                      torch.cat(where_t).to(device), torch.cat(tgt_ids).to(device), torch.cat(tgt_logp).to(device),
                      torch.cat(best).to(device), torch.cat(weights).to(device), tags)


def _draft_logprobs(draft, input_ids, attention, where_b, where_t, invalid: int) -> torch.Tensor:
    """[P, V_draft] the draft's log-probabilities at the gathered positions (the input-only id excluded)."""
    hidden = draft.model(input_ids=input_ids, attention_mask=attention).last_hidden_state  # [B, T, H]
    logits = draft.lm_head(hidden[where_b, where_t]).float()  # [P, V_draft]
    if invalid < logits.shape[-1]:
        logits[:, invalid] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


def _soft_targets(tgt_ids: torch.Tensor, tgt_logp: torch.Tensor, invalid: int) -> torch.Tensor:
    """[P, k] the target's top-k probabilities renormalised over the ids the draft covers."""
    logp = tgt_logp.masked_fill(tgt_ids == invalid, float("-inf"))
    probs = torch.softmax(logp, dim=-1)
    return torch.nan_to_num(probs, nan=0.0)  # a row with no covered id teaches nothing


def distill(draft, examples: Sequence[DistillExample], targets: Sequence[TargetTopK], vocab: DraftVocab | None,
            config: DistillConfig = DistillConfig(), log: Callable[[str], None] | None = None) -> DistillLog:
    """Train ``draft`` (a transformers causal LM over draft ids) in place towards ``targets``.

    AdamW with linear warm-up and cosine decay over ``config.steps`` or ``config.max_seconds``, whichever
    ends first (a time budget anneals rather than cuts); batches drawn in shuffled epochs. Deterministic for a seed on the CPU."""
    device = next(draft.parameters()).device
    batcher = _Batcher(examples, targets, vocab, config.window, draft.config.vocab_size)
    order_rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=config.lr,
                            weight_decay=config.weight_decay, betas=(0.9, 0.98))
    draft.train()
    result, t0, pending, running = DistillLog(), time.monotonic(), [], 0.0
    order: list[int] = []
    for step in range(config.steps):
        # cosine decay over the steps or the time budget, whichever runs out first
        done = max(step / max(1, config.steps), (time.monotonic() - t0) / config.max_seconds)
        if done >= 1.0:
            break
        for group in opt.param_groups:
            group["lr"] = config.lr * min(1.0, (step + 1) / max(1, config.warmup)) * 0.5 * (1 + math.cos(math.pi * done))
        if len(order) < config.batch:
            epoch = list(range(len(examples)))
            order_rng.shuffle(epoch)
            order += epoch
        picked, order = order[: config.batch], order[config.batch:]
        b = batcher.batch(picked, device)
        logq = _draft_logprobs(draft, b.input_ids, b.attention, b.where_b, b.where_t, batcher.invalid)
        p = _soft_targets(b.target_ids, b.target_logprobs, batcher.invalid)
        q_at = logq.gather(1, b.target_ids.clamp(max=logq.shape[-1] - 1))
        per_position = -(p * q_at.masked_fill(p == 0, 0.0)).sum(-1)
        loss = (per_position * b.weights).sum() / b.weights.sum().clamp(min=1e-9)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        pending.append(loss.item())
        result.steps = step + 1
        if (step + 1) % config.log_every == 0:
            running = sum(pending) / len(pending)
            result.losses.append((step + 1, running))
            pending = []
            if log is not None:
                log(f"step {step + 1}/{config.steps}  loss {running:.3f}  {time.monotonic() - t0:.0f}s")
    draft.eval()
    result.seconds = time.monotonic() - t0
    return result


@torch.no_grad()
def agreement(draft, examples: Sequence[DistillExample], targets: Sequence[TargetTopK], vocab: DraftVocab | None,
              window: int = 512, batch: int = 8) -> Agreement:
    """How often ``draft``'s argmax is the target's, and their probability overlap, at the counted positions."""
    device = next(draft.parameters()).device
    was_training = draft.training
    draft.eval()
    batcher = _Batcher(examples, targets, vocab, window, draft.config.vocab_size)
    ids = torch.tensor(vocab.ids, dtype=torch.long, device=device) if vocab is not None else None
    hits, overlap, count = 0.0, 0.0, 0
    tags: dict[str, list[int]] = {}
    for lo in range(0, len(examples), batch):
        b = batcher.batch(range(lo, min(len(examples), lo + batch)), device)
        if len(b.where_b) == 0:
            continue
        logq = _draft_logprobs(draft, b.input_ids, b.attention, b.where_b, b.where_t, batcher.invalid)
        best = logq.argmax(-1)
        hit = (ids[best] if ids is not None else best) == b.target_best
        q_at = logq.exp().gather(1, b.target_ids.clamp(max=logq.shape[-1] - 1))
        q_at = q_at.masked_fill(b.target_ids == batcher.invalid, 0.0)
        overlap += float(torch.minimum(b.target_logprobs.exp(), q_at).sum())
        hits += float(hit.sum())
        count += len(hit)
        for tag, h in zip(b.tags, hit.tolist()):
            entry = tags.setdefault(tag, [0, 0])
            entry[0] += 1
            entry[1] += int(h)
    if was_training:
        draft.train()
    return Agreement(count, hits / count if count else 0.0, overlap / count if count else 0.0,
                     {t: (n, h / n) for t, (n, h) in sorted(tags.items())})


def free_text_mask(tokenizer, schema: dict | None, output_ids: Sequence[int]) -> tuple[bool, ...]:
    """Per output token, whether the router would draft it with the draft model: the output before it stands
    inside a free-text string (``speculation.json_position.is_free_text``). Cost: one decode per token."""
    return tuple(is_free_text(schema, scan(tokenizer.decode(list(output_ids[:j]), skip_special_tokens=True)))
                 for j in range(len(output_ids)))
