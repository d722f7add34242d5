"""The held-out policy benchmark's arithmetic: the ratios over the requests every configuration finished."""

from __future__ import annotations

import numpy as np
import pytest

from structspec.bench.policy_heldout import finished_by_all, format_table, summarize_run


def run(stops: list[bool], latency: float, tokens: int) -> dict:
    return {"outputs": [{"token_ids": [0] * tokens, "latency_s": latency, "stop": s} for s in stops]}


def test_a_request_one_configuration_ran_to_the_cap_is_left_out_of_every_configuration():
    rows = {"off": run([True, True, False], 1.0, 10), "ff": run([True, False, True], 0.5, 10),
            "ff+ngram+history": run([True, True, True], 0.4, 10), "all": run([True, True, True], 0.25, 10),
            "policy": run([True, True, True], 0.5, 10)}
    rows["all"]["outputs"][2]["latency_s"] = 0.01  # fast on a request another configuration did not finish
    got = finished_by_all(rows)
    assert got["requests"] == 1  # only the first request finished everywhere
    assert got["tokens_per_s"]["all"] == pytest.approx(40.0)  # its fast third request does not count
    assert got["best_fixed"] == "all"
    assert got["policy_vs_off"] == pytest.approx(2.0) and got["policy_vs_best"] == pytest.approx(0.5)


def test_rows_without_outputs_or_of_unequal_length_give_nothing():
    assert finished_by_all({"off": {"tokens_per_s": 1.0}}) == {}
    assert finished_by_all({"off": run([True], 1.0, 1), "policy": run([True, True], 1.0, 1)}) == {}


def test_the_table_shows_the_finished_ratios():
    row = {"setup": "s", "workload": "w", "phase": "cold", "best_fixed": "ff", "policy_vs_off": 1.1,
           "policy_vs_best": 0.9, "configs": {"off": {"tokens_per_s": 1.0}},
           "finished_by_all": {"requests": 7, "policy_vs_off": 1.2, "policy_vs_best": 0.97}}
    assert "| 7, 1.20, 0.97 |" in format_table({"rows": [row]})


def test_a_row_carries_the_policys_ratio_intervals_and_the_table_shows_them():
    rng = np.random.default_rng(0)
    tokens = rng.integers(50, 300, 8)

    def config(speed: float) -> dict:
        return {"tokens_per_s": speed, "outputs": [{"token_ids": [0] * int(t), "latency_s": t / speed *
                                                    rng.lognormal(0, 0.05), "stop": True} for t in tokens]}
    bench = {"runs": [{"config": c, **config(v)} for c, v in
                      (("off", 20.0), ("ff", 30.0), ("ff+ngram+history", 40.0), ("all", 35.0), ("policy", 30.0))]}
    row = summarize_run("s", "w", "cold", bench, 1.0)
    best, off = row["intervals"]["best"], row["intervals"]["off"]
    assert best["low"] < 0.75 < best["high"] < 0.95 and off["low"] < 1.5 < off["high"]
    assert f"| {best['low']:.2f}-{best['high']:.2f} |" in format_table({"rows": [row]})
