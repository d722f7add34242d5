"""vLLM's rejection sampler on drafts with no probabilities (structspec's, n-gram's), on made-up inputs: the first
output token of a one-hot draft is distributed as the target's masked distribution p, whatever was drafted.

The kernels are those a worker runs on this platform (``register_triton_kernel_overrides``: vLLM's C++ fallbacks
on a CPU without Triton, the Triton kernels elsewhere). What this pins down: with ``draft_probs`` None, vLLM keeps a drafted token x with probability p(x) and otherwise
samples from p with x removed, so the output is p exactly (``docs/vllm.md``, Exactness). A bias measured end to end
(sampled requests with the proposers' drafts) therefore enters before the sampler, not in it. Power: the same test
handed a draft distribution the drafter never sampled from (uniform q: x kept with min(1, p(x)/q(x))) fails.

Skipped where vLLM is not installed; ``STRUCTSPEC_REQUIRE_VLLM=1`` makes them fail instead."""

from __future__ import annotations

import pytest

from tests.vllm_engine import chi2_sf, need_vllm

need_vllm()

import torch  # noqa: E402

N = 20_000  # requests of one drafted token each, in one call
# the target's logits over a vocabulary of 8: tokens 5-7 masked by the grammar (-inf), as vLLM masks drafted rows
LOGITS = torch.tensor([1.0, 0.2, -0.5, 0.7, -1.5, float("-inf"), float("-inf"), float("-inf")])
P = torch.softmax(LOGITS, dim=-1)


def first_tokens(drafted: int, draft_probs: torch.Tensor | None) -> torch.Tensor:
    """The first output token of ``N`` requests that each drafted ``drafted`` (temperature 1)."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import rejection_sample

    current_platform.register_triton_kernel_overrides()  # as a worker does at start: the kernels it runs here
    vocab = LOGITS.numel()
    meta = SamplingMetadata(
        temperature=torch.ones(N), all_greedy=False, all_random=True, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(N),
        presence_penalties=torch.zeros(N), repetition_penalties=torch.ones(N), output_token_ids=[[] for _ in range(N)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    torch.manual_seed(0)
    out = rejection_sample(
        torch.full((N,), drafted, dtype=torch.int64), [1] * N, 1, torch.arange(1, N + 1, dtype=torch.int32),
        draft_probs, LOGITS.expand(N, vocab).contiguous().clone(), torch.zeros((N, 1), dtype=torch.int64), meta)
    return out[:, 0].long()


def fit_p(tokens: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit of ``tokens`` to ``P`` over the unmasked tokens (the p-value)."""
    allowed = P > 0
    counts = torch.bincount(tokens, minlength=P.numel()).double()
    assert counts[~allowed].sum() == 0  # nothing outside the mask
    expected = P[allowed].double() * len(tokens)
    stat = ((counts[allowed] - expected) ** 2 / expected).sum()
    return chi2_sf(float(stat), int(allowed.sum()) - 1)


@pytest.mark.parametrize("drafted", [0, 2, 4])  # the likeliest token, a middling one, the least likely
def test_a_one_hot_draft_leaves_the_target_distribution(drafted):
    assert fit_p(first_tokens(drafted, None)) > 0.001


def test_the_fit_catches_a_draft_distribution_the_drafter_never_sampled_from():
    uniform = torch.full((N, LOGITS.numel()), 1 / LOGITS.numel())  # x kept with min(1, p/q): over-kept when p > q
    assert fit_p(first_tokens(4, uniform)) < 1e-6
