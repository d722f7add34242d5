"""``structspec bench heldout``: does the drafting policy ever lose, on traffic it was not tuned on?

For each model setup (profile x executor) and held-out workload (``heldout_workloads``: manifest, classify,
nested_tools), two ``bench decode`` runs of the same items, interleaved request by request (the machine's drift
biases no row): *cold* (the policy starts from an empty statistics book, as a fresh data directory) and *warm*
(every configuration first serves ``warm_requests`` more items of the workload, so the policy reads their
evidence). Configurations: off, ff, ff+ngram+history, all (the draft model, where the profile has one) and policy.

Per row: tokens/s, the ratio to ``off`` and to the best fixed configuration of the same run (the fastest of off,
ff, ff+ngram+history and all), target passes per token, validity, the share finished, and the policy's decisions.
The goal: policy >= 1.0x off and >= 0.95x the best fixed configuration in every row. The ratios are also given
over the requests *every* configuration finished (``finished_by_all``): where near-ties send one configuration's
output of a request into a loop until ``max_tokens`` (a failed request, whose repeated tokens copy lookup drafts
at near-full acceptance), tokens/s over all requests rewards the loop; over the requests all finished, each
configuration is timed on the same work. Beside them, the step profile
each setup's policy priced drafts with (``models.step_profile``): a k-row step's cost in plain decode steps.

The report (JSON, and a table beside it) is rewritten after every run, so a long run interrupted keeps what it has.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from structspec.bench.decode_bench import run_decode_bench
from structspec.bench.heldout_workloads import HELDOUT_WORKLOADS
from structspec.bench.ratio_interval import paired_ratio
from structspec.models import step_profile

FIXED = ("off", "ff", "ff+ngram+history", "all")
CONFIGS = (*FIXED, "policy")
SETUPS = ("gemma-3-270m:llamacpp", "gemma-3-270m:transformers", "smollm2:llamacpp", "demo:transformers")
MAX_TOKENS = {"manifest": 288, "classify": 48, "nested_tools": 224}
REQUESTS_FACTOR = {"classify": 3}  # short outputs: more of them, so a row's time is not one prefill's noise


def run_policy_heldout(out: Path, setups: Sequence[str] = SETUPS, workloads: Sequence[str] = HELDOUT_WORKLOADS,
                       requests: int = 8, warm_requests: int = 16, log: Callable[[str], None] = print,
                       requests_for: dict[str, int] | None = None) -> dict[str, Any]:
    """Every (setup, workload), cold then warm; the report written to ``out`` (and ``out.with_suffix('.txt')``)
    after each run. ``requests_for``: per setup, another number of measured requests (a slow executor's); the
    short-output workload runs ``REQUESTS_FACTOR`` times as many."""
    report: dict[str, Any] = {"requests": requests, "warm_requests": warm_requests, "configs": list(CONFIGS),
                              "rows": [], "profiles": {}, "started": time.time()}
    for setup in setups:
        profile, _, executor = setup.partition(":")
        n = (requests_for or {}).get(setup, requests)
        for workload in workloads:
            for phase, warm in (("cold", 0), ("warm", warm_requests)):
                count = n * REQUESTS_FACTOR.get(workload, 1)
                log(f"{setup} {workload} {phase}: {count} requests")
                started = time.perf_counter()
                bench = run_decode_bench(profile, workload, 1, requests=count, max_tokens=MAX_TOKENS[workload],
                                         configs=CONFIGS, executor=executor or "auto", warmup_requests=warm,
                                         interleave=True, block=2, save_outputs=True)
                report["rows"].append(summarize_run(setup, workload, phase, bench, time.perf_counter() - started))
                for key, prof in step_profile._MEMORY.items():  # noqa: SLF001 - what the policy rows priced with
                    report["profiles"][key] = prof.to_json()
                _write(report, out)
    return report


def summarize_run(setup: str, workload: str, phase: str, bench: dict[str, Any], seconds: float) -> dict[str, Any]:
    """One (setup, workload, phase): each configuration's figures and the policy's ratios."""
    rows = {r["config"]: r for r in bench["runs"]}
    rate = {c: r.get("tokens_per_s", 0.0) for c, r in rows.items() if "error" not in r}
    fixed = {c: v for c, v in rate.items() if c in FIXED}
    best = max(fixed, key=lambda c: fixed[c]) if fixed else ""
    policy = rows.get("policy", {})
    out = {"setup": setup, "workload": workload, "phase": phase, "seconds": round(seconds, 1), "best_fixed": best,
           "configs": {c: {k: r.get(k) for k in ("tokens_per_s", "speedup_vs_off", "forward_passes_per_token",
                                                "valid_rate", "stop_rate", "field_accuracy", "acceptance",
                                                "output_tokens", "error")} for c, r in rows.items()}}
    if rate.get("policy") and rate.get("off") and best:
        out["policy_vs_off"] = rate["policy"] / rate["off"]
        out["policy_vs_best"] = rate["policy"] / fixed[best]
    out["finished_by_all"] = finished_by_all(rows)
    if best:
        out["intervals"] = ratio_intervals(rows, best)
    out["policy_decisions"] = _decisions(policy)
    return out


def finished_by_all(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Tokens/s per configuration over the requests every configuration finished (stopped before ``max_tokens``),
    from each request's own latency, and the policy's ratios to off and to the best fixed configuration there."""
    outputs = {c: r["outputs"] for c, r in rows.items() if "error" not in r and r.get("outputs")}
    if not outputs or len({len(o) for o in outputs.values()}) != 1:
        return {}
    common = [i for i in range(len(next(iter(outputs.values())))) if all(o[i]["stop"] for o in outputs.values())]
    rate = {}
    for c, o in outputs.items():
        seconds = sum(o[i]["latency_s"] for i in common)
        rate[c] = sum(len(o[i]["token_ids"]) for i in common) / seconds if seconds else 0.0
    out: dict[str, Any] = {"requests": len(common), "tokens_per_s": rate}
    fixed = {c: v for c, v in rate.items() if c in FIXED}
    if rate.get("policy") and rate.get("off") and fixed:
        best = max(fixed, key=lambda c: fixed[c])
        out.update(best_fixed=best, policy_vs_off=rate["policy"] / rate["off"], policy_vs_best=rate["policy"] / fixed[best])
    return out


def ratio_intervals(rows: dict[str, dict[str, Any]], best: str) -> dict[str, dict[str, float]]:
    """The policy's tokens/s over off's and over the best fixed configuration's, each with its paired bootstrap
    interval over the row's requests (``bench.ratio_interval``): how far one run of a few requests resolves them."""
    policy = (rows.get("policy") or {}).get("outputs")
    out = {}
    for name, base in (("off", "off"), ("best", best)):
        other = (rows.get(base) or {}).get("outputs")
        if not policy or not other or len(other) != len(policy):
            continue
        interval = paired_ratio([len(o["token_ids"]) for o in policy], [o["latency_s"] for o in policy],
                                [len(o["token_ids"]) for o in other], [o["latency_s"] for o in other])
        if interval is not None:
            out[name] = asdict(interval)
    return out


def _decisions(row: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for schema in (row.get("by_schema") or {}).values():
        for reason, n in (schema.get("decisions") or {}).items():
            counts[reason] = counts.get(reason, 0) + n
    return counts


def _write(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".txt").write_text(format_table(report))


def format_table(report: dict[str, Any]) -> str:
    """A Markdown table: one line per (setup, workload, phase), tokens/s per configuration, the policy's ratios."""
    head = ("| setup | workload | phase | " + " | ".join(CONFIGS) + " | policy/off | policy/best | best fixed "
            "| finished by all: requests, policy/off, policy/best | policy/best, 95% interval |")
    lines = [head, "|" + "---|" * (len(CONFIGS) + 8)]
    for r in report["rows"]:
        cells = []
        for c in CONFIGS:
            row = r["configs"].get(c, {})
            cells.append("err" if row.get("error") else f"{row.get('tokens_per_s') or 0:.1f}")
        fin = r.get("finished_by_all") or {}
        finished = (f"{fin['requests']}, {fin['policy_vs_off']:.2f}, {fin['policy_vs_best']:.2f}"
                    if "policy_vs_best" in fin else "-")
        best = (r.get("intervals") or {}).get("best")
        interval = f"{best['low']:.2f}-{best['high']:.2f}" if best else "-"
        lines.append(f"| {r['setup']} | {r['workload']} | {r['phase']} | " + " | ".join(cells) +
                     f" | {r.get('policy_vs_off', 0):.2f} | {r.get('policy_vs_best', 0):.2f} | {r['best_fixed']} "
                     f"| {finished} | {interval} |")
    lines += ["", "Step profiles (a k-row step in plain decode steps, full output head; batch 1):", ""]
    for key, prof in report.get("profiles", {}).items():
        full = {(b, k): s for b, k, s in prof["full"]}
        plain = full.get((1, 0))
        if plain:
            ratios = ", ".join(f"k={k} {full[(1, k)] / plain:.2f}x" for b, k in sorted(full) if b == 1 and k)
            lines.append(f"- {key.split('|')[0]} on {key.split('|')[1]}: plain {plain * 1000:.1f} ms; {ratios}")
    return "\n".join(lines) + "\n"
