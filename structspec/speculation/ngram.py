"""Prompt lookup: copy the continuation of the longest earlier match of the output's tail.

Matching happens on text, not token ids: a value copied into JSON often starts
with a different token than in the document (``"Tyrell`` after a quote vs
`` Tyrell`` in prose), so token-id n-grams miss exactly the copies extraction
is made of. We find the longest suffix of the output text (``min_chars`` ..
``max_chars`` characters) that occurs earlier in the prompt or the output,
take the text after its latest occurrence, and tokenize that as the draft.

A draft whose matched tail is ``long_chars`` characters or more is a *long match* (``long_match_key``: recorded,
capped and priced under ``ngram/long``): a copy well under way, or the output repeating its own text, whose
drafts are accepted far more often than a short match's (which is mostly a key or a word that also occurs
elsewhere). The policy prices the two apart, so a long match drafts where a short one does not pay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structspec.speculation.base import Draft, DraftContext
from structspec.speculation.text_tokens import TextTokens
from structspec.stats.counters import long_match_key


@dataclass(frozen=True)
class NgramConfig:
    min_chars: int = 3
    max_chars: int = 40
    continuation_chars: int = 64  # text taken after the match, before tokenizing
    long_chars: int = 24  # a matched tail this long or longer makes a long match's draft (``long_match_key``)


class NgramProposer:
    name = "ngram"

    def __init__(self, tokenizer: Any, config: NgramConfig = NgramConfig()):
        self.tokenizer = tokenizer
        self.tokens = TextTokens(tokenizer)
        self.config = config

    def propose(self, ctx: DraftContext, k: int) -> Draft | None:
        """A draft named ``ngram``, or ``ngram/long`` where its match is long (``NgramConfig.long_chars``)."""
        found = find_match(ctx.prompt_text, ctx.output_text, self.config)
        if found is None:
            return None
        cont, matched = found
        tokens = self.tokens(cont, k)
        name = long_match_key(self.name) if matched >= self.config.long_chars else self.name
        return Draft(tokens, None, name) if tokens else None


def find_continuation(source: str, output: str, cfg: NgramConfig) -> str | None:
    """Text following the longest match of ``output``'s tail in ``source`` (``find_match``), or None."""
    found = find_match(source, output, cfg)
    return found[0] if found is not None else None


def find_match(source: str, output: str, cfg: NgramConfig) -> tuple[str, int] | None:
    """The text following the longest match of ``output``'s tail in ``source`` (or earlier in ``output``: at that
    length, ``source``'s latest match first), and that match's length in characters; None where no tail of
    ``min_chars`` occurs or nothing follows it. The longest is found by bisection: a tail that occurs means every
    shorter one occurs too (in ``output``, ending at the same place), so a lookup searches about
    log2(``max_chars``) times, not once per tail length."""
    def match(n: int) -> str | None:
        tail = output[len(output) - n:]
        at = source.rfind(tail)
        if at >= 0:
            return source[at + n: at + n + cfg.continuation_chars]
        at = output.rfind(tail, 0, len(output) - 1)  # an earlier repeat inside the output itself
        return output[at + n: min(len(output), at + n + cfg.continuation_chars)] if at >= 0 else None

    lo, hi = cfg.min_chars, min(cfg.max_chars, len(output))
    found = match(lo) if lo <= hi else None
    if found is None:
        return None
    while lo < hi:  # the longest tail that matches: ``found`` is match(lo), match(hi + 1) is None
        mid = (lo + hi + 1) // 2
        longer = match(mid)
        if longer is None:
            hi = mid - 1
        else:
            lo, found = mid, longer
    return (found, lo) if found else None
