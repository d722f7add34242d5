"""Wire the engine: models -> executors, grammar compiler, speculation, core -> ``Engine``.

The one module that knows every package the engine is built from (the engine itself
knows only the ``Speculator`` protocol). ``build_engine`` is the server's default engine
factory; ``assemble_engine`` wires already-loaded models (tests, benchmarks).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from structspec.engine.config import EngineConfig, SchedulerLimits
from structspec.engine.core import EngineCore
from structspec.engine.default_examples import ExampleBook, build_example_book
from structspec.engine.engine import Engine
from structspec.grammar import GrammarCompiler, TokenizerView
from structspec.models.hf_executor import TransformersExecutor
from structspec.speculation.configs import ProposerSet, speculation_config
from structspec.speculation.draft_model import DraftModelProposer
from structspec.speculation.router import AcceptanceSink, Router

log = logging.getLogger(__name__)


def assemble_engine(models, grammar_backend: str = "llguidance", limits: SchedulerLimits = SchedulerLimits(),
                    proposers: ProposerSet | None = None, max_context: int | None = None, max_tokens_cap: int = 4096,
                    compiler: GrammarCompiler | None = None, stats: AcceptanceSink | None = None,
                    examples: ExampleBook | None = None, fast_forward: bool = True) -> Engine:
    """An engine (not started) around loaded models.

    ``proposers``: None = no drafting (fast-forward is per request, and ``fast_forward`` for all).
    ``stats`` receives the per-step acceptance counts. ``examples``: worked examples added to requests
    that bring none (``build_engine`` builds them for base-model profiles).
    """
    executor = TransformersExecutor(models.target, max_context=max_context)
    if compiler is None:
        compiler = GrammarCompiler(TokenizerView(models.tokenizer, n_vocab=executor.vocab_size), backend=grammar_backend)
    eos = models.tokenizer.eos_token_id
    speculator = None
    if proposers is not None:
        draft = None
        if proposers.draft and models.draft is not None:
            draft = DraftModelProposer(TransformersExecutor(models.draft, max_context=executor.max_context), eos)
        speculator = Router(models.tokenizer, proposers, executor.vocab_size, draft=draft, stats=stats)
    core = EngineCore(executor, models.tokenizer, eos, limits, speculator)
    return Engine(core, models.tokenizer, compiler, executor.max_context, max_tokens_cap, examples, fast_forward)


def build_engine(settings: Any, store: Any = None) -> Engine:
    """Load the configured profile and start the engine (the server's engine factory).

    ``settings``: a ``ServiceSettings`` (anything with ``engine_config()``) or an ``EngineConfig``.
    ``store`` receives the per-step acceptance counts (per schema, proposer and batch-size bucket).
    """
    from structspec.models.loading import load_profile
    from structspec.models.profiles import get_profile
    from structspec.models.threads import size_torch_threads
    from structspec.models.worker_thread import run_in_worker

    config: EngineConfig = settings if isinstance(settings, EngineConfig) else settings.engine_config()
    t0 = time.monotonic()
    device = config.resolved_device(torch.cuda.is_available())
    if device != "cuda":  # intra-op threads from the CPUs this process may use, not the machine's
        log.info("torch intra-op threads: %d", size_torch_threads())
    spec = speculation_config(config.speculation)
    # Model work off the main thread, so the engine thread computes at full speed (see worker_thread).
    models = run_in_worker(load_profile, config.profile, device=device, dtype=config.resolved_dtype(device),
                           with_draft=bool(spec.proposers and spec.proposers.draft))
    examples = build_example_book(get_profile(models.profile).few_shot)
    engine = run_in_worker(assemble_engine, models, config.grammar_backend, config.limits, spec.proposers,
                           max_tokens_cap=config.max_tokens_cap, stats=store, examples=examples,
                           fast_forward=spec.fast_forward)
    engine.start()
    log.info("engine ready in %.1fs (profile %s)", time.monotonic() - t0, models.profile)
    return engine
