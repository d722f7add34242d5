"""The vLLM rows of ``structspec bench decode``: the same items through ``--engine vllm``.

  vllm:off     vLLM, grammar-constrained (its guidance backend, structspec's grammars), no speculation
  vllm:ngram   + vLLM's n-gram speculation (``DEFAULT_NGRAM``, or ``speculative_config``)
  vllm:policy  the same method, its draft length per batch size set by structspec's batch-size rule
               (``structspec.vllm_engine.schedule``) from what the run's earlier vLLM rows recorded

Each row builds its own ``AsyncLLM`` (vLLM fixes the speculative method when an engine is built) and runs its
warm-up and measured requests in one event loop (``AsyncLLM``'s output handler lives in the loop that first
used it). Every row records into the run's ``StatsBook``, so ``vllm:policy`` reads the acceptance and step costs
``vllm:ngram`` measured; the row reports the draft lengths it was built with and why (``vllm``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import Any, Callable, Sequence

from structspec.engine.config import EngineConfig, PolicyConfig, SchedulerLimits, VllmOptions

VLLM_CONFIGS = ("vllm:off", "vllm:ngram", "vllm:policy")
DEFAULT_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def vllm_config(name: str, profile: str, dtype: str, options: VllmOptions, policy: PolicyConfig | None,
                concurrency: int) -> EngineConfig:
    """The engine configuration of row ``name``."""
    spec = options.speculative_config or json.dumps(DEFAULT_NGRAM)
    opts = dataclasses.replace(options, speculative_config="" if name == "vllm:off" else spec)
    return EngineConfig(profile=profile, dtype=dtype, engine="vllm", vllm=opts,
                        speculation="policy" if name == "vllm:policy" else "off",
                        limits=SchedulerLimits(max_batch=max(16, concurrency)), policy=policy or PolicyConfig())


def run_vllm_row(name: str, profile: str, dtype: str, options: VllmOptions, book: Any, items: Sequence[Any],
                 warm: Sequence[Any], extra_warm: Sequence[Any], concurrency: int, max_tokens: int,
                 temperature: float, run_engine: Callable[..., Any], summarize: Callable[..., dict[str, Any]],
                 save_outputs: bool, progress: Any = None, policy: PolicyConfig | None = None) -> dict[str, Any]:
    """One vLLM row: its summary (``summarize``'s) and ``vllm`` (model key, the schedule it was built with)."""
    from structspec.vllm_engine.build import build_vllm_engine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vLLM's CPU default would take far more
    engine = build_vllm_engine(vllm_config(name, profile, dtype, options, policy, concurrency), book=book)

    async def run() -> tuple[list[Any], float]:
        engine.start()
        await run_engine(engine, list(warm), 1, max_tokens, False, True, temperature)
        if extra_warm:
            await run_engine(engine, list(extra_warm), concurrency, max_tokens, False, True, temperature)
        if progress is not None:
            progress(0, len(items), 0)
        return await run_engine(engine, list(items), concurrency, max_tokens, False, True, temperature, progress)

    try:
        records, wall = asyncio.run(run())
    finally:
        engine.close()
    return {**summarize(records, wall, save_outputs),
            "vllm": {"model_key": engine.model_key, "schedule": [list(e) for e in engine.schedule],
                     "lengths": [dataclasses.asdict(b) for b in engine.lengths]}}
