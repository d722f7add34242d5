"""The store's rejected-draft samples and policy changes: persisted, bounded, pruned, read with the unwritten ones
(on SQLite and PostgreSQL: ``backend``); the SQLite file's migration from schema version 2."""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason, Series, hour_of
from structspec.stats.policy_states import OFF, ON
from structspec.stats.samples import KEEP_PER_KEY
from structspec.store import Store, StoreError
from structspec.store.sqlite import SQLiteStore
from tests.store.test_store import NOW, Clock, key, opened


def decode(ids):
    return " ".join(map(str, ids))


def reject(store: Store, schema: str = "inv@1", proposer: str = "ngram", target: int = 99, model: str = "m"):
    return store.stats.recorder(model).record_rejection(schema, proposer, 2, list(range(40)), [5, 6, 7], 1, target,
                                                        True, decode)


async def test_samples_survive_a_restart_and_unwritten_ones_are_read_too(backend) -> None:
    s = await backend.open()
    assert reject(s) and reject(s, proposer="draft") and reject(s, schema="other@1")
    (first,) = await s.read_rejected_drafts("m", "inv@1", "ngram")  # not flushed yet: read from memory
    await s.flush()
    assert await s.read_rejected_drafts("m", "inv@1", "ngram") == [first]
    assert reject(s, target=98)  # a second one in the same hour: the next slot
    await s.close()  # close flushes
    s2 = await backend.open()
    got = await s2.read_rejected_drafts("m", "inv@1")
    assert sorted((r.proposer, r.slot, r.target_token) for r in got) == [("draft", 0, 99), ("ngram", 0, 99),
                                                                        ("ngram", 1, 98)]
    r = next(x for x in got if x.slot == 1)
    assert (r.context_tokens, r.draft_tokens, r.rejected_token, r.rejected_text, r.target_text) == (
        tuple(range(8, 40)), (5, 6, 7), 6, "6", "98")
    assert [x.schema_key for x in await s2.read_rejected_drafts(limit=1)] == ["inv@1"]  # newest first
    assert await s2.read_rejected_drafts("other-model") == []
    await s2.close()


async def test_two_writers_and_a_restart_never_overwrite_each_others_slots(backend) -> None:
    """Replicas sharing a store, and a process restarted within the hour: each fills a reservoir of its own."""
    a, b = await backend.open(samples_per_hour=2), await backend.open(samples_per_hour=2)
    for s, first in ((a, 100), (b, 200)):
        assert reject(s, target=first) and reject(s, target=first + 1)  # slots 0 and 1 of the same hour, each
    await a.flush()
    await b.flush()
    assert sorted(r.target_token for r in await a.read_rejected_drafts("m", "inv@1")) == [100, 101, 200, 201]
    await a.close()
    a2 = await backend.open(samples_per_hour=2)  # a, restarted within the hour: its reservoir starts at slot 0 again
    assert reject(a2, target=300)
    await a2.flush()
    got = await b.read_rejected_drafts("m", "inv@1")
    assert sorted(r.target_token for r in got) == [100, 101, 200, 201, 300]
    assert sorted(r.slot for r in got) == [0, 0, 0, 1, 1]
    await a2.close()
    await b.close()


async def test_two_writers_samples_stay_uniform(backend) -> None:
    """Each writer's stored sample is a uniform one of the rejections it saw: 2 of an hour's 10, each kept with odds
    2 in 10 (30 of 150 trials); where writers shared slots, the second's flush overwrote the first's."""
    a, b = await backend.open(samples_per_hour=2), await backend.open(samples_per_hour=2)
    a.stats.samples._rng, b.stats.samples._rng = random.Random(1), random.Random(2)
    trials = 150
    for t in range(trials):  # one hour of one key per trial
        for s, first in ((a, 100), (b, 200)):
            for i in range(10):
                reject(s, schema=f"s{t}@1", target=first + i)
    await a.flush()
    await b.flush()
    rows = await a.read_rejected_drafts(limit=10 * trials)
    assert len(rows) == 4 * trials
    kept = Counter(r.target_token for r in rows)
    assert all(12 <= kept[first + i] <= 50 for first in (100, 200) for i in range(10)), kept
    await a.close()
    await b.close()


async def test_samples_are_bounded_per_key_and_pruned_with_their_hour(backend) -> None:
    clock = Clock(NOW - 400 * HOUR)
    s = await backend.open(clock=clock)
    s.stats.samples.per_hour = 1
    for _ in range(KEEP_PER_KEY + 30):  # one sample an hour, more hours than are kept
        clock.t += HOUR
        assert reject(s)
        if clock.t % (50 * HOUR) < HOUR:
            await s.flush()
    await s.flush()
    rows = await s.read_rejected_drafts("m", "inv@1", limit=1000)
    assert len(rows) == KEEP_PER_KEY and min(r.hour for r in rows) == hour_of(clock.t) - (KEEP_PER_KEY - 1) * HOUR
    removed = await s.prune(clock.t - 10 * HOUR)
    assert removed == KEEP_PER_KEY - 11 and len(await s.read_rejected_drafts("m", "inv@1", limit=1000)) == 11
    await s.close()


async def test_policy_changes_persist_and_seed_a_restarted_server(backend) -> None:
    clock = Clock()
    s = await backend.open(clock=clock)
    rec = s.stats.recorder("m")
    rec.record_policy("inv@1", {"ngram": Reason.COLD}, 1, {}, 0.55)
    clock.t += 60
    rec.record_policy("inv@1", {"ngram": Reason.LOW_ACCEPTANCE}, 1, {"ngram": 0.3}, 0.55)
    assert [c.state for c in await s.read_policy_changes("m", "inv@1")] == [ON, OFF]  # unwritten, read
    await s.close()

    s2 = await backend.open(clock=clock)
    changes = await s2.read_policy_changes()
    assert [(c.state, c.reason, c.previous, c.acceptance, c.threshold) for c in changes] == [
        (ON, Reason.COLD, "", None, 0.55), (OFF, Reason.LOW_ACCEPTANCE, ON, 0.3, 0.55)]
    await s2.refresh_stats()  # the server's start: the latest state per key seeds the book
    rec2 = s2.stats.recorder("m")
    clock.t += 60
    rec2.record_policy("inv@1", {"ngram": Reason.LOW_ACCEPTANCE}, 1, {"ngram": 0.3}, 0.55)
    assert s2.stats.policy.pending() == []  # not a switch: it was off before the restart
    rec2.record_policy("inv@1", {"ngram": Reason.DRAFTED}, 1, {"ngram": 0.7}, 0.55)
    (back_on,) = s2.stats.policy.pending()
    assert (back_on.previous, back_on.state) == (OFF, ON)
    # Past retention, all but the key's newest stored change go (a state unchanged since is still its state);
    # the unwritten one stays.
    assert await s2.prune(clock.t - 30) == 1
    await s2.close()
    s3 = await backend.open(clock=clock)
    assert [c.reason for c in await s3.read_policy_changes()] == [Reason.LOW_ACCEPTANCE, Reason.DRAFTED]
    assert await s3.prune(clock.t + 30) == 1  # now DRAFTED is the newest: LOW_ACCEPTANCE goes, DRAFTED stays
    assert [c.reason for c in await s3.read_policy_changes()] == [Reason.DRAFTED]
    await s3.close()


async def test_a_failed_write_keeps_samples_and_changes_for_the_next_flush(backend) -> None:
    s = await backend.open()
    reject(s)
    s.stats.recorder("m").record_policy("inv@1", {"ngram": Reason.COLD}, 1, {}, 0.55)
    await backend.execute("db", "DROP TABLE rejected_drafts")
    await backend.execute("db", "DROP TABLE policy_changes")
    with pytest.raises(StoreError):
        await s.flush()
    backlog = s.backlog()  # still waiting, counted
    assert (backlog.unwritten["samples"], backlog.unwritten["policy_changes"]) == (1, 1)


# -- migration from version 2 ---------------------------------------------------------------------

_V2_DDL = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE schema_ids (schema_id TEXT PRIMARY KEY, last_version INTEGER NOT NULL)",
    """CREATE TABLE schema_versions (
        schema_id TEXT NOT NULL, version INTEGER NOT NULL, schema_json TEXT NOT NULL,
        sha256 TEXT NOT NULL, description TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        source TEXT NOT NULL, speculation TEXT NOT NULL DEFAULT 'auto', PRIMARY KEY (schema_id, version))""",
    "CREATE INDEX schema_versions_hash ON schema_versions (schema_id, sha256)",
    """CREATE TABLE counters (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, hour BIGINT NOT NULL, series TEXT NOT NULL,
        proposer TEXT NOT NULL, batch_bucket INTEGER NOT NULL, label TEXT NOT NULL, value DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (model, schema_key, hour, series, proposer, batch_bucket, label))""",
    "CREATE INDEX counters_hour ON counters (hour)",
    """CREATE TABLE history (
        id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL, history_key TEXT NOT NULL,
        text TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX history_by_key ON history (model, history_key, id)",
)


async def test_migration_from_version_2(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path)
    for stmt in _V2_DDL:
        conn.execute(stmt)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    conn.execute("INSERT INTO schema_ids VALUES ('inv', 1)")
    conn.execute("INSERT INTO schema_versions VALUES ('inv', 1, '{}', 'h', '', 1.0, 'api', 'off')")
    conn.execute("INSERT INTO counters VALUES ('m', 'inv@1', ?, 'drafted', 'ngram', 1, '', 12.0)", (hour_of(NOW),))
    conn.execute("INSERT INTO history (model, history_key, text, created_at) VALUES ('m', 'inv@1', '{\"a\":1}', 2.0)")
    conn.commit()
    conn.close()

    s = await opened(path)
    assert s._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("5",)  # type: ignore[union-attr]
    assert (await s.read_counters(since=0)) == {key("m", "inv@1", Series.DRAFTED, proposer="ngram", bucket=1): 12.0}
    assert (await s.get_schema("inv", 1)).speculation == "off"  # type: ignore[union-attr]
    assert await s.load_history("m", 8, 8) == [("inv@1", '{"a":1}')]
    assert await s.read_rejected_drafts() == [] and await s.read_policy_changes() == []
    assert reject(s)
    s.stats.recorder("m").record_policy("inv@1", {"ngram": Reason.COLD}, 1, {}, 0.55)
    await s.close()
    s2 = SQLiteStore(path, StatsBook(clock=Clock()))
    await s2.open()  # the current version: nothing to migrate
    assert len(await s2.read_rejected_drafts()) == 1 and len(await s2.read_policy_changes()) == 1
    await s2.close()


# -- migration to version 5 -----------------------------------------------------------------------

_V4_SQLITE = {  # the reservoir tables as version 4 made them: a slot's key without its writer
    "rejected_drafts": """CREATE TABLE rejected_drafts (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, proposer TEXT NOT NULL, hour BIGINT NOT NULL,
        slot INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL, batch_bucket INTEGER NOT NULL,
        context_tokens TEXT NOT NULL, context_text TEXT NOT NULL, draft_tokens TEXT NOT NULL, draft_text TEXT NOT NULL,
        position INTEGER NOT NULL, rejected_token INTEGER NOT NULL, rejected_text TEXT NOT NULL,
        target_token INTEGER NOT NULL, target_text TEXT NOT NULL, grammatical INTEGER NOT NULL,
        PRIMARY KEY (model, schema_key, proposer, hour, slot))""",
    "traffic_samples": """CREATE TABLE traffic_samples (
        model TEXT NOT NULL, schema_key TEXT NOT NULL, hour BIGINT NOT NULL, slot INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, prompt_tokens TEXT NOT NULL, output_tokens TEXT NOT NULL,
        finish TEXT NOT NULL, PRIMARY KEY (model, schema_key, hour, slot))""",
}


async def test_migration_to_version_5(backend) -> None:
    """Rows version 4 wrote read back as they were written (text starting with the codec's marker included), and
    its reservoir rows (writer '') are overwritten by no writer's slot."""
    from structspec.store.text import MARK

    await (await backend.open()).close()
    for table, columns in (("rejected_drafts", "model, schema_key, proposer"), ("traffic_samples", "model, schema_key")):
        if backend.kind == "sqlite":
            await backend.execute("db", f"DROP TABLE {table}")
            await backend.execute("db", _V4_SQLITE[table])
        else:
            await backend.execute("db", f"ALTER TABLE {table} DROP COLUMN writer")  # its primary key went with it
            await backend.execute("db", f"ALTER TABLE {table} ADD PRIMARY KEY ({columns}, hour, slot)")
    ids = "'[1, 2]'" if backend.kind == "sqlite" else "'{1,2}'"
    hour = hour_of(NOW)
    true = "1" if backend.kind == "sqlite" else "TRUE"
    for sql in ((f"INSERT INTO rejected_drafts VALUES ('m', 'inv@1', 'ngram', {hour}, 0, {NOW}, 1, {ids}, '{MARK}old', "
                 f"{ids}, 'd', 0, 1, 'r', 2, 't', {true})"),
                f"INSERT INTO traffic_samples VALUES ('m', 'inv@1', {hour}, 0, {NOW}, {ids}, {ids}, 'stop')",
                f"INSERT INTO history (model, history_key, text, created_at) VALUES ('m', 'k', '{MARK}\"kept\"', 1.0)",
                "UPDATE meta SET value = '4' WHERE key = 'schema_version'"):
        await backend.execute("db", sql)

    s = await backend.open(samples_per_hour=1, traffic_per_hour=1)
    assert await s.load_history("m", 8, 8) == [("k", f'{MARK}"kept"')]  # as written, not taken for encoded text
    assert reject(s, target=50) and s.stats.recorder("m").record_traffic("inv@1", [1], [3], "stop")  # slot 0 again
    await s.close()
    s2 = await backend.open()
    samples = sorted(await s2.read_rejected_drafts("m"), key=lambda r: r.writer)
    assert (samples[0].writer, samples[0].slot, samples[0].context_text) == ("", 0, f"{MARK}old")
    assert len(samples) == 2 and samples[1].target_token == 50
    assert sorted(t.output_tokens for t in await s2.read_traffic_samples("m")) == [(1, 2), (3,)]
    await s2.close()
