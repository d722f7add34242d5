"""The output layer for a few token ids, computed from the GGUF's own rows as llama.cpp's CPU kernels do.

llama.cpp's graph runs the whole output layer for every row it returns (Gemma 3: 262k rows
of 640, ~6 ms a position on 2 cores, more than half a decode step). Where the grammar
allows a few ids at every scored position of a forward, the llama.cpp executor stops the
graph at the final norm (``result_norm``, the hidden states of the flagged rows) and
scores just those ids here, reading their rows of the output matrix from the mapped file:

  F32   float32 dot products (llama.cpp's activation type for F32 weights is F32);
  F16   the activation rounded to f16, products summed in f32 (its F16 kernels);
  Q8_0  the activation quantized to Q8_0 as llama.cpp's AVX2 path does (blocks of 32,
        scale max|x|/127 stored as f16, values 127/max|x| times x rounded half to even),
        then per block the integer dot product times the two scales, summed in f32.

The results equal llama.cpp's own logits for those ids up to float32 summation order
(measured <= 3e-6 on Gemma 3 270M Q4_K_M, whose output matrix is Q8_0). Other matrix
types, and architectures whose logits are not ``output_norm`` times the output matrix
(soft-capping, logit scales), are not handled: ``for_model`` returns None and the executor
scores every row in full. Cost: gathering the rows (680 bytes each for Gemma) and a
[n, 640] product: ~0.1 ms for 256 ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from structspec.models.gguf_tensors import TensorBytes, tensor_bytes

F32, F16, Q8_0 = 0, 1, 8
ARCHITECTURES = ("llama", "gemma3")  # logits = output(output_norm(h)), nothing after
Q8_BLOCK = 32


def _q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[D] float32 -> scales [D/32] (as stored: f16, read back as f32) and values [D/32, 32] (float32 integers)."""
    blocks = x.reshape(-1, Q8_BLOCK)
    amax = np.abs(blocks).max(axis=1)
    scale = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return scale, np.rint(blocks * inv[:, None]).astype(np.float32)  # rint: half to even, as _mm256_round_ps


class RestrictedHead:
    """Logits of chosen token ids from hidden states, over the output matrix as the GGUF stores it."""

    def __init__(self, weight: TensorBytes):
        if weight.ggml_type not in (F32, F16, Q8_0):
            raise ValueError(f"output matrix of type {weight.ggml_type} is not scored here")
        self.weight = weight
        self.n_embd, self.n_vocab = weight.shape[0], weight.shape[1]

    @staticmethod
    def for_model(info: Any) -> "RestrictedHead | None":
        """The head of a loaded model (``GGUFInfo``), or None where its logits are not computed this way."""
        if info.architecture not in ARCHITECTURES:
            return None
        for name in ("output.weight", "token_embd.weight"):  # llama.cpp ties the output to the embedding if absent
            try:
                weight = tensor_bytes(info.path, name)
            except ValueError:
                continue
            if weight.ggml_type in (F32, F16, Q8_0) and weight.shape == (info.n_embd, info.n_vocab):
                return RestrictedHead(weight)
            return None
        return None

    def logits(self, hidden: np.ndarray, ids: torch.Tensor) -> torch.Tensor:
        """hidden [n_embd] float32, ids [n] int64 -> [n] float32 logits of those ids (n may be 0: a grammar dead
        end allows nothing, and its row is -inf everywhere). Raises IndexError for an id past the vocabulary."""
        rows = self.weight.data[ids.numpy()]  # [n, row bytes], gathered from the mapped file
        n = rows.shape[0]
        t = self.weight.ggml_type
        if t == F32:
            w = torch.from_numpy(rows.view(np.float32))
            return w @ torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))
        if t == F16:
            w = torch.from_numpy(rows.view(np.float16).astype(np.float32))
            return w @ torch.from_numpy(hidden.astype(np.float16).astype(np.float32))
        # numpy throughout: a decode step scores a handful of ids, where torch's per-op dispatch would show
        blocks = rows.reshape(n, self.n_embd // Q8_BLOCK, 2 + Q8_BLOCK)  # the block count given: n may be 0
        w_scale = blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32)  # [n, B]
        w_q = blocks[:, :, 2:].view(np.int8).astype(np.float32)  # [n, B, 32]
        x_scale, x_q = _q8_0(np.ascontiguousarray(hidden, dtype=np.float32))
        dots = np.einsum("nbk,bk->nb", w_q, x_q)  # [n, B]: integers, exact in float32
        return torch.from_numpy((dots * (w_scale * x_scale)).sum(-1))
