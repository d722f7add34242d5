"""Speculative sampling is exact on every path the core takes, and the tests have the power to say so.

A toy run through the real ``EngineCore`` (model-free executor, three grammar positions, one of
them masking a token the proposer likes): the output distribution over whole 3-token outputs is
compared with the exact target distribution, enumerated from the same logits (a chi-square
goodness of fit over fixed seeds, so the test is deterministic). Temperature < 1 with top-k and
top-p, and temperature 1. Then the harness: each mutation below, applied to the verifier's (or the
toy proposer's) source, must make the same test fail. A mutation whose target line is gone fails
the harness loudly, so it cannot rot into a test that always passes.
"""

from __future__ import annotations

import itertools
import sys
import types

import pytest
import torch
from scipy.stats import chisquare

from structspec.engine import core as core_module
from structspec.engine import verify as verify_module
from structspec.engine.config import SchedulerLimits
from structspec.engine.core import EngineCore, run_until_idle
from structspec.engine.sampling import keyed_gumbel, target_logprobs
from structspec.engine.speculator import Draft
from structspec.engine.types import SamplingParams
from structspec.grammar.base import allocate_bitmask, apply_token_bitmask
from tests.engine.fakes import AlwaysDrafts, EOS, SlotMatcher, TableExecutor, ToyTokenizer, make_seq

V = 6  # 0 = EOS, 1..5
SLOTS = [frozenset({1, 2, 3, 4}), frozenset({1, 2, 3, 4, 5}), frozenset({2, 3, 4, 5})]  # 5 masked first, 1 last
WARPED = SamplingParams(temperature=0.9, top_k=4, top_p=0.95, max_tokens=3)
PLAIN = SamplingParams(temperature=1.0, max_tokens=3)
PROMPT = [1, 2]
N = 8000  # outputs per run: every mutation below is caught at p < 1e-6 with this many (most at < 1e-25)


def _table(context: tuple[int, ...], salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((context, salt)) % (2**31))
    return torch.randn(V, generator=g)


class ToyExecutor(TableExecutor):
    """The target: fixed pseudo-random logits per context."""

    def logits(self, context):
        return _table(context, 1)


class SampledProposer(AlwaysDrafts):
    """Drafts up to 3 tokens from its own q (which gives the masked token 5 and EOS real mass), reporting q."""

    def propose(self, seq, max_tokens, narrow=True):
        context = tuple(seq.prompt + seq.output)
        tokens, qs = [], []
        for i in range(max_tokens):
            logq = target_logprobs(_table(context, 2), seq.params)  # q warped like p (the contract)
            q = logq.exp()
            x = int(torch.argmax(logq + keyed_gumbel(seq.seed, len(seq.output) + i, V, "toy-draft")))
            tokens.append(x)
            qs.append(q)
            context += (x,)
        return Draft(tokens, torch.stack(qs), "toy")

    def on_verified(self, seq, verdict):
        pass

    def on_finish(self, seq):
        pass


def target_distribution(params: SamplingParams) -> dict[tuple[int, ...], float]:
    """Exact: the product over positions of the warped, grammar-masked target distribution."""
    out = {}
    for xs in itertools.product(range(V), repeat=3):
        prob, context, matcher = 1.0, tuple(PROMPT), SlotMatcher(SLOTS)
        for x in xs:
            mask = allocate_bitmask(1, V)
            matcher.fill_mask(mask, 0)
            p = target_logprobs(apply_token_bitmask(_table(context, 1)[None], mask)[0], params).exp()
            prob *= float(p[x])
            if prob == 0.0 or not matcher.consume([x]):
                prob = 0.0
                break
            context += (x,)
        if prob > 0:
            out[xs] = prob
    return out


def sampled_outputs(params: SamplingParams, speculator, n: int = N) -> dict[tuple[int, ...], int]:
    core = EngineCore(ToyExecutor({}, vocab_size=V), ToyTokenizer(), EOS,
                      SchedulerLimits(max_batch=512, max_queue=10**6, max_spec_batch=10**6, max_draft=3,
                                      prefix_cache_tokens=0), speculator)
    counts: dict[tuple[int, ...], int] = {}
    for start in range(0, n, 500):
        seqs = []
        for seed in range(start, min(n, start + 500)):
            seq = make_seq(PROMPT, SLOTS, params=params)
            seq.seed = seed
            seqs.append(seq)
        run_until_idle(core, seqs)
        for s in seqs:
            key = tuple(s.output)
            counts[key] = counts.get(key, 0) + 1
    return counts


def fit_pvalue(counts: dict[tuple[int, ...], int], exact: dict[tuple[int, ...], float]) -> float:
    n = sum(counts.values())
    if set(counts) - set(exact):
        return 0.0  # an output the target can never produce
    keys = sorted(exact, key=lambda k: -exact[k])
    big = [k for k in keys if exact[k] * n >= 5]
    observed = [counts.get(k, 0) for k in big] + [sum(counts.get(k, 0) for k in keys if k not in big)]
    expected = [exact[k] * n for k in big] + [sum(exact[k] * n for k in keys if k not in big)]
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    scale = sum(observed) / sum(expected)  # the exact probabilities sum to 1 up to rounding
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


@pytest.mark.parametrize("params", [WARPED, PLAIN], ids=["t0.9-topk4-topp0.95", "t1"])
def test_sampled_drafts_through_the_core_keep_the_target_distribution(params):
    speculator = SampledProposer()
    counts = sampled_outputs(params, speculator)
    assert fit_pvalue(counts, target_distribution(params)) > 1e-3


def test_the_toy_exercises_every_path():
    """Drafts are accepted, rejected, and cut at the masked token (the tail) in this toy."""
    seen = {"accepted": 0, "rejected": 0, "tail": 0}
    real = core_module.verify

    def watching(rows, draft, q, params, seed, position, tail=None):
        v = real(rows, draft, q, params, seed, position, tail)
        seen["accepted"] += v.accepted
        seen["rejected"] += v.accepted < len(draft)
        seen["tail"] += tail is not None
        return v

    core_module.verify = watching
    try:
        sampled_outputs(WARPED, SampledProposer(), n=500)
    finally:
        core_module.verify = real
    assert all(v > 20 for v in seen.values()), seen


# -- the power check: each mutation breaks exactness, and the test above must see it ----------------
VERIFIER_MUTATIONS = {
    "q's first row at every position": ("_test_one(p[i], x, q[i], seed, position + i)",
                                        "_test_one(p[i], x, q[0], seed, position + i)"),
    "one accept uniform (and residual noise) for the whole draft": (
        "_test_one(p[i], x, q[i], seed, position + i)", "_test_one(p[i], x, q[i], seed, position)"),
    "the bonus token from row k-1": ("logp[k] + keyed_gumbel(seed, position + k",
                                     "logp[max(k - 1, 0)] + keyed_gumbel(seed, position + k"),
    "p not warped by temperature/top-k/top-p in the sampled path": (
        "logp = target_logprobs(rows, params)  # [k+1, V]", "logp = torch.log_softmax(rows, dim=-1)"),
    "a cut draft trimmed, the next token drawn from p": ("    if tail is not None:\n", "    if False:\n"),
    "a rejection drawn from p, not the residual": ("residual = (p - q).clamp_min(0.0)", "residual = p.clone()"),
}


class UnwarpedQ(SampledProposer):
    """Draws from the warped q but reports the unwarped one."""

    def propose(self, seq, max_tokens, narrow=True):
        draft = super().propose(seq, max_tokens)
        context = tuple(seq.prompt + seq.output)
        rows = []
        for x in draft.tokens:
            rows.append(torch.softmax(_table(context, 2), dim=-1))
            context += (x,)
        return Draft(draft.tokens, torch.stack(rows), draft.proposer)


def mutated_verify(old: str, new: str):
    source = open(verify_module.__file__).read()
    assert source.count(old) == 1, f"mutation target not found once in verify.py: {old!r}"
    module = types.ModuleType("mutated_verify")
    sys.modules[module.__name__] = module  # dataclasses look their module up while the class is made
    try:
        exec(compile(source.replace(old, new), "mutated_verify", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module.verify


@pytest.mark.parametrize("name", sorted(VERIFIER_MUTATIONS))
def test_a_broken_verifier_is_caught(name, monkeypatch):
    """Caught by the distribution test at one of its two settings (warping matters only at the first,
    a wrong q row shows most at the second)."""
    monkeypatch.setattr(core_module, "verify", mutated_verify(*VERIFIER_MUTATIONS[name]))
    pvalues = []
    for params in (WARPED, PLAIN):
        pvalues.append(fit_pvalue(sampled_outputs(params, SampledProposer()), target_distribution(params)))
        if pvalues[-1] < 1e-6:
            break
    assert min(pvalues) < 1e-6, (name, pvalues)


def test_a_proposer_that_reports_an_unwarped_q_is_caught():
    counts = sampled_outputs(WARPED, UnwarpedQ())
    assert fit_pvalue(counts, target_distribution(WARPED)) < 1e-6


def test_a_proposer_whose_noise_is_the_verifiers_is_caught():
    """Drafting with the verifier's residual noise stream correlates the draft with the recovered token: a
    weak bias, so this one runs at the verifier alone (one position, 120k seeds, p and q far apart); the
    same proposer with its own stream passes."""
    p = torch.tensor([0.05, 0.15, 0.4, 0.3, 0.1])
    q = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1])
    rows, n = torch.log(p).expand(2, -1).clone(), 120_000

    def emitted(salt: str) -> list[float]:
        counts = [0.0] * 5
        for seed in range(n):
            x = int(torch.argmax(torch.log(q) + keyed_gumbel(seed, 0, 5, salt)))
            v = verify_module.verify(rows, [x], q[None], PLAIN, seed, 0)
            counts[x if v.accepted else v.token] += 1
        return counts

    assert chisquare(emitted("own"), (p * n).tolist()).pvalue > 1e-3
    assert chisquare(emitted("gumbel"), (p * n).tolist()).pvalue < 1e-6
