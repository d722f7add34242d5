"""A GGUF file loaded by llama.cpp (llama-cpp-python's low-level API), weights as stored.

llama.cpp memory-maps the GGUF and computes on its quantized blocks: nothing is
dequantized or cached beside it (the Gemma 3 270M Q4_K_M file is 253 MB; the
transformers path keeps a 1.1 GB fp32 copy). ``llama-cpp-python`` is an optional
dependency (the ``llamacpp`` extra); importing this module never needs it, loading does.

Weight repacking (``use_extra_bufts``) is off: with it, llama.cpp's CPU backend moves
some quantized matrices into interleaved layouts whose kernels switch on the number of
tokens in a batch (one code path under 4 tokens, another from 4), so the logits of a
position change with how many tokens share its forward (up to ~2 logits on Gemma 3
270M Q4_K_M). Without it, any forward of up to 7 tokens gives logits bit-identical to
token-by-token decoding; a decode step costs the same either way (measured: 10.3 ms).

Raises ``LlamaCppUnavailable`` (an ImportError) when the package is missing, naming the
extra to install; ``LlamaCppError`` (a RuntimeError) when llama.cpp refuses a file or an
operation.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structspec.models.end_of_turn import GGUF_KEYS

log = logging.getLogger("structspec.llamacpp")

INSTALL_HINT = "pip install 'structspec[llamacpp]' (builds llama-cpp-python from source, ~5-8 min on 2 cores)"


class LlamaCppUnavailable(ImportError):
    """llama-cpp-python is not installed."""


class LlamaCppError(RuntimeError):
    """llama.cpp refused a file or an operation; the message says which and why."""


_INIT = threading.Lock()
_STATE: dict[str, Any] = {}


def llamacpp_available() -> bool:
    """Whether llama-cpp-python can be imported (does not load a model)."""
    try:
        lib()
    except LlamaCppUnavailable:
        return False
    return True


def lib():
    """The ``llama_cpp`` module, its backend initialised once and its log routed to ``structspec.llamacpp``."""
    if "lib" in _STATE:
        return _STATE["lib"]
    with _INIT:
        if "lib" not in _STATE:
            try:
                import llama_cpp
            except ImportError as exc:
                raise LlamaCppUnavailable(f"the llama.cpp executor needs llama-cpp-python: {INSTALL_HINT}") from exc
            llama_cpp.llama_backend_init()

            @llama_cpp.llama_log_callback
            def _route(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
                # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation. llama.cpp's warnings are about
                # its own defaults (e.g. a context shorter than the training one); its errors say why a call failed.
                message = text.decode("utf-8", "replace").rstrip()
                if message:
                    log.log(logging.WARNING if level == 4 else logging.DEBUG, "%s", message)

            llama_cpp.llama_log_set(_route, ctypes.c_void_p(0))
            _STATE["log_callback"] = _route  # the C side keeps only the pointer
            _STATE["lib"] = llama_cpp
    return _STATE["lib"]


@dataclass(frozen=True)
class GGUFInfo:
    """What the executor needs to know of a loaded model."""

    path: str
    architecture: str
    n_vocab: int  # width of the logits
    n_ctx_train: int
    n_layer: int
    n_embd: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_swa: int  # sliding window of the SWA layers (0: none)
    n_params: int
    file_bytes: int
    end_of_turn_ids: tuple[int, ...] = ()  # its EOS, end-of-turn and end-of-message ids, as written (``GGUF_KEYS``)


def _meta(llama_cpp, model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else None


def _meta_ids(llama_cpp, model, keys: tuple[str, ...]) -> tuple[int, ...]:
    """The token ids the metadata ``keys`` hold, in order, each once (a key missing or not an id: left out)."""
    found = (_meta(llama_cpp, model, key) for key in keys)
    return tuple(dict.fromkeys(int(v) for v in found if v is not None and v.strip().isdigit()))


class LlamaCppModel:
    """A GGUF loaded by llama.cpp on the CPU; ``close()`` (or garbage collection) frees it.

    Raises: LlamaCppUnavailable, LlamaCppError (missing or unreadable file, an architecture this
    llama.cpp does not know). Cost: a memory map and llama.cpp's checks (~0.7 s for Gemma 3 270M)."""

    def __init__(self, path: str | Path):
        llama_cpp = lib()
        self._lib = llama_cpp
        file = Path(path)
        if not file.is_file():
            raise LlamaCppError(f"cannot load GGUF {file}: the file does not exist")
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = False  # no repacked weights: kernels that do not depend on the batch (module doc)
        handle = llama_cpp.llama_model_load_from_file(os.fsencode(file), params)
        if not handle:
            raise LlamaCppError(f"cannot load GGUF {file}: llama.cpp refused it (see the structspec.llamacpp log)")
        self.handle = handle
        vocab = llama_cpp.llama_model_get_vocab(handle)
        arch = _meta(llama_cpp, handle, "general.architecture") or "?"
        n_embd = llama_cpp.llama_model_n_embd(handle)
        n_head = llama_cpp.llama_model_n_head(handle)
        head_k = int(_meta(llama_cpp, handle, f"{arch}.attention.key_length") or n_embd // max(1, n_head))
        head_v = int(_meta(llama_cpp, handle, f"{arch}.attention.value_length") or head_k)
        self.info = GGUFInfo(
            path=str(file), architecture=arch, n_vocab=llama_cpp.llama_vocab_n_tokens(vocab),
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(handle), n_layer=llama_cpp.llama_model_n_layer(handle),
            n_embd=n_embd, n_head_kv=llama_cpp.llama_model_n_head_kv(handle), head_dim_k=head_k, head_dim_v=head_v,
            n_swa=llama_cpp.llama_model_n_swa(handle), n_params=llama_cpp.llama_model_n_params(handle),
            file_bytes=file.stat().st_size, end_of_turn_ids=_meta_ids(llama_cpp, handle, GGUF_KEYS))
        if self.info.n_vocab <= 0:
            self.close()
            raise LlamaCppError(f"cannot use GGUF {file}: it declares no vocabulary size (logits would be empty)")

    def kv_bytes_per_token(self, type_bytes: int = 2) -> int:
        """K and V bytes one cached token takes over all layers (every layer full-size: see the executor)."""
        i = self.info
        return i.n_layer * i.n_head_kv * (i.head_dim_k + i.head_dim_v) * type_bytes

    def close(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self._lib.llama_model_free(handle)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn the library down
            pass
