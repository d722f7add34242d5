"""Text deltas from committed tokens, cut only on UTF-8 character boundaries."""

from __future__ import annotations

from typing import Sequence

from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a growing token list and hands out only text that can no longer change.

    A token can end in the middle of a multi-byte character; the decoder shows
    that as U+FFFD until the rest arrives, so trailing replacement characters
    are held back (at the end of a sequence, ``flush`` releases everything).
    Decoding the whole output each time is O(n) per token but n is at most
    ``max_tokens`` and string work is cheap next to a model step.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.emitted = 0  # characters already handed out

    def text(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def delta(self, tokens: Sequence[int], final: bool = False) -> str:
        text = self.text(tokens)
        stable = text if final else text.rstrip(REPLACEMENT)
        if len(stable) <= self.emitted:
            return ""
        out = stable[self.emitted:]
        self.emitted = len(stable)
        return out
