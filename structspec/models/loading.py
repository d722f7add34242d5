"""Load a profile's target and draft for one executor: transformers ``from_pretrained``, or llama.cpp GGUFs.

A model named by its path (``profiles.resolve_model``): a GGUF file runs on llama.cpp, its
tokenizer the ``--tokenizer`` folder or the GGUF's own vocabulary, read by transformers once
(tens of seconds) into a cached folder named by the file's identity (``gguf_tokenizer``); a
model folder runs on transformers, or on llama.cpp through ``gguf_for``. ``load_format``
``dummy`` builds a folder's model from its config with seeded random weights (timing without
weights; transformers only).

``resolve_executor`` turns ``auto`` into a choice (the profile's ``cpu_executor`` on a CPU
when llama-cpp-python is installed, else transformers). For llama.cpp the target is the
profile's own GGUF where it ships one (gemma-3-270m: loaded as it is, no conversion);
otherwise, as for any draft, a GGUF written once from the transformers folder into the
cache, named by the folder's weights version (``gguf_for``; about a second for the demo
pair).

Every end-of-turn id the target declares is read beside its tokenizer's EOS (``end_of_turn``):
a folder's generation_config (or config), a GGUF's EOS, EOT and EOM metadata, and those of the
tokenizer folder it is given; ``LoadedModels.end_of_turn_ids`` holds them, the EOS first.

Failures become one ``ModelLoadError`` line naming the path and the cause, so an
operator reading the server log knows what to fix.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from structspec.models.draft_vocab import VOCAB_FILE, DraftVocab, vocabulary_hash
from structspec.models.end_of_turn import declared_ids, end_of_turn_ids, folder_ids
from structspec.models.gguf_export import export_gguf
from structspec.models.identity import dummy_identity, folder_digest, gguf_digest
from structspec.models import llamacpp_model
from structspec.models.llamacpp_model import INSTALL_HINT, LlamaCppError, LlamaCppModel
from structspec.models.profiles import EXECUTORS, ModelProfile, cache_dir, is_gguf, resolve_model, write_folder

log = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "dummy")  # auto: the weights as stored; dummy: seeded random weights of the config
DUMMY_SEED = 0
GGUF_MAGIC = b"GGUF"
DIFFERING_SHOWN = 3  # (token, id) pairs a tokenizer mismatch names

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message is one line: path and cause."""


@dataclass
class LoadedModels:
    profile: str
    target: Any  # a transformers PreTrainedModel, or a LlamaCppModel (``executor``)
    tokenizer: PreTrainedTokenizerBase
    draft: Any  # the same kind as ``target``, or None
    device: torch.device
    dtype: torch.dtype  # the weights' dtype (transformers); float32, the logits', on llama.cpp
    draft_version: str = ""  # ``weights_version`` of the loaded draft ("" without one)
    executor: str = "transformers"  # transformers | llamacpp
    draft_vocab: DraftVocab | None = None  # a restricted draft's vocabulary map (``draft_vocab``); None: full
    draft_context: int | None = None  # the committed tokens the draft's outputs depend on (``LoadedDraft``)
    # the chat template's text to render prompts with (``--chat-template`` file, else the tokenizer's own);
    # None: the model has none and prompts keep the plain format
    chat_template: str | None = None
    plain_answers: bool = True  # ``ModelProfile.plain_answers``
    plain_json_line: str = "heading"  # ``ModelProfile.plain_json_line``
    # every id that ends the target's turn, the tokenizer's EOS first (``end_of_turn``); empty: that EOS alone
    end_of_turn_ids: tuple[int, ...] = ()
    # the target's content identity (``identity``): what its statistics are kept under beside the served name;
    # "" where unknown (models built in memory)
    identity: str = ""

    def parameter_count(self) -> int:
        if self.executor == "llamacpp":
            return self.target.info.n_params
        return sum(p.numel() for p in self.target.parameters())


def resolve_executor(requested: str, profile: ModelProfile, device: str) -> str:
    """``auto`` -> the profile's ``cpu_executor`` on a CPU when llama-cpp-python is installed, else transformers;
    ``llamacpp`` on another device than the CPU is refused (this build runs llama.cpp on the CPU only).
    Raises: ModelLoadError."""
    if requested not in ("auto", *EXECUTORS):
        raise ModelLoadError(f"unknown executor {requested!r}; use auto, {', '.join(EXECUTORS)}")
    cpu = device in ("cpu", "auto") and not (device == "auto" and torch.cuda.is_available())
    if requested == "auto":
        requested = profile.cpu_executor if cpu and llamacpp_model.llamacpp_available() else "transformers"
    if requested == "transformers" and is_gguf(profile.target):
        raise ModelLoadError(f"cannot load {profile.target} on transformers: a GGUF runs on the llama.cpp executor "
                             f"(--executor llamacpp, on the CPU; {INSTALL_HINT}); for transformers give the model's "
                             "folder (config, weights, tokenizer)")
    if requested == "llamacpp":
        if not cpu:
            raise ModelLoadError(f"the llama.cpp executor runs on the CPU, not on device {device!r}")
        if not llamacpp_model.llamacpp_available():
            raise ModelLoadError(f"executor llamacpp: llama-cpp-python is not installed; {INSTALL_HINT}")
    return requested


def weights_version(path: str | Path) -> str:
    """A short content hash of a model folder's weights and config: another draft, another version
    (``identity.folder_digest``; cost: reads the weight files once, then remembered by their stat)."""
    return folder_digest(path)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available in this torch build")
    return dev


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPES))}")
    return DTYPES[dtype]


def _cause(exc: BaseException) -> str:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return "out of memory while loading the weights"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no message'}"


def check_model_folder(path: str) -> None:
    """Raises ModelLoadError where ``path`` is a missing folder or one without config.json (a name that is no local
    path passes: transformers may find it on a hub)."""
    local = Path(path)
    if not local.exists() and (local.is_absolute() or path.startswith(".")):
        raise ModelLoadError(f"cannot load model from {path}: the directory does not exist")
    if local.is_dir() and not (local / "config.json").is_file():
        raise ModelLoadError(f"cannot load model from {path}: no config.json (not a transformers model folder)")


def load_causal_lm(path: str, device: torch.device, dtype: torch.dtype, load_format: str = "auto") -> PreTrainedModel:
    """The model in folder ``path``; ``load_format`` dummy: its config's model with random weights (``DUMMY_SEED``:
    the same ones each time), for timing without the weights. Raises: ModelLoadError."""
    check_model_folder(path)
    try:
        if load_format == "dummy":
            config = AutoConfig.from_pretrained(path)
            with torch.random.fork_rng(devices=[]):  # seeded here without moving the caller's generator
                torch.manual_seed(DUMMY_SEED)
                model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        model.to(device)
    except Exception as exc:  # noqa: BLE001 - every cause becomes one readable line
        dummy = " (dummy weights)" if load_format == "dummy" else ""
        raise ModelLoadError(f"cannot load model from {path}{dummy}: {_cause(exc)}") from exc
    model.eval()
    return model


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load tokenizer from {path}: {_cause(exc)}") from exc


def tokenizer_differences(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> list[str]:
    """What differs between two tokenizers for ids compared across models: the vocabulary (its sizes and a few
    (token, id) pairs only one maps) and the EOS id; beside either, the BOS ids. Empty: the draft may speak for
    the target."""
    a, b = target.get_vocab(), draft.get_vocab()
    out = []
    if a != b:
        differing = set(a.items()) ^ set(b.items())
        shown = sorted({t for t, _ in differing}, key=lambda t: (a.get(t, b.get(t)), t))[:DIFFERING_SHOWN]
        pairs = ", ".join(f"{t!r}: {a.get(t, '-')} vs {b.get(t, '-')}" for t in shown)
        out.append(f"vocab {len(a)} vs {len(b)} tokens, {len(differing)} (token, id) pairs differ (e.g. {pairs})")
    if target.eos_token_id != draft.eos_token_id:
        out.append(f"EOS id {target.eos_token_id} vs {draft.eos_token_id}")
    if out and target.bos_token_id != draft.bos_token_id:  # prompts take the target's BOS: named, never a cause
        out.append(f"BOS id {target.bos_token_id} vs {draft.bos_token_id}")
    return out


def check_shared_tokenizer(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase,
                           target_path: str, draft_path: str) -> None:
    """Speculation compares token ids across models: both must map every token to the same id and agree on EOS.
    Raises: ModelLoadError naming what differs (``tokenizer_differences``: target's value vs the draft's)."""
    differences = tokenizer_differences(target, draft)
    if differences:
        raise ModelLoadError(f"draft {draft_path} does not share the tokenizer of target {target_path} (target vs "
                             f"draft): {'; '.join(differences)}")


@dataclass(frozen=True)
class LoadedDraft:
    model: Any  # a PreTrainedModel or LlamaCppModel (None: no draft)
    version: str  # ``weights_version`` of its folder
    vocab: DraftVocab | None  # a restricted draft's vocabulary map; None: the draft covers the target's ids
    context_tokens: int | None = None  # the last committed tokens its next-token logits depend on (None: all)


def draft_context_tokens(folder: str | Path) -> int | None:
    """How many of the last tokens a draft's next-token logits depend on: layers x window when every layer
    attends within a sliding window (the gemma draft: 2 x 384), else None (all). The draft then never prefills
    more of a prompt than that: the rest could not change what it drafts."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    layers, window, types = cfg.get("num_hidden_layers"), cfg.get("sliding_window"), cfg.get("layer_types")
    if isinstance(layers, int) and isinstance(window, int) and isinstance(types, list) and types and \
            all(t == "sliding_attention" for t in types):
        return layers * window
    return None


def check_draft_folder(path: str, tokenizer: PreTrainedTokenizerBase, tokenizer_source: str) -> DraftVocab | None:
    """Whether the draft in folder ``path`` speaks the target's ``tokenizer`` (loaded from ``tokenizer_source``,
    named in errors): a full draft by its own tokenizer files, a restricted one (``draft_vocab.json``) by the
    tokenizer hash in its map, which is returned (None: a full draft). Reads no weights. Raises: ModelLoadError."""
    try:
        vocab = DraftVocab.load(path)
    except ValueError as exc:
        raise ModelLoadError(f"cannot load draft from {path}: {exc}") from exc
    if vocab is None:
        check_shared_tokenizer(tokenizer, load_tokenizer(path), tokenizer_source, path)
    elif vocab.tokenizer_sha256 != vocabulary_hash(tokenizer):
        raise ModelLoadError(f"draft {path} was made for another tokenizer than target {tokenizer_source}'s "
                             f"(the tokenizer hash in its {VOCAB_FILE} differs)")
    return vocab


def load_draft(path: str, tokenizer: PreTrainedTokenizerBase, tokenizer_source: str, executor: str,
               device: torch.device, dtype: torch.dtype, load_format: str = "auto") -> LoadedDraft:
    """The draft model in folder ``path`` (or a GGUF file, on llama.cpp) for ``executor``, checked against the
    target's ``tokenizer`` (``check_draft_folder``). Raises: ModelLoadError."""
    if is_gguf(path):
        if executor != "llamacpp" or load_format == "dummy":
            raise ModelLoadError(f"cannot load draft {path}: a GGUF draft runs on the llama.cpp executor, with its "
                                 "weights (give a draft folder for transformers)")
        check_shared_tokenizer(tokenizer, load_tokenizer(str(gguf_tokenizer(path))), tokenizer_source, path)
        return LoadedDraft(_load_gguf(Path(path)), gguf_identity(Path(path)), None)
    vocab = check_draft_folder(path, tokenizer, tokenizer_source)
    if executor == "llamacpp":
        model = _load_gguf(gguf_for(path))
    else:
        model = load_causal_lm(path, device, dtype, load_format)
    return LoadedDraft(model, weights_version(path), vocab, draft_context_tokens(path))


def gguf_for(path: str) -> Path:
    """A GGUF of the transformers model folder ``path`` (F32, exact), written once into the cache and named by the
    folder's ``weights_version``. Raises: ModelLoadError."""
    folder = Path(path)
    out = cache_dir() / "gguf" / f"{folder.name}-{weights_version(folder)}-f32.gguf"
    if out.is_file():
        return out
    model = load_causal_lm(path, torch.device("cpu"), torch.float32)
    try:
        eos = declared_ids(model.config.eos_token_id)  # one id or a list (the rest are read from the folder)
        export_gguf(model, out, "f32", bos_token_id=model.config.bos_token_id, eos_token_id=eos[0] if eos else None)
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"cannot write {path} as GGUF for llama.cpp: {_cause(exc)}") from exc
    log.info("wrote %s for the llama.cpp executor", out)
    return out


def chat_template_of(profile: ModelProfile, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The template text prompts are rendered with: the profile's ``chat_template`` file (``--chat-template``),
    else the tokenizer's own (transformers fills it from a folder's ``chat_template.jinja`` or
    ``tokenizer_config.json``, or from a GGUF's ``tokenizer.chat_template``); None: none (the plain format).
    A tokenizer with several named templates gives its ``default``. Raises: ModelLoadError (an unreadable file)."""
    if profile.chat_template is not None:
        try:
            return Path(profile.chat_template).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read chat template {profile.chat_template}: {_cause(exc)}") from exc
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        own = own.get("default")
    return own or None


def gguf_identity(path: Path) -> str:
    """A short name for a GGUF file's content: its size and a hash of its first and last MiB (a model's header,
    vocabulary and metadata sit at the start; another quantization or model changes its size or its tensors'
    layout). Raises: OSError."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as fh:
        digest.update(fh.read(1 << 20))
        fh.seek(max(0, size - (1 << 20)))
        digest.update(fh.read(1 << 20))
    return f"{size}-{digest.hexdigest()[:12]}"


def _check_gguf_file(path: Path) -> None:
    """Raises ModelLoadError (one line: the path and the cause) unless ``path`` is a readable GGUF file."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise ModelLoadError(f"cannot load GGUF {path}: the file does not exist") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot load GGUF {path}: {_cause(exc)}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"cannot load GGUF {path}: not a GGUF file (it does not start with {GGUF_MAGIC!r})")


def gguf_tokenizer(path: str | Path) -> Path:
    """A folder with the tokenizer of the GGUF file ``path``, read from its vocabulary by transformers once (tens of
    seconds for a 49k-token vocabulary) and saved into the cache under the file's stem and ``gguf_identity``, with
    its chat template (``write_folder``); later calls return that folder (loaded in under a second). Raises: ModelLoadError (no such file, not a GGUF, no vocabulary: give --tokenizer)."""
    file = Path(path)
    _check_gguf_file(file)
    out = cache_dir() / "tokenizers" / f"{file.stem}-{gguf_identity(file)}"
    if (out / "tokenizer_config.json").is_file():
        return out
    model = gguf.GGUFReader(file).fields.get("tokenizer.ggml.model")
    if model is None or model.contents() == "no_vocab":
        raise ModelLoadError(f"cannot read a tokenizer from GGUF {file}: it holds no vocabulary (give --tokenizer "
                             "FOLDER, the Hugging Face tokenizer it was made with)")
    log.info("reading the tokenizer of %s (once: it is cached in %s)", file, out)
    try:
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except Exception as exc:  # noqa: BLE001 - every cause becomes one readable line
        raise ModelLoadError(f"cannot read a tokenizer from GGUF {file}: {_cause(exc)} (give --tokenizer FOLDER)") \
            from exc
    return write_folder(out, tokenizer.save_pretrained, ".gguf-tokenizer-")


def tokenizer_source(profile: ModelProfile, executor: str = "transformers") -> str:
    """The folder the tokenizer of ``profile``'s target is loaded from: ``--tokenizer``, else (llama.cpp) the
    profile's tokenizer-only folder, else a GGUF's own (``gguf_tokenizer``), else the target folder.
    Raises: ModelLoadError."""
    if profile.tokenizer_path:
        return profile.tokenizer_path
    if executor == "llamacpp" and profile.tokenizer is not None:
        return str(profile.tokenizer())
    if is_gguf(profile.target):
        return str(gguf_tokenizer(profile.target))
    return profile.target


def _load_gguf(path: Path):
    try:
        return LlamaCppModel(path)
    except LlamaCppError as exc:
        raise ModelLoadError(str(exc)) from exc


def _load_llamacpp(profile: ModelProfile, with_draft: bool) -> LoadedModels:
    tokenizer_dir = tokenizer_source(profile, "llamacpp")
    tokenizer = load_tokenizer(tokenizer_dir)
    target = _load_gguf(profile.gguf() if profile.gguf is not None else gguf_for(profile.target))
    if target.info.n_vocab < len(tokenizer):
        raise ModelLoadError(f"GGUF {target.info.path} has {target.info.n_vocab} logits, fewer than the "
                             f"{len(tokenizer)} tokens of the tokenizer in {tokenizer_dir}")
    draft = LoadedDraft(None, "", None)
    if with_draft and profile.draft:
        draft = load_draft(profile.draft, tokenizer, tokenizer_dir, "llamacpp", torch.device("cpu"), torch.float32)
    # a GGUF written from the target folder (``gguf_for``) keeps one EOS: the folder declares the rest
    own_folder = profile.target if profile.gguf is None else None
    stops = end_of_turn_ids(tokenizer, target.info.end_of_turn_ids, folder_ids(own_folder), folder_ids(tokenizer_dir))
    # a GGUF written from a folder is that folder's weights; a GGUF loaded as it is, its own content
    identity = weights_version(profile.target) if own_folder is not None else gguf_digest(gguf_identity(Path(target.info.path)))
    log.info("loaded %s for llama.cpp (%s; end of turn %s)", profile.name, target.info.path, list(stops))
    return LoadedModels(profile.name, target, tokenizer, draft.model, torch.device("cpu"), torch.float32,
                        draft.version, executor="llamacpp", draft_vocab=draft.vocab, draft_context=draft.context_tokens,
                        chat_template=chat_template_of(profile, tokenizer), plain_answers=profile.plain_answers,
                        plain_json_line=profile.plain_json_line,
                        end_of_turn_ids=stops, identity=identity)


def load_models(profile: ModelProfile, device: str = "cpu", dtype: str | torch.dtype = "float32",
                with_draft: bool = True, executor: str = "transformers", load_format: str = "auto") -> LoadedModels:
    """``executor``: transformers | llamacpp | auto (``resolve_executor``; with ``load_format`` dummy, auto is
    transformers). ``load_format``: auto (the stored weights) | dummy (seeded random weights of a folder's config; transformers).
    Raises: ModelLoadError."""
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"unknown load format {load_format!r}; use {', '.join(LOAD_FORMATS)}")
    if load_format == "dummy":
        if is_gguf(profile.target):
            raise ModelLoadError(f"cannot load {profile.target} with dummy weights: --load-format dummy builds a "
                                 "model folder's config (a GGUF is loaded with its weights)")
        executor = "transformers" if executor == "auto" else executor
        if executor == "llamacpp":
            raise ModelLoadError("--load-format dummy runs on the transformers executor, not llamacpp")
    executor = resolve_executor(executor, profile, device if isinstance(device, str) else str(device))
    if executor == "llamacpp":
        return _load_llamacpp(profile, with_draft)
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    if profile.prepare is not None:  # makes the files exist; on a ready profile a quick check (and migration)
        profile.prepare()
    check_model_folder(profile.target)  # before its tokenizer: the error then names what is missing
    source = tokenizer_source(profile)
    tokenizer = load_tokenizer(source)
    target = load_causal_lm(profile.target, dev, dt, load_format)
    draft = LoadedDraft(None, "", None)
    if with_draft and profile.draft:
        draft = load_draft(profile.draft, tokenizer, source, "transformers", dev, dt, load_format)
    stops = end_of_turn_ids(tokenizer, folder_ids(profile.target), folder_ids(source))
    log.info("loaded %s on %s (%s%s; end of turn %s)", profile.name, dev, dt,
             ", dummy weights" if load_format == "dummy" else "", list(stops))
    return LoadedModels(profile.name, target, tokenizer, draft.model, dev, dt, draft.version, draft_vocab=draft.vocab,
                        draft_context=draft.context_tokens, chat_template=chat_template_of(profile, tokenizer),
                        plain_answers=profile.plain_answers, plain_json_line=profile.plain_json_line,
                        end_of_turn_ids=stops,
                        identity=dummy_identity(profile.target) if load_format == "dummy" else weights_version(profile.target))


def load_without_weights(profile: ModelProfile, load_format: str = "auto") -> LoadedModels:
    """Everything of ``profile``'s target folder but its weights (an engine that loads them itself: vLLM): the
    tokenizer, chat template, end-of-turn ids and identity; ``target`` is the folder's path, and no draft. Raises:
    ModelLoadError (a GGUF, a folder that is not a model)."""
    if is_gguf(profile.target):
        raise ModelLoadError(f"{profile.target}: this engine serves a model folder (config, weights, tokenizer), not "
                             "a GGUF file")
    if profile.prepare is not None:
        profile.prepare()
    check_model_folder(profile.target)
    source = tokenizer_source(profile)
    tokenizer = load_tokenizer(source)
    stops = end_of_turn_ids(tokenizer, folder_ids(profile.target), folder_ids(source))
    identity = dummy_identity(profile.target) if load_format == "dummy" else weights_version(profile.target)
    return LoadedModels(profile.name, profile.target, tokenizer, None, torch.device("cpu"), torch.float32,
                        chat_template=chat_template_of(profile, tokenizer), plain_answers=profile.plain_answers,
                        plain_json_line=profile.plain_json_line,
                        end_of_turn_ids=stops, identity=identity)


def check_draft(profile: ModelProfile) -> None:
    """Whether ``profile``'s draft speaks its target's tokenizer, reading tokenizers only (a start-up check before
    any weights load; the tokenizer-only folder where the profile has one). Raises: ModelLoadError naming what
    differs."""
    if not profile.draft:
        return
    source = tokenizer_source(profile, "llamacpp")
    tokenizer = load_tokenizer(source)
    if is_gguf(profile.draft):
        check_shared_tokenizer(tokenizer, load_tokenizer(str(gguf_tokenizer(profile.draft))), source, profile.draft)
    else:
        check_draft_folder(profile.draft, tokenizer, source)


def model_profile(spec: str, *, draft: str | None = None, tokenizer: str | None = None,
                  served_name: str | None = None, chat_template: str | None = None) -> ModelProfile:
    """``profiles.resolve_model`` (empty overrides: none) with its refusal as a ModelLoadError."""
    try:
        return resolve_model(spec, draft=draft or None, tokenizer=tokenizer or None, served_name=served_name or None,
                             chat_template=chat_template or None)
    except KeyError as exc:
        raise ModelLoadError(str(exc.args[0])) from exc


def load_profile(spec: str, *, draft: str | None = None, tokenizer: str | None = None, served_name: str | None = None,
                 chat_template: str | None = None, **kwargs: Any) -> LoadedModels:
    """The models ``spec`` names (a profile name, a GGUF file, a model folder: ``model_profile``, with its
    overrides), loaded by ``load_models`` with ``kwargs``. Raises: ModelLoadError."""
    profile = model_profile(spec, draft=draft, tokenizer=tokenizer, served_name=served_name,
                            chat_template=chat_template)
    return load_models(profile, **kwargs)
