"""Forward steps on a transformers causal LM, with a KV cache structspec manages itself.

Why not transformers' own cache: it holds one batch of equal-length rows and
refuses to crop sliding-window layers once past the window, while the engine
needs sequences of different lengths joining and leaving between steps, and
rolling back one of them after a rejected draft.

Layout: per layer, one buffer K (and V) of shape [slots, kv_heads, capacity, head_dim];
each sequence owns a slot, and a token's cache index is its absolute position.
Every layer keeps the full history, sliding-window layers included (the window
is enforced by the attention mask), so rollback is just a shorter length.

A step:
  input_ids, position_ids         [B, T]     T = longest new chunk; shorter rows padded
  new K/V written at positions    L_b + t    (L_b = cached length of row b)
  attention over cache indices    [0, Lk)    Lk = max_b L_b + T
  mask[b, 0, t, j] = j <= L_b + t  (and j > L_b + t - window on sliding layers)
Padded rows write K/V past their sequence's length, where nothing reads them
before they are overwritten. Padding costs compute, so a step whose inputs differ
a lot in width (a 256-token prompt chunk beside one-token decodes) runs as several
forwards grouped by width (``plan_forwards``); the output layer then runs once over
every row asked for.
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

import torch
from transformers import PreTrainedModel

from structspec.models.executor import ContextOverflow, StepInput
from structspec.models.small_gemm import OutputHead, fast_linears_enabled, small_row_linears


def plan_forwards(counts: Sequence[int], cost_rows: int) -> list[list[int]]:
    """Group inputs (by index) into forwards, minimising padded rows + ``cost_rows`` per forward.

    A forward over inputs of widths w costs about ``len(w) * max(w)`` rows of compute plus a fixed
    part (reading every weight once, the per-layer overheads), here expressed as ``cost_rows`` rows.
    Sorted by width, the best grouping is a split into runs, found by dynamic programming.
    """
    order = sorted(range(len(counts)), key=lambda i: counts[i])
    widths = [counts[i] for i in order]
    best = [0] + [None] * len(order)  # best[j]: cost of the first j inputs (by width)
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            cost = best[i] + cost_rows + (j - i) * widths[j - 1]
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j > 0:
        groups.append(order[cut[j]: j])
        j = cut[j]
    return groups[::-1]


class _SlotCache:
    """The object handed to the model as ``cache``: writes new K/V into slots, returns the batch view."""

    def __init__(self, owner: "TransformersExecutor", slots: list[int], positions: torch.Tensor, kv_len: int):
        self.owner, self.positions, self.kv_len = owner, positions, kv_len
        self.slots = torch.tensor(slots, device=positions.device)
        # Consecutive slots (always so at batch 1) are read through a view instead of a gathered copy.
        self.span = (slots[0], slots[0] + len(slots)) if slots == list(range(slots[0], slots[0] + len(slots))) else None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        # key/value: [B, H_kv, T, D] -> buffer[slot_b, :, pos_bt] (advanced indices come first: [B, T, H_kv, D])
        kbuf, vbuf = self.owner._k[layer_idx], self.owner._v[layer_idx]
        idx = (self.slots[:, None], slice(None), self.positions)
        kbuf[idx] = key.transpose(1, 2).to(kbuf.dtype)
        vbuf[idx] = value.transpose(1, 2).to(vbuf.dtype)
        if self.span is not None:  # [B, H_kv, Lk, D]
            lo, hi = self.span
            return kbuf[lo:hi, :, : self.kv_len], vbuf[lo:hi, :, : self.kv_len]
        return kbuf[:, :, : self.kv_len].index_select(0, self.slots), vbuf[:, :, : self.kv_len].index_select(0, self.slots)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len

    def __len__(self) -> int:
        return len(self.owner._k)


class TransformersExecutor:
    """``ForwardStep`` over a transformers decoder-only model (Llama, Gemma 3, ...)."""

    def __init__(self, model: PreTrainedModel, max_context: int | None = None, initial_slots: int = 4,
                 initial_capacity: int = 256, split_cost_rows: int = 16):
        self.model = model
        self.split_cost_rows = split_cost_rows  # what one more forward costs, in padded rows (plan_forwards)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = cfg
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context = int(max_context or getattr(cfg, "max_position_embeddings", 2048))
        self.forward_calls = 0
        self._base = getattr(model, model.base_model_prefix)
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        head = model.get_output_embeddings()
        self._head = OutputHead(head.weight, getattr(head, "bias", None))  # tuned output-layer product
        small_row_linears(self._base)  # the body's decode-sized products (active only inside step)
        layer_types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
        self._window = getattr(cfg, "sliding_window", None) if "sliding_attention" in layer_types else None
        self._kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self._head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self._layers = cfg.num_hidden_layers
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._alloc(initial_slots, initial_capacity)
        self._free_slots = list(range(initial_slots))
        self._slot: dict[int, int] = {}
        self._len: dict[int, int] = {}
        self._next_id = 0

    # -- storage -----------------------------------------------------------------------------------
    def _alloc(self, slots: int, capacity: int) -> None:
        shape = (slots, self._kv_heads, capacity, self._head_dim)
        old_k, old_v = self._k, self._v
        self._k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self._layers)]
        self._v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self._layers)]
        for new, old in ((self._k, old_k), (self._v, old_v)):
            for layer, buf in enumerate(old):
                new[layer][: buf.shape[0], :, : buf.shape[2]] = buf

    @property
    def slots(self) -> int:
        return self._k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self._k[0].shape[2]

    def cached_tokens(self) -> int:
        """Tokens held across all live sequences (what admission control budgets)."""
        return sum(self._len.values())

    # -- ForwardStep -------------------------------------------------------------------------------
    def new_sequence(self) -> int:
        if not self._free_slots:
            n = self.slots
            self._alloc(2 * n, self.capacity)
            for slot in range(n, 2 * n):
                heapq.heappush(self._free_slots, slot)
        seq_id = self._next_id
        self._next_id += 1
        self._slot[seq_id] = heapq.heappop(self._free_slots)  # lowest first: batches tend to be consecutive
        self._len[seq_id] = 0
        return seq_id

    def seq_len(self, seq_id: int) -> int:
        return self._len[seq_id]

    def rollback(self, seq_id: int, n: int) -> None:
        if n < 0 or n > self._len[seq_id]:
            raise ValueError(f"cannot roll back {n} tokens of a {self._len[seq_id]}-token sequence")
        self._len[seq_id] -= n

    @torch.inference_mode()  # buffers grown inside a step are inference tensors
    def copy_prefix(self, seq_id: int, source_id: int, n: int) -> None:
        # A token's K/V depends only on the tokens up to it, so a shared prompt prefix is copied, not recomputed.
        if self._len[seq_id] != 0:
            raise ValueError(f"sequence {seq_id} is not empty")
        if n < 0 or n > self._len[source_id]:
            raise ValueError(f"sequence {source_id} holds {self._len[source_id]} tokens, not {n}")
        dst, src = self._slot[seq_id], self._slot[source_id]
        for buf in (*self._k, *self._v):  # [slots, H_kv, capacity, D]
            buf[dst, :, :n] = buf[src, :, :n]
        self._len[seq_id] = n

    def free(self, seq_id: int) -> None:
        heapq.heappush(self._free_slots, self._slot.pop(seq_id))
        del self._len[seq_id]

    @torch.inference_mode()
    def step(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        if not inputs:
            return []
        lens = [self._len[x.seq_id] for x in inputs]
        counts = [len(x.tokens) for x in inputs]
        if min(counts) < 1:
            raise ValueError("every StepInput needs at least one token")
        for x, n, c in zip(inputs, lens, counts):
            if n + c > self.max_context:
                raise ContextOverflow(f"sequence {x.seq_id} would hold {n + c} tokens; the context is {self.max_context}")
        need = max(n + c for n, c in zip(lens, counts))
        if need > self.capacity:
            self._alloc(self.slots, max(need, 2 * self.capacity))

        # Rows are padded to the widest input of a forward, so inputs of very different widths (a prompt
        # chunk beside one-token decodes) run as separate forwards when that pads fewer rows than it costs.
        picked: list[torch.Tensor] = [torch.empty(0)] * len(inputs)
        for group in plan_forwards(counts, self.split_cost_rows):
            hidden = self._forward([inputs[i] for i in group], [lens[i] for i in group])
            for i, h in zip(group, hidden):
                picked[i] = h
        splits = [h.shape[0] for h in picked]
        logits = self._head(torch.cat(picked)).float()  # [N, V]: one output-layer product for the whole step
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        for x, n, c in zip(inputs, lens, counts):
            self._len[x.seq_id] = n + c
        return list(logits.cpu().split(splits))

    def _forward(self, inputs: Sequence[StepInput], lens: list[int]) -> list[torch.Tensor]:
        """One model forward over ``inputs``; per input the hidden states [len(logits_at), H] asked for."""
        dev = self.device
        counts = [len(x.tokens) for x in inputs]
        batch, width = len(inputs), max(counts)
        kv_len = max(lens) + width
        ids = torch.zeros((batch, width), dtype=torch.long)
        for b, x in enumerate(inputs):
            ids[b, : counts[b]] = torch.as_tensor(list(x.tokens), dtype=torch.long)
        start = torch.tensor(lens, dtype=torch.long)
        positions = (start[:, None] + torch.arange(width)[None, :]).to(dev)  # [B, T]
        cache = _SlotCache(self, [self._slot[x.seq_id] for x in inputs], positions, kv_len)
        mask = self._masks(positions, kv_len)
        with fast_linears_enabled():
            out = self._base(input_ids=ids.to(dev), position_ids=positions, attention_mask=mask, cache=cache,
                             use_cache=True)
        self.forward_calls += 1
        hidden = out.last_hidden_state  # [B, T, H]
        return [hidden[b, [t % counts[b] for t in x.logits_at]] for b, x in enumerate(inputs)]  # [n_b, H] each

    def _masks(self, positions: torch.Tensor, kv_len: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """Boolean [B, 1, T, Lk] masks (True = attend): causal by absolute position, plus the sliding window."""
        j = torch.arange(kv_len, device=positions.device)[None, None, :]  # [1, 1, Lk]
        q = positions[:, :, None]  # [B, T, 1]
        causal = (j <= q)[:, None]  # [B, 1, T, Lk]
        if self._window is None:
            return causal
        return {"full_attention": causal, "sliding_attention": causal & (j > q - self._window)[:, None]}
