"""Distillation core: target distributions through an executor, training towards them, agreement."""

from __future__ import annotations

import copy

import pytest
import torch

from structspec.draft.distill import (DistillConfig, DistillExample, agreement, distill, free_text_mask,
                                      target_topk)
from structspec.models.hf_executor import TransformersExecutor


def _examples(tok, n: int = 6):
    from structspec.bench.workloads import build_workload
    from structspec.prompts import encode_prompt, extraction_prompt
    import json

    out = []
    for it in build_workload("freetext", n, seed=21):
        prompt = encode_prompt(tok, extraction_prompt(it.schema, it.source, None, ()))
        output = tok(json.dumps(it.truth), add_special_tokens=False)["input_ids"]
        out.append(DistillExample(tuple(prompt + output), len(prompt), mask=free_text_mask(tok, it.schema, output)))
    return out


def test_target_topk_matches_a_whole_sequence_forward(demo_models):
    """Examples sharing a prefix reuse its cache; the distributions equal one forward over each whole sequence."""
    tok, target = demo_models.tokenizer, demo_models.target
    base = _examples(tok, 3)
    # two examples that share a long prefix with the first: its prompt, then other outputs
    shared = [DistillExample(base[0].ids[: base[0].start] + base[i].ids[base[i].start:], base[0].start) for i in (1, 2)]
    examples = base + shared
    tops = target_topk(TransformersExecutor(target), examples, top_k=5, rows_per_step=7, prefill_chunk=50)
    for ex, top in zip(examples, tops):
        with torch.no_grad():
            logits = target(torch.tensor([ex.ids])).logits[0, ex.start - 1: -1].float()
        want = torch.log_softmax(logits, -1).topk(5, -1)
        assert top.ids.shape == (ex.learned, 5)
        assert torch.equal(top.ids[:, 0], want.indices[:, 0])
        assert torch.allclose(top.logprobs, want.values, atol=1e-3)


def test_free_text_mask_marks_string_values_only(demo_models):
    tok = demo_models.tokenizer
    schema = {"type": "object", "properties": {"summary": {"type": "string"}, "n": {"type": "integer"}}}
    out = tok('{"summary": "a long day", "n": 3}', add_special_tokens=False)["input_ids"]
    mask = free_text_mask(tok, schema, out)
    inside = "".join(tok.decode(out[j]) for j in range(len(out)) if mask[j])
    assert "long" in inside and "3" not in inside and "summary" not in inside


def test_distill_raises_agreement_and_shuffled_targets_do_not(demo_models):
    """A perturbed draft trained towards the target's distributions agrees with it more on those positions;
    trained towards another example's distributions (a broken pairing) it does not gain as much."""
    tok = demo_models.tokenizer
    examples = _examples(tok, 8)
    targets = target_topk(TransformersExecutor(demo_models.target), examples, top_k=8)
    torch.manual_seed(0)
    start = copy.deepcopy(demo_models.draft)
    with torch.no_grad():
        for p in start.parameters():
            p.add_(0.05 * torch.randn_like(p))
    before = agreement(start, examples, targets, None)
    good, bad = copy.deepcopy(start), copy.deepcopy(start)
    config = DistillConfig(steps=30, lr=1e-3, batch=4, warmup=3)
    distill(good, examples, targets, None, config)
    shuffled = [copy.copy(targets[(i + 1) % len(targets)]) for i in range(len(targets))]
    # the broken pairing needs equal lengths: cut every example to the shortest learned span
    n = min(ex.learned for ex in examples)
    cut = [DistillExample(ex.ids[: ex.start + n], ex.start) for ex in examples]
    cut_t = [type(t)(t.ids[:n], t.logprobs[:n]) for t in targets]
    cut_bad = [type(t)(t.ids[:n], t.logprobs[:n]) for t in shuffled]
    distill(bad, cut, cut_bad, None, config)
    after_good = agreement(good, examples, targets, None)
    after_bad = agreement(bad, cut, cut_t, None)
    assert before.positions > 100
    assert after_good.top1 > before.top1 + 0.1
    assert after_good.overlap > before.overlap
    assert after_bad.top1 < after_good.top1 - 0.1


def test_example_checks_its_span():
    with pytest.raises(ValueError):
        DistillExample((1, 2, 3), 3)
    with pytest.raises(ValueError):
        DistillExample((1, 2, 3), 1, mask=(True,))
