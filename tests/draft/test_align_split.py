"""The alignment's data, without models: the held-out split by a hash of the request (deterministic, the share asked
for, duplicates on one side once), and rejected drafts as short examples (the draft model's only, none that a
held-out request contains)."""

from __future__ import annotations

import random

from structspec.draft.align import rejected_examples, split, traffic_examples
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import TrafficSample


def sample(prompt, output, slot=0, key="s@1") -> TrafficSample:
    return TrafficSample("m", key, 0, slot, 0.0, tuple(prompt), tuple(output), "stop")


def rejected(context, draft, position, target, proposer="draft") -> RejectedDraft:
    return RejectedDraft("m", "s@1", proposer, 0, 0, 0.0, 1, tuple(context), "", tuple(draft), "", position,
                         draft[position], "", target, "", True)


def test_the_split_is_a_deterministic_share_and_duplicates_count_once():
    r = random.Random(0)
    traffic = [sample([r.randrange(100) for _ in range(8)], [r.randrange(100) for _ in range(4)], i)
               for i in range(2000)]
    train, held = split(traffic, 0.2)
    assert 0.17 < len(held) / 2000 < 0.23 and len(train) + len(held) == 2000
    assert split(list(reversed(traffic)), 0.2)[1] == list(reversed(held))  # order does not move a request
    twice = traffic[:50] + [sample(t.prompt_tokens, t.output_tokens, 999) for t in traffic[:50]]
    a, b = split(twice, 0.5)
    assert len(a) + len(b) == 50
    (ex,) = traffic_examples(traffic[:1], lambda t: None)
    assert ex.ids == traffic[0].ids and ex.start == 8 and ex.learned == 4 and ex.tag == "s@1"


def test_rejected_drafts_become_short_examples_unless_held_out_or_not_the_draft_models():
    held = [sample(range(10, 50), [1, 2, 3])]
    kept = rejected(range(100, 132), [7, 8, 9], 1, 5)
    examples = rejected_examples([kept, rejected(range(100, 132), [7, 8], 0, 5, proposer="ngram"),
                                  rejected(range(20, 45), [45, 46, 99], 2, 47)], held, 0.5)
    (ex,) = examples  # the ngram one is not the draft model's; the third is inside the held-out request (20..47)
    assert ex.ids == tuple(range(100, 132)) + (7, 5) and ex.start == 32 and ex.learned == 2 and ex.weight == 0.5
