"""The device check (bench/device_check.sh) as the CPU runs it: a tiny config, dummy weights, the demo tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from structspec.bench.device_bench import BATCHES, DRAFT_LENGTHS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_cpu_check_reports_every_batch_draft_length_and_a_perfect_draft(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run([str(ROOT / "bench" / "device_check.sh"), "--device", "cpu", "--tiny"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "device-tiny.json").read_text())
    assert report["load_format"] == "dummy" and report["device"] == "cpu"
    assert set(report["step_ms"]) == {str(b) for b in BATCHES}
    assert set(report["batch_ratio"]) == {f"c{b}/c1" for b in BATCHES if b != 1}
    assert set(report["verify_ms"]) == set(report["verify_ratio"]) == set(report["model_ceiling"]) \
        == {str(k) for k in DRAFT_LENGTHS}
    assert all(ms > 0 for ms in [*report["step_ms"].values(), *report["verify_ms"].values()])
    assert report["batch_ratio"]["c16/c1"] == report["step_ms"]["16"] / report["step_ms"]["1"]
    assert report["model_ceiling"]["4"] == 5 * report["step_ms"]["1"] / report["verify_ms"]["4"]
    ceiling = report["perfect_draft"]
    assert ceiling["workload"] == "freetext"
    assert ceiling["draft_acceptance"] == 1.0  # the target's own greedy output, whatever the weights
    assert ceiling["perfect_draft"]["forward_passes_per_token"] < ceiling["off"]["forward_passes_per_token"]
    assert (tmp_path / "device-tiny.txt").read_text().startswith("bench/device_configs/tiny")
    assert "done in" in (tmp_path / "device-check.log").read_text()


def test_step_timings_import_no_grammar_package():
    """A GPU machine may lack the engine's grammar packages (and the check may not carry them): the step timings
    must not need them."""
    code = ("import sys, structspec.bench.device_bench; "
            "print(sorted(m for m in ('llguidance', 'jsonschema_rs', 'outlines_core', 're2') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
