"""Forward steps on a transformers causal LM, with a KV cache structspec manages itself.

Why not transformers' own cache: it holds one batch of equal-length rows and
refuses to crop sliding-window layers once past the window, while the engine
needs sequences of different lengths joining and leaving between steps, and
rolling back one of them after a rejected draft.

Layout: per layer, one buffer K (and V) of shape [slots, kv_heads, capacity, head_dim];
each sequence owns a slot, and a token's cache index is its absolute position.
The buffers grow (doubling slots or capacity) when a sequence needs it, and shrink
back when the live sequences use under a quarter of them (``_fit``, on ``free``), so
memory follows the live set (running requests and retained prompts), not the largest
burst the process ever served. The scheduler admits a request only while
``footprint`` (slots x capacity) stays within its KV budget. Every layer keeps the full history, sliding-window layers included (the window
is enforced by the attention mask), so rollback is just a shorter length.

A step packs every sequence's new tokens into one row, with no padding:
  input_ids, position_ids         [1, N]     N = sum of the new tokens; positions are absolute
  new K/V written at              buffer[slot_n, :, pos_n] for each packed token n
  attention, per sequence         queries of its new tokens over its own cache [lo, L_b + c_b)
                                  (causal within the chunk; lo = L_b + 1 - window on sliding layers)
The model's own modules run unchanged; only the attention function is ours
(``packed_attention``, registered with transformers), and it reads the slot
buffers directly, so nothing is gathered or padded: a 256-token prompt chunk
beside fifteen one-token decodes costs 271 rows, not 16 x 256.
"""

from __future__ import annotations

import ctypes
import heapq
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Sequence, cast

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from structspec.models.executor import InputError, StepInput, check_inputs
from structspec.models.profiles import cache_dir
from structspec.models.small_gemm import FormChoices, OutputHead, fast_linears_enabled, small_row_linears

log = logging.getLogger(__name__)


def _return_freed_memory(device: torch.device) -> None:
    """Give the freed K/V buffers back to the OS. glibc keeps freed blocks under its (self-raising) mmap
    threshold in the heap, so without this a process's resident memory stays at its largest cache ever."""
    if device.type != "cpu" or _LIBC is None:
        return
    _LIBC.malloc_trim(0)


_LIBC: ctypes.CDLL | None
try:  # glibc only (Linux); elsewhere the allocator's own policy applies
    _LIBC = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim  # noqa: B018 - the symbol exists
except (OSError, AttributeError):
    _LIBC = None


def _pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class _Chunk:
    """One sequence's part of a packed step."""

    slot: int
    start: int  # tokens cached before this step (= absolute position of the first new token)
    count: int  # new tokens
    offset: int  # where they sit in the packed row


class _PackedStep:
    """The object handed to the model as ``cache`` for one packed forward; also what the attention reads."""

    def __init__(self, owner: "TransformersExecutor", chunks: list[_Chunk], device: torch.device):
        self.owner, self.chunks = owner, chunks
        self.slot_idx = torch.tensor([c.slot for c in chunks for _ in range(c.count)], device=device)  # [N]
        self.pos_idx = torch.tensor([c.start + t for c in chunks for t in range(c.count)], device=device)  # [N]
        self.kv_len = max(c.start + c.count for c in chunks)
        self._masks: dict[tuple[int, int | None], torch.Tensor] = {}  # (chunk, window) -> [c, Lk], shared by layers

    def chunk_mask(self, i: int, lo: int, window: int | None) -> torch.Tensor | None:
        """Chunk i's queries over cache [lo, end): causal within the chunk, each within its own window."""
        c = self.chunks[i]
        if c.count == 1:
            return None  # one query sees its whole slice (the window is already cut by ``lo``)
        key = (i, window)
        mask = self._masks.get(key)
        if mask is None:
            end = c.start + c.count
            j = torch.arange(lo, end, device=self.slot_idx.device)[None, :]  # [1, Lk]
            p = torch.arange(c.start, end, device=self.slot_idx.device)[:, None]  # [c, 1]
            mask = j <= p
            if window:
                mask &= j > p - window
            self._masks[key] = mask
        return mask

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        # key/value: [1, H_kv, N, D] -> buffer[slot_n, :, pos_n] ([N, H_kv, D] through advanced indexing)
        kbuf, vbuf = self.owner._k[layer_idx], self.owner._v[layer_idx]
        kbuf[self.slot_idx, :, self.pos_idx] = key[0].transpose(0, 1).to(kbuf.dtype)
        vbuf[self.slot_idx, :, self.pos_idx] = value[0].transpose(0, 1).to(vbuf.dtype)
        return key, value  # packed_attention reads each sequence's history from the buffers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len

    def __len__(self) -> int:
        return len(self.owner._k)


_ACTIVE = threading.local()  # the packed step running on this thread, if any


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Any, scaling: float | None = None, sliding_window: int | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention for a packed step: each sequence's queries over its own cached keys and values.

    query: [1, H, N, D]. Returns [1, N, H, D] as transformers' attention functions do. Outside an
    executor step (e.g. HF ``generate`` on the same model) this is transformers' SDPA attention.
    """
    step: _PackedStep | None = getattr(_ACTIVE, "step", None)
    if step is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    layer = cast(int, module.layer_idx)  # (set on each attention module by transformers)
    kbuf, vbuf = step.owner._k[layer], step.owner._v[layer]  # [slots, H_kv, cap, D]
    gqa = query.shape[1] != kbuf.shape[1]
    outs = []
    for i, c in enumerate(step.chunks):
        end = c.start + c.count
        lo = max(0, c.start + 1 - sliding_window) if sliding_window else 0
        q = query[:, :, c.offset: c.offset + c.count]  # [1, H, c, D]
        k = kbuf[c.slot, :, lo:end].unsqueeze(0)  # [1, H_kv, end - lo, D]: a view, no copy
        v = vbuf[c.slot, :, lo:end].unsqueeze(0)
        mask = step.chunk_mask(i, lo, sliding_window)
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa))
    return torch.cat(outs, dim=2).transpose(1, 2), None  # [1, N, H, D]


def cache_keyword(base: torch.nn.Module) -> str:
    """The name the base model's ``forward`` takes its cache by: ``cache`` in newer transformers releases,
    ``past_key_values`` before (an unknown keyword is swallowed by ``**kwargs``: the model would then run without
    the executor's cache and write garbage, so the name is read from the signature, never assumed)."""
    params = inspect.signature(base.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(f"{type(base).__name__}.forward takes neither cache nor past_key_values")


ATTENTION_NAME = "structspec_packed"
AttentionInterface.register(ATTENTION_NAME, packed_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # masks for plain HF calls on the same model


RESTRICT_MIN_VOCAB = 32768  # vocabularies at least this large score small allowed sets alone
RESTRICTED_LOGITS_MAX = 1024  # ... of at most this many ids (a gather of 1024 rows costs ~ one GEMV of 30k)


class TransformersExecutor:
    """``ForwardStep`` over a transformers decoder-only model (Llama, Gemma 3, ...)."""

    def __init__(self, model: PreTrainedModel, max_context: int | None = None, initial_slots: int = 4,
                 initial_capacity: int = 256):
        self.model = model
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = cfg
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context = int(max_context or cast(int, getattr(cfg, "max_position_embeddings", 2048)))
        self.forward_calls = 0
        self._peak_tokens = 0  # the most tokens cached at once (metrics)
        self._base = getattr(model, model.base_model_prefix)
        self._cache_kwarg = cache_keyword(self._base)
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        if getattr(cfg, "attn_logit_softcapping", None):
            raise ValueError("attention logit soft-capping (Gemma 2) is not supported by the packed executor")
        model.set_attn_implementation(ATTENTION_NAME)  # falls back to SDPA outside executor steps
        layer_types = getattr(cfg, "layer_types", None)
        dummy = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=self.device)  # masks are packed_attention's job
        self._placeholder_masks = {t: dummy for t in set(layer_types)} if layer_types else dummy
        head = model.get_output_embeddings()
        # tuned output-layer product; the choice is kept per machine so every process computes the same logits
        self._head = OutputHead(head.weight, getattr(head, "bias", None),
                                choices=FormChoices(cache_dir() / "output-layer-forms.json"))
        # With a large vocabulary, a position whose grammar allows a few ids (digits, an enum, the end of
        # an array) is scored on those rows of the output layer alone (Gemma: ~1/3 of an extraction's
        # scored positions allow <= 256 of 262k ids). Small vocabularies gain nothing from it.
        self.restricted_logits_max = RESTRICTED_LOGITS_MAX if self.vocab_size >= RESTRICT_MIN_VOCAB else 0
        small_row_linears(self._base)  # the body's decode-sized products (active only inside step)
        self._kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self._head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self._layers = cfg.num_hidden_layers
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._initial = (initial_slots, initial_capacity)
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
        del old_k, old_v
        _return_freed_memory(self.device)

    @property
    def slots(self) -> int:
        return self._k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self._k[0].shape[2]

    def cached_tokens(self) -> int:
        """Tokens held across all live sequences (what admission control budgets)."""
        return sum(self._len.values())

    def peak_cached_tokens(self) -> int:
        """The most tokens held at once since the executor was built (drafted tokens before their rollback too)."""
        return self._peak_tokens

    def footprint(self, sequences: int, longest: int) -> int:
        """Slots x capacity after growing for ``sequences`` sequences up to ``longest`` tokens (both grow to
        powers of two, never shrink below what is allocated now)."""
        return max(self.slots, _pow2(sequences)) * max(self.capacity, min(self.max_context, _pow2(longest)))

    def allocated_bytes(self) -> int:
        """Bytes of the K/V buffers (every slot at full capacity: the dense layout's real footprint)."""
        return sum(b.numel() * b.element_size() for b in (*self._k, *self._v))

    @torch.inference_mode()
    def _fit(self) -> None:
        """Shrink the buffers to the live sequences (moved to the lowest slots) when they use under a quarter.

        Cost: one copy of the live sequences' cached tokens; the quarter (not half) keeps a size that
        the next request would grow right back from."""
        live = sorted(self._slot.items(), key=lambda kv: kv[1])
        slots = max(self._initial[0], _pow2(len(live)))
        capacity = max(self._initial[1], _pow2(max(self._len.values(), default=0)))
        if 4 * slots * capacity > self.slots * self.capacity:
            return
        shape = (slots, self._kv_heads, capacity, self._head_dim)
        old = (self._k, self._v)
        self._k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self._layers)]
        self._v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self._layers)]
        for new, before in zip((self._k, self._v), old):
            for layer, buf in enumerate(before):
                for slot, (seq_id, was) in enumerate(live):
                    n = self._len[seq_id]
                    new[layer][slot, :, :n] = buf[was, :, :n]
        self._slot = {seq_id: slot for slot, (seq_id, _) in enumerate(live)}
        self._free_slots = list(range(len(live), slots))  # ascending: already a heap
        del old
        _return_freed_memory(self.device)

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
        self._fit()

    @torch.inference_mode()
    def step(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        if not inputs:
            return []
        lens = [self._len[x.seq_id] for x in inputs]
        check_inputs(inputs, lens, self.vocab_size, self.max_context)
        counts = [len(x.tokens) for x in inputs]
        need = max(n + c for n, c in zip(lens, counts))
        if need > self.capacity:  # powers of two, as ``footprint`` assumes
            self._alloc(self.slots, min(self.max_context, _pow2(need)))

        chunks, offset = [], 0
        for x, n, c in zip(inputs, lens, counts):
            chunks.append(_Chunk(self._slot[x.seq_id], n, c, offset))
            offset += c
        dev = self.device
        ids = torch.tensor([[t for x in inputs for t in x.tokens]], dtype=torch.long, device=dev)  # [1, N]
        step = _PackedStep(self, chunks, dev)
        _ACTIVE.step = step
        try:
            with fast_linears_enabled():
                out = self._base(input_ids=ids, position_ids=step.pos_idx[None, :],
                                 attention_mask=self._placeholder_masks, use_cache=True, **{self._cache_kwarg: step})
        finally:
            _ACTIVE.step = None
        self.forward_calls += 1
        hidden = out.last_hidden_state[0]  # [N, H]
        rows = [c.offset + t % c.count for x, c in zip(inputs, chunks) for t in x.logits_at]
        allowed = [None if x.allowed is None else x.allowed[j] for x in inputs for j in range(len(x.logits_at))]
        owners = [x.seq_id for x in inputs for _ in x.logits_at]
        splits = [len(x.logits_at) for x in inputs]
        faults: dict[int, str] = {}
        logits = self._logits(hidden[rows], allowed, owners, faults)  # [sum logits_at, V]
        if faults:  # nothing is counted as cached: the K/V written past each length is overwritten later
            raise InputError(faults)
        for x, n, c in zip(inputs, lens, counts):
            self._len[x.seq_id] = n + c
        self._peak_tokens = max(self._peak_tokens, sum(self._len.values()))
        return list(logits.cpu().split(splits))

    def _logits(self, hidden: torch.Tensor, allowed: list[torch.Tensor | None], owners: list[int],
                faults: dict[int, str]) -> torch.Tensor:
        """hidden [R, H] -> float32 logits [R, V]; a row with a small ``allowed`` set gets only those (else -inf).
        A row whose allowed ids could not be scored names its sequence (``owners``) in ``faults``."""
        small = [i for i, ids in enumerate(allowed)
                 if ids is not None and len(ids) <= self.restricted_logits_max]
        if not small:
            return self._finish_logits(self._head(hidden).float())
        logits = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)  # [R, V]
        chosen = set(small)
        full = [i for i in range(hidden.shape[0]) if i not in chosen]
        if full:
            logits[full] = self._finish_logits(self._head(hidden[full]).float())
        for i in small:
            try:
                row_ids = allowed[i]
                assert row_ids is not None  # (``small`` lists rows with ids)
                ids = row_ids.to(hidden.device)  # [n]
                part = self._head.weight.index_select(0, ids) @ hidden[i]  # [n, H] @ [H] -> [n]
                if self._head.bias is not None:
                    part = part + self._head.bias.index_select(0, ids)
                logits[i, ids] = self._finish_logits(part.float())
            except Exception as exc:  # noqa: BLE001 - that row's ids fail its sequence, not the step
                log.exception("scoring the allowed ids of sequence %d failed", owners[i])
                faults.setdefault(owners[i], f"scoring its allowed ids failed: {type(exc).__name__}: {exc}")
        return logits

    def _finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits
