"""A perfect draft model for the decode benchmark: it drafts the target's own greedy output.

The bound on what a draft model can add. The router lets the draft model draft inside free-text
strings only, and ranks it against copy lookup there; with this proposer in the draft model's
place (the ``perfect_draft`` configuration: ``all`` otherwise) every draft is the target's next
tokens, so each is accepted whole, and its drafting costs a list slice. No draft model, however
well distilled, makes a greedy request faster than this configuration does on the same engine
and machine: ``perfect_draft / ff+ngram+history`` is the ceiling of ``all / ff+ngram+history``.

The reference is the ``off`` row's output for the same prompt in the same run (greedy outputs do
not depend on drafting; on llama.cpp a verification's rounding may still part them, and where the
output leaves its reference the proposer stops drafting).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from structspec.speculation.base import Draft, DraftContext, SequenceSpeculation


class ReferenceDraft:
    """Drafts the next tokens of the reference output of a request's prompt (``references``: prompt ids ->
    output ids, filled as the references are decoded). Raises: Never (an unknown prompt drafts nothing)."""

    name = "draft"  # in the draft model's seat (``DraftModelProposer.name``)

    def __init__(self, references: Mapping[tuple[int, ...], Sequence[int]]):
        self.references = references

    def propose(self, ctx: DraftContext, k: int) -> Draft | None:
        reference = self.references.get(tuple(ctx.prompt_ids))
        done = len(ctx.output_ids)
        if reference is None or list(reference[:done]) != list(ctx.output_ids):
            return None
        tokens: list[int] = []
        for tok in reference[done: done + k]:  # only what the grammar takes: drafts are grammatical
            if ctx.matcher.is_stopped() or not ctx.matcher.consume([tok]):
                break
            tokens.append(tok)
        ctx.matcher.rollback(len(tokens))
        return Draft(tokens, None, self.name) if tokens else None

    def release(self, state: SequenceSpeculation) -> None:
        """Nothing is held per sequence."""

    def close(self) -> None:
        """Nothing is held."""


def install_perfect_draft(engine, references: Mapping[tuple[int, ...], Sequence[int]], stats=None) -> None:
    """Seat a ``ReferenceDraft`` over ``references`` in ``engine``'s draft-model place, recording into ``stats``.
    Before ``engine.start()``: nothing else touches the router yet."""
    engine.core.speculator.install_draft(ReferenceDraft(references), "reference", stats)
