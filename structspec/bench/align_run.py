"""An alignment run: traffic of a style the draft never saw, ``structspec draft align`` on its first part,
acceptance before and after on the rest (and on the original traffic, for forgetting).

    python -m structspec.bench.align_run --out reports/gemma-align-run.json

The server records what it serves as it would (``record_traffic`` through the engine, into a
SQLite store, the schema registered so the draft's free-text positions are known): first the
original traffic (the benchmark's free-text documents sent to the summary schema), then the
shift: the same schema over the docstrings of Python's standard-library modules (technical
prose; the draft was distilled on invoices, tickets, events, listings and contacts). ``draft
align --since <the shift>`` runs as a user runs it, as a subprocess: it learns the shifted
traffic, replays the original and refuses a draft that forgets it. Then each draft serves the
held-out shifted requests and other original free-text items (neither recorded) with every
proposer on (``all``), and the draft's acceptance and the tokens/s are reported side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import importlib
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from structspec.assembly import AssemblyConfig, assemble_engine, engine_model_key
from structspec.bench.decode_bench import PERFECT_DRAFT, _block_order
from structspec.bench.perfect_draft import install_perfect_draft
from structspec.bench.workloads import build_workload
from structspec.engine.api import ExtractionRequest
from structspec.engine.config import SchedulerLimits
from structspec.engine.default_examples import build_example_book
from structspec.engine.types import SamplingParams
from structspec.models.loading import load_draft, load_profile
from structspec.models.profiles import get_profile
from structspec.prompts import encode_prompt, extraction_prompt
from structspec.schemas import load_builtin_schemas
from structspec.speculation.configs import ProposerSet
from structspec.stats.book import StatsBook
from structspec.store import open_store

SCHEMA = "summary"


def stdlib_documents(n: int, min_chars: int = 250, max_chars: int = 800) -> list[str]:
    """``n`` documents cut from the docstrings of the standard library's modules, in name order (deterministic):
    each docstring in pieces of whole sentences, ``min_chars`` to about ``max_chars`` long."""
    docs: list[str] = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in ("antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle"):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = importlib.import_module(name).__doc__ or ""
        except Exception:  # noqa: BLE001 - a module that does not import here is simply not used
            continue
        piece = ""
        for sentence in " ".join(doc.split()).replace(". ", ".\n").splitlines():
            piece = f"{piece} {sentence}".strip()
            if len(piece) >= max_chars - 200:
                docs.append(piece[:max_chars])
                piece = ""
        if len(piece) >= min_chars:
            docs.append(piece[:max_chars])
        if len(docs) >= n:
            break
    return docs[:n]


def _examples(models):
    return build_example_book(get_profile(models.profile).few_shot).for_schema(load_builtin_schemas()[SCHEMA])


def _serve(models, key: str, docs: list[str], recorder=None, max_tokens: int = 200, draft_model: bool = True,
           references: dict[tuple[int, ...], list[int]] | None = None) -> dict[str, Any]:
    """Copy lookup, history and the draft model on (``all``; ``draft_model`` False: ``ff+ngram+history``;
    ``references``: the perfect draft in the draft model's place, ``bench.perfect_draft``); the draft's
    drafted/accepted tokens and the tokens/s of ``docs``."""
    schema = load_builtin_schemas()[SCHEMA]
    examples = _examples(models)
    engine = assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(),
                             proposers=ProposerSet(True, True, draft_model or references is not None),
                             stats=recorder, seed=0))
    if references is not None:
        install_perfect_draft(engine, references, recorder)
    engine.start()

    async def run():
        out = []
        for doc in docs:
            req = ExtractionRequest(schema=schema, text=doc, examples=examples, schema_key=key,
                                    sampling=SamplingParams(max_tokens=max_tokens))
            out.append(await engine.extract(req))
        return out

    t0 = time.perf_counter()
    try:
        results = asyncio.run(run())
    finally:
        engine.stop()
    wall = time.perf_counter() - t0
    drafted = sum(r.usage.drafted.get("draft", 0) for r in results)
    accepted = sum(r.usage.accepted.get("draft", 0) for r in results)
    tokens = sum(r.usage.output_tokens for r in results)
    return {"requests": len(results), "output_tokens": tokens, "tokens_per_s": tokens / wall, "wall_s": wall,
            "draft_drafted": drafted, "draft_accepted": accepted,
            "draft_acceptance": accepted / drafted if drafted else None,
            "valid": sum(r.outcome.value == "valid" for r in results) / len(results),
            "outputs": [list(r.token_ids) for r in results]}


def prompt_ids(models, doc: str) -> tuple[int, ...]:
    """The prompt ids the engine builds for ``doc`` sent to the summary schema (``Engine.prepare_extraction``)."""
    return tuple(encode_prompt(models.tokenizer, extraction_prompt(load_builtin_schemas()[SCHEMA], doc, None,
                                                                    _examples(models))))


def measure_ceiling(models, key: str, docs: list[str], block: int = 10) -> dict[str, Any]:
    """``ff+ngram+history``, ``all`` and ``perfect_draft`` (the ceiling of any draft model: it drafts the first
    row's output of the same request) on ``docs``, in blocks of ``block`` requests, the first two taking turns;
    tokens/s over the sum of each row's blocks."""
    names = ["ff+ngram+history", "all", PERFECT_DRAFT]
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    references: dict[tuple[int, ...], list[int]] = {}
    for b, start in enumerate(range(0, len(docs), block)):
        chunk = docs[start: start + block]
        for name in _block_order(names, b, reference="ff+ngram+history"):
            served = _serve(models, key, chunk, draft_model=name == "all",
                            references=references if name == PERFECT_DRAFT else None)
            rows[name].append(served)
            if name == "ff+ngram+history":
                references.update((prompt_ids(models, d), o) for d, o in zip(chunk, served["outputs"]))
    out = {}
    for name, parts in rows.items():
        tokens, wall = sum(p["output_tokens"] for p in parts), sum(p["wall_s"] for p in parts)
        drafted, accepted = sum(p["draft_drafted"] for p in parts), sum(p["draft_accepted"] for p in parts)
        out[name] = {"requests": sum(p["requests"] for p in parts), "output_tokens": tokens, "wall_s": wall,
                     "tokens_per_s": tokens / wall, "draft_drafted": drafted, "draft_accepted": accepted,
                     "draft_acceptance": accepted / drafted if drafted else None}
    base = out["ff+ngram+history"]["tokens_per_s"]
    for row in out.values():
        row["x_ff_ngram_history"] = row["tokens_per_s"] / base
    return out


def run_alignment(out: Path, train: int = 120, held: int = 40, original: int = 30, steps: int = 300,
                  data_dir: Path | None = None, original_recorded: int = 60, replay_weight: float = 1.0,
                  lr: float | None = None) -> dict[str, Any]:
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="structspec-align-"))
    models = load_profile("gemma-3-270m", with_draft=True, executor="auto")
    if models.draft is None:
        raise SystemExit("gemma-3-270m has no draft here")
    model = engine_model_key(models)
    docs = stdlib_documents(train + held)
    shifted_train, shifted_held = docs[:train], docs[train:]
    pool = [it.source for it in build_workload("freetext", original + original_recorded)]
    originals, served_before = pool[:original], pool[original:]
    text = json.dumps(load_builtin_schemas()[SCHEMA], sort_keys=True, separators=(",", ":"))

    async def open_():
        store = open_store("", data_dir, StatsBook(traffic_per_hour=100_000))
        await store.open()
        rec, _ = await store.put_schema(SCHEMA, text, hashlib.sha256(text.encode()).hexdigest(), "", "api", 0.0)
        return store, f"{rec.schema_id}@{rec.version}"

    store, key = asyncio.run(open_())
    t0 = time.monotonic()
    recorded_before = _serve(models, key, served_before, store.stats.recorder(model))
    shift_at = time.time()
    recorded = _serve(models, key, shifted_train, store.stats.recorder(model))
    asyncio.run(store.close())
    t_record = time.monotonic() - t0
    before = {"shifted": _serve(models, key, shifted_held), "original": _serve(models, key, originals)}
    ceiling = measure_ceiling(models, key, shifted_held)
    aligned = data_dir / "aligned"
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "structspec.cli", "draft", "align", "--data-dir", str(data_dir), "--schema", key,
           "--model", model, "--profile", "gemma-3-270m", "--draft", get_profile("gemma-3-270m").draft, "--out",
           str(aligned), "--steps", str(steps), "--since", f"{shift_at:.3f}", "--replay-weight", str(replay_weight),
           *(["--lr", str(lr)] if lr is not None else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    t_align = time.monotonic() - t0
    report: dict[str, Any] = {"model": model, "schema_key": key, "command": " ".join(cmd[1:]),
                              "align_exit": proc.returncode, "align_stdout": proc.stdout[-4000:],
                              "align_stderr": proc.stderr[-2000:], "recorded": {k: v for k, v in recorded.items()
                                                                                if k != "outputs"},
                              "recorded_before_shift": {k: v for k, v in recorded_before.items() if k != "outputs"},
                              "seconds": {"record": t_record, "align": t_align}, "ceiling": {"shifted": ceiling}}
    if proc.returncode == 0:
        loaded = load_draft(str(aligned), models.tokenizer, "gemma-3-270m", models.executor, models.device,
                            models.dtype)
        new = dataclasses.replace(models, draft=loaded.model, draft_version=loaded.version, draft_vocab=loaded.vocab)
        after = {"shifted": _serve(new, key, shifted_held), "original": _serve(new, key, originals)}
        align_report = aligned / "align_report.json"
        report["align_report"] = json.loads(align_report.read_text()) if align_report.is_file() else None
        for part in ("shifted", "original"):
            report[part] = {"before": before[part], "after": after[part],
                            "same_outputs": before[part]["outputs"] == after[part]["outputs"]}
    else:
        report.update({part: {"before": before[part]} for part in ("shifted", "original")})
    for part in ("shifted", "original"):
        for side in report[part].values():
            if isinstance(side, dict):
                side.pop("outputs", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    out.with_suffix(".txt").write_text(format_table(report))
    return report


def run_ceiling(out: Path, train: int = 120, held: int = 40) -> dict[str, Any]:
    """The ceiling rows alone, on the held-out shifted documents ``run_alignment`` would measure."""
    models = load_profile("gemma-3-270m", with_draft=True, executor="auto")
    docs = stdlib_documents(train + held)[train:]
    report = {"model": engine_model_key(models), "schema_key": SCHEMA, "executor": models.executor,
              "ceiling": {"shifted": measure_ceiling(models, SCHEMA, docs)}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    out.with_suffix(".txt").write_text("\n".join(_ceiling_lines(report)) + "\n")
    return report


def format_table(report: dict[str, Any]) -> str:
    lines = [f"alignment run: {report['model']} / {report['schema_key']} (draft align exit {report['align_exit']})",
             "traffic    draft    requests  draft acceptance  tok/s",
             ]
    for part in ("shifted", "original"):
        for side in ("before", "after"):
            r = report.get(part, {}).get(side)
            if r:
                acc = r["draft_acceptance"]
                lines.append(f"{part:10} {side:8} {r['requests']:8d}  {acc if acc is None else round(acc, 3)!s:16}  "
                             f"{r['tokens_per_s']:.1f}")
    lines += _ceiling_lines(report)
    return "\n".join(lines) + "\n"


def _ceiling_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for part, rows in report.get("ceiling", {}).items():
        lines.append(f"ceiling on the {part} traffic (the shipped draft; perfect_draft: the ceiling of any draft)")
        lines.append("config             requests  draft acceptance  tok/s  x ff+ngram+history")
        for name, r in rows.items():
            acc = r["draft_acceptance"]
            lines.append(f"{name:18} {r['requests']:8d}  {acc if acc is None else round(acc, 3)!s:16}  "
                         f"{r['tokens_per_s']:5.1f}  {r['x_ff_ngram_history']:.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/gemma-align-run.json"))
    parser.add_argument("--train", type=int, default=120)
    parser.add_argument("--held", type=int, default=40)
    parser.add_argument("--original", type=int, default=30)
    parser.add_argument("--original-recorded", type=int, default=60, help="original requests served (and recorded) "
                        "before the shift")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=None, help="draft align --lr (default: the profile's, 1e-4)")
    parser.add_argument("--replay-weight", type=float, default=1.0, help="draft align --replay-weight: the original "
                        "traffic learned beside the shifted, at this weight")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--ceiling-only", action="store_true", help="only the ceiling on the held-out shifted "
                        "traffic: ff+ngram+history, all and perfect_draft (no recording, no alignment)")
    args = parser.parse_args()
    if args.ceiling_only:
        report = run_ceiling(args.out, args.train, args.held)
        print("\n".join(_ceiling_lines(report)))
        return
    report = run_alignment(args.out, args.train, args.held, args.original, args.steps, args.data_dir,
                           args.original_recorded, args.replay_weight, args.lr)
    print(format_table(report))


if __name__ == "__main__":
    main()
