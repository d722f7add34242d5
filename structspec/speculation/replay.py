"""Replayed drafts: what a proposer that did not draft in a request would have had accepted, read off its output.

A cold proposer the policy prices out (no draft length pays at the prior) drafts nothing, so it would gather
evidence only through probes. Yet a cheap proposer (copy lookup, the schema history) needs no model to draft: on a
finished output it can be asked, position by position, what it would have drafted, and the output itself says
what verification would have kept of it.

Why that is the acceptance it would have had. A draft carries no probabilities, so verification keeps a drafted
token x with the target's probability p(x) under the grammar mask (greedy: when x is the argmax), and the output
token at that position was drawn from the same p (greedy: is the argmax). So P(kept) = P(output token = x), at
every position given the ones before: the matched prefix of a draft against the output has the distribution of the
accepted prefix of a verification, and the counts by draft position (``Recorder.record_replay``) estimate the same
per-position acceptance, unbiased. Greedy and deterministic proposers make them equal to the verdicts the engine
would have recorded, draft for draft (``tests/speculation/test_replay.py``).

The walk mirrors the engine's step: forced tokens are fast-forwarded (never a proposer's turn); a draft is asked at
the length ``draft_length`` picks from the replay's own recent acceptance, cut at the first token the grammar
refuses (as ``Drafter.draft`` cuts it); the walk then moves past the matched tokens and the one the target
committed after them.

Cost: one matcher over the output, a proposer call and a decode of the output so far per replayed step. The router
replays a proposer only while its replayed evidence is thin (``Router.on_finish``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from structspec.grammar.base import Matcher, allocate_bitmask, token_allowed
from structspec.speculation.base import DraftContext, Proposer, SequenceSpeculation
from structspec.speculation.proposing import draft_length, remember_acceptance


def replay_drafts(proposer: Proposer, output: Sequence[int], matcher: Matcher, vocab_size: int,
                  context: Callable[[list[int], Matcher, SequenceSpeculation], DraftContext], max_draft: int,
                  fast_forward: bool = True, end_of_turn: frozenset[int] = frozenset()) -> list[tuple[int, int]]:
    """(drafted, accepted) of each draft ``proposer`` would have made while ``output`` was decoded.

    ``matcher``: a fresh matcher of the request's grammar (consumed here); ``context(output_so_far, matcher,
    state)``: the proposer's view at a position; ``end_of_turn``: ids a draft never runs past. Stops where the
    matcher refuses the output (an output the grammar did not produce: a stop string, say).
    Raises: whatever the proposer raises (the caller logs it and keeps the request's answer)."""
    out = list(output)
    state = SequenceSpeculation()
    mask = allocate_bitmask(1, vocab_size)
    verdicts: list[tuple[int, int]] = []
    t = 0
    while t < len(out) and not matcher.is_stopped():
        if fast_forward:
            forced = matcher.forced_tokens()
            n = 0
            while n < len(forced) and t + n < len(out) and out[t + n] == forced[n]:
                n += 1
            if n:
                if not matcher.consume(out[t:t + n]):
                    break
                t += n
                continue
        k = draft_length(state, proposer.name, max_draft)
        draft = proposer.propose(context(out[:t], matcher, state), k)
        step = 1
        if draft is not None and draft.tokens:
            # counted as the engine counts it: drafted before the grammar's cut (a draft cut whole is a verdict of 0)
            tokens = list(draft.tokens)[:k]
            grammatical = _grammatical(tokens, matcher, mask, end_of_turn)
            accepted = 0
            while accepted < grammatical and t + accepted < len(out) and tokens[accepted] == out[t + accepted]:
                accepted += 1
            verdicts.append((len(tokens), accepted))
            remember_acceptance(state, proposer.name, accepted)
            step = accepted + 1
        step = min(step, len(out) - t)
        if not matcher.consume(out[t:t + step]):
            break
        t += step
    return verdicts


def _grammatical(tokens: list[int], matcher: Matcher, mask: torch.Tensor, end_of_turn: frozenset[int]) -> int:
    """How many of ``tokens`` the grammar takes in a row from here (the matcher left as found)."""
    consumed = 0
    for tok in tokens:
        matcher.fill_mask(mask, 0)
        if tok in end_of_turn or not token_allowed(mask[0], tok) or not matcher.consume([tok]):
            break
        consumed += 1
        if matcher.is_stopped():
            break
    if consumed:
        matcher.rollback(consumed)
    return consumed
