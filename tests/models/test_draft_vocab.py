"""Restricted-vocabulary drafts: the id mapping, the folder format, loading checks, and exact speculation with one."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import torch
from transformers import LlamaForCausalLM

from structspec.models.draft_vocab import VOCAB_FILE, DraftVocab, VocabMappedExecutor, vocabulary_hash
from structspec.models.executor import StepInput
from structspec.models.loading import ModelLoadError, load_draft


class _Inner:
    """An executor over 4 draft ids (3 covered + unknown) that records what it was fed."""

    vocab_size = 4
    restricted_logits_max = 0
    max_context = 64
    forward_calls = 0

    def __init__(self):
        self.fed: list[list[int]] = []

    def step(self, inputs):
        self.fed += [list(i.tokens) for i in inputs]
        return [torch.tensor([[1.0, 2.0, 3.0, 99.0]] * len(i.logits_at)) for i in inputs]


def test_mapped_executor_maps_inputs_and_spreads_logits():
    vocab = DraftVocab((7, 2, 5), target_vocab_size=10)
    inner = _Inner()
    ex = VocabMappedExecutor(inner, vocab)
    (logits,) = ex.step([StepInput(0, [2, 5, 9, 7], logits_at=(0, -1))])
    assert inner.fed == [[1, 2, 3, 0]]  # 9 is outside: the unknown id
    assert logits.shape == (2, 10)
    assert logits[0, 7] == 1.0 and logits[0, 2] == 2.0 and logits[0, 5] == 3.0
    outside = [i for i in range(10) if i not in (7, 2, 5)]
    assert torch.isinf(logits[:, outside]).all()  # the unknown id's logit (99) is never returned
    assert ex.vocab_size == 10


def test_vocab_roundtrip_and_refusals(tmp_path):
    vocab = DraftVocab((3, 1), 8, "abc")
    vocab.save(tmp_path)
    assert DraftVocab.load(tmp_path) == vocab
    assert DraftVocab.load(tmp_path / "none") is None
    with pytest.raises(ValueError):
        DraftVocab((1, 1), 8)
    with pytest.raises(ValueError):
        DraftVocab((9,), 8)
    (tmp_path / VOCAB_FILE).write_text(json.dumps({"ids": [1]}))
    with pytest.raises(ValueError, match="not a draft vocabulary map"):
        DraftVocab.load(tmp_path)


def restricted_demo_draft(demo_models, folder, size: int = 600, tokenizer_hash: str | None = None):
    """The demo draft cut to the ``size`` ids its target's tokenizer gives most often on the demo corpus."""
    from structspec.bench.workloads import build_workload

    tok = demo_models.tokenizer
    counts: Counter[int] = Counter()
    for item in build_workload("mixed", 60, seed=3):
        counts.update(tok(item.source + json.dumps(item.truth))["input_ids"])
    counts[tok.eos_token_id] += 1
    ids = tuple(sorted(counts, key=lambda i: (-counts[i], i))[:size])
    vocab = DraftVocab(ids, demo_models.target.config.vocab_size, tokenizer_hash or vocabulary_hash(tok))
    full = demo_models.draft
    config = full.config.__class__.from_dict(full.config.to_dict())
    config.vocab_size = vocab.draft_vocab_size
    config.pad_token_id = config.bos_token_id = config.eos_token_id = vocab.unknown
    small = LlamaForCausalLM(config)
    state = {k: v for k, v in full.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    emb = full.get_input_embeddings().weight.detach()
    state["model.embed_tokens.weight"] = torch.cat([emb[list(ids)], emb.mean(0, keepdim=True)])
    small.load_state_dict(state, strict=False)
    small.tie_weights()
    small.save_pretrained(folder)
    vocab.save(folder)
    return vocab


def test_load_draft_checks_the_tokenizer_hash(demo_models, tmp_path):
    restricted_demo_draft(demo_models, tmp_path, tokenizer_hash="0" * 64)
    with pytest.raises(ModelLoadError, match="another tokenizer"):
        load_draft(str(tmp_path), demo_models.tokenizer, "demo", "transformers", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_restricted_draft_speculates_exactly(demo_models, executor_kind, temperature, tmp_path, request):
    """Outputs with a restricted draft are those of plain decoding (greedy, and sampled with the same seeds: the
    draft takes the verifier's keyed noise at its covered ids), and the draft's tokens are accepted."""
    import asyncio

    from structspec.assembly import AssemblyConfig, assemble_engine
    from structspec.engine.api import ExtractionRequest
    from structspec.engine.config import SchedulerLimits
    from structspec.engine.types import SamplingParams, SpeculationMode
    from structspec.bench.workloads import build_workload
    from structspec.speculation.configs import ProposerSet

    vocab = restricted_demo_draft(demo_models, tmp_path)
    base = demo_models if executor_kind == "transformers" else request.getfixturevalue("demo_llamacpp_models")
    loaded = load_draft(str(tmp_path), base.tokenizer, "demo", base.executor, torch.device("cpu"), torch.float32)
    assert loaded.vocab == vocab
    models = dataclasses.replace(base, draft=loaded.model, draft_version=loaded.version, draft_vocab=loaded.vocab)
    items = build_workload("freetext", 4, seed=11)
    outputs = {}
    for name, proposers in (("off", None), ("draft", ProposerSet(ngram=False, history=False, draft=True))):
        engine = assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(), proposers=proposers))
        engine.start()
        try:
            async def run(proposers=proposers, engine=engine):
                reqs = [ExtractionRequest(schema=it.schema, text=it.source,
                                          sampling=SamplingParams(max_tokens=96, temperature=temperature,
                                                                  seed=n if temperature else None),
                                          speculation=SpeculationMode.AUTO if proposers else SpeculationMode.OFF)
                        for n, it in enumerate(items)]
                return [await engine.extract(r) for r in reqs]
            outputs[name] = asyncio.run(run())
        finally:
            engine.stop()
    assert [r.token_ids for r in outputs["draft"]] == [r.token_ids for r in outputs["off"]]
    drafted = sum(r.usage.drafted.get("draft", 0) for r in outputs["draft"])
    accepted = sum(r.usage.accepted.get("draft", 0) for r in outputs["draft"])
    assert drafted > 20 and accepted > (0.3 if temperature == 0 else 0.15) * drafted
