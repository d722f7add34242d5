"""Forward steps on llama.cpp (``ForwardStep`` over a ``LlamaCppModel``), GGUF weights as stored.

Layout: one llama.cpp context with a *unified* KV cache (``kv_unified``): a pool of cells
that any sequence may use, each structspec sequence being one llama.cpp sequence id.

  step         one ``llama_batch`` carrying every input's tokens (absolute positions, the
               sequence id per token) with the logits flag set only at the requested
               positions: llama.cpp runs the output layer on those rows alone. Logits are
               copied out per row (``llama_get_logits_ith``). A step larger than
               ``batch_tokens`` tokens or ``max_outputs`` logit rows is cut into several
               ``llama_decode`` calls (each counts in ``forward_calls``).
  rollback     ``llama_memory_seq_rm(seq, len - n, -1)``.
  copy_prefix  ``llama_memory_seq_cp(src, dst, 0, n)``: in a unified cache the cells are
               shared, no K/V is copied; either sequence may then roll back or grow alone.
  free         ``llama_memory_seq_rm(seq, -1, -1)``.

Sliding-window layers (Gemma 3): llama.cpp treats a cell whose position has left the
window of its sequence's last position as free. By default it also sizes those layers'
cache to the window (plus a batch); with ``swa_full`` (used here) the cache is full-size,
but a new token may still be written over such a cell, and llama.cpp then drops every
older position of that sequence (its cache keeps positions contiguous). Rolling the
sequence back would bring those positions back into the window: wrong logits, no error.
Two defences: (1) on a model with a window, each sequence has a second, *guard* sequence
id that shares its cells up to ``len - window`` (``llama_memory_seq_cp``, extended 256
positions at a time): llama.cpp reuses a window-masked cell only while one sequence owns
it, so guarded cells are never overwritten; (2) every rollback, copy and context move is
checked against llama.cpp's own record of the sequence (``llama_memory_seq_pos_min/max``):
a cache that does not hold exactly positions 0..len-1 raises ``LlamaCppError`` rather than
returning wrong logits. (llama.cpp's per-sequence state save likewise keeps only the
window's cells, so contexts are moved whole: see Capacity.)

Capacity: cells and sequence ids are sized in powers of two. When a step needs more cells
than the pool has (counted as the sum of the sequences' lengths: shared prefix cells
count once per sequence, so the count is an upper bound), or a new sequence finds no
free id, the context is rebuilt at the new size and the whole cache moved into it
(``llama_state_get_data``/``set_data``: one copy of the used cells, shared ones once).
The pool shrinks the same way when a ``free`` leaves it under a quarter used.
``footprint`` is ``max(cells, pow2(sequences x longest))``. The pool never shrinks below
the size it starts at (``initial_tokens`` cells, ids for ``initial_sequences`` sequences):
a resize costs ~0.25 s for Gemma 3 270M at 4k cells, so the engine starts it at what a
steady stream needs (``assembly.make_executor``: twice the prefix cache's budget, ids for a
batch and the retained prompts).

Numerics: llama.cpp's CPU kernels are chosen by the shape of a forward, and their rounding
differs. With weight repacking off (``llamacpp_model``), on a short cache, a forward of up
to 7 tokens (a decode, a verification of up to 6 drafted tokens, a batch of up to 7
decodes) gives logits bit-identical to feeding the same tokens one at a time. Beyond that
the kernels change: matrix products from 8 tokens; attention for one query once the cache
view spans 512 cells; attention tiled by 64 cache cells from 64 queries (so a prompt
chunk's result also depends on where its cells sit in the pool). On a quantized model the
logits then move by up to a few logits (Gemma 3 270M Q4_K_M: median ~1, about its own
distance from the fp32 model); on F32 weights by ~1e-3. That is llama.cpp's evaluation,
not an error of this executor (which matches llama.cpp fed the same forwards exactly);
greedy outputs can then differ between batch compositions, or with speculation on and
off, where the top two logits are that close.

Small allowed sets: llama.cpp's graph runs the whole output layer for every flagged row.
When every flagged row of a forward has an allowed set of at most ``restricted_logits_max``
ids (``StepInput.allowed``), the executor stops the graph once the final norm is computed
(llama.cpp's eval callback, on ``result_norm``: the hidden states of the flagged rows; the
K/V of every token is written before it) and scores just those ids from the GGUF's own
output rows (``restricted_head``, equal to llama.cpp's logits up to summation order), -inf
elsewhere. A forward with any other row runs in full. At start-up one probe forward checks
the restricted logits against llama.cpp's own; a mismatch turns the path off.

Raises: ``InputError`` naming the inputs at fault (``ContextOverflow``, bad tokens or
positions, before running; allowed ids the restricted layer could not score, after), so
the caller may run the others again; ``ValueError`` (a sequence twice), ``KeyError``
(unknown sequence), ``LlamaCppError`` (llama.cpp refused a decode, a state move, a
context): the whole step. A failed step leaves every sequence as it was before the step.
Cost notes: a decode step of Gemma 3 270M Q4_K_M takes ~10.5 ms on 2 cores, of which the
262k-row output layer is ~6 ms per flagged row; K/V in f16 take 18 KB per token.
"""

from __future__ import annotations

import ctypes
import heapq
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from structspec.models.executor import InputError, StepInput, check_inputs
from structspec.models.llamacpp_model import LlamaCppError, LlamaCppModel, lib
from structspec.models.restricted_head import ARCHITECTURES, RestrictedHead
from structspec.models.threads import cpu_budget

log = logging.getLogger(__name__)

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ (a model with a sliding window uses two ids a sequence)
GUARD_STRIDE = 256  # positions a guard sequence is extended by at a time (module doc: sliding-window layers)
KV_TYPES = {"f16": (1, 2), "f32": (0, 4)}  # name -> (ggml_type, bytes per element)
RESTRICTED_LOGITS_MAX = 1024  # allowed ids a row may have to be scored alone (~0.4 ms against ~6 ms of output layer)
HIDDEN_NODE = b"result_norm"  # llama.cpp's name for the final norm's output (the output layer's input)


def _ggml_base():
    """libggml-base beside llama-cpp-python's libllama (tensor names and data for the eval callback), or None."""
    folder = Path(lib().__file__).resolve().parent / "lib"
    for path in sorted(folder.glob("libggml-base.*")) + sorted(folder.glob("ggml-base.*")):
        try:
            base = ctypes.CDLL(os.fspath(path))
        except OSError:
            continue
        base.ggml_get_name.restype, base.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        base.ggml_get_data_f32.restype, base.ggml_get_data_f32.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
        base.ggml_nelements.restype, base.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
        base.ggml_is_contiguous.restype, base.ggml_is_contiguous.argtypes = ctypes.c_bool, [ctypes.c_void_p]
        return base
    return None


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class _Row:
    """One flagged token of a step: where it sits in the packed tokens, and the output row it fills."""

    token: int  # index into the packed tokens of the step
    out: int  # row of the step's logits tensor
    seq: int  # the structspec sequence it scores
    allowed: torch.Tensor | None = None  # the only ids to score (restricted output layer), or None for all


class _Batch:
    """A ``llama_batch`` over numpy arrays this object owns (never ``llama_batch_free``d)."""

    def __init__(self, llama_cpp, capacity: int):
        c_int_p = ctypes.POINTER(ctypes.c_int32)
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        base = self.seq.ctypes.data
        self._seq_ptrs = (c_int_p * capacity)(*[ctypes.cast(base + 4 * i, c_int_p) for i in range(capacity)])
        self.struct = llama_cpp.llama_batch(
            n_tokens=0, token=self.tokens.ctypes.data_as(c_int_p), embd=None, pos=self.pos.ctypes.data_as(c_int_p),
            n_seq_id=self.n_seq.ctypes.data_as(c_int_p), seq_id=self._seq_ptrs,
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)))


class LlamaCppExecutor:
    """``ForwardStep`` over a GGUF model run by llama.cpp on the CPU."""

    def __init__(self, model: LlamaCppModel, max_context: int | None = None, threads: int = 0,
                 initial_tokens: int = 1024, initial_sequences: int = 4, max_outputs: int = 64,
                 batch_tokens: int = 512, kv_type: str = "f16", restricted: bool = True):
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, not {kv_type!r}")
        if max_outputs < 1 or batch_tokens < 1:
            raise ValueError("max_outputs and batch_tokens must be >= 1")
        self._lib = lib()
        self.model = model
        self.vocab_size = model.info.n_vocab
        self.max_context = int(min(max_context or model.info.n_ctx_train, model.info.n_ctx_train))
        self.forward_calls = 0
        self.eval_seconds = 0.0  # time spent inside llama_decode (the rest of a step is this executor's)
        self.head_seconds = 0.0  # ... and in the restricted output layer, the model's last matrix computed here
        self.tokens_evaluated = 0  # tokens through llama_decode (drafts rolled back afterwards included)
        self.rows_scored = 0  # logit rows returned
        self.rows_restricted = 0  # ... of which scored on their allowed ids alone (no output layer)
        self.threads = threads if threads > 0 else cpu_budget()
        self._kv_type, self._kv_elem = KV_TYPES[kv_type]
        self._max_outputs = max_outputs
        self._batch_tokens = batch_tokens
        ids = min(MAX_SEQUENCES, _pow2(max(1, initial_sequences) * (2 if model.info.n_swa else 1)))  # guards: below
        self._initial = (_pow2(max(256, initial_tokens)), ids)
        self._batch = _Batch(self._lib, batch_tokens)
        self._ctx = None
        self._cells, self._n_seq = 0, 0
        self._lseq: dict[int, int] = {}  # structspec sequence id -> llama.cpp sequence id
        self._swa = model.info.n_swa
        self._guard: dict[int, int] = {}  # structspec sequence id -> its guard's llama.cpp id (models with a window)
        self._guarded: dict[int, int] = {}  # leading positions its guard shares
        self._len: dict[int, int] = {}
        self._free_ids: list[int] = []
        self._next_id = 0
        self._peak_tokens = 0
        self.restricted_logits_max = 0  # set below once the restricted path has passed its probe
        self._head, self._ggml, self._callback = None, None, None
        self._hidden: np.ndarray | None  # what the eval callback captured
        self._capturing, self._hidden = False, None
        if restricted:
            self._head = RestrictedHead.for_model(model.info)
            self._ggml = _ggml_base() if self._head is not None else None
            if self._ggml is not None:
                self._callback = self._lib.ggml_backend_sched_eval_callback(self._on_tensor)
            elif self._head is None:
                log.info("restricted output layer off for %s (architecture %s): it scores %s models with an F32, F16 "
                         "or Q8_0 output matrix; every row goes through llama.cpp's full output layer",
                         model.info.path, model.info.architecture, " and ".join(ARCHITECTURES))
            else:
                log.info("restricted output layer off for %s: libggml-base was not found beside llama-cpp-python; "
                         "every row goes through llama.cpp's full output layer", model.info.path)
        self._ctx, self._mem = self._new_context(*self._initial)
        self._cells, self._n_seq = self._initial
        self._free_ids = list(range(self._n_seq))
        if self._callback is not None:
            self.restricted_logits_max = RESTRICTED_LOGITS_MAX if self._probe_restricted() else 0

    # -- the restricted output layer ---------------------------------------------------------------
    def _on_tensor(self, tensor: int, ask: bool, _user) -> bool:
        """llama.cpp's eval callback: while capturing, observe ``result_norm``, keep it and stop the graph there."""
        if not self._capturing:
            return False
        try:
            base = self._ggml
            assert base is not None  # (set before the callback is installed)
            if base.ggml_get_name(tensor) != HIDDEN_NODE:
                return not ask  # asked: not needed; observed (cannot happen): go on
            if ask:
                return True
            n, width = base.ggml_nelements(tensor), self.model.info.n_embd
            if ctypes.c_int.from_address(tensor).value == 0 and base.ggml_is_contiguous(tensor) and n % width == 0:
                data = (ctypes.c_float * n).from_address(base.ggml_get_data_f32(tensor))
                self._hidden = np.ctypeslib.as_array(data).reshape(-1, width).copy()
        except Exception:  # noqa: BLE001 - a C callback cannot raise; a missing capture is caught after the decode
            log.exception("capturing the hidden states failed")
        return False  # the output layer is not needed: stop the graph here

    def _probe_restricted(self) -> bool:
        """A few tokens through both paths on a scratch sequence id: do the restricted logits equal llama.cpp's?"""
        llama_cpp, lseq = self._lib, self._free_ids[0]
        b, v = self._batch, self.vocab_size
        probe = [1 + v // 7, 1 + v // 3, 1 + v // 2]  # not id 0: a padding id's embedding may be all zeros
        n = len(probe)
        b.tokens[:n], b.pos[:n], b.seq[:n], b.logits[:n] = probe, range(n), lseq, (0,) * (n - 1) + (1,)
        b.struct.n_tokens = n
        ids = torch.arange(0, v, max(1, v // 512))
        try:
            if llama_cpp.llama_decode(self._ctx, b.struct) != 0:
                return False
            full = torch.from_numpy(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, n - 1),
                                                          shape=(v,)).copy())
            llama_cpp.llama_memory_seq_rm(self._mem, lseq, -1, -1)
            self._capturing, self._hidden = True, None
            try:
                if llama_cpp.llama_decode(self._ctx, b.struct) != 0 or self._hidden is None:
                    return False
            finally:
                self._capturing = False
            got = self._head.logits(self._hidden[0], ids)
            scale = float(full[ids].abs().max())
            ok = scale > 0 and bool((got - full[ids]).abs().max() <= 1e-4 * max(1.0, scale))
            if not ok:
                log.warning("restricted scoring disagrees with llama.cpp on %s: scoring every row in full",
                            self.model.info.path)
            return ok
        finally:
            llama_cpp.llama_memory_seq_rm(self._mem, lseq, -1, -1)

    # -- the context -------------------------------------------------------------------------------
    def _new_context(self, cells: int, n_seq: int):
        llama_cpp = self._lib
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = cells
        p.n_batch = p.n_ubatch = self._batch_tokens
        p.n_seq_max = n_seq
        p.n_outputs_max = max(self._max_outputs, n_seq)  # llama.cpp asserts the output buffer holds n_seq_max rows
        p.n_threads = p.n_threads_batch = self.threads
        p.kv_unified = True
        p.swa_full = True
        p.type_k = p.type_v = self._kv_type
        p.no_perf = True
        if self._callback is not None:
            p.cb_eval = self._callback
        ctx = llama_cpp.llama_init_from_model(self.model.handle, p)
        if not ctx:
            raise LlamaCppError(f"llama.cpp could not create a context of {cells} cells and {n_seq} sequences "
                                "(out of memory?)")
        return ctx, llama_cpp.llama_get_memory(ctx)

    def _rebuild(self, cells: int, n_seq: int) -> None:
        """Move every sequence into a new context of ``cells`` cells and ``n_seq`` ids (module doc: capacity).

        The whole context's state moves (``llama_state_get_data``/``set_data``): the per-sequence state functions
        save only the cells inside the sliding window of a sequence's last position, which would drop the history
        a rollback needs on Gemma 3's sliding-window layers."""
        llama_cpp = self._lib
        ctx, mem = self._new_context(cells, n_seq)
        try:
            if self._lseq:
                size = llama_cpp.llama_state_get_size(self._ctx)
                buf = (ctypes.c_uint8 * size)()
                got = llama_cpp.llama_state_get_data(self._ctx, buf, size)
                if got == 0 or llama_cpp.llama_state_set_data(ctx, buf, got) != got:
                    raise LlamaCppError(f"llama.cpp could not move {len(self._lseq)} sequences "
                                        f"({self.cached_tokens()} tokens) into a context of {cells} cells")
                for sid in self._lseq:
                    self._check(sid, mem)
        except BaseException:
            llama_cpp.llama_free(ctx)
            raise
        llama_cpp.llama_free(self._ctx)
        self._ctx, self._mem = ctx, mem
        self._free_ids = sorted(set(self._free_ids) | set(range(self._n_seq, n_seq)))
        self._cells, self._n_seq = cells, n_seq

    def _check(self, sid: int, mem=None) -> None:
        """Raise unless llama.cpp holds exactly positions 0..len-1 of ``sid`` (nothing pruned, nothing left over)."""
        llama_cpp, mem = self._lib, mem if mem is not None else self._mem
        lseq, n = self._lseq[sid], self._len[sid]
        lo, hi = llama_cpp.llama_memory_seq_pos_min(mem, lseq), llama_cpp.llama_memory_seq_pos_max(mem, lseq)
        if (lo, hi) != ((0, n - 1) if n else (-1, -1)):
            raise LlamaCppError(f"llama.cpp's cache holds positions {lo}..{hi} of sequence {sid}, not 0..{n - 1}")

    def close(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx:
            self._lib.llama_free(ctx)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- accounting --------------------------------------------------------------------------------
    @property
    def cells(self) -> int:
        """KV cells of the pool (every sequence draws from it)."""
        return self._cells

    def cached_tokens(self) -> int:
        """Tokens held across all live sequences (a shared prefix counts once per sequence)."""
        return sum(self._len.values())

    def peak_cached_tokens(self) -> int:
        return self._peak_tokens

    def allocated_bytes(self) -> int:
        """Bytes of the K/V pool (every layer at full size)."""
        return self._cells * self.model.kv_bytes_per_token(self._kv_elem)

    def footprint(self, sequences: int, longest: int) -> int:
        """Cells of the pool after growing for ``sequences`` sequences up to ``longest`` tokens (an upper bound:
        the pool grows to the power of two over the sum of the lengths, never shrinking below its size now)."""
        return max(self._cells, _pow2(max(1, sequences) * max(1, longest)))

    # -- ForwardStep -------------------------------------------------------------------------------
    def new_sequence(self) -> int:
        ids = 2 if self._swa else 1
        if len(self._free_ids) < ids:
            if self._n_seq >= MAX_SEQUENCES:
                raise LlamaCppError(f"llama.cpp holds at most {MAX_SEQUENCES // ids} sequences per context "
                                    f"({MAX_SEQUENCES} ids, {ids} a sequence)")
            self._rebuild(self._cells, min(MAX_SEQUENCES, 2 * self._n_seq))
        sid = self._next_id
        self._next_id += 1
        self._lseq[sid] = heapq.heappop(self._free_ids)
        self._len[sid] = 0
        if self._swa:
            self._guard[sid] = heapq.heappop(self._free_ids)
            self._guarded[sid] = 0
        return sid

    def _protect(self, sid: int, length: int) -> None:
        """Let the guard share the positions of ``sid`` that have left (or will soon leave) the window."""
        need = length - self._swa + 1
        if not self._swa or need <= self._guarded[sid]:
            return
        upto = min(length, need + GUARD_STRIDE)
        self._lib.llama_memory_seq_cp(self._mem, self._lseq[sid], self._guard[sid], self._guarded[sid], upto)
        self._guarded[sid] = upto

    def _forget(self, sid: int, keep: int) -> None:
        """Remove positions >= ``keep`` of ``sid`` from llama.cpp's cache (and from its guard)."""
        ok = self._lib.llama_memory_seq_rm(self._mem, self._lseq[sid], keep, -1)
        if self._swa:
            self._lib.llama_memory_seq_rm(self._mem, self._guard[sid], keep, -1)
            self._guarded[sid] = min(self._guarded[sid], keep)
        if not ok:
            raise LlamaCppError(f"llama.cpp refused to remove positions >= {keep} of sequence {sid}")

    def seq_len(self, seq_id: int) -> int:
        return self._len[seq_id]

    def rollback(self, seq_id: int, n: int) -> None:
        have = self._len[seq_id]
        if n < 0 or n > have:
            raise ValueError(f"cannot roll back {n} tokens of a {have}-token sequence")
        if n == 0:
            return
        self._forget(seq_id, have - n)
        self._len[seq_id] = have - n
        self._check(seq_id)

    def copy_prefix(self, seq_id: int, source_id: int, n: int) -> None:
        if self._len[seq_id] != 0:
            raise ValueError(f"sequence {seq_id} is not empty")
        if n < 0 or n > self._len[source_id]:
            raise ValueError(f"sequence {source_id} holds {self._len[source_id]} tokens, not {n}")
        if n == 0:
            return
        self._lib.llama_memory_seq_cp(self._mem, self._lseq[source_id], self._lseq[seq_id], 0, n)
        self._len[seq_id] = n
        self._protect(seq_id, n)
        self._check(seq_id)
        self._grow_for(0)  # the copy is counted in full (an upper bound); keep the pool above the count
        self._peak_tokens = max(self._peak_tokens, self.cached_tokens())

    def free(self, seq_id: int) -> None:
        self._forget(seq_id, 0)
        heapq.heappush(self._free_ids, self._lseq.pop(seq_id))
        if self._swa:
            heapq.heappush(self._free_ids, self._guard.pop(seq_id))
            del self._guarded[seq_id]
        del self._len[seq_id]
        cells = max(self._initial[0], _pow2(max(1, self.cached_tokens())))
        if 4 * cells <= self._cells:
            self._rebuild(cells, self._n_seq)

    def _grow_for(self, new_tokens: int) -> None:
        need = self.cached_tokens() + new_tokens
        if need > self._cells:
            self._rebuild(_pow2(need), self._n_seq)

    def step(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        if not inputs:
            return []
        lens = [self._len[x.seq_id] for x in inputs]
        check_inputs(inputs, lens, self.vocab_size, self.max_context)
        counts = [len(x.tokens) for x in inputs]
        # plain lists: a decode step packs a few tokens, where numpy's per-call cost would show (module doc)
        tokens = [int(t) for x in inputs for t in x.tokens]
        self._grow_for(len(tokens))
        rows: list[_Row]
        rows, splits, offset = [], [], 0
        limit = self.restricted_logits_max
        for x, c in zip(inputs, counts):
            splits.append(len(x.logits_at))
            for j, t in enumerate(x.logits_at):
                ids = x.allowed[j] if x.allowed is not None else None
                rows.append(_Row(offset + t % c, len(rows), x.seq_id,
                                 ids if ids is not None and len(ids) <= limit else None))
            offset += c
        positions = [p for n, c in zip(lens, counts) for p in range(n, n + c)]
        seqs = [self._lseq[x.seq_id] for x, c in zip(inputs, counts) for _ in range(c)]
        segments = [(x.seq_id, n, c) for x, n, c in zip(inputs, lens, counts)]  # in packing order
        out = torch.empty((len(rows), self.vocab_size), dtype=torch.float32)
        faults: dict[int, str] = {}
        try:
            self._decode_all(tokens, positions, seqs, segments, rows, out, faults)
            if faults:
                raise InputError(faults)
        except BaseException:
            for x, n in zip(inputs, lens):  # whatever llama.cpp took in of this step goes again
                self._forget(x.seq_id, n)
            raise
        for x, n, c in zip(inputs, lens, counts):
            self._len[x.seq_id] = n + c
        self._peak_tokens = max(self._peak_tokens, self.cached_tokens())
        return list(out.split(splits))

    def _decode_all(self, tokens: list[int], positions: list[int], seqs: list[int],
                    segments: list[tuple[int, int, int]], rows: list[_Row], out: torch.Tensor,
                    faults: dict[int, str]) -> None:
        """Run the packed tokens in as few ``llama_decode`` calls as the batch and output limits allow; a row whose
        allowed ids could not be scored names its sequence in ``faults``."""
        by_token: dict[int, list[_Row]] = {}
        for r in rows:
            by_token.setdefault(r.token, []).append(r)
        marks_all = sorted(by_token)
        start, total, m = 0, len(tokens), 0
        while start < total:
            end = min(total, start + self._batch_tokens)
            m_end = m
            while m_end < len(marks_all) and marks_all[m_end] < end:
                m_end += 1
            if m_end - m > self._max_outputs:
                m_end = m + self._max_outputs
                end = marks_all[m_end - 1] + 1
            self._decode(start, end, tokens, positions, seqs, marks_all[m:m_end], by_token, out, faults)
            if self._swa:  # before any other forward: the cells that just left a window get their guard
                at = 0
                for sid, n, c in segments:
                    if at < end and at + c > start:
                        self._protect(sid, n + min(end, at + c) - at)
                    at += c
            start, m = end, m_end

    def _decode(self, start: int, end: int, tokens: list[int], positions: list[int], seqs: list[int],
                marks: list[int], by_token: dict[int, list[_Row]], out: torch.Tensor, faults: dict[int, str]) -> None:
        """One ``llama_decode`` of tokens [start, end); ``marks`` are the flagged ones (indices into the step)."""
        llama_cpp, b, n = self._lib, self._batch, end - start
        b.tokens[:n], b.pos[:n], b.seq[:n] = tokens[start:end], positions[start:end], seqs[start:end]
        b.logits[:n] = 0
        for i in marks:
            b.logits[i - start] = 1
        b.struct.n_tokens = n
        capture = self.restricted_logits_max > 0 and len(marks) > 0 and all(
            r.allowed is not None for i in marks for r in by_token[i])
        self._capturing, self._hidden = capture, None
        t0 = time.perf_counter()
        try:
            rc = llama_cpp.llama_decode(self._ctx, b.struct)
        finally:
            self._capturing = False
        self.eval_seconds += time.perf_counter() - t0
        self.forward_calls += 1
        self.tokens_evaluated += n
        self.rows_scored += len(marks)
        self.rows_restricted += len(marks) if capture else 0
        if rc != 0:
            why = {1: "no KV cell free for the batch", 2: "aborted"}.get(rc, "invalid batch or internal error")
            raise LlamaCppError(f"llama_decode returned {rc} ({why}) for {n} tokens")
        if capture:
            hidden = self._hidden
            if hidden is None or hidden.shape[0] != len(marks):
                raise LlamaCppError(f"llama.cpp did not expose the hidden states of the {len(marks)} scored rows")
            dense = out.numpy()  # numpy, not torch: one thread and no dispatch for a few rows
            for j, i in enumerate(marks):
                for r in by_token[i]:
                    dense[r.out].fill(-np.inf)
                    t1 = time.perf_counter()
                    try:
                        dense[r.out, r.allowed.numpy()] = self._head.logits(hidden[j], r.allowed).numpy()
                    except Exception as exc:  # noqa: BLE001 - that row's ids fail its sequence, not the step
                        log.exception("scoring the allowed ids of sequence %d failed", r.seq)
                        faults.setdefault(r.seq, f"scoring its allowed ids failed: {type(exc).__name__}: {exc}")
                    self.head_seconds += time.perf_counter() - t1
            return
        row_bytes = 4 * self.vocab_size
        base = out.data_ptr()
        for i in marks:
            src = llama_cpp.llama_get_logits_ith(self._ctx, i - start)
            if not src:
                raise LlamaCppError(f"llama.cpp returned no logits for token {i - start} of the batch")
            for r in by_token[i]:
                ctypes.memmove(base + r.out * row_bytes, src, row_bytes)
