"""The decode benchmark's report: every configuration on the same prompts, ratios within the run."""

from __future__ import annotations

import json

from structspec.bench.decode_bench import format_table, run_decode_bench, to_json


def test_report_rows_ratios_and_table():
    report = run_decode_bench("demo", "extraction", concurrency=(1, 2), requests=3, max_tokens=96,
                              configs=("off", "ff", "hf_generate"))
    runs = report["runs"]
    assert [(r["config"], r["concurrency"]) for r in runs] == [("off", 1), ("ff", 1), ("hf_generate", 1),
                                                               ("off", 2), ("ff", 2)]  # HF only at 1
    for r in runs:
        assert "error" not in r, r
        assert r["requests"] == 3 and r["output_tokens"] > 0 and r["tokens_per_s"] > 0
        assert r["latency_ms_p50"] <= r["latency_ms_p99"]
    engine_rows = [r for r in runs if r["config"] != "hf_generate"]
    assert all(r["valid_rate"] == 1.0 for r in engine_rows)  # constrained: every output validates
    off1, ff1 = runs[0], runs[1]
    assert 0.9 <= off1["forward_passes_per_token"] <= 1.1  # one model decision per token
    assert ff1["forward_passes_per_token"] < off1["forward_passes_per_token"] and ff1["forced_share"] > 0
    assert off1["speedup_vs_off"] == 1.0 and abs(ff1["speedup_vs_off"] - ff1["tokens_per_s"] / off1["tokens_per_s"]) < 1e-9
    assert abs(runs[3]["speedup_vs_c1"] - runs[3]["tokens_per_s"] / off1["tokens_per_s"]) < 1e-9
    # same prompts, greedy: the configurations agree on what they extracted
    assert off1["field_accuracy"] == ff1["field_accuracy"] == runs[3]["field_accuracy"]
    assert json.loads(to_json(report))["runs"][0]["config"] == "off"
    table = format_table(report)
    assert "hf_generate" in table and "passes/tok" in table


def test_saved_outputs_compare_token_for_token():
    from structspec.bench.decode_bench import compare_outputs

    report = run_decode_bench("demo", "extraction", requests=2, max_tokens=64, configs=("off", "ff"),
                              save_outputs=True)
    off, ff = report["runs"]
    assert len(off["outputs"]) == 2 and all(o["token_ids"] and o["text"] for o in off["outputs"])
    assert off["outputs"] == ff["outputs"]  # greedy: fast-forward never changes the text
    assert compare_outputs(report, report) == []
    changed = json.loads(json.dumps(report))
    changed["runs"][1]["outputs"][1]["token_ids"][3] += 1
    assert compare_outputs(report, changed) == ["('ff', 1): request 1 differs from token 3"]
    del changed["runs"][0]["outputs"]
    assert "('off', 1): no saved outputs (run with --save-outputs)" in compare_outputs(report, changed)


def test_progress_is_reported_per_configuration_from_its_start():
    seen = []
    run_decode_bench("demo", "extraction", requests=2, max_tokens=48, configs=("off", "ff"),
                     progress=lambda *args: seen.append(args))
    for config in ("off", "ff"):
        mine = [(d, n) for c, level, d, n, _ in seen if c == config and level == 1]
        assert mine == [(0, 2), (1, 2), (2, 2)], seen
    assert all(tokens >= 0 for *_, tokens in seen) and seen[-1][-1] > 0


def test_interleaved_policy_rows_per_schema_and_phase():
    report = run_decode_bench("demo", "shift", requests=6, max_tokens=64, configs=("off", "policy"), interleave=True,
                              save_outputs=True)
    assert report["interleaved"]
    off, policy = report["runs"]
    assert (off["config"], policy["config"]) == ("off", "policy") and off["requests"] == policy["requests"] == 6
    assert list(policy["by_phase"]) == ["before", "shifted", "after"]
    assert all(p["requests"] == 2 for p in policy["by_phase"].values())
    assert set(policy["by_schema"]) == {"contact"}
    assert off["by_schema"]["contact"]["decisions"] == {"server_off": 6}
    assert sum(policy["by_schema"]["contact"]["decisions"].values()) == 6  # every request says why it drafted or not
    assert off["outputs"] == policy["outputs"]  # greedy: the policy changes the speed, never the text
    table = format_table(report)
    assert "per phase" in table and "per schema" in table
