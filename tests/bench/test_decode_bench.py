"""The decode benchmark's report: every configuration on the same prompts, ratios within the run."""

from __future__ import annotations

import json

import pytest

from structspec.bench import decode_bench
from structspec.bench.compare import compare_outputs
from structspec.bench.decode_bench import ExecutorTime, executor_summary, format_table, run_decode_bench, to_json


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


def written(row: dict) -> list[tuple]:
    """A row's saved outputs as written (text, tokens, stopped), without their timings."""
    return [(o["text"], o["token_ids"], o["stop"]) for o in row["outputs"]]


def test_saved_outputs_compare_token_for_token():
    report = run_decode_bench("demo", "extraction", requests=2, max_tokens=64, configs=("off", "ff"),
                              save_outputs=True)
    off, ff = report["runs"]
    assert len(off["outputs"]) == 2 and all(o["token_ids"] and o["text"] for o in off["outputs"])
    assert written(off) == written(ff)  # greedy: fast-forward never changes the text
    assert all(o["latency_s"] > 0 for o in off["outputs"])  # each request's own time (``bench heldout`` reads it)
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
    assert written(off) == written(policy)  # greedy: the policy changes the speed, never the text
    table = format_table(report)
    assert "per phase" in table and "per schema" in table


def test_llamacpp_executor_rows_say_where_the_time_goes():
    """--executor llamacpp: engine rows split each forward's time into llama.cpp's and the engine's; llama.cpp's own
    baselines refuse a GGUF without a vocabulary (the demo pair's), in their row, naming why."""
    from tests.conftest import need_llamacpp

    need_llamacpp()
    report = run_decode_bench("demo", "extraction", requests=2, max_tokens=96, executor="llamacpp",
                              configs=("off", "ff", "llamacpp_generate", "hf_generate"))
    assert report["machine"]["executor"] == "llamacpp"
    off, ff, generate, hf = report["runs"]
    for row in (off, ff):
        assert "error" not in row and row["valid_rate"] == 1.0
        ex = row["executor"]
        assert ex["forward_calls"] >= row["forward_passes_per_token"] * row["output_tokens"] * 0.9
        assert ex["eval_ms_per_forward"] > 0 and ex["overhead_ms_per_forward"] >= 0
    assert ff["executor"]["forward_calls"] < off["executor"]["forward_calls"]
    assert "no vocabulary" in generate["error"] and "--executor transformers" in hf["error"]
    assert "eval ms/fwd" in format_table(report)


def test_llamacpp_baselines_on_gemma_and_their_ratios():
    """llama.cpp's own grammar-constrained, prompt-lookup and unconstrained generation on the profile's GGUF, from
    the prompt token ids the engine gets; the engine rows' ratios against them."""
    from tests.conftest import need_llamacpp

    need_llamacpp()
    from structspec.bench.llamacpp_baselines import run_llamacpp_baseline
    from structspec.bench.workloads import build_workload
    from structspec.models.loading import load_profile

    models = load_profile("gemma-3-270m", executor="llamacpp", with_draft=False)
    item = build_workload("extraction", 1, few_shot=3)[0]
    for mode in ("llamacpp_grammar", "llamacpp_grammar_lookup", "llamacpp_generate"):
        (rec,), wall = run_llamacpp_baseline(models, [item], 32, mode, schema_of=lambda i: i.schema,
                                             prompt_of=decode_bench._prompt_ids(models), record=decode_bench.Record)
        assert rec.output_tokens == 32 and not rec.stop and wall >= rec.latency_s > 0  # cut by the cap
        assert rec.prompt_tokens > 400 and rec.text
        if mode == "llamacpp_grammar_lookup":
            assert 2 < rec.forward_passes < 32  # the prompt in batches of 512, then drafts of up to 10 tokens
        else:
            assert 32 <= rec.forward_passes <= 34  # the prompt in batches of 512, then one decode per token
        if mode != "llamacpp_generate":
            assert rec.text.lstrip().startswith("{")  # its grammar holds from the first token
    runs = [{"config": "off", "concurrency": 1, "tokens_per_s": 60.0},
            {"config": "llamacpp_grammar", "concurrency": 1, "tokens_per_s": 20.0},
            {"config": "llamacpp_generate", "concurrency": 1, "tokens_per_s": 80.0}]
    decode_bench._add_ratios(runs)
    assert runs[0]["speedup_vs_llamacpp_grammar"] == 3.0 and runs[0]["speedup_vs_llamacpp_generate"] == 0.75


def test_the_overhead_is_the_wall_time_outside_the_models_evaluation():
    """llama_decode and the restricted output layer are the model's; the rest of the wall time is the engine's."""
    before = ExecutorTime(4, 0.5, 0.05, 10, 4, 2)
    after = ExecutorTime(14, 1.5, 0.25, 30, 14, 8)
    spent = after.since(before)
    assert (spent.forward_calls, spent.tokens, spent.rows, spent.restricted) == (10, 20, 10, 6)
    out = executor_summary(spent, wall_s=1.5)
    assert abs(out["eval_ms_per_forward"] - 100.0) < 1e-9 and abs(out["head_ms_per_forward"] - 20.0) < 1e-9
    assert abs(out["overhead_ms_per_forward"] - 30.0) < 1e-9  # 1.5 s - 1.0 s - 0.2 s over 10 forwards
    assert abs(out["overhead_share_of_eval"] - 0.25) < 1e-9  # 0.3 s of 1.2 s
    assert executor_summary(ExecutorTime(10, 1.0), wall_s=0.9)["overhead_ms_per_forward"] == 0.0


def test_the_perfect_draft_is_accepted_whole_and_bounds_the_draft_model():
    report = run_decode_bench("demo", "freetext", requests=6, max_tokens=96, configs=("all", "off", "perfect_draft"),
                              interleave=True, save_outputs=True, block=2)
    rows = {r["config"]: r for r in report["runs"]}
    perfect, all_, off = rows["perfect_draft"], rows["all"], rows["off"]
    assert written(perfect) == written(off)
    assert perfect["drafted"]["draft"] > 0 and perfect["accepted"]["draft"] == perfect["drafted"]["draft"]
    assert perfect["acceptance"]["draft"] == 1.0 > all_["acceptance"]["draft"]
    assert perfect["forward_passes_per_token"] < all_["forward_passes_per_token"]


def test_the_perfect_draft_needs_the_off_row_interleaved_and_greedy():
    import pytest

    for kwargs in ({"configs": ("perfect_draft",), "interleave": True}, {"configs": ("off", "perfect_draft")},
                   {"configs": ("off", "perfect_draft"), "interleave": True, "temperature": 0.5}):
        with pytest.raises(ValueError, match="perfect_draft"):
            run_decode_bench("demo", "freetext", requests=1, max_tokens=8, **kwargs)


def test_in_every_block_the_perfect_draft_runs_right_after_off_the_rest_rotating():
    from structspec.bench.decode_bench import _block_order

    names = ["perfect_draft", "all", "off", "ff"]
    orders = [_block_order(names, b) for b in range(4)]
    for order in orders:
        assert sorted(order) == sorted(names) and order[order.index("off") + 1] == "perfect_draft"
    assert len({o[0] for o in orders}) >= 3  # the turns still rotate
    assert _block_order(["all", "ff"], 1) == ["ff", "all"]


def test_the_chat_workload_is_free_text_with_speculation_and_refuses_json_baselines():
    report = run_decode_bench("demo", "chat", requests=3, max_tokens=32, configs=("off", "ff+ngram+history"),
                              interleave=True, save_outputs=True)
    rows = {r["config"]: r for r in report["runs"]}
    assert rows["off"]["valid_rate"] == 1.0  # every answer is text, ended or cut: none errored
    assert written(rows["off"]) == written(rows["ff+ngram+history"])  # greedy: drafting changes nothing
    assert sum(rows["ff+ngram+history"]["drafted"].values()) > 0
    with pytest.raises(ValueError, match="engine configurations only"):
        run_decode_bench("demo", "chat", requests=1, max_tokens=8, configs=("off", "hf_generate"))


def test_vllms_rows_are_measured_against_vllm_without_speculation_and_the_engines_against_its_own_off():
    runs = [{"config": c, "concurrency": 1, "tokens_per_s": tps, "outputs": [{"token_ids": ids}]}
            for c, tps, ids in (("off", 50.0, [1, 2]), ("ff", 100.0, [1, 2]), ("vllm:off", 80.0, [1, 3]),
                                ("vllm:structspec", 160.0, [1, 3]), ("vllm:ngram", 40.0, [1, 4]))]
    decode_bench._add_ratios(runs)
    decode_bench._add_identity(runs)
    by = {r["config"]: r for r in runs}
    assert by["ff"]["speedup_vs_off"] == 2.0 and by["vllm:structspec"]["speedup_vs_off"] == 2.0
    assert by["vllm:ngram"]["speedup_vs_off"] == 0.5
    assert by["vllm:structspec"]["same_as_off"] == 1.0 and by["vllm:ngram"]["same_as_off"] == 0.0
    assert by["ff"]["same_as_off"] == 1.0
