"""`bench decode --data-dir` records each engine configuration's traffic in the store there, under its own model key,
so `structspec stats --data-dir` shows a benchmark as it shows a server."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from structspec.bench.decode_bench import run_decode_bench
from structspec.cli import app


def test_a_benchmark_is_inspected_like_a_server(tmp_path):
    report = run_decode_bench("demo", "extraction", requests=2, max_tokens=48, configs=("ff", "policy"),
                              data_dir=tmp_path)
    measured = {r["config"]: r["requests"] for r in report["runs"]}
    out = CliRunner().invoke(app, ["stats", "--data-dir", str(tmp_path), "--window", "1h", "--json"])
    assert out.exit_code == 0, out.output
    entries = json.loads(out.output)
    by_config: dict[str, int] = {}
    for e in entries:
        model, _, config = e["model"].partition("/bench:")
        assert model.startswith("demo") and config in measured
        by_config[config] = by_config.get(config, 0) + e["windows"]["3600"]["requests"]
    assert set(by_config) == {"ff", "policy"}
    assert all(by_config[c] >= measured[c] for c in measured)  # the measured requests and the warm-up ones
    policy = [e for e in entries if e["model"].endswith("/bench:policy")]
    assert any(e["policy"] for e in policy) and not any(e["policy"] for e in entries if e not in policy)
