"""The perfect draft: it drafts the reference output's next tokens, grammatical ones only, and nothing off it."""

from __future__ import annotations

import pytest

from structspec.bench.perfect_draft import ReferenceDraft
from structspec.engine.types import SamplingParams
from structspec.speculation.base import DraftContext, SequenceSpeculation


class Matcher:
    """Takes tokens below ``limit`` and stops after ``stop_after`` of them."""

    def __init__(self, limit: int = 100, stop_after: int = 1000):
        self.limit, self.stop_after, self.taken = limit, stop_after, []

    def consume(self, tokens):
        if any(t >= self.limit for t in tokens):
            return False
        self.taken += tokens
        return True

    def rollback(self, n):
        del self.taken[len(self.taken) - n:]

    def is_stopped(self):
        return len(self.taken) >= self.stop_after


def context(prompt, output, matcher):
    return DraftContext("s", None, "", "", list(prompt), list(output), matcher, 0, SamplingParams(),
                        SequenceSpeculation())


def test_it_drafts_the_next_tokens_of_the_reference_and_leaves_the_matcher_as_found():
    refs = {(1, 2): [10, 11, 12, 13, 14]}
    m = Matcher()
    d = ReferenceDraft(refs).propose(context((1, 2), [10], m), 3)
    assert d.tokens == [11, 12, 13] and d.proposer == "draft" and d.q is None
    assert m.taken == []
    assert ReferenceDraft(refs).propose(context((1, 2), [10, 11, 12, 13, 14], m), 3) is None  # nothing left


@pytest.mark.parametrize("matcher, expected", [(Matcher(limit=13), [11, 12]), (Matcher(stop_after=1), [11])])
def test_it_stops_where_the_grammar_refuses_or_ends(matcher, expected):
    d = ReferenceDraft({(1,): [10, 11, 12, 13]}).propose(context((1,), [10], matcher), 8)
    assert d.tokens == expected and matcher.taken == []


def test_an_output_that_left_its_reference_or_an_unknown_prompt_gets_no_draft():
    refs = {(1,): [10, 11, 12]}
    assert ReferenceDraft(refs).propose(context((1,), [10, 99], Matcher()), 4) is None
    assert ReferenceDraft(refs).propose(context((2,), [10], Matcher()), 4) is None
