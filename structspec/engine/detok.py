"""A sequence's output as text: decoded once per commit, and handed out as deltas cut on UTF-8 character boundaries.

``OutputText`` is the one place a sequence's committed output is detokenized: the text deltas of a stream, the
proposers' view of the output, the final result and the schema history all read it, and a commit is decoded at
most once whoever asks first (the output only grows, so its length names the commit).

Cost: a commit decodes its new tokens after a window of the ones before (``WINDOW``), not the whole output: the
drafting context reads the text at every step, and a whole decode grows with the output (0.1 ms a step at 120
tokens on the demo tokenizer, a 4.9 ms step). The text so grown is the whole decode's wherever the checks in
``OutputText._grown`` hold; where they do not (a character split across the window's edge), the output is decoded
whole.
"""

from __future__ import annotations

from typing import Sequence, cast

from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"


WINDOW = 4  # tokens decoded again before a commit's new ones: the decoder's context for them


class OutputText:
    """The text of a growing token list, decoded once per length. Raises: what the tokenizer's decode raises."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self._tokens = 0  # how many tokens ``_text`` decodes
        self._text = ""

    def __call__(self, tokens: Sequence[int]) -> str:
        if len(tokens) != self._tokens:
            grown = self._grown(tokens) if len(tokens) > self._tokens else None
            self._text = grown if grown is not None else self._decode(tokens)
            self._tokens = len(tokens)
        return self._text

    def _grown(self, tokens: Sequence[int]) -> str | None:
        """The text of ``tokens`` (the ones ``_text`` decodes, then more), decoding the new ones after the last
        ``WINDOW`` old ones: the window's text, decoded alone, must end the old text (no character split at its
        start), must not end in a split character, and must begin the window's text with the new tokens; None
        where one of these fails."""
        start = self._tokens - WINDOW
        if start <= 0:
            return None  # short: decoded whole
        before = self._decode(tokens[start: self._tokens])
        if not before or before.endswith(REPLACEMENT) or not self._text.endswith(before):
            return None
        after = self._decode(tokens[start:])
        return self._text + after[len(before):] if after.startswith(before) else None

    def _decode(self, tokens: Sequence[int]) -> str:
        return cast(str, self.tokenizer.decode(list(tokens), skip_special_tokens=False,  # one id list: one str
                                               clean_up_tokenization_spaces=False))


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
