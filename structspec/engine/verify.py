"""Verify a draft against the target in one pass: which drafted tokens to keep, and the next token.

Terms (per sequence, per step):
  drafted    the k tokens x_0..x_{k-1} a proposer suggested after the committed text
             (and after the forced tokens, which are neither drafted nor accepted).
  accepted   the longest prefix x_0..x_{a-1} that passes the test below; a <= k.
  recovered  when x_a is rejected: a token drawn at position a from the target's
             distribution with x_a's share removed (greedy: the masked argmax).
  bonus      when all k are accepted: a token drawn from the target's distribution
             after x_{k-1}, which the same forward pass scored for free.
Every step therefore emits a + 1 tokens (a accepted + one recovered or bonus); with
k = 0 this is plain decoding, so speculation on and off share this one code path.

The test at position i, with p_i the target's processed distribution (grammar mask,
temperature, top-k, top-p) and q_i the proposer's:
  greedy                 accept iff argmax p_i == x_i.
  deterministic proposer accept iff the keyed sample y_i ~ p_i equals x_i; on rejection emit y_i.
  (q_i a point mass)     P(accept) = p_i(x_i) = min(1, p_i/q_i), and y_i given y_i != x_i is
                         p_i without x_i, renormalised: the residual max(0, p_i - q_i).
  sampled draft          accept iff u_i < p_i(x_i) / q_i(x_i); on rejection draw from
  (q_i a distribution)   normalize(max(0, p_i - q_i)), or p_i if that is numerically empty.
An ungrammatical x_i has p_i(x_i) = 0 and is always rejected.

The cut tail. The engine walks a draft through the grammar and stops at the first token it
cannot consume (ungrammatical, or EOS, which no draft continues past). For a sampled draft
that token x_k is still a draw from q_k, so position k is tested like any other: ``tail =
(x_k, q_k)`` makes row k a test of x_k (accepted only when it is an EOS the target allows)
whose rejection draws from normalize(max(0, p_k - q_k)), not from p_k (a draw from p_k
would over-weight what q_k also proposed). For point masses the two coincide: row k is the
keyed sample of p_k either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from structspec.engine.sampling import argmax, choose, keyed_gumbel, keyed_uniform, target_logprobs
from structspec.engine.types import SamplingParams


@dataclass(frozen=True)
class Verdict:
    accepted: int  # a: drafted tokens kept
    token: int  # the recovered (a < k) or bonus (a == k) token


def verify(
    rows: torch.Tensor,  # [k+1, V] target logits, grammar-masked per position (row i scores x_i, row k the bonus)
    draft: Sequence[int],  # [k] drafted tokens x_0..x_{k-1}
    q: torch.Tensor | None,  # [k, V] proposer probabilities, or None for point masses (deterministic drafts)
    params: SamplingParams,
    seed: int,
    position: int,  # output position of x_0 (keys the sampling noise)
    tail: tuple[int, torch.Tensor] | None = None,  # (x_k, q_k [V]): a sampled draft's token cut at row k
) -> Verdict:
    k = len(draft)
    assert rows.shape[0] == k + 1, (rows.shape, k)
    if params.greedy or q is None:
        for i, x in enumerate(draft):
            y = choose(rows[i], params, seed, position + i)
            if y != x:
                return Verdict(i, y)
        return Verdict(k, choose(rows[k], params, seed, position + k))

    logp = target_logprobs(rows, params)  # [k+1, V]
    p = logp.exp()
    for i, x in enumerate(draft):
        y = _test_one(p[i], x, q[i], seed, position + i)
        if y != x:  # the residual gives x no mass, so y == x means x was accepted
            return Verdict(i, y)
    if tail is not None:
        x, q_tail = tail
        return Verdict(k, _test_one(p[k], x, q_tail, seed, position + k))
    return Verdict(k, argmax(logp[k] + keyed_gumbel(seed, position + k, logp.shape[-1])))


def _test_one(p: torch.Tensor, x: int, q: torch.Tensor, seed: int, position: int) -> int:
    """The emitted token at a position that tests x ~ q against p: x itself if accepted, else a residual draw."""
    ratio = float(p[x] / q[x]) if q[x] > 0 else 0.0
    if keyed_uniform(seed, position) < ratio:
        return x
    residual = (p - q).clamp_min(0.0)
    if float(residual.sum()) <= 1e-12:
        residual = p
    return argmax(torch.log(residual) + keyed_gumbel(seed, position, residual.shape[-1]))
