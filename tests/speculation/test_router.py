"""The router's asking: what a lookup is charged, and when nobody is asked."""

from __future__ import annotations

import time

from structspec.engine.detok import OutputText
from structspec.engine.speculator import Draft
from structspec.engine.types import SpeculationReport
from structspec.speculation.configs import ProposerSet
from structspec.speculation.router import Router
from structspec.stats.counters import Reason
from tests.engine.fakes import ToyTokenizer, free_slots, make_seq


class _Proposals:
    def __init__(self) -> None:
        self.timed: list[tuple[str, float]] = []

    def record_proposal(self, proposer: str, asked: int, seconds: float, made: bool = True) -> None:
        self.timed.append((proposer, seconds))


def _router(monkeypatch, build_seconds: float) -> tuple[Router, list, _Proposals]:
    router = Router(ToyTokenizer(), ProposerSet(ngram=True, history=False, draft=False), vocab_size=16)
    built: list = []
    context = router._context

    def slow_context(seq):  # the output decoded and its JSON position: slow here, to be seen in the charge
        built.append(seq)
        time.sleep(build_seconds)
        return context(seq)

    stats = _Proposals()
    monkeypatch.setattr(router, "_context", slow_context)
    monkeypatch.setattr(router, "_stats", lambda seq: stats)
    return router, built, stats


def test_the_first_proposer_asked_pays_for_building_its_context(monkeypatch):
    """A lookup is timed from the start of ``Router.propose``: the context it needs is the cost of asking at all,
    so the cost model prices it (timing the proposer's own call alone left it out: 0.2 ms of a 4.9 ms step)."""
    router, built, stats = _router(monkeypatch, build_seconds=0.03)
    seq = make_seq([1, 2, 3, 1, 2], free_slots(4))
    seq.output, seq.text = [3], OutputText(router.tokenizer)
    seq.decision = SpeculationReport(True, Reason.DRAFTED, False, {"ngram": 4}, {"ngram": Reason.DRAFTED})
    router.propose(seq, 4)
    assert len(built) == 1 and [p for p, _ in stats.timed] == ["ngram"] and stats.timed[0][1] >= 0.03


def test_with_no_proposer_allowed_a_draft_nothing_is_built(monkeypatch):
    router, built, stats = _router(monkeypatch, build_seconds=0.0)
    seq = make_seq([1, 2, 3, 1, 2], free_slots(4))
    seq.output, seq.text = [3], OutputText(router.tokenizer)
    seq.decision = SpeculationReport(False, Reason.PRICED_OUT, False, {"ngram": 0}, {"ngram": Reason.PRICED_OUT})
    assert router.propose(seq, 4) is None and built == [] and stats.timed == []
    seq.decision = SpeculationReport(True, Reason.DRAFTED, False, {}, {}, restricted_max_draft={"ngram": 4})
    router.propose(seq, 4)  # a restricted cap alone: asked at a narrow position ...
    assert len(built) == 1
    assert router.propose(seq, 4, narrow=False) is None and len(built) == 1  # ... and not at a wide one


class _Lookup:
    """Copy lookup that drafts ``tokens`` under ``key`` (its own name, or its long matches')."""

    name = "ngram"

    def __init__(self, key: str, tokens: list[int]) -> None:
        self.key, self.tokens, self.asked = key, tokens, []

    def propose(self, ctx, k):
        self.asked.append(k)
        return Draft(self.tokens[:k], None, self.key)


def test_a_long_match_drafts_under_its_own_cap_and_a_short_one_not_where_only_that_is_allowed(monkeypatch):
    """The policy decides copy lookup's long matches apart (``ngram/long``): where only they may draft, a short
    match's draft is dropped, and a long one is cut at its own cap, however long the lookup was asked."""
    router, _, stats = _router(monkeypatch, build_seconds=0.0)
    seq = make_seq([1, 2, 3, 1, 2], free_slots(4))
    seq.output, seq.text = [3], OutputText(router.tokenizer)
    seq.decision = SpeculationReport(True, Reason.DRAFTED, False, {"ngram/long": 3},
                                     {"ngram": Reason.PRICED_OUT, "ngram/long": Reason.DRAFTED})
    router.ngram = short = _Lookup("ngram", [4, 5, 6, 7, 8])
    assert router.propose(seq, 8) is None and short.asked == [3]
    assert stats.timed and stats.timed[-1][0] == "ngram"  # its lookup charged to copy lookup, as every one
    router.ngram = _Lookup("ngram/long", [4, 5, 6, 7, 8])
    draft = router.propose(seq, 8)
    assert draft is not None and draft.tokens == [4, 5, 6] and draft.proposer == "ngram/long"
    # both allowed: asked as far as the longer cap, each draft cut at its own
    seq.decision = SpeculationReport(True, Reason.DRAFTED, False, {"ngram": 2, "ngram/long": 6},
                                     {"ngram": Reason.DRAFTED, "ngram/long": Reason.DRAFTED})
    router.ngram = short = _Lookup("ngram", [4, 5, 6, 7, 8])
    draft = router.propose(seq, 8)
    assert short.asked == [6] and draft is not None and draft.tokens == [4, 5]
