"""Re-run vs shipped figures: what counts as "within noise"."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from structspec.demo.compare import compare, main, proportion_tolerance
from structspec.models.profiles import get_profile


def _shipped() -> dict:
    return json.loads((Path(get_profile("demo").target).parent / "figures.json").read_text())


def _rows(a: dict, b: dict) -> dict:
    return {r.figure: r for r in compare(a, b)}


def test_the_shipped_figures_reproduce_themselves():
    shipped = _shipped()
    assert all(r.ok for r in compare(shipped, copy.deepcopy(shipped)))


def test_tolerance_is_three_standard_errors_of_a_difference_of_proportions():
    # p = 0.9 on 976 fields each: 3 * sqrt(0.09 * 2 / 976) = 0.0407
    assert math.isclose(proportion_tolerance(0.9, 976, 0.9, 976), 3 * math.sqrt(0.09 * 2 / 976))
    assert proportion_tolerance(0.9, 10_000, 0.9, 10_000) < proportion_tolerance(0.9, 100, 0.9, 100)


def test_a_field_accuracy_outside_the_noise_fails_and_says_why():
    shipped = _shipped()
    tol = proportion_tolerance(shipped["target"]["field_accuracy"], shipped["target"]["fields"],
                               shipped["target"]["field_accuracy"], shipped["target"]["fields"])
    near, far = copy.deepcopy(shipped), copy.deepcopy(shipped)
    near["target"]["field_accuracy"] = min(1.0, shipped["target"]["field_accuracy"] + tol / 2)
    far["target"]["field_accuracy"] = shipped["target"]["field_accuracy"] - 2 * tol
    assert _rows(shipped, near)["field accuracy"].ok
    row = _rows(shipped, far)["field accuracy"]
    assert not row.ok and "differs by" in row.why and "outside the goal" in row.why


def test_a_run_below_the_goal_fails_even_within_noise():
    a, b = _shipped(), _shipped()
    a["target"]["valid_json_rate"], b["target"]["valid_json_rate"] = 0.95, 0.94
    row = _rows(a, b)["valid JSON rate"]
    assert not row.ok and "re-run 0.940 outside the goal" in row.why


def test_another_recipe_is_not_a_rerun():
    a, b = _shipped(), _shipped()
    b["params"]["target"] += 1
    b["plan"]["target_steps"] += 1
    rows = _rows(a, b)
    assert not rows["target parameters"].ok and not rows["plan"].ok and rows["draft parameters"].ok


def test_timing_tolerance_and_the_5x_goal():
    a, b = _shipped(), _shipped()
    b["decode_step_ratio"] = a["decode_step_ratio"] * 1.2
    assert _rows(a, b)["target step / draft step"].ok
    b["decode_step_ratio"] = a["decode_step_ratio"] * 0.5
    assert not _rows(a, b)["target step / draft step"].ok


def test_cli_exit_status(tmp_path, capsys):
    shipped = _shipped()
    bad = copy.deepcopy(shipped)
    bad["freetext_greedy_agreement"] = 0.99  # a copy of the target, not a draft
    (tmp_path / "a.json").write_text(json.dumps(shipped))
    (tmp_path / "b.json").write_text(json.dumps(bad))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "draft/target agreement" in out
