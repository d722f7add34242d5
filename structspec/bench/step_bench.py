"""A target step alone and beside a CPU-bound neighbour: does a step degrade in proportion to
the CPU it gets, or collapse?

``structspec bench step`` loads a profile's target into the engine's executor, prefills one
prompt and times batch-1 decode steps and 4-token verifications (medians), first on a quiet
machine, then while a neighbour process spins on ``--neighbour-cores`` cores. The report
(JSON + table) gives both and their ratio; on 2 cores with a one-core neighbour, a step that
degrades in proportion costs about 2x.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch

from structspec.models.executor import StepInput
from structspec.models.hf_executor import TransformersExecutor
from structspec.models.loading import load_profile
from structspec.models.threads import cpu_budget
from structspec.models.worker_thread import run_in_worker

_SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


@dataclass(frozen=True)
class StepTimes:
    decode_ms: float  # median batch-1 decode step
    verify_ms: float  # median 4-token verification (scores 5 positions)
    steps: int


def time_steps(executor, prompt_len: int = 200, steps: int = 20, vocab: int = 1000) -> StepTimes:
    """Medians over ``steps`` decode steps and as many verifications, each rolled back after."""
    seq = executor.new_sequence()
    try:
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(10, vocab, (prompt_len,), generator=gen).tolist()
        executor.step([StepInput(seq, prompt)])
        decode, verify = [], []
        for i in range(steps):
            start = time.perf_counter()
            executor.step([StepInput(seq, [11 + i])])
            decode.append((time.perf_counter() - start) * 1000)
            executor.rollback(seq, 1)
            start = time.perf_counter()
            executor.step([StepInput(seq, [11 + i, 12, 13, 14, 15], logits_at=(0, 1, 2, 3, 4))])
            verify.append((time.perf_counter() - start) * 1000)
            executor.rollback(seq, 5)
        return StepTimes(statistics.median(decode), statistics.median(verify), steps)
    finally:
        executor.free(seq)


def spin(cores: int, seconds: float) -> list[subprocess.Popen]:
    """``cores`` busy processes that end by themselves after ``seconds`` (bounded even if we die)."""
    code = _SPIN.format(seconds=seconds)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(cores)]


def run_step_bench(profile: str, steps: int = 20, neighbour_cores: int = 1, dtype: str = "float32") -> dict:
    models = run_in_worker(load_profile, profile, device="cpu", dtype=dtype, with_draft=False)
    executor = run_in_worker(TransformersExecutor, models.target, max_context=1024)
    # measured on one thread, as the engine computes on its own
    run_in_worker(time_steps, executor, steps=3)  # warm-up: allocations, the output layer's form choices
    alone = run_in_worker(time_steps, executor, steps=steps)
    neighbours = spin(neighbour_cores, seconds=600)
    try:
        time.sleep(0.5)
        beside = run_in_worker(time_steps, executor, steps=steps)
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
    return {
        "profile": profile, "dtype": dtype, "cpus": os.cpu_count(), "cpu_budget": cpu_budget(),
        "torch_threads": torch.get_num_threads(), "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", ""),
        "neighbour_cores": neighbour_cores,
        "alone": asdict(alone), "beside_neighbour": asdict(beside),
        "ratio": {"decode": beside.decode_ms / alone.decode_ms, "verify": beside.verify_ms / alone.verify_ms},
    }


def format_table(report: dict) -> str:
    a, b, r = report["alone"], report["beside_neighbour"], report["ratio"]
    rows = [
        f"{report['profile']} ({report['dtype']}), {report['torch_threads']} torch threads, "
        f"GOMP_SPINCOUNT={report['gomp_spincount'] or '(unset)'}, neighbour on {report['neighbour_cores']} core(s)",
        "| step | alone ms | beside neighbour ms | ratio |",
        "|---|---|---|---|",
        f"| decode (batch 1) | {a['decode_ms']:.1f} | {b['decode_ms']:.1f} | {r['decode']:.2f} |",
        f"| verify (4 tokens) | {a['verify_ms']:.1f} | {b['verify_ms']:.1f} | {r['verify']:.2f} |",
    ]
    return "\n".join(rows) + "\n"
