"""Rejected-draft samples: a uniform, bounded reservoir per key and hour; what a kept sample holds."""

from __future__ import annotations

import random
from collections import Counter

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR
from structspec.stats.samples import CONTEXT_TOKENS, RejectedDraftReservoir


def decode(ids):
    return "".join(f"<{i}>" for i in ids)


def test_a_kept_sample_holds_the_context_tail_the_draft_and_both_tokens():
    book = StatsBook(clock=lambda: 5 * HOUR + 12.0)
    rec = book.recorder("m")
    context = list(range(100, 150))
    assert rec.record_rejection("s@1", "ngram", 3, context, [7, 8, 9, 10], 2, 42, True, decode)
    (s,) = book.samples.pending()
    assert (s.model, s.schema_key, s.proposer, s.hour, s.slot, s.batch_bucket) == ("m", "s@1", "ngram", 5 * HOUR, 0, 4)
    assert s.context_tokens == tuple(context[-CONTEXT_TOKENS:]) and s.context_text == decode(context[-CONTEXT_TOKENS:])
    assert (s.draft_tokens, s.draft_text, s.position) == ((7, 8, 9, 10), "<7><8><9><10>", 2)
    assert (s.rejected_token, s.rejected_text, s.target_token, s.target_text) == (9, "<9>", 42, "<42>")
    assert s.grammatical and s.created_at == 5 * HOUR + 12.0


def test_nothing_refused_is_no_sample_and_a_failing_decode_never_raises():
    book = StatsBook(clock=lambda: HOUR)
    rec = book.recorder("m")
    assert not rec.record_rejection("s", "ngram", 1, [1], [5, 6], 1, 6, True, decode)  # the target chose the same
    assert not rec.record_rejection("s", "ngram", 1, [1], [5, 6], 2, 6, True, decode)  # past the draft
    assert not rec.record_rejection("s", "ngram", 1, [1], [5, 6], 0, 9, True, lambda ids: 1 / 0)
    assert book.samples.pending() == []


def test_the_reservoir_keeps_per_hour_samples_uniformly_and_restarts_each_hour():
    picks: Counter[int] = Counter()
    for trial in range(3000):
        sampler = RejectedDraftReservoir(per_hour=2, rng=random.Random(trial))
        kept = {}
        for i in range(10):
            slot = sampler.slot("m", "s", "ngram", 0)
            if slot is not None:
                kept[slot] = i
        assert set(kept) == {0, 1}
        picks.update(kept.values())
    # every rejection of the hour is kept with the same odds, 2 in 10 (600 of 3000 trials each)
    assert all(480 < picks[i] < 720 for i in range(10)), picks
    sampler = RejectedDraftReservoir(per_hour=2, rng=random.Random(0))
    assert [sampler.slot("m", "s", "p", 0) for _ in range(2)] == [0, 1]
    assert sampler.slot("m", "s", "p", HOUR) == 0  # a new hour, a new reservoir
    assert RejectedDraftReservoir(per_hour=0).slot("m", "s", "p", 0) is None  # off


def test_keys_are_bounded_and_a_replaced_slot_overwrites_the_unwritten_sample():
    sampler = RejectedDraftReservoir(per_hour=1, max_keys=3)
    assert [sampler.slot("m", f"inline:{i}", "p", 0) for i in range(5)] == [0, 0, 0, None, None]
    assert sampler.slot("m", "inline:9", "p", HOUR) == 0  # the past hour's keys are forgotten for the new one
    book = StatsBook(clock=lambda: 0.0, samples_per_hour=1)
    book.samples._rng = random.Random(1)
    rec = book.recorder("m")
    kept = [rec.record_rejection("s", "p", 1, [1], [2, 3], 0, 4 + i, True, decode) for i in range(50)]
    assert kept[0] and sum(kept) > 1
    (s,) = book.samples.take()
    assert s.target_token == 4 + max(i for i, k in enumerate(kept) if k)  # the last kept one
    book.samples.restore([s])
    assert book.samples.pending() == [s]
