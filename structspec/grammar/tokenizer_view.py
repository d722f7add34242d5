"""One tokenizer as the grammar engines see it, built once per (HF tokenizer, model vocab size)."""

from __future__ import annotations

import copy
import hashlib
import json
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import llguidance
import llguidance.hf
import numpy as np


class TokenizerView:
    """The llguidance tokenizer, lazily the token bytes outlines-core needs, the EOS ids, a fingerprint.

    ``n_vocab`` is the model's vocabulary size (its logits width); it may exceed
    ``len(tokenizer)`` (padding rows), never be smaller. Masks are ``ceil(n_vocab / 32)`` words.
    """

    def __init__(self, tokenizer: Any, n_vocab: int | None = None, eos_token_ids: Sequence[int] | None = None):
        size = len(tokenizer)
        n_vocab = size if n_vocab is None else int(n_vocab)
        if n_vocab < size:
            raise ValueError(f"n_vocab {n_vocab} is smaller than the tokenizer's {size} tokens")
        eos = list(eos_token_ids) if eos_token_ids else [tokenizer.eos_token_id]
        if any(e is None for e in eos):
            raise ValueError("the tokenizer has no EOS token; pass eos_token_ids")
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self.eos_token_ids: tuple[int, ...] = tuple(int(e) for e in eos)
        self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=list(self.eos_token_ids))
        self.fingerprint = self._fingerprint()

    @property
    def eos_token_id(self) -> int:
        return self.eos_token_ids[0]

    @property
    def mask_words(self) -> int:
        return (self.n_vocab + 31) // 32

    def encode(self, text: str) -> list[int]:
        """The tokenizer's own split of ``text``, no special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_bytes(self, data: bytes) -> list[int]:
        """Like ``encode`` for bytes that may start or end inside a UTF-8 character."""
        return self.ll_tokenizer.tokenize_bytes(data)

    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        return self.ll_tokenizer.decode_bytes(list(tokens))

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        """Bytes of every token id below ``len(tokenizer)``; special tokens map to b''."""
        llt = self.ll_tokenizer
        return tuple(b"" if llt.is_special_token(i) else llt.decode_bytes([i]) for i in range(len(self.tokenizer)))

    @cached_property
    def outlines_tokens(self) -> dict[bytes, list[int]]:
        """Token bytes -> ids, what outlines-core's ``Vocabulary`` is built from (its
        ``from_pretrained`` needs the model hub; the vocabulary itself lives in the index worker)."""
        by_bytes: dict[bytes, list[int]] = {}
        for i, data in enumerate(self.token_bytes):
            if data:
                by_bytes.setdefault(data, []).append(i)
        return by_bytes

    def _fingerprint(self) -> str:
        # The serialized tokenizer covers vocab, merges, normalizer and pre-tokenizer: everything
        # that changes which tokens exist or how forced text is split.
        backend = copy.copy(self.tokenizer.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        digest = hashlib.sha256(backend.to_str().encode())
        digest.update(json.dumps([self.n_vocab, list(self.eos_token_ids)]).encode())
        return digest.hexdigest()[:24]


class TokenPrefixIndex:
    """Token ids by their bytes (``token_bytes[id]``, as given: a view's, or a form of them): the ids whose bytes
    begin with a prefix, or are exactly some bytes, by bisection in the sorted bytes. Empty bytes (special tokens)
    begin with no prefix. Raises: Never."""

    def __init__(self, token_bytes: Sequence[bytes], n_vocab: int):
        order = sorted(range(len(token_bytes)), key=token_bytes.__getitem__)
        self._sorted = [token_bytes[i] for i in order]
        self._ids = np.asarray(order, dtype=np.int64)
        self.words = (n_vocab + 31) // 32  # a mask row's words

    def starting_with(self, prefix: bytes) -> np.ndarray:
        """The ids whose bytes begin with ``prefix`` (non-empty), as an int64 array."""
        lo = bisect_left(self._sorted, prefix)
        head = prefix.rstrip(b"\xff")  # the least bytes above every extension of ``prefix``: its last byte + 1
        hi = bisect_left(self._sorted, head[:-1] + bytes([head[-1] + 1]), lo) if head else len(self._sorted)
        return self._ids[lo:hi]

    def exactly(self, data: bytes) -> np.ndarray:
        """The ids whose bytes are ``data`` (non-empty), as an int64 array."""
        lo = bisect_left(self._sorted, data)
        return self._ids[lo:bisect_right(self._sorted, data, lo)]
