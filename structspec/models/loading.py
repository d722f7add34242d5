"""Load a profile's target and draft with transformers ``from_pretrained``.

Failures become one ``ModelLoadError`` line naming the path and the cause, so an
operator reading the server log knows what to fix.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from structspec.models.profiles import ModelProfile, get_profile

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message is one line: path and cause."""


@dataclass
class LoadedModels:
    profile: str
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    draft: PreTrainedModel | None
    device: torch.device
    dtype: torch.dtype
    draft_version: str = ""  # ``weights_version`` of the loaded draft ("" without one)


def weights_version(path: str | Path) -> str:
    """A short content hash of a model folder's weights and config: another draft, another version.

    Cost: reads the weight files once (a few MB for a draft model)."""
    digest = hashlib.sha256()
    folder = Path(path)
    for file in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")) + [folder / "config.json"]:
        if file.is_file():
            digest.update(file.name.encode())
            with file.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:12]


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


def load_causal_lm(path: str, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    local = Path(path)
    if not local.exists() and (local.is_absolute() or path.startswith(".")):
        raise ModelLoadError(f"cannot load model from {path}: the directory does not exist")
    if local.is_dir() and not (local / "config.json").is_file():
        raise ModelLoadError(f"cannot load model from {path}: no config.json (not a transformers model folder)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        model.to(device)
    except Exception as exc:  # noqa: BLE001 - every cause becomes one readable line
        raise ModelLoadError(f"cannot load model from {path}: {_cause(exc)}") from exc
    model.eval()
    return model


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load tokenizer from {path}: {_cause(exc)}") from exc


def check_shared_tokenizer(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase,
                           target_path: str, draft_path: str) -> None:
    """Speculation compares token ids across models: both must map every token to the same id."""
    a, b = target.get_vocab(), draft.get_vocab()
    if a != b:
        only = len(set(a.items()) ^ set(b.items()))
        raise ModelLoadError(f"draft {draft_path} does not share the tokenizer of target {target_path}: "
                             f"{only} (token, id) pairs differ (vocab {len(a)} vs {len(b)})")
    if target.eos_token_id != draft.eos_token_id:
        raise ModelLoadError(f"draft {draft_path} and target {target_path} disagree on the EOS token id "
                             f"({draft.eos_token_id} vs {target.eos_token_id})")


def load_models(profile: ModelProfile, device: str = "cpu", dtype: str | torch.dtype = "float32",
                with_draft: bool = True) -> LoadedModels:
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    if profile.prepare is not None:  # makes the files exist; on a ready profile a quick check (and migration)
        profile.prepare()
    tokenizer = load_tokenizer(profile.target)
    target = load_causal_lm(profile.target, dev, dt)
    draft, draft_version = None, ""
    if with_draft and profile.draft:
        check_shared_tokenizer(tokenizer, load_tokenizer(profile.draft), profile.target, profile.draft)
        draft = load_causal_lm(profile.draft, dev, dt)
        draft_version = weights_version(profile.draft)
    log.info("loaded profile %s on %s (%s)", profile.name, dev, dt)
    return LoadedModels(profile.name, target, tokenizer, draft, dev, dt, draft_version)


def load_profile(name: str, **kwargs: Any) -> LoadedModels:
    try:
        profile = get_profile(name)
    except KeyError as exc:
        raise ModelLoadError(str(exc.args[0])) from exc
    return load_models(profile, **kwargs)
