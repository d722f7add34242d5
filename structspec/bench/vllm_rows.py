"""The vLLM rows of ``structspec bench decode``: the same items through ``--engine vllm``.

  vllm:off     vLLM, grammar-constrained (its guidance backend, structspec's grammars), no speculation
  vllm:ngram   + vLLM's n-gram speculation (``DEFAULT_NGRAM``, or ``speculative_config``)
  vllm:policy  the same method, its draft length per batch size set by structspec's batch-size rule
               (``structspec.vllm_engine.schedule``) from what the run's earlier vLLM rows recorded
  vllm:structspec         structspec's proposer inside vLLM (``vllm_engine.proposer``): forced tokens, copy
                          lookup and the schema history, every proposer on for every request
  vllm:structspec-policy  the same proposer, each request drafting what the per-schema policy decided for it

Each row builds its own ``AsyncLLM`` (vLLM fixes the speculative method when an engine is built) and runs its
warm-up and measured requests in one event loop (``AsyncLLM``'s output handler lives in the loop that first
used it). Every row records into the run's ``StatsBook``, so ``vllm:policy`` reads the acceptance and step costs
``vllm:ngram`` measured; the row reports the draft lengths it was built with and why (``vllm``).

With ``load_format`` dummy the vLLM rows load the own engine's seeded random weights, written once as a model
folder (``dummy_weights_folder``): vLLM's own dummy weights are other random numbers (uniform within 1e-3), on
which the outputs, and so the n-gram acceptance, would not compare with the own engine's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from structspec.engine.config import EngineConfig, PolicyConfig, SchedulerLimits, VllmOptions

VLLM_CONFIGS = ("vllm:off", "vllm:ngram", "vllm:policy", "vllm:structspec", "vllm:structspec-policy")
STRUCTSPEC_ROWS = {"vllm:structspec": "ff+ngram+history", "vllm:structspec-policy": "policy"}  # -> speculation
DEFAULT_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@dataclasses.dataclass(frozen=True)
class VllmModel:
    """What the vLLM rows load: a model folder (or profile), its tokenizer ("": the folder's), load format and
    served name ("": the folder's)."""

    profile: str
    tokenizer: str = ""
    load_format: str = "auto"
    served_name: str = ""


def dummy_weights_folder(model: Any, identity: str, dtype: str, root: str | Path | None = None) -> str:
    """``model`` (the own engine's transformers model on seeded dummy weights, ``identity`` its dummy identity) saved
    as a model folder under ``root`` (the temp directory), once per identity and dtype: later runs reuse it. The
    folder appears whole (written beside it, then renamed)."""
    base = Path(root or tempfile.gettempdir())
    folder = base / f"structspec-{identity}-{dtype}"
    if folder.is_dir():
        return str(folder)
    base.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=base))
    try:
        model.save_pretrained(partial)
        partial.rename(folder)
    except OSError:
        if not folder.is_dir():  # not another run's folder arriving first
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return str(folder)


def vllm_model(profile: str, tokenizer: str, load_format: str, models: Any) -> VllmModel:
    """What the vLLM rows load beside ``models`` (the own engine's, loaded from ``profile``): the same folder and
    format, or with ``load_format`` dummy the own engine's random weights as a folder (``dummy_weights_folder``),
    under the own engine's tokenizer and name."""
    if load_format != "dummy":
        return VllmModel(profile, tokenizer, load_format)
    dtype = str(models.dtype).removeprefix("torch.")
    folder = dummy_weights_folder(models.target, models.identity, dtype)
    return VllmModel(folder, tokenizer or models.tokenizer.name_or_path, "auto", models.profile)


def vllm_config(name: str, model: VllmModel, dtype: str, options: VllmOptions, policy: PolicyConfig | None,
                concurrency: int) -> EngineConfig:
    """The engine configuration of row ``name``."""
    spec = options.speculative_config or json.dumps(DEFAULT_NGRAM)
    speculation = "policy" if name == "vllm:policy" else "off"
    if name in STRUCTSPEC_ROWS:
        spec, speculation = json.dumps({"method": "structspec", "num_speculative_tokens": 8}), STRUCTSPEC_ROWS[name]
    opts = dataclasses.replace(options, speculative_config="" if name == "vllm:off" else spec)
    return EngineConfig(profile=model.profile, tokenizer=model.tokenizer, served_name=model.served_name,
                        load_format=model.load_format, dtype=dtype, engine="vllm", vllm=opts,
                        speculation=speculation,
                        limits=SchedulerLimits(max_batch=max(16, concurrency)), policy=policy or PolicyConfig())


def run_vllm_row(name: str, model: VllmModel, dtype: str, options: VllmOptions, book: Any, items: Sequence[Any],
                 warm: Sequence[Any], extra_warm: Sequence[Any], concurrency: int, max_tokens: int,
                 temperature: float, run_engine: Callable[..., Any], summarize: Callable[..., dict[str, Any]],
                 save_outputs: bool, progress: Any = None, policy: PolicyConfig | None = None) -> dict[str, Any]:
    """One vLLM row: its summary (``summarize``'s) and ``vllm`` (model key, the schedule it was built with)."""
    from structspec.vllm_engine.build import build_vllm_engine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vLLM's CPU default would take far more
    engine = build_vllm_engine(vllm_config(name, model, dtype, options, policy, concurrency), book=book)

    # requests leave fast-forward on: structspec's proposer drafts the forced tokens; without it vLLM decodes them
    async def run() -> tuple[list[Any], float]:
        engine.start()
        await run_engine(engine, list(warm), 1, max_tokens, True, True, temperature)
        if extra_warm:
            await run_engine(engine, list(extra_warm), concurrency, max_tokens, True, True, temperature)
        if progress is not None:
            progress(0, len(items), 0)
        return await run_engine(engine, list(items), concurrency, max_tokens, True, True, temperature, progress)

    try:
        records, wall = asyncio.run(run())
    finally:
        engine.close()
    return {**summarize(records, wall, save_outputs),
            "vllm": {"model_key": engine.model_key, "schedule": [list(e) for e in engine.schedule],
                     "lengths": [dataclasses.asdict(b) for b in engine.lengths]}}
