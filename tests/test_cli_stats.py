"""``structspec stats`` (``cli_stats``) printing the draft pricing per proposer: the decision and its numbers, the
prices by draft length, the same in ``--json``, and the report's table, from a store written here."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from typer.testing import CliRunner

from structspec.cli import app
from structspec.cli_stats import pricing_line
from structspec.front import views
from structspec.stats.counters import Reason
from structspec.store import open_store

runner = CliRunner()
KEY = "inline:cafe"


def record(data: Path) -> None:
    """A cold schema on a CPU-like profile (each drafted row costs a plain step's worth) that the policy priced
    out; copy@1 with copies accepted 3 in 4 on the same model, drafting."""

    async def write() -> None:
        store = open_store("", data)
        await store.open()
        rec = store.stats.recorder("cpu")
        rec.record_profile({**{("full", 1, k): 0.0142 * (1 + 0.9 * k) for k in (0, 1, 2, 4, 8)},
                            ("draft", 1, 1): 0.003})
        rec.record_decision(KEY, Reason.PRICED_OUT, {"ngram": Reason.PRICED_OUT})
        rec.record_request(KEY, 30, 20, 10, "stop", 300.0)
        await store.close()

    asyncio.run(write())


def test_stats_prints_each_proposers_decision_and_prices(tmp_path: Path) -> None:
    record(tmp_path)
    out = runner.invoke(app, ["stats", KEY, "--data-dir", str(tmp_path)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    line = next(t for t in out.output.splitlines() if t.startswith("ngram at batch 1"))
    assert line == ("ngram at batch 1: off (priced_out): cold, 0 of 500 drafted tokens, priced at acceptance 0.40 "
                    "(prior); plain step 14.2 ms; none pays by 5%, best k=1: 27.0 ms/step, 0.40 accepted -> "
                    "19.3 ms/token vs 14.2 ms plain")
    for heading in ("step / plain", "E[accepted]", "ms / token", "step from"):
        assert heading in out.output, heading
    assert "1.90" in out.output and "profile" in out.output  # k=1's step over the plain one, and where it came from
    as_json = runner.invoke(app, ["stats", KEY, "--data-dir", str(tmp_path), "--json"])
    (entry,) = json.loads(as_json.output)
    (pricing,) = entry["pricing"]
    assert (pricing["proposer"], pricing["chosen"], pricing["cold"], pricing["reason"]) == ("ngram", 0, True, "priced_out")
    assert [p["k"] for p in pricing["prices"]] == list(range(9)) and pricing["prices"][0]["step_source"] == "profile"


def test_the_line_of_a_measured_proposer_and_of_one_with_no_cost_known() -> None:
    prices = [views.DraftPrice(0, 0.010, 0.0, 0.0, 0.010, "served"),
              views.DraftPrice(1, 0.0105, 0.001, 0.9, 0.0115 / 1.9, "served"),
              views.DraftPrice(2, 0.011, 0.002, 1.7, 0.013 / 2.7, "profile")]
    state = views.ProposerPolicyState("draft", "on", "drafted", time.time(), time.time(), None, None, 0.9, 0.55, 2)
    measured = views.DraftPricing("draft", 2, 1000.0, 500, 0.9, False, 2, 0.05, prices, "drafted")
    assert pricing_line(measured, state) == (
        "draft at batch 2: on (drafted): 1000 drafted tokens read, acceptance 0.90 per examined token, priced at "
        "acceptance 0.90 (measured); plain step 10.0 ms; chose k=2: 11.0 ms/step + 2.0 ms drafting, 1.70 accepted -> "
        "4.8 ms/token vs 10.0 ms plain")
    unknown = views.DraftPricing("ngram", 1, 30.0, 500, 0.5, True, 8, 0.05,
                                 [views.DraftPrice(k, None, 0.0, 0.4 * k, None, "") for k in range(3)], "cold")
    assert pricing_line(unknown, None) == (
        "ngram at batch 1: on (cold): cold, 30 of 500 drafted tokens, priced at acceptance 0.40 (prior + 30 tokens "
        "of evidence); no step cost known (the cost model drafts k=8 to measure)")


def test_the_report_has_a_pricing_table_per_proposer() -> None:
    from structspec.report.page import _pricing_tables

    p = views.DraftPricing("ngram", 1, 0.0, 500, None, True, 0, 0.05,
                           [views.DraftPrice(0, 0.010, 0.0, 0.0, 0.010, "profile"),
                            views.DraftPrice(1, 0.019, 0.0, 0.4, 0.019 / 1.4, "profile")], "priced_out")
    page = _pricing_tables(views.SchemaStats(KEY, {}, "cpu", pricing=[p]))
    assert "ngram at batch \u22641 (the policy&#x27;s latest: priced_out)" in page
    assert "<th>step / plain</th>" in page and "1.90" in page and "13.6" in page
    assert "No proposer priced" in _pricing_tables(views.SchemaStats(KEY, {}, "cpu"))


def test_a_cold_proposers_line_says_what_its_replayed_drafts_measured(tmp_path: Path) -> None:
    """Drafts replayed on the schema's finished outputs (``speculation.replay``) move the acceptance it is priced
    at off the prior, and the line says so."""
    record(tmp_path)

    async def replays() -> None:
        store = open_store("", tmp_path)
        await store.open()
        store.stats.recorder("cpu").record_replay(KEY, "ngram", 1, [(8, 8)] * 30)
        await store.close()

    asyncio.run(replays())
    out = runner.invoke(app, ["stats", KEY, "--data-dir", str(tmp_path)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    line = next(t for t in out.output.splitlines() if t.startswith("ngram at batch 1"))
    assert "cold, 0 of 500 drafted tokens, priced at acceptance 0.73 (prior + 240 replayed at 1.00)" in line, line  # (30 + 0.4 x 24) / 54
