"""A store with 30 simulated hours of two schemas' traffic: one whose copy-lookup acceptance drops and recovers (the
policy switches it off, then on), one short-output schema the policy never drafts for; with rejected drafts."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason, hour_of
from structspec.store.sqlite import SQLiteStore

HOURS = 30  # ending with the hour before this one
MODEL = "demo+draft:0123456789ab"
PLOTS = 5 * 2  # two schemas


async def _write(path: Path) -> None:
    START = hour_of(time.time()) - HOURS * HOUR
    clock = [float(START)]
    store = SQLiteStore(path, StatsBook(clock=lambda: clock[0], samples_per_hour=2))
    await store.open()
    rec = store.stats.recorder(MODEL)
    rng = random.Random(7)
    await store.put_schema("invoice", "{}", "h1", "", "api", clock[0])
    await store.put_schema("ticket_triage", "{}", "h2", "", "api", clock[0])
    for hour in range(HOURS):
        accept = 0.3 if 10 <= hour < 18 else 0.85  # the invoice traffic shifts, then comes back
        for i in range(12):
            clock[0] = START + hour * HOUR + i * 300
            ngram = Reason.LOW_ACCEPTANCE if 11 <= hour < 19 else Reason.DRAFTED if hour else Reason.COLD
            rec.record_policy("invoice@1", {"ngram": ngram, "draft": Reason.DRAFTED}, 1 + i % 3,
                              {"ngram": accept, "draft": 0.7}, 0.55)
            batch = 1 + i % 4
            for proposer, c in (("ngram", accept), ("draft", 0.7)):
                for _ in range(6):
                    k = 6
                    accepted = 0
                    while accepted < k and rng.random() < c:
                        accepted += 1
                    rec.record_verification("invoice@1", proposer, batch, k, accepted, False)
                    if accepted < k:
                        rec.record_rejection("invoice@1", proposer, batch, list(range(40)), [11, 12, 13, 14, 15, 16],
                                             accepted, 99, True, lambda ids: "".join(f"<{t}>" for t in ids))
                    rec.record_step(batch, k, 0.014)
                    rec.record_step(batch, 0, 0.010)
            out = rng.randint(60, 200)
            rec.record_request("invoice@1", out, int(out * (0.7 if accept > 0.5 else 0.95)), 10,
                               "length" if i == 11 else "stop", rng.uniform(300, 2500))
            rec.record_policy("ticket_triage@1", {"ngram": Reason.SHORT_OUTPUT}, 1, {}, 0.55)
            rec.record_request("ticket_triage@1", rng.randint(8, 14), 6, 4, "cancelled" if i == 5 else "stop",
                               rng.uniform(80, 200))
        await store.flush()
    await store.close()


def write_store(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(_write(data_dir / "structspec.db"))
    return data_dir

