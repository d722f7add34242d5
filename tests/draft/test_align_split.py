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


class _Store:
    """What ``read_traffic`` reads of a store: samples, rejected drafts, registered schemas."""

    def __init__(self, traffic, rejected_drafts):
        self.traffic, self.rejected = traffic, rejected_drafts

    async def read_traffic_samples(self, model=None, schema_key=None, limit=1000):
        return [t for t in self.traffic if model is None or t.model == model][:limit]

    async def read_rejected_drafts(self, model=None, schema_key=None, proposer=None, limit=1000):
        return [r for r in self.rejected if schema_key is None or r.schema_key == schema_key][:limit]

    async def get_schema(self, schema_id, version=None):
        from types import SimpleNamespace

        return SimpleNamespace(schema_id=schema_id, version=version or 1, schema_json='{"type": "object"}')


def test_since_aligns_to_the_recent_traffic_and_keeps_the_earlier_and_the_other_schemas():
    import asyncio
    import dataclasses

    import pytest

    from structspec.draft.align import AlignError, read_traffic

    def at(t, when, key="s@1"):
        return dataclasses.replace(t, created_at=when, schema_key=key)

    old = [at(sample([i, 1, 2], [3]), 100.0) for i in range(3)]
    new = [at(sample([i, 5, 6], [7]), 200.0 + i) for i in range(4)]
    other = [at(sample([i, 8, 9], [9]), 250.0, "t@1") for i in range(2)]
    rej = [dataclasses.replace(rejected(range(32), [7, 8], 0, 5), created_at=when) for when in (150.0, 210.0)]
    store = _Store(old + new + other, rej)
    traffic, kept, rejected_, schemas = asyncio.run(read_traffic(store, "m", "s@1", 100, since=200.0))
    assert traffic == new and kept == old + other  # the schema's earlier style is kept, as the other schemas are
    assert [r.created_at for r in rejected_] == [210.0] and set(schemas) == {"s@1", "t@1"}
    traffic, kept, *_ = asyncio.run(read_traffic(store, "m", "s@1", 100))
    assert traffic == old + new and kept == other
    traffic, kept, *_ = asyncio.run(read_traffic(store, "m", None, 100, since=250.0))
    assert traffic == other and kept == old + new
    with pytest.raises(AlignError, match=r"no traffic samples of schema s@1 since 1970-01-01 00:05:00 UTC"):
        asyncio.run(read_traffic(store, "m", "s@1", 100, since=300.0))


def test_since_reads_seconds_iso_times_and_ages():
    import pytest

    from structspec.cli_draft import parse_since

    now = 1_800_000_000.0
    assert parse_since("1700000000", now) == 1_700_000_000.0
    assert parse_since("90m", now) == now - 5400 and parse_since("6h", now) == now - 21600
    assert parse_since("1.5d", now) == now - 129600 and parse_since("30s", now) == now - 30
    assert parse_since("2026-12-01T08:00:00", now) == parse_since("2026-12-01T08:00:00+00:00", now) == 1_796_112_000.0
    assert parse_since("2026-12-01T09:00:00+01:00", now) == 1_796_112_000.0
    with pytest.raises(ValueError, match="unix seconds, an ISO 8601 time"):
        parse_since("yesterday", now)
