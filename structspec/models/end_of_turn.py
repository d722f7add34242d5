"""The ids that end a model's turn: every one the model declares, not its tokenizer's EOS alone.

A chat model's turn often ends at another token than ``tokenizer.eos_token_id``: Llama 3 Instruct's
generation_config lists ``<|end_of_text|>``, ``<|eom_id|>`` and ``<|eot_id|>``, Gemma 3 it's ``<eos>`` and
``<end_of_turn>``, Phi-3.5's ``<|end|>``, ``<|assistant|>`` and ``<|endoftext|>``. Where they are declared:

- a model (or tokenizer) folder: ``generation_config.json``'s ``eos_token_id`` (one id or a list), else
  ``config.json``'s (or its ``text_config``'s), what transformers' ``generate`` stops at (``folder_ids``);
- a GGUF: ``tokenizer.ggml.eos_token_id``, ``eot_token_id`` and ``eom_token_id`` (``GGUF_KEYS``, read by
  ``LlamaCppModel``);
- the tokenizer: its EOS, always, and first (``end_of_turn_ids``).

The engine ends a turn at any of them (``as_id_set``), and the grammar allows them all where an output may end.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GGUF_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def declared_ids(value: Any) -> tuple[int, ...]:
    """The ids of an ``eos_token_id`` field: one id, a list of them, or nothing (None, anything else)."""
    values = value if isinstance(value, list) else [value]
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def _eos_field(file: Path) -> tuple[int, ...] | None:
    """``eos_token_id`` of a JSON config file (a multimodal config's under ``text_config``); None: the file or the
    field is missing or unreadable."""
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    for where in (config, config.get("text_config")):
        if isinstance(where, dict) and where.get("eos_token_id") is not None:
            return declared_ids(where["eos_token_id"])
    return None


def folder_ids(folder: str | Path | None) -> tuple[int, ...]:
    """The end-of-turn ids a folder declares: its generation_config's, else its config's (none: a folder without
    either, a GGUF file, a hub name)."""
    if folder is None or not Path(folder).is_dir():
        return ()
    for name in ("generation_config.json", "config.json"):
        found = _eos_field(Path(folder) / name)
        if found is not None:
            return found
    return ()


def end_of_turn_ids(tokenizer: Any, *declared: Iterable[int], n_vocab: int | None = None) -> tuple[int, ...]:
    """The tokenizer's EOS then every declared id, each once, in order; an id past the model's ``n_vocab`` logits
    is left out (logged: the model can never write it). Empty: the model declares none."""
    eos = tokenizer.eos_token_id
    ids = [int(i) for i in dict.fromkeys((*(() if eos is None else (eos,)), *(i for d in declared for i in d)))]
    if n_vocab is not None:
        beyond = [i for i in ids if i >= n_vocab]
        if beyond:
            log.warning("end-of-turn ids %s are past the model's %d logits; left out", beyond, n_vocab)
        ids = [i for i in ids if i < n_vocab]
    return tuple(ids)


def as_id_set(ids: int | Iterable[int]) -> frozenset[int]:
    """One end-of-turn id or several, as the set a turn ends at. Raises: ValueError (none)."""
    found = frozenset([int(ids)] if isinstance(ids, int) else (int(i) for i in ids))
    if not found:
        raise ValueError("a turn needs at least one end-of-turn id")
    return found
