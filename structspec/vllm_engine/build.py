"""``build_vllm_engine``: the server's engine factory for ``--engine vllm``.

Loads what structspec needs of the model folder without its weights (tokenizer, chat template, end-of-turn ids,
identity: ``loading.load_without_weights``), builds the prompt format and grammar compiler as the own engine's
assembly does, reads the batch-size rule from the store's statistics (``schedule``), and builds vLLM's
``AsyncLLM`` from the settings' vLLM options in this process (vLLM starts its engine core as a process of its
own). The statistics are kept under ``<name>@<identity>+<format>+vllm[:<method>]``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from structspec.assembly import (claim_legacy_rows, end_of_turn, history_model_key, make_prompts,
                                 persisted_history)
from structspec.engine.config import EngineConfig, VllmOptions
from structspec.engine.default_examples import build_example_book
from structspec.grammar import GrammarCompiler, TokenizerView
from structspec.models.loading import ModelLoadError, load_without_weights, model_profile
from structspec.speculation.configs import speculation_config
from structspec.speculation.history import SchemaHistory
from structspec.stats.counters import draft_keys, model_key
from structspec.vllm_engine.extension import EXTENSION_PATH
from structspec.vllm_engine.proposer import CLASS_PATH
from structspec.vllm_engine.schedule import batch_schedule, schedule_entries

log = logging.getLogger(__name__)

ENGINE = "vllm"
STRUCTSPEC_METHOD = "structspec"  # ``--speculative-config '{"method": "structspec"}'``: structspec's own drafting
DEFAULT_DRAFT = 8


def engine_part(speculative: dict[str, Any] | None) -> str:
    """The model key's engine part: ``vllm``, or ``vllm:<method>`` with vLLM's speculation on (``vllm:structspec``
    with structspec's own proposer)."""
    if is_structspec(speculative):
        return f"{ENGINE}:{STRUCTSPEC_METHOD}"
    method = (speculative or {}).get("method") or ("draft_model" if (speculative or {}).get("model") else "")
    return f"{ENGINE}:{method}" if method else ENGINE


def is_structspec(speculative: dict[str, Any] | None) -> bool:
    """Whether ``speculative`` asks for structspec's own proposer (``{"method": "structspec", ...}``, or vLLM's
    ``custom_class`` naming it)."""
    spec = speculative or {}
    return spec.get("method") == STRUCTSPEC_METHOD or spec.get("model") == CLASS_PATH


def structspec_method(speculative: dict[str, Any]) -> dict[str, Any]:
    """vLLM's speculative config for structspec's proposer: ``custom_class`` naming it, K drafted tokens at most
    (``num_speculative_tokens``, 8 unless given). Raises: ModelLoadError (a field of another method)."""
    extra = set(speculative) - {"method", "model", "num_speculative_tokens"}
    if extra:
        raise ModelLoadError(f"the structspec method takes num_speculative_tokens alone, not {sorted(extra)}")
    k = int(speculative.get("num_speculative_tokens") or DEFAULT_DRAFT)
    return {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": k}


def engine_args(folder: str, tokenizer: str, options: VllmOptions, *, dtype: str, load_format: str, served_name: str,
                speculative: dict[str, Any] | None) -> dict[str, Any]:
    """vLLM's ``AsyncEngineArgs`` fields for ``folder`` under ``options``. Raises: ModelLoadError (``extra`` names a
    field vLLM does not have is left to vLLM, which refuses it)."""
    args: dict[str, Any] = dict(
        model=folder, tokenizer=tokenizer, served_model_name=served_name, dtype=dtype,
        load_format="dummy" if load_format == "dummy" else "auto",
        tensor_parallel_size=options.tensor_parallel_size, pipeline_parallel_size=options.pipeline_parallel_size,
        data_parallel_size=options.data_parallel_size, gpu_memory_utilization=options.gpu_memory_utilization,
        enable_prefix_caching=options.enable_prefix_caching,
        structured_outputs_config={"backend": "guidance"},  # llguidance: the grammar engine structspec compiles with
        disable_log_stats=False,  # the stat loggers (``steps``) see every step
    )
    if options.max_model_len:
        args["max_model_len"] = options.max_model_len
    if options.distributed_executor_backend:
        args["distributed_executor_backend"] = options.distributed_executor_backend
    if speculative:
        args["speculative_config"] = speculative
        args["per_request_spec_decode_metrics"] = "detailed"  # drafted/accepted per verification step, per request
    if is_structspec(speculative):
        args["worker_extension_cls"] = EXTENSION_PATH  # the front reaches the proposer through it
    if options.extra:
        args.update(json.loads(options.extra))
    return args


def build_vllm_engine(settings: Any, store: Any = None, book: Any = None) -> Any:
    """The server's engine on vLLM (started by the server). ``store``: its statistics book records the engine's
    traffic and holds the evidence of the batch-size rule (``book``: a ``StatsBook`` alone, without a store: the
    benchmark's). Raises: ModelLoadError; ImportError where vLLM is not installed."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from structspec.vllm_engine.engine import VllmEngine, step_logger
    from structspec.vllm_engine.planning import DraftingFront
    from structspec.vllm_engine.steps import StepLog

    config: EngineConfig = settings if isinstance(settings, EngineConfig) else settings.engine_config()
    t0 = time.monotonic()
    profile = model_profile(config.profile, tokenizer=config.tokenizer, served_name=config.served_name,
                            chat_template=config.chat_template)
    if config.draft:
        raise ModelLoadError("--draft is structspec's own engine's; on vLLM give its speculative config "
                             "(--speculative-config '{\"method\": \"draft_model\", \"model\": FOLDER, ...}')")
    models = load_without_weights(profile, config.load_format)
    prompts = make_prompts(models)
    options = config.vllm
    speculative = json.loads(options.speculative_config) if options.speculative_config else None
    key = model_key(models.profile, "", prompts.stats_format, models.identity, engine_part(speculative))
    if store is not None:
        claim_legacy_rows(store, models)
        book = store.stats
    recorder = book.recorder(key) if book is not None else None
    max_batch = json.loads(options.extra or "{}").get("max_num_seqs", config.limits.max_batch)
    lengths = []
    spec = speculation_config(config.speculation)
    ours = is_structspec(speculative)
    if ours:
        speculative = structspec_method(speculative or {})
    elif speculative and spec.adaptive and book is not None:
        k = int(speculative.get("num_speculative_tokens") or 1)
        lengths = batch_schedule(book.rows(), key, str(speculative.get("method", "")), k, int(max_batch),
                                 config.policy, now=time.time())
        speculative = {**speculative, "num_speculative_tokens_per_batch_size": schedule_entries(lengths)}
        for b in lengths:
            log.info("vLLM draft length at batch %d-%d: %d (%s; acceptance %s over %.0f drafted tokens)", b.first,
                     b.last, b.draft_length, b.reason, "n/a" if b.acceptance is None else f"{b.acceptance:.3f}",
                     b.drafted)
    args = engine_args(profile.target, models.tokenizer.name_or_path or profile.target, options, dtype=config.dtype,
                       load_format=config.load_format, served_name=models.profile, speculative=speculative)
    if "max_num_seqs" not in args:
        args["max_num_seqs"] = int(max_batch)
    steps = StepLog(recorder)
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=[step_logger(steps)])
    vocab = int(llm.model_config.get_vocab_size())
    eos = end_of_turn(models, vocab)
    drafting = None
    if ours:
        names = tuple(key for n, on in (("ngram", spec.proposers and spec.proposers.ngram),
                                         ("history", spec.proposers and spec.proposers.history)) if on
                      for key in draft_keys(n))
        history = (persisted_history(store, history_model_key(models)) if store is not None
                   else SchemaHistory())
        drafting = DraftingFront(names, int((speculative or {})["num_speculative_tokens"]),
                                 config.policy if spec.adaptive else None, recorder, history, tuple(eos),
                                 tokenizer=models.tokenizer, vocab_size=vocab)
    compiler = GrammarCompiler(TokenizerView(models.tokenizer, n_vocab=vocab, eos_token_ids=eos), backend="llguidance")
    engine = VllmEngine(llm, models.tokenizer, compiler, int(llm.model_config.max_model_len), model_key=key,
                        end_of_turn=eos, steps=steps, proposer=str((speculative or {}).get("method", "")),
                        stats=recorder, max_tokens_cap=config.max_tokens_cap,
                        examples=build_example_book(profile.few_shot), prompts=prompts,
                        max_in_flight=config.limits.max_queue + int(max_batch),
                        schedule=tuple(schedule_entries(lengths)) if lengths else (), drafting=drafting,
                        max_batch=int(max_batch))
    engine.lengths = tuple(lengths)
    log.info("vLLM engine ready in %.1fs (model %s, statistics under %s)", time.monotonic() - t0, models.profile, key)
    return engine

