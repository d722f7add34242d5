"""Prompt lookup: copy the continuation of the longest earlier match of the output's tail.

Matching happens on text, not token ids: a value copied into JSON often starts
with a different token than in the document (``"Tyrell`` after a quote vs
`` Tyrell`` in prose), so token-id n-grams miss exactly the copies extraction
is made of. We find the longest suffix of the output text (``min_chars`` ..
``max_chars`` characters) that occurs earlier in the prompt or the output,
take the text after its latest occurrence, and tokenize that as the draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structspec.speculation.base import Draft, DraftContext


@dataclass(frozen=True)
class NgramConfig:
    min_chars: int = 3
    max_chars: int = 40
    continuation_chars: int = 64  # text taken after the match, before tokenizing


class NgramProposer:
    name = "ngram"

    def __init__(self, tokenizer: Any, config: NgramConfig = NgramConfig()):
        self.tokenizer = tokenizer
        self.config = config

    def propose(self, ctx: DraftContext, k: int) -> Draft | None:
        cont = find_continuation(ctx.prompt_text, ctx.output_text, self.config)
        if not cont:
            return None
        tokens = self.tokenizer(cont, add_special_tokens=False)["input_ids"][:k]
        return Draft(tokens, None, self.name) if tokens else None


def find_continuation(source: str, output: str, cfg: NgramConfig) -> str | None:
    """Text following the longest match of ``output``'s tail in ``source`` (or earlier in ``output``)."""
    cfg_max = min(cfg.max_chars, len(output))
    for n in range(cfg_max, cfg.min_chars - 1, -1):
        tail = output[-n:]
        at = source.rfind(tail)
        if at >= 0:
            start = at + n
            return source[start: start + cfg.continuation_chars] or None
        at = output.rfind(tail, 0, len(output) - 1)  # an earlier repeat inside the output itself
        if at >= 0 and at + n < len(output):
            start = at + n
            return output[start: min(len(output), start + cfg.continuation_chars)] or None
    return None
