"""The gemma-3-270m draft: Gemma's own first layers over the ids its structured outputs use, distilled.

    structspec draft distill --profile gemma-3-270m --out structspec/models/gemma_draft

1. **Traffic.** Held-in items of the benchmark workloads (extraction, free text, tool calls;
   another seed than the benchmark's) with the server's worked examples, answered by the
   target itself through the engine (greedy, speculation without a draft).
2. **Targets.** The target's top-k next-token distributions (``distill.target_topk``, on the
   profile's executor) at every output position, and at the last ``corpus_tokens`` tokens of each
   document (the corpus: prose the draft must continue in the target's way).
3. **Vocabulary.** The ``vocab`` ids the target emits most (outputs and its top-1 on the corpus),
   frequency-ranked; the draft's q is 0 elsewhere (``models.draft_vocab``).
4. **Body.** Gemma's first ``layers`` layers (all sliding-window), its final norm and its embedding
   rows of those ids, tied as the output layer: a draft that starts out as Gemma's early exit.
5. **Distillation** of every weight towards the targets (``distill.distill``), then top-1 agreement
   before and after on held-out items' free-text positions (where the router drafts with it).

Written: the draft folder (bf16 safetensors, ``draft_vocab.json``) and ``distill_report.json``
beside the weights (data sizes, coverage, agreement, timings). Everything is seeded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from structspec.assembly import AssemblyConfig, assemble_engine, make_draft_executor, make_executor
from structspec.bench.decode_bench import request_for
from structspec.bench.step_bench import time_steps
from structspec.bench.workloads import build_workload
from structspec.draft.distill import (DistillConfig, DistillExample, agreement, distill, free_text_mask,
                                      target_topk)
from structspec.engine.config import SchedulerLimits
from structspec.models import gemma
from structspec.models.draft_vocab import DraftVocab, vocabulary_hash
from structspec.models.llamacpp_model import llamacpp_available
from structspec.models.loading import load_draft, load_profile
from structspec.models.profiles import get_profile
from structspec.speculation.configs import ProposerSet

TRAIN_SEED = 1001  # the benchmark's items come from seed 7 (bench.workloads.BENCH_SEED)


@dataclass(frozen=True)
class GemmaDraftPlan:
    extraction: int = 150
    freetext: int = 150
    toolcall: int = 0  # the router drafts with the draft model in free-text strings of a schema: tool calls have none
    holdout: float = 0.15  # share of items kept out of training, for agreement
    corpus_tokens: int = 128  # document tokens per item learned from the target (the corpus positions)
    corpus_weight: float = 0.3
    layers: int = 2
    vocab: int = 8192
    window: int = 384  # the draft's sliding window, and its training context
    top_k: int = 16
    steps: int = 480  # the shipped draft: 472 steps, ended by a 32-minute budget on a loaded 2-core machine
    batch: int = 8
    lr: float = 2e-4
    max_minutes: float = 90.0  # a safety cap: training anneals and stops here whatever ``steps`` says
    seed: int = 0
    max_tokens: int = 256


Say = Callable[[str], None]


def _items(plan: GemmaDraftPlan, few_shot: int):
    items = []
    for workload, n in (("extraction", plan.extraction), ("freetext", plan.freetext), ("toolcall", plan.toolcall)):
        if n:
            items += [(workload, it) for it in build_workload(workload, n, few_shot, seed=TRAIN_SEED)]
    return items


def generate_traffic(models, items, max_tokens: int, say: Say, concurrency: int = 4) -> list[dict[str, Any]]:
    """The target's own answers to ``items``: prompt ids, output ids, the schema drafted against."""
    engine = assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(max_batch=concurrency),
                             proposers=ProposerSet(ngram=True, history=True, draft=False), seed=0))
    engine.start()
    done = [0]

    async def one(sem, workload, item):
        async with sem:
            req = request_for(item, max_tokens, fast_forward=True, speculate=True, rid="")
            if item.kind == "toolcall":
                seq = engine.prepare_toolcall(req)
                res = (await engine.call_tool(req)).result
            else:
                seq = engine.prepare_extraction(req)
                res = await engine.extract(req)
            done[0] += 1
            if done[0] % 20 == 0:
                say(f"traffic: {done[0]}/{len(items)} answered")
            return {"workload": workload, "schema_key": seq.schema_key, "schema": seq.schema, "prompt": seq.prompt,
                    "output": list(res.token_ids), "source": item.source, "finish": res.finish_reason.value}

    async def run():
        sem = asyncio.Semaphore(concurrency)
        return await asyncio.gather(*(one(sem, w, it) for w, it in items))

    try:
        return list(asyncio.run(run()))
    finally:
        engine.stop()


def _document_start(tokenizer, prompt: list[int], source: str) -> int:
    """The prompt index where the request's own document begins (its last occurrence: the examples come first)."""
    text = tokenizer.decode(prompt, skip_special_tokens=False)
    at = text.rfind(source[:80])
    if at < 0:
        return len(prompt)
    # the shortest prefix of ids whose text reaches the document
    lo, hi = 0, len(prompt)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(prompt[:mid], skip_special_tokens=False)) >= at:
            hi = mid
        else:
            lo = mid + 1
    return lo


def build_examples(tokenizer, traffic: list[dict[str, Any]], plan: GemmaDraftPlan
                   ) -> tuple[list[DistillExample], list[DistillExample]]:
    """(output examples with their free-text masks, corpus examples over the documents' last tokens)."""
    outputs, corpus = [], []
    for t in traffic:
        prompt, out = t["prompt"], t["output"]
        if not out:
            continue
        tag = t["workload"]
        outputs.append(DistillExample(tuple(prompt + out), len(prompt), 1.0,
                                      free_text_mask(tokenizer, t["schema"], out), tag))
        doc = _document_start(tokenizer, prompt, t["source"])
        start = max(doc + 1, len(prompt) - plan.corpus_tokens)
        if start < len(prompt) - 8:
            corpus.append(DistillExample(tuple(prompt), start, plan.corpus_weight, None, "corpus"))
    return outputs, corpus


def coverage(examples, vocab: DraftVocab) -> float:
    """The share of ``examples``' learned tokens that ``vocab`` covers."""
    chosen = set(vocab.ids)
    covered = sum(1 for ex in examples for i in ex.ids[ex.start:] if i in chosen)
    return covered / max(1, sum(ex.learned for ex in examples))


def choose_vocab(examples, targets, size: int, target_vocab: int, tokenizer) -> tuple[DraftVocab, float]:
    """The ``size`` ids the target emits most on ``examples`` (the learned tokens and its top-1 at each
    position, by frequency; ties by id); and the share of learned tokens they cover."""
    counts: Counter[int] = Counter()
    for ex, tg in zip(examples, targets):
        counts.update(ex.ids[ex.start:])
        counts.update(tg.ids[:, 0].tolist())
    ranked = sorted(counts, key=lambda i: (-counts[i], i))[:size]
    vocab = DraftVocab(tuple(ranked), target_vocab, vocabulary_hash(tokenizer))
    return vocab, coverage(examples, vocab)


def init_draft(target_dir: str, vocab: DraftVocab, layers: int, window: int):
    """A Gemma 3 text model of the target's first ``layers`` layers over ``vocab``'s ids (+ the input-only id)."""
    cfg = Gemma3TextConfig.from_pretrained(target_dir)
    cfg.num_hidden_layers = layers
    cfg.layer_types = ["sliding_attention"] * layers
    cfg.sliding_window = window
    cfg.vocab_size = vocab.draft_vocab_size
    table = vocab.to_draft_table()
    cfg.pad_token_id = vocab.unknown
    cfg.bos_token_id = int(table[cfg.bos_token_id]) if cfg.bos_token_id is not None else None
    cfg.eos_token_id = int(table[cfg.eos_token_id]) if isinstance(cfg.eos_token_id, int) else vocab.unknown
    cfg.max_position_embeddings = 32768
    draft = Gemma3ForCausalLM(cfg)
    state: dict[str, torch.Tensor] = {}
    with safe_open(str(Path(target_dir) / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
        prefix = "model." if any(n.startswith("model.") for n in names) else ""
        for name in names:
            local = name[len(prefix):] if name.startswith(prefix) else name
            if local.startswith("layers."):
                if int(local.split(".")[1]) >= layers:
                    continue
                state["model." + local] = f.get_tensor(name)
            elif local == "norm.weight":
                state["model.norm.weight"] = f.get_tensor(name)
            elif local == "embed_tokens.weight":
                emb = f.get_tensor(name).float()
                rows = emb[torch.tensor(vocab.ids)]
                state["model.embed_tokens.weight"] = torch.cat([rows, emb.mean(0, keepdim=True)])
    missing, unexpected = draft.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied to the embedding
    if missing or unexpected:
        raise RuntimeError(f"draft initialisation: missing {missing}, unexpected {unexpected}")
    draft.tie_weights()
    return draft.float()


def build_gemma_draft(out: Path, plan: GemmaDraftPlan = GemmaDraftPlan(), say: Say = print,
                      executor: str = "auto") -> dict[str, Any]:
    """Build the gemma-3-270m draft into ``out`` (see the module docstring); returns the report written there."""
    t_start = time.monotonic()
    random.seed(plan.seed)
    torch.manual_seed(plan.seed)
    models = load_profile("gemma-3-270m", with_draft=False, executor=executor)
    tokenizer = models.tokenizer
    items = _items(plan, get_profile("gemma-3-270m").few_shot)
    say(f"{len(items)} items; the target answers them ({models.executor})")
    t0 = time.monotonic()
    traffic = generate_traffic(models, items, plan.max_tokens, say)
    t_traffic = time.monotonic() - t0
    outputs, corpus = build_examples(tokenizer, traffic, plan)
    rng = random.Random(plan.seed)
    held = set(rng.sample(range(len(outputs)), max(1, int(len(outputs) * plan.holdout))))
    train_out = [e for i, e in enumerate(outputs) if i not in held]
    held_out = [e for i, e in enumerate(outputs) if i in held]
    train_corpus = [e for i, e in enumerate(corpus) if i not in held]
    t0 = time.monotonic()
    executor_ = make_executor(models, models.target)
    say(f"target distributions at {sum(e.learned for e in outputs + corpus)} positions")
    every = outputs + corpus
    tops = target_topk(executor_, every, plan.top_k,
                       progress=lambda n, total: say(f"targets: {n}/{total}") if n % 50 == 0 else None)
    by_example = dict(zip(map(id, every), tops))
    t_targets = time.monotonic() - t0
    train = train_out + train_corpus
    train_t = [by_example[id(e)] for e in train]
    held_t = [by_example[id(e)] for e in held_out]
    vocab, coverage_train = choose_vocab(train, train_t, plan.vocab, executor_.vocab_size, tokenizer)
    held_cover = coverage(held_out, vocab)
    say(f"vocabulary: {len(vocab.ids)} ids cover {coverage_train:.3f} of training output tokens, "
        f"{held_cover:.3f} of held-out ones")
    draft = init_draft(str(gemma.ensure_converted()), vocab, plan.layers, plan.window)
    before = agreement(draft, held_out, held_t, vocab, plan.window)
    say(f"held-out free-text agreement before: top1 {before.top1:.3f} overlap {before.overlap:.3f} "
        f"({before.positions} positions)")
    config = DistillConfig(steps=plan.steps, lr=plan.lr, batch=plan.batch, window=plan.window, seed=plan.seed,
                           max_seconds=plan.max_minutes * 60, log_every=25)
    log = distill(draft, train, train_t, vocab, config, log=say)
    after = agreement(draft, held_out, held_t, vocab, plan.window)
    all_positions = [DistillExample(e.ids, e.start, e.weight, None, e.tag) for e in held_out]
    after_all = agreement(draft, all_positions, held_t, vocab, plan.window)
    say(f"held-out free-text agreement after: top1 {after.top1:.3f} overlap {after.overlap:.3f}; "
        f"all output positions top1 {after_all.top1:.3f}")
    out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.bfloat16).save_pretrained(out)
    vocab.save(out)
    report = {
        "plan": asdict(plan), "executor": models.executor,
        "items": len(items), "outputs": len(outputs), "held_out": len(held_out),
        "finish": dict(Counter(t["finish"] for t in traffic)),
        "output_tokens": sum(e.learned for e in outputs), "corpus_positions": sum(e.learned for e in corpus),
        "free_text_positions": sum(sum(e.mask or ()) for e in outputs),
        "vocab_coverage": {"train": coverage_train, "held_out": held_cover},
        "parameters": sum(p.numel() for p in draft.parameters()),
        "agreement_before": asdict(before), "agreement_after": asdict(after),
        "agreement_after_all_positions": asdict(after_all),
        "training": {"steps": log.steps, "seconds": log.seconds, "losses": log.losses},
        "seconds": {"traffic": t_traffic, "targets": t_targets, "total": time.monotonic() - t_start},
    }
    (out / "distill_report.json").write_text(json.dumps(report, indent=2))
    return report


def measure_steps(draft_dir: Path, executors: tuple[str, ...] = ("llamacpp", "transformers"), steps: int = 30,
                  prompt_len: int = 400) -> dict[str, dict[str, float]]:
    """Median batch-1 decode step of the target and of the draft in ``draft_dir``, per executor (ms), and their
    ratio: the draft must cost at most a fifth of a target step to pay at the acceptance it reaches."""
    out = {}
    for kind in executors:
        if kind == "llamacpp" and not llamacpp_available():
            continue
        models = load_profile("gemma-3-270m", with_draft=False, executor=kind)
        target = make_executor(models, models.target)
        loaded = load_draft(str(draft_dir), models.tokenizer, "gemma-3-270m", models.executor, models.device,
                            models.dtype)
        draft = make_draft_executor(models, loaded.model, loaded.vocab, target)
        t = time_steps(target, prompt_len, steps)
        d = time_steps(draft, prompt_len, steps)
        out[kind] = {"target_decode_ms": t.decode_ms, "draft_decode_ms": d.decode_ms,
                     "draft_over_target": d.decode_ms / t.decode_ms}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="build the gemma-3-270m draft (see the module docstring)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--executor", default="auto")
    parser.add_argument("--measure-steps", action="store_true",
                        help="time the draft already in --out against the target (adds step_ms to its report)")
    for name, value in asdict(GemmaDraftPlan()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    if args.measure_steps:
        steps = measure_steps(args.out)
        path = args.out / "distill_report.json"
        report = json.loads(path.read_text()) if path.is_file() else {}
        report["step_ms"] = steps
        path.write_text(json.dumps(report, indent=2))
        print(json.dumps(steps, indent=2))
        return
    plan = GemmaDraftPlan(**{k: getattr(args, k) for k in asdict(GemmaDraftPlan())})
    build_gemma_draft(args.out, plan, say=lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True),
                      executor=args.executor)


if __name__ == "__main__":
    main()
