"""Wire the engine: models -> executors, grammar compiler, speculation, core -> ``Engine``.

The executor follows the loaded models (``LoadedModels.executor``): ``TransformersExecutor``
or ``LlamaCppExecutor``, for the target and the draft alike. A turn ends at any end-of-turn id
the model declares (``end_of_turn``: its tokenizer's EOS and ``LoadedModels.end_of_turn_ids``):
the grammar allows each of them where an output may end, and the core, the drafter and the draft
model stop at each.

The one module that knows every package the engine is built from (the engine itself
knows only the ``Speculator`` protocol). ``build_engine`` is the server's default engine
factory; ``assemble_engine`` wires already-loaded models (tests, benchmarks). ``DraftLoader``
loads another draft folder for a running engine (``Engine.load_draft``, the LoadDraft RPC).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from structspec.chat_template import ChatPrompts, PlainPrompts, PromptFormat
from structspec.engine.config import EngineConfig, PolicyConfig, SchedulerLimits
from structspec.engine.core import EngineCore
from structspec.engine.default_examples import ExampleBook, build_example_book
from structspec.engine.engine import Engine
from structspec.engine.sequence import Serving
from structspec.engine.types import DraftLoadError, DraftUpdate
from structspec.grammar.copy_guard import GuardTokens
from structspec.grammar import GrammarCompiler, TokenizerView
from structspec.models.draft_vocab import DraftVocab, VocabMappedExecutor
from structspec.models.end_of_turn import end_of_turn_ids
from structspec.models.executor import ForwardStep
from structspec.models.hf_executor import TransformersExecutor
from structspec.models.llamacpp_executor import LlamaCppExecutor
from structspec.models.identity import DUMMY_PREFIX
from structspec.models.loading import ModelLoadError, check_draft, check_draft_folder, load_draft, load_models, \
    model_profile, weights_version
from structspec.models.step_profile import StepProfile, StepProfileCache, cached_step_profile, profile_key
from structspec.models.threads import size_torch_threads
from structspec.models.worker_thread import run_in_worker
from structspec.speculation.configs import ProposerSet, speculation_config
from structspec.speculation.draft_model import DraftModelProposer
from structspec.speculation.history import SchemaHistory
from structspec.speculation.router import Router
from structspec.stats.book import Recorder
from structspec.stats.counters import RESTRICTED_HEAD, model_key
from structspec.stats.legacy_keys import Claim, claims

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AssemblyConfig:
    """How ``assemble_engine`` wires an engine around loaded models.

    ``proposers``: None = no drafting (fast-forward is per request, and ``fast_forward`` for all). ``policy``: the
    drafting policy's thresholds; None drafts with every proposer always (a fixed configuration). ``seed`` seeds
    the policy's probes. The parts made elsewhere (None: made here, or none): ``compiler`` (one over the target's
    tokenizer), ``stats`` records requests, decisions, verifications and step times (its model should be
    ``engine_model_key(models)``), ``examples`` are added to requests that bring none (``build_engine`` builds them
    for base-model profiles), ``history`` is the schema history the proposers draft from. A ``compiler`` given
    should be over ``TokenizerView(tokenizer, n_vocab, eos_token_ids=end_of_turn(models, n_vocab))``: its grammars
    then allow every id the turn ends at.
    """

    grammar_backend: str = "llguidance"
    limits: SchedulerLimits = SchedulerLimits()
    proposers: ProposerSet | None = None
    max_context: int | None = None
    max_tokens_cap: int = 4096
    fast_forward: bool = True
    policy: PolicyConfig | None = None
    seed: int | None = None
    compiler: GrammarCompiler | None = None
    stats: Recorder | None = None
    examples: ExampleBook | None = None
    history: SchemaHistory | None = None
    step_profile_dir: str = ""  # where measured step costs are kept ("": this process's memory only)
    step_profile_seconds: float = 20.0  # the measurement's budget; 0: none (a cold schema drafts at the cap)
    copy_guard: bool = True  # outputs never go along the server's examples' values past the input (grammar.copy_guard)


def assemble_engine(models, config: AssemblyConfig = AssemblyConfig()) -> Engine:
    """An engine (not started) around loaded models, wired as ``config`` says."""
    limits, proposers, stats = config.limits, config.proposers, config.stats
    executor = make_executor(models, models.target, config.max_context, limits)
    eos = end_of_turn(models, executor.vocab_size)
    compiler = config.compiler
    if compiler is None:
        compiler = GrammarCompiler(TokenizerView(models.tokenizer, n_vocab=executor.vocab_size, eos_token_ids=eos),
                                   backend=config.grammar_backend)
    prompts = make_prompts(models)
    speculator, loader = None, None
    draft_version = models.draft_version if proposers is not None and proposers.draft and models.draft is not None else ""
    if proposers is not None:
        draft = None
        if draft_version:
            draft = DraftModelProposer(make_draft_executor(models, models.draft, models.draft_vocab, executor), eos,
                                       context_tokens=getattr(models, "draft_context", None))
        profile = step_profile(models, executor, draft, limits, config) if config.policy is not None else None
        speculator = Router(models.tokenizer, proposers, executor.vocab_size, history=config.history, draft=draft,
                            stats=stats, policy=config.policy, rng=random.Random(config.seed),
                            max_draft=limits.max_draft, draft_version=draft_version, step_profile=profile)
        if proposers.draft:
            loader = DraftLoader(models.profile, models.tokenizer, f"profile {models.profile}",
                                 getattr(models, "executor", "transformers"), models.device, models.dtype, executor,
                                 eos, prompts.stats_format, getattr(models, "identity", ""))
    core = EngineCore(executor, models.tokenizer, eos, limits, speculator,
                      Serving(stats, engine_model_key(models), draft_version))
    if config.copy_guard and config.examples:  # the guard's token index, built now rather than on a request
        GuardTokens.for_view(compiler.view)
    return Engine(core, models.tokenizer, compiler, executor.max_context, config.max_tokens_cap, config.examples,
                  config.fast_forward, draft_loader=loader, prompts=prompts, copy_guard=config.copy_guard)


def step_profile(models, executor: ForwardStep, draft: DraftModelProposer | None, limits: SchedulerLimits,
                 config: AssemblyConfig) -> StepProfile | None:
    """The executor's step costs for the drafting policy: cached per model and machine, else measured now (on the
    caller's thread: the assembly's worker) and recorded in ``config.stats``; None where the budget is 0 or the
    measurement failed (the policy then drafts a cold schema at the cap to measure)."""
    if config.step_profile_seconds <= 0:
        return None
    key = profile_key(history_model_key(models), getattr(models, "executor", "transformers"),
                      str(getattr(models, "device", "cpu")), str(getattr(models, "dtype", "")))
    cache = StepProfileCache(config.step_profile_dir) if config.step_profile_dir else None
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= max(1, limits.max_batch))
    try:
        profile = cached_step_profile(executor, key, cache, draft.executor if draft is not None else None, buckets,
                                      config.step_profile_seconds)
    except Exception:  # noqa: BLE001 - without a profile the policy measures while serving, as it always could
        log.exception("measuring the step costs failed; a cold schema drafts at the cap to measure them")
        return None
    if config.stats is not None:
        config.stats.record_profile({**{("full", b, k): s for (b, k), s in profile.full.items()},
                                     **{(RESTRICTED_HEAD, b, k): s for (b, k), s in profile.restricted.items()},
                                     **{("draft", b, 1): s for b, s in profile.draft_token.items()}})
    return profile


@dataclass(frozen=True)
class DraftLoader:
    """Loads draft folders for a running engine: checked against the target's tokenizer, on the target's executor
    kind, device and dtype, over the target's ids. Holds nothing of any draft (a replaced one can be freed)."""

    profile: str
    tokenizer: Any
    tokenizer_source: str  # how errors name the target's tokenizer
    executor: str  # transformers | llamacpp (``make_executor`` reads it)
    device: torch.device
    dtype: torch.dtype
    target: ForwardStep
    eos: tuple[int, ...]  # the ids that end a turn (``end_of_turn``)
    prompt_format: str = ""  # the statistics key's prompt format (``PromptFormat.stats_format``)
    identity: str = ""  # the target's content identity (``LoadedModels.identity``)

    def version(self, path: str) -> str:
        """The ``weights_version`` of the draft folder ``path``, its tokenizer checked against the target's (the
        version hashes the weights, not the tokenizer: a folder of the serving version's weights with another
        tokenizer must still be refused). Raises: DraftLoadError (not a model folder, another tokenizer)."""
        self._check_folder(path)
        try:
            check_draft_folder(path, self.tokenizer, self.tokenizer_source)
        except ModelLoadError as exc:
            raise DraftLoadError(str(exc)) from exc
        return weights_version(path)

    @staticmethod
    def _check_folder(path: str) -> None:
        folder = Path(path)
        if not path or not folder.is_dir():
            raise DraftLoadError(f"{path!r} is not a folder on the server")
        if not (folder / "config.json").is_file():
            raise DraftLoadError(f"{path} has no config.json (not a model folder)")

    def load(self, path: str) -> DraftUpdate:
        """The draft in folder ``path`` as the router's proposer. Raises: DraftLoadError (bad folder, another
        tokenizer, another vocabulary width)."""
        self._check_folder(path)  # load_draft checks the tokenizer and hashes the weights itself
        try:
            loaded = load_draft(path, self.tokenizer, self.tokenizer_source, self.executor, self.device, self.dtype)
            executor = make_draft_executor(self, loaded.model, loaded.vocab, self.target)
        except (ModelLoadError, ValueError) as exc:
            raise DraftLoadError(str(exc)) from exc
        return DraftUpdate(DraftModelProposer(executor, self.eos, context_tokens=loaded.context_tokens), loaded.version,
                           model_key(self.profile, loaded.version, self.prompt_format, self.identity))


def end_of_turn(models, n_vocab: int | None = None) -> tuple[int, ...]:
    """The ids that end a turn of ``models``' target: its tokenizer's EOS, then every other id it declares
    (``LoadedModels.end_of_turn_ids``), those within its ``n_vocab`` logits."""
    return end_of_turn_ids(models.tokenizer, getattr(models, "end_of_turn_ids", ()), n_vocab=n_vocab)


def make_executor(models, model: Any, max_context: int | None = None,
                  limits: SchedulerLimits | None = None) -> ForwardStep:
    """The forward-step executor of ``model`` (the target or the draft of ``models``) for ``models.executor``.

    ``limits``: the scheduler's, where the executor serves an engine: llama.cpp's pool then starts at what a steady
    stream holds (each resize moves the whole cache): a full prefix cache and as much again for the running
    requests, whose copied prefixes the pool counts once more; ids for a batch and the retained prompts."""
    if getattr(models, "executor", "transformers") == "llamacpp":
        if limits is None:
            return LlamaCppExecutor(model, max_context=max_context)
        retained = 4  # prompts the prefix cache typically holds beside the batch
        # never over the KV budget: the scheduler would then admit nothing beside a running request
        steady = min(2 * limits.prefix_cache_tokens, limits.kv_budget_tokens)
        return LlamaCppExecutor(model, max_context=max_context,
                                initial_tokens=max(1024, 1 << max(0, steady.bit_length() - 1)),
                                initial_sequences=limits.max_batch + retained)
    return TransformersExecutor(model, max_context=max_context)


def make_draft_executor(models, draft: Any, vocab: DraftVocab | None, target: ForwardStep) -> ForwardStep:
    """The forward-step executor of a draft model beside ``target``'s executor: over the target's ids, the
    draft's restricted vocabulary (``vocab``) mapped onto them. Raises: ValueError (the widths disagree)."""
    executor = make_executor(models, draft, target.max_context)
    if vocab is not None:
        executor = VocabMappedExecutor(executor, vocab)
    if executor.vocab_size != target.vocab_size:
        raise ValueError(f"the draft returns {executor.vocab_size} logits per row, the target {target.vocab_size}")
    return executor


def make_prompts(models) -> PromptFormat:
    """How the engine renders prompts for ``models``: through its chat template (``models.chat_template``; the
    tokenizer's ``tool_use`` variant, where it has one beside that template, for tool calls), else the plain
    format."""
    template = getattr(models, "chat_template", None)
    if not template:
        return PlainPrompts(models.tokenizer, answers=getattr(models, "plain_answers", True),
                            json_line=getattr(models, "plain_json_line", "heading"))
    own = getattr(models.tokenizer, "chat_template", None)
    if isinstance(own, dict) and own.get("default") == template and "tool_use" in own:
        return ChatPrompts(models.tokenizer, {"default": template, "tool_use": own["tool_use"]})
    return ChatPrompts(models.tokenizer, template)


def engine_model_key(models) -> str:
    """The model an engine's statistics are kept under (``model_key``): the served name, the target's identity,
    its prompt format and, with a draft model, its version."""
    return _model_key(models, models.draft_version if models.draft is not None else "")


def history_model_key(models) -> str:
    """The model an engine's schema history is kept under: its statistics key without the draft version. The
    history holds outputs, and outputs are the target's (verification makes them whatever drafted them), so a
    draft swap neither loses them nor splits them by version; another prompt format writes other text (another
    call format), so it keeps its own."""
    return _model_key(models, "")


def _model_key(models, draft_version: str) -> str:
    return model_key(models.profile, draft_version, make_prompts(models).stats_format, getattr(models, "identity", ""))


def claim_legacy_rows(store: Any, models) -> list[Claim]:
    """Move what ``store`` holds under ``models``' served name's legacy keys to the keys this engine's name,
    identity and prompt format make (``legacy_keys``), then reload the store's counters into its book; none for
    dummy weights or a model without an identity. A store that fails is logged: the rows stay where they were."""
    identity = getattr(models, "identity", "")
    if not identity or identity.startswith(DUMMY_PREFIX):
        return []
    fmt = make_prompts(models).stats_format
    try:  # on the factory's thread: its own event loop for the store's coroutines
        done = asyncio.run(store.claim(lambda stored: claims(stored, models.profile, identity, fmt)))
        if done:
            asyncio.run(store.refresh_stats())
    except Exception:  # noqa: BLE001 - unclaimed rows cost a cold start, not the server
        log.exception("claiming the statistics stored under %s failed; starting without them", models.profile)
        return []
    for c in done:
        log.info("statistics stored under %s moved to %s (history to %s)", c.old, c.statistics, c.history)
    return done


def persisted_history(store: Any, model: str) -> SchemaHistory:
    """A schema history loaded from ``store`` (the last outputs of the most recent schemas) that writes
    every new output back to it, under ``model`` (``history_model_key``)."""
    history = SchemaHistory(journal=lambda key, text: store.append_history(model, key, text, time.time()))
    cfg = history.config
    try:  # on the factory's thread: its own event loop for the store's coroutine
        history.load(asyncio.run(store.load_history(model, cfg.per_schema, cfg.max_schemas)))
    except Exception:  # noqa: BLE001 - a cold history costs speed, not the server
        log.exception("loading the schema history failed; starting without it")
    return history


def draft_problem(config: EngineConfig) -> str | None:
    """Why ``config``'s model and draft cannot serve together, read from their tokenizers alone (no weights: a
    start-up check before the server starts), or None."""
    try:
        check_draft(model_profile(config.profile, draft=config.draft, tokenizer=config.tokenizer))
    except ModelLoadError as exc:
        return str(exc)
    return None


def build_engine(settings: Any, store: Any = None) -> Engine:
    """Load the configured model (a profile, a GGUF file or a model folder, under its served name) and start the
    engine (the server's engine factory). Raises: ModelLoadError.

    ``settings``: a ``ServiceSettings`` (anything with ``engine_config()``) or an ``EngineConfig``.
    ``store``: its statistics book records this engine's traffic (keyed by the model) and the drafting
    policy reads it; the schema history is loaded from it and written back.
    """
    config: EngineConfig = settings if isinstance(settings, EngineConfig) else settings.engine_config()
    t0 = time.monotonic()
    device = config.resolved_device(torch.cuda.is_available())
    if device != "cuda":  # intra-op threads from the CPUs this process may use, not the machine's
        log.info("torch intra-op threads: %d", size_torch_threads())
    spec = speculation_config(config.speculation)
    # Model work off the main thread, so the engine thread computes at full speed (see worker_thread).
    profile = model_profile(config.profile, draft=config.draft, tokenizer=config.tokenizer,
                            served_name=config.served_name, chat_template=config.chat_template)
    models = run_in_worker(load_models, profile, device=device, dtype=config.resolved_dtype(device),
                           with_draft=bool(spec.proposers and spec.proposers.draft), executor=config.executor,
                           load_format=config.load_format)
    examples = build_example_book(profile.few_shot)
    model = engine_model_key(models)
    if store is not None:  # before anything is recorded or loaded under the keys it moves rows to
        claim_legacy_rows(store, models)
    recorder = store.stats.recorder(model) if store is not None else None
    history = persisted_history(store, history_model_key(models)) if store is not None and spec.proposers else None
    engine = run_in_worker(assemble_engine, models, AssemblyConfig(
        config.grammar_backend, config.limits, spec.proposers, max_tokens_cap=config.max_tokens_cap,
        fast_forward=spec.fast_forward, policy=config.policy if spec.adaptive else None, stats=recorder,
        examples=examples, history=history, step_profile_dir=config.step_profile_dir,
        step_profile_seconds=config.step_profile_seconds, copy_guard=config.copy_guard))
    engine.start()
    log.info("engine ready in %.1fs (model %s on %s, statistics under model %s)", time.monotonic() - t0,
             models.profile, models.executor, model)
    return engine
