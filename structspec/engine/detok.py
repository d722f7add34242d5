"""A sequence's output as text: decoded once per commit, and handed out as deltas cut on UTF-8 character boundaries.

``OutputText`` is the one place a sequence's committed output is detokenized: the text deltas of a stream, the
proposers' view of the output, the final result and the schema history all read it, and a commit is decoded at
most once whoever asks first (the output only grows, so its length names the commit). Decoding the whole output
each time is O(n) per token but n is at most ``max_tokens`` and string work is cheap next to a model step.
"""

from __future__ import annotations

from typing import Sequence, cast

from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"


class OutputText:
    """The text of a growing token list, decoded once per length. Raises: what the tokenizer's decode raises."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self._tokens = 0  # how many tokens ``_text`` decodes
        self._text = ""

    def __call__(self, tokens: Sequence[int]) -> str:
        if len(tokens) != self._tokens:
            self._text = cast(str, self.tokenizer.decode(list(tokens), skip_special_tokens=False,  # one id list: one str
                                                         clean_up_tokenization_spaces=False))
            self._tokens = len(tokens)
        return self._text


class IncrementalDetokenizer:
    """Hands out only text that can no longer change.

    A token can end in the middle of a multi-byte character; the decoder shows
    that as U+FFFD until the rest arrives, so trailing replacement characters
    are held back (at the end of a sequence, ``final`` releases everything).
    """

    def __init__(self, text: OutputText):
        self.text = text
        self.emitted = 0  # characters already handed out

    def delta(self, tokens: Sequence[int], final: bool = False) -> str:
        text = self.text(tokens)
        stable = text if final else text.rstrip(REPLACEMENT)
        if len(stable) <= self.emitted:
            return ""
        out = stable[self.emitted:]
        self.emitted = len(stable)
        return out
