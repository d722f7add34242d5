"""Which proposer drafts first at a position, how long a draft it is asked for, and the draft made fit to verify.

``proposer_order``: inside a free-text string value (or anywhere in a free-text answer), copy lookup and the draft model (the one with the longer
recent accepted drafts in this request first), then the schema history; elsewhere the schema history first (key
order, enum values seen before), then copy lookup. Forced tokens never reach a proposer's turn: the engine
fast-forwards them before asking for a draft.
"""

from __future__ import annotations

from typing import Mapping

import torch

from structspec.speculation.base import Draft, DraftContext, Proposer, SequenceSpeculation
from structspec.speculation.json_position import is_free_text
from structspec.stats.counters import draft_keys


def proposer_order(ctx: DraftContext, ngram: Proposer | None, draft: Proposer | None,
                   history: Proposer | None) -> list[Proposer]:
    """The proposers present, in the order they are asked at ``ctx``'s position (``draft``: the sequence's own
    draft version's model).

    Free-text string values: copy lookup and the draft model, the one with the longer recent accepted
    drafts in this request first (one without a record yet counts as longest; each falls back on the other),
    then history; elsewhere history first (key order, enum values seen before), then copy lookup.

    Why both orders: a value copied from the document (a summary quoting it) is drafted whole by copy
    lookup (Gemma's free text: 4.1 tokens a verification, the draft model 2.3), prose of the model's own
    by the draft model (demo summaries: copy lookup 0.26 acceptance, the draft 0.68)."""
    free = ctx.prose or is_free_text(ctx.schema, ctx.state.json_scan.position(ctx.output_text))
    if not free:
        order = [history, ngram]
    else:
        recent = ctx.state.accepted
        first = [ngram, draft]
        if ngram is not None and draft is not None and \
                recent.get(draft.name, float("inf")) > recent.get(ngram.name, float("inf")):
            first = [draft, ngram]
        order = first + [history]
    return [p for p in order if p is not None]


def draft_length(state: SequenceSpeculation, proposer: str, max_tokens: int) -> int:
    """Draft about what this proposer got accepted lately in this request (+2), so a proposer that keeps
    being rejected early does not pay for long verifications; starts at the maximum."""
    mean = state.accepted.get(proposer)
    return max_tokens if mean is None else min(max_tokens, max(2, int(mean + 2.5)))


def key_lengths(state: SequenceSpeculation, proposer: str, caps: Mapping[str, int], limit: int,
                adapt: bool = True) -> dict[str, int]:
    """Per draft key of ``proposer`` (``draft_keys``) that ``caps`` lets draft, how far: its cap within ``limit``,
    adapted to the key's recent acceptance (``draft_length``) unless not ``adapt``. Ask the proposer for the longest
    and cut its draft to its own key's (``cut_to_key``)."""
    return {key: draft_length(state, key, min(limit, caps[key])) if adapt else min(limit, caps[key])
            for key in draft_keys(proposer) if caps.get(key, 0) > 0}


def cut_to_key(draft: Draft | None, lengths: Mapping[str, int]) -> Draft | None:
    """``draft`` cut to the length of the key it was made under (``key_lengths``); None where that key may not
    draft or nothing is left."""
    cap = lengths.get(draft.proposer, 0) if draft is not None else 0
    if draft is None or cap <= 0 or not draft.tokens:
        return None
    if len(draft.tokens) <= cap:
        return draft
    return Draft(draft.tokens[:cap], draft.q[:cap] if draft.q is not None else None, draft.proposer)


def fit_q(draft: Draft, vocab_size: int) -> Draft:
    """``draft`` with its q as wide as the target's vocabulary (the verifier indexes q by it)."""
    if draft.q is None or draft.q.shape[-1] == vocab_size:
        return draft
    q = torch.zeros((draft.q.shape[0], vocab_size))
    n = min(vocab_size, draft.q.shape[-1])
    q[:, :n] = draft.q[:, :n]
    return Draft(draft.tokens, q, draft.proposer)


def remember_acceptance(state: SequenceSpeculation, proposer: str, accepted: int) -> None:
    """Fold one verdict into the request's recent accepted tokens per draft of ``proposer`` (``draft_length``,
    ``proposer_order``)."""
    prev = state.accepted.get(proposer)
    state.accepted[proposer] = accepted if prev is None else 0.5 * prev + 0.5 * accepted
