"""The restricted output layer on each matrix layout a GGUF stores (F32, F16, Q8_0), without llama.cpp.

The output matrix is built here as the GGUF would hold it (Q8_0 by the ``gguf`` package's own
quantizer), so a small one shows what Gemma 3's 262k-row Q8_0 matrix does. Reference: the
dequantized rows times the hidden state in float64. Q8_0 also quantizes the hidden state to
8 bits a block (llama.cpp's activation type), which moves a logit by at most
sum |w_i| * max|x| / 254 over each block: that bound is the tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from structspec.models.gguf_tensors import TensorBytes
from structspec.models.restricted_head import F16, F32, Q8_0, Q8_BLOCK, RestrictedHead

N_EMBD, N_VOCAB = 96, 50  # three Q8_0 blocks a row


@pytest.fixture(scope="module")
def weights() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N_VOCAB, N_EMBD)).astype(np.float32)


def head(ggml_type: int, w: np.ndarray) -> tuple[RestrictedHead, np.ndarray]:
    """The head over ``w`` [vocab, embd] stored as ``ggml_type``, and the weights it stands for (dequantized)."""
    if ggml_type == F32:
        stored, exact = w.view(np.uint8), w
    elif ggml_type == F16:
        stored, exact = w.astype(np.float16).view(np.uint8), w.astype(np.float16).astype(np.float32)
    else:
        stored = quants.quantize(w, GGMLQuantizationType.Q8_0)  # [vocab, 3 x 34] bytes, as a GGUF holds them
        exact = quants.dequantize(stored, GGMLQuantizationType.Q8_0)
    return RestrictedHead(TensorBytes("output.weight", ggml_type, (N_EMBD, N_VOCAB), stored)), exact


@pytest.mark.parametrize("ggml_type", [F32, F16, Q8_0], ids=["f32", "f16", "q8_0"])
def test_an_empty_allowed_set_scores_no_id(weights, ggml_type):
    """A grammar dead end allows nothing: no logits, not an error (Q8_0 raised on the reshape of zero rows)."""
    restricted, _ = head(ggml_type, weights)
    hidden = np.random.default_rng(1).standard_normal(N_EMBD).astype(np.float32)
    got = restricted.logits(hidden, torch.empty(0, dtype=torch.long))
    assert got.shape == (0,) and got.dtype == torch.float32


@pytest.mark.parametrize("ggml_type", [F32, F16, Q8_0], ids=["f32", "f16", "q8_0"])
def test_chosen_ids_score_their_own_rows(weights, ggml_type):
    restricted, exact = head(ggml_type, weights)
    hidden = np.random.default_rng(2).standard_normal(N_EMBD).astype(np.float32)
    ids = torch.tensor([0, 17, 49, 17, 3])
    got = restricted.logits(hidden, ids).double().numpy()
    want = exact[ids.numpy()].astype(np.float64) @ hidden.astype(np.float64)
    if ggml_type == F32:
        tol = np.full(len(ids), 1e-5)
    elif ggml_type == F16:  # the hidden state is rounded to f16 as well
        tol = np.abs(exact[ids.numpy()]) @ np.abs(hidden) * 2.0 ** -10
    else:
        step = np.abs(hidden).reshape(-1, Q8_BLOCK).max(axis=1) / 254  # half a quantization step, per block
        tol = (np.abs(exact[ids.numpy()]).reshape(len(ids), -1, Q8_BLOCK).sum(-1) * step).sum(-1) + 1e-5
    assert (np.abs(got - want) <= tol).all(), (got - want, tol)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()  # the tolerance is not so loose that anything passes
