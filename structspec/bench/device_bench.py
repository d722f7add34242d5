"""``structspec bench device``: what a step costs on an accelerator, by batch and by draft length, and the
perfect draft's ceiling on free text, for a model folder's config with dummy weights.

A model folder's ``config.json`` is built with seeded random weights (``--load-format dummy``:
``loading.dummy_causal_lm``), so timings need no weights: only the architecture and the
vocabulary size set a step's cost. The target runs in the engine's executor (``hf_executor``),
as ``structspec bench step`` runs it. Terms of the report:

  step(b)         one decode step of b sequences (a prompt of ``prompt_len`` cached each, one new
                  token each, packed into one forward): median ms over ``steps`` steps
  c4/c1 ...       step(b) / step(1): what a step of b sequences costs against one (1.0: batching
                  is free; b: no gain over b steps of one)
  verify(k)       a verification of k drafted tokens at batch 1 (k + 1 new tokens: the pending one
                  and the draft, logits at each): median ms, and its ratio to step(1)
  model_ceiling   (k + 1) / (verify(k) / step(1)): the speedup over plain decoding if every k-token
                  draft were accepted, counting the model's time alone (no grammar, no drafting): the
                  bound the perfect draft's measured speedup approaches
  perfect_draft   ``bench.decode_bench``'s ceiling configuration on the ``freetext`` workload:
                  ``all`` with a draft model that drafts the ``off`` row's own greedy output, run
                  interleaved beside ``off``. Its acceptance is 1 whatever the weights (the target's
                  own output), unless rounding parts a verification from a decode step (bf16 on
                  near-ties): the report shows it. ``speedup`` = its tok/s / off's.

On CUDA every timing is taken between ``torch.cuda.synchronize`` calls. Raises (``run_device_bench``):
ModelLoadError (the folder or tokenizer cannot be loaded).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Callable

import torch

from structspec.models.executor import StepInput
from structspec.models.hf_executor import TransformersExecutor
from structspec.models.loading import load_profile
from structspec.models.worker_thread import run_in_worker

BATCHES = (1, 4, 16, 32)
DRAFT_LENGTHS = (1, 2, 4, 8)
PERFECT_DRAFT_WORKLOAD = "freetext"  # the summary schema: one long free-text string, where a draft model drafts
WARMUP_STEPS = 3  # untimed steps of each shape first: kernels chosen, buffers grown, output-layer forms tuned


def _synchronizer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _timed_ms(run: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    run()
    sync()
    return (time.perf_counter() - start) * 1000


def _prompt(prompt_len: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, min(vocab, 1000), (prompt_len,), generator=gen).tolist()


def time_batches(executor, batches=BATCHES, prompt_len: int = 128, steps: int = 20) -> dict[int, float]:
    """Median ms of a decode step of b sequences (one token each, rolled back after) for each b in ``batches``."""
    sync = _synchronizer(executor.device)
    out = {}
    for b in batches:
        seqs = [executor.new_sequence() for _ in range(b)]
        try:
            executor.step([StepInput(s, _prompt(prompt_len, executor.vocab_size, i)) for i, s in enumerate(seqs)])
            times = []
            for i in range(WARMUP_STEPS + steps):
                ms = _timed_ms(lambda: executor.step([StepInput(s, [11 + i]) for s in seqs]), sync)  # noqa: B023 (run here)
                for s in seqs:
                    executor.rollback(s, 1)
                if i >= WARMUP_STEPS:
                    times.append(ms)
            out[b] = statistics.median(times)
        finally:
            for s in seqs:
                executor.free(s)
    return out


def time_verification(executor, draft_lengths=DRAFT_LENGTHS, prompt_len: int = 128, steps: int = 20
                      ) -> dict[int, float]:
    """Median ms of verifying k drafted tokens at batch 1 (k + 1 new tokens, logits at each; rolled back after)
    for each k in ``draft_lengths``."""
    sync = _synchronizer(executor.device)
    seq = executor.new_sequence()
    out = {}
    try:
        executor.step([StepInput(seq, _prompt(prompt_len, executor.vocab_size, 0))])
        for k in draft_lengths:
            tokens = [11 + t for t in range(k + 1)]
            times = []
            for i in range(WARMUP_STEPS + steps):
                ms = _timed_ms(lambda: executor.step([StepInput(seq, tokens, logits_at=tuple(range(k + 1)))]), sync)  # noqa: B023 (run here)
                executor.rollback(seq, k + 1)
                if i >= WARMUP_STEPS:
                    times.append(ms)
            out[k] = statistics.median(times)
    finally:
        executor.free(seq)
    return out


def perfect_draft_ceiling(models, requests: int = 8, max_tokens: int = 128) -> dict[str, Any]:
    """``off`` and ``perfect_draft`` interleaved on the free-text workload (greedy, concurrency 1, plain prompts
    without worked examples): each row's tok/s, passes per token and the perfect draft's acceptance."""
    # The engine imports the grammar packages (llguidance, jsonschema-rs, outlines-core, re2), which a GPU machine
    # may lack and ``bench/device_check.sh`` may not fit in what it carries: the step timings run without them.
    from structspec.bench.decode_bench import PERFECT_DRAFT, run_interleaved
    from structspec.bench.workloads import build_workload

    pool = build_workload(PERFECT_DRAFT_WORKLOAD, requests + 1)
    items, warm = pool[:requests], pool[requests:]
    rows = run_interleaved(["off", PERFECT_DRAFT], models, items, warm, [], max_tokens)
    off, perfect = rows["off"], rows[PERFECT_DRAFT]
    keep = ("requests", "output_tokens", "tokens_per_s", "ms_per_output_token", "forward_passes_per_token",
            "valid_rate", "acceptance", "mean_accepted_length")
    return {"workload": PERFECT_DRAFT_WORKLOAD, "requests": requests, "max_tokens": max_tokens,
            "off": {k: off[k] for k in keep}, "perfect_draft": {k: perfect[k] for k in keep},
            "draft_acceptance": perfect["acceptance"].get("draft"),
            "speedup": perfect["tokens_per_s"] / off["tokens_per_s"] if off["tokens_per_s"] else None}


def run_device_bench(model: str, tokenizer: str, device: str = "cuda", dtype: str = "bfloat16", steps: int = 20,
                     prompt_len: int = 128, perfect_draft: bool = True, requests: int = 8,
                     max_tokens: int = 128) -> dict[str, Any]:
    """Step and verification timings of model folder ``model``'s config with dummy weights on ``device``, and
    (``perfect_draft``) the perfect draft's ceiling, its prompts tokenized by the folder ``tokenizer``."""
    started = time.perf_counter()
    models = run_in_worker(load_profile, model, tokenizer=tokenizer, device=device, dtype=dtype, with_draft=False,
                           executor="transformers", load_format="dummy")
    loaded_s = time.perf_counter() - started
    executor = run_in_worker(TransformersExecutor, models.target, max_context=max(1024, prompt_len + 64))
    batches = run_in_worker(time_batches, executor, BATCHES, prompt_len, steps)
    verify = run_in_worker(time_verification, executor, DRAFT_LENGTHS, prompt_len, steps)
    del executor  # its K/V buffers: the engine below builds its own
    one = batches[1]
    report: dict[str, Any] = {
        "model": model, "tokenizer": tokenizer, "load_format": "dummy", "dtype": dtype, "device": device,
        "device_name": torch.cuda.get_device_name() if models.device.type == "cuda" else platform.processor()
        or platform.machine(),
        "torch": torch.__version__, "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "parameters": models.parameter_count(), "vocab_size": int(models.target.config.vocab_size),
        "prompt_len": prompt_len, "steps": steps, "load_s": round(loaded_s, 2),
        "step_ms": {str(b): ms for b, ms in batches.items()},
        "batch_ratio": {f"c{b}/c1": ms / one for b, ms in batches.items() if b != 1},
        "verify_ms": {str(k): ms for k, ms in verify.items()},
        "verify_ratio": {str(k): ms / one for k, ms in verify.items()},
        "model_ceiling": {str(k): (k + 1) * one / ms for k, ms in verify.items()},
    }
    report["perfect_draft"] = perfect_draft_ceiling(models, requests, max_tokens) if perfect_draft else None
    report["wall_s"] = round(time.perf_counter() - started, 2)
    return report


def format_table(report: dict[str, Any]) -> str:
    one = report["step_ms"]["1"]
    rows = [
        f"{report['model']} (dummy weights, {report['parameters'] / 1e6:.1f}M parameters, vocab "
        f"{report['vocab_size']}), {report['device']} {report['device_name']}, {report['dtype']}, prompt "
        f"{report['prompt_len']} tokens, medians of {report['steps']} steps",
        "| step | ms | x step(1) | model ceiling |",
        "|---|---|---|---|",
        *(f"| decode, batch {b} | {ms:.2f} | {ms / one:.2f} | - |" for b, ms in report["step_ms"].items()),
        *(f"| verify k={k}, batch 1 | {ms:.2f} | {report['verify_ratio'][k]:.2f} | "
          f"{report['model_ceiling'][k]:.2f} |" for k, ms in report["verify_ms"].items()),
    ]
    ceiling = report.get("perfect_draft")
    if ceiling:
        off, perfect = ceiling["off"], ceiling["perfect_draft"]
        acceptance = ceiling["draft_acceptance"]
        rows += [
            "",
            f"perfect draft on {ceiling['workload']} ({ceiling['requests']} requests, max_tokens "
            f"{ceiling['max_tokens']}, greedy, interleaved)",
            "| config | tok/s | passes/tok | draft acceptance (mean accepted length) |",
            "|---|---|---|---|",
            f"| off | {off['tokens_per_s']:.1f} | {off['forward_passes_per_token']:.2f} | - |",
            f"| perfect_draft | {perfect['tokens_per_s']:.1f} | {perfect['forward_passes_per_token']:.2f} | "
            + (f"{acceptance:.3f} ({perfect['mean_accepted_length'].get('draft', 0):.1f})" if acceptance is not None
               else "-") + " |",
            f"speedup perfect_draft / off: {ceiling['speedup']:.2f}x" if ceiling["speedup"] else "",
        ]
    else:
        rows += ["", "perfect draft: not run"]
    return "\n".join(rows).rstrip("\n") + "\n"
