"""The acceptance rule on toy distributions: speculative output has exactly the target distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from structspec.engine.sampling import argmax, choose, target_logprobs
from structspec.engine.types import SamplingParams
from structspec.engine.verify import verify

P = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])  # target; token 4 is masked by the grammar
Q = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2])  # a sampling draft that even proposes the masked token
SAMPLE = SamplingParams(temperature=1.0)
N = 12000


def rows_for(p: torch.Tensor, k: int) -> torch.Tensor:
    logits = torch.log(p).expand(k + 1, -1).clone()  # -inf where p = 0: masked
    return logits


def first_token(verdict, draft) -> int:
    return draft[0] if verdict.accepted >= 1 else verdict.token


def empirical(fn, n: int = N) -> np.ndarray:
    counts = np.zeros(len(P))
    for seed in range(n):
        counts[fn(seed)] += 1
    return counts


def assert_matches(counts: np.ndarray, p: torch.Tensor) -> None:
    support = p.numpy() > 0
    assert counts[~support].sum() == 0, "a masked token was emitted"
    expected = p.numpy()[support] * counts.sum()
    stat = chisquare(counts[support], expected)
    assert stat.pvalue > 1e-3, (counts, expected)


def sampled_draft(seed: int) -> tuple[list[int], torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 + seed)
    x = int(torch.multinomial(Q, 1, generator=g))
    return [x], Q.unsqueeze(0)


def test_sampled_draft_keeps_target_distribution():
    def run(seed):
        draft, q = sampled_draft(seed)
        return first_token(verify(rows_for(P, 1), draft, q, SAMPLE, seed, 0), draft)
    assert_matches(empirical(run), P)


def test_point_mass_draft_keeps_target_distribution():
    def run(seed):
        draft = [2]  # a deterministic proposer always says token 2
        return first_token(verify(rows_for(P, 1), draft, None, SAMPLE, seed, 0), draft)
    assert_matches(empirical(run), P)


def test_ungrammatical_draft_never_emitted_and_distribution_kept():
    def run(seed):
        draft = [4]  # masked: p(4) = 0
        return first_token(verify(rows_for(P, 1), draft, None, SAMPLE, seed, 0), draft)
    assert_matches(empirical(run), P)


def test_broken_rules_are_detected():
    """Power check: the same test fails when the rule is broken (a wrong residual / sampling from p after a rejection)."""
    def point_mass_residual(seed):  # min(1, p/q) acceptance, but the residual of a point mass (p without x)
        draft, q = sampled_draft(seed)
        x = draft[0]
        if torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) < min(1.0, P[x] / Q[x]):
            return x
        rest = P.clone()
        rest[x] = 0
        return choose(torch.log(rest), SAMPLE, seed, 0)

    def from_p_not_residual(seed):
        draft, q = sampled_draft(seed)
        v = verify(rows_for(P, 1), draft, q, SAMPLE, seed, 0)
        if v.accepted:
            return draft[0]
        return choose(rows_for(P, 0)[0], SAMPLE, seed, 99)  # wrong: ignores the residual

    for broken in (point_mass_residual, from_p_not_residual):
        counts = empirical(broken)
        expected = P.numpy()[:4] * counts.sum()
        assert chisquare(counts[:4], expected).pvalue < 1e-6, broken.__name__


def test_keyed_point_mass_identical_to_plain_sampling():
    """With keyed noise, speculation with a deterministic draft emits the very tokens plain decoding emits."""
    logits = torch.log(P)
    for seed in range(300):
        plain = [choose(logits, SAMPLE, seed, pos) for pos in range(4)]
        draft = [2, 0, 1]
        v = verify(logits.expand(4, -1).clone(), draft, None, SAMPLE, seed, 0)
        emitted = draft[: v.accepted] + [v.token]
        assert emitted == plain[: len(emitted)]


def test_greedy_accepts_while_argmax_matches():
    rows = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0], [1.0, 2.0, 0.0]])
    v = verify(rows, [1, 0, 1], None, SamplingParams(), 0, 0)
    assert (v.accepted, v.token) == (2, 2)  # row 2's argmax (2) recovers the rejected 1
    v = verify(rows, [1, 0, 2], None, SamplingParams(), 0, 0)
    assert (v.accepted, v.token) == (3, 1)  # all accepted: row 3 gives the bonus


@pytest.mark.parametrize("top_k,top_p,support", [(2, 1.0, {0, 1}), (0, 0.7, {0, 1}), (0, 0.5, {0}), (0, 1.0, {0, 1, 2, 3})])
def test_top_k_top_p(top_k, top_p, support):
    logp = target_logprobs(torch.log(P), SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p))
    assert {i for i in range(5) if logp[i] > float("-inf")} == support
    assert torch.isclose(logp.exp().sum(), torch.tensor(1.0))


def test_argmax_is_torchs_first_maximum():
    """The numpy path greedy decoding uses on CPU rows gives torch.argmax's answer, ties to the first index."""
    row = torch.full((262_144,), float("-inf"))
    row[[7, 100, 200_000]] = torch.tensor([1.5, 2.5, 2.5])
    assert argmax(row) == int(torch.argmax(row)) == 100
    batch = torch.randn(3, 50)
    assert [argmax(r) for r in batch] == torch.argmax(batch, dim=-1).tolist()  # rows of a batch (views)
    assert argmax(torch.tensor([1.0, 3.0], dtype=torch.bfloat16)) == 1  # other dtypes: torch itself
