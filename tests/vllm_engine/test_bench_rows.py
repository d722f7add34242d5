"""The decode benchmark's vLLM rows on vLLM's CPU build (the demo target): what ``bench decode --engine vllm``
measures is what it names."""

from __future__ import annotations

from tests.vllm_engine import need_vllm

need_vllm()

from structspec.bench.decode_bench import _run_engine, summarize  # noqa: E402
from structspec.bench.vllm_rows import VllmModel, run_vllm_row  # noqa: E402
from structspec.bench.workloads import build_workload  # noqa: E402
from structspec.engine.config import VllmOptions  # noqa: E402
from structspec.models.profiles import DEMO_DIR  # noqa: E402
from structspec.stats.book import StatsBook  # noqa: E402


def test_the_structspec_row_drafts_forced_tokens_and_its_proposers(monkeypatch):
    """``vllm:structspec``: forced tokens and both proposers' drafts reach vLLM and are counted (a row whose requests
    turned fast-forward off would count no forced token)."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    items = [i for i in build_workload("extraction", 12) if i.schema_name == "contact"][:3]  # one schema: history
    options = VllmOptions(max_model_len=768, extra='{"enforce_eager": true}')
    row = run_vllm_row("vllm:structspec", VllmModel(str(DEMO_DIR / "target")), "float32", options, StatsBook(),
                       items[1:], items[:1], (), 1, 128, 0.0, _run_engine, summarize, False)
    assert row["valid_rate"] == 1.0 and row["forced_share"] > 0.1, row
    assert set(row["drafted"]) == {"ngram", "history"} and row["forward_passes_per_token"] < 0.8, row
    assert row["vllm"]["model_key"].endswith("+vllm:structspec")
