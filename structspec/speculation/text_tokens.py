"""A copy proposer's text made token ids, the recent ones remembered.

Copy lookup and the schema history draft text, then tokenize it. Their continuations repeat (a schema's keys and
enum values after the same tail, the same document span at successive steps of a rejected draft), and a
tokenizer call costs about 30 us on the demo tokenizer: a lookup's whole budget on a fast target. A hit costs a
dict lookup.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


class TextTokens:
    """``tokenizer``'s ids of a text, without special tokens, for the last ``size`` texts asked.
    Raises: what the tokenizer raises."""

    def __init__(self, tokenizer: Any, size: int = 4096):
        self.tokenizer = tokenizer
        self._ids = lru_cache(maxsize=size)(self._encode)

    def __call__(self, text: str, limit: int) -> list[int]:
        """The first ``limit`` ids of ``text``."""
        return list(self._ids(text)[:limit])

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
