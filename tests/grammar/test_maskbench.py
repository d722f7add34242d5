"""A fast MaskBench subset: real-world schemas and instances, walked token by token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from structspec.bench.grammar_bench import (
    format_table,
    run_grammar_bench,
    select_files,
    split_of,
)

MASKBENCH = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "maskbench"
needs_maskbench = pytest.mark.skipif(not MASKBENCH.is_dir(), reason=f"MaskBench data not found at {MASKBENCH}")


def test_split_names():
    assert split_of("Github_easy---o10094.json") == "Github_easy"
    assert split_of("BFCL_parallel_multiple_12.json") == "BFCL_parallel_multiple"
    assert split_of("Glaiveai2K---calculate_area_27950976.json") == "Glaiveai2K"


@needs_maskbench
def test_sampling_covers_every_split():
    files = select_files(MASKBENCH, limit=30)
    assert len(files) == 30
    assert len({split_of(f.name) for f in files}) >= 10


@needs_maskbench
def test_llguidance_subset(view):
    report = run_grammar_bench(MASKBENCH, "llguidance", view, limit=60)
    overall = report["overall"]
    assert overall["schemas"] == 60 and overall["crashed"] == 0 and overall["timed_out"] == 0
    assert overall["compiled"] >= 54
    assert overall["invalidation_errors"] == 0
    assert overall["validation_errors"] <= max(1, overall["valid_instances"] // 20)
    assert 0 < overall["ff_share"] < 1 and overall["mask_us_p50"] > 0
    json.dumps(report)  # the CLI writes it as JSON
    assert "overall" in format_table(report)


@needs_maskbench
def test_outlines_subset(view):
    report = run_grammar_bench(MASKBENCH, "outlines", view, split_prefix="BFCL_simple", limit=20)
    overall = report["overall"]
    assert overall["crashed"] == 0 and overall["compiled"] >= 18
    assert overall["invalidation_errors"] == 0
