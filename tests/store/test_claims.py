"""A legacy key's rows claimed by the engine that starts under its name (``SQLStore.claim``, on SQLite and
PostgreSQL: ``backend``): every kind of row moves, counters add up, nothing is lost and nothing is claimed twice."""

from __future__ import annotations

from structspec.stats.counters import Reason, Series
from structspec.stats.legacy_keys import claims
from tests.store.test_samples_and_changes import reject

NEW = "gemma@f00d+plain-v3"  # where the bare name's statistics go (the wording they were measured under)
HISTORY = "gemma@f00d+plain-v4"  # the claimer's history
TOOLS = "gemma@f00d+format-unknown"


def requests(counters, model):
    return sum(v for k, v in counters.items() if k.model == model and k.series == Series.REQUESTS)


def gemma(stored):
    return claims(stored, "gemma", "f00d", "plain-v4")


async def test_every_row_of_a_legacy_key_moves_to_the_claimers_keys(backend) -> None:
    s = await backend.open()
    old, already = s.stats.recorder("gemma"), s.stats.recorder(NEW)
    for rec in (old, old, already):
        rec.record_request("inv@1", 10, 4, 2, "stop", 12.0)
    assert reject(s, model="gemma")
    old.record_policy("inv@1", {"ngram": Reason.COLD}, 1, {}, 0.55)
    assert old.record_traffic("inv@1", [1, 2, 3], [4, 5], "stop")
    s.append_history("gemma", "inv@1", '{"a": 1}', 1.0)
    s.append_history("gemma", "tok|tools:ab12", '{"name": "f"}', 2.0)
    s.append_history("other", "inv@1", '{"b": 2}', 3.0)
    await s.flush()

    done = await s.claim(gemma)
    assert [(c.old, c.statistics) for c in done] == [("gemma", NEW)]
    counters = await s.read_counters(0)
    assert requests(counters, NEW) == 3 and requests(counters, "gemma") == 0  # summed into the new key's
    assert [r.model for r in await s.read_rejected_drafts()] == [NEW]
    assert [c.model for c in await s.read_policy_changes()] == [NEW]
    assert [t.model for t in await s.read_traffic_samples()] == [NEW]
    assert await s.load_history(HISTORY, 64, 64) == [("inv@1", '{"a": 1}')]
    assert await s.load_history(TOOLS, 64, 64) == [("tok|tools:ab12", '{"name": "f"}')]
    assert await s.load_history("gemma", 64, 64) == []
    assert await s.load_history("other", 64, 64) == [("inv@1", '{"b": 2}')]  # another name's: untouched
    assert await s.claim(gemma) == []  # claimed once
    await s.close()

    s2 = await backend.open()  # and it is stored: a restart reads the moved rows
    await s2.refresh_stats()
    assert requests(s2.stats.rows_for(NEW, "inv@1"), NEW) == 3
    await s2.close()


async def test_a_sample_slot_the_new_key_holds_is_kept(backend) -> None:
    s = await backend.open()
    assert reject(s, model="gemma", target=1) and reject(s, model=NEW, target=2)  # both in slot 0 of this hour
    await s.flush()
    await s.claim(gemma)
    assert [(r.model, r.target_token) for r in await s.read_rejected_drafts()] == [(NEW, 2)]
    await s.close()


async def test_two_replicas_claiming_at_once_move_the_rows_once(backend) -> None:
    """Replicas of one model start together: each claims, and the counters are moved once, not summed twice."""
    import asyncio

    s = await backend.open()
    old = s.stats.recorder("gemma")
    for i in range(200):
        old.record_request(f"inv@{i}", 10, 4, 2, "stop", 12.0)
    await s.flush()
    a, b = await backend.open(), await backend.open()
    await asyncio.gather(a.claim(gemma), b.claim(gemma))
    counters = await s.read_counters(0)
    assert requests(counters, NEW) == 200 and requests(counters, "gemma") == 0
    for store in (s, a, b):
        await store.close()
