"""The held-out policy benchmark's arithmetic: the ratios over the requests every configuration finished."""

from __future__ import annotations

import pytest

from structspec.bench.policy_heldout import finished_by_all, format_table


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
