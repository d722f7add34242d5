"""``structspec draft``: draft models made from their target.

    structspec draft align --data-dir DIR [--schema invoice] [--since 6h] --out DIR
                                                                            fine-tune on recorded traffic
    structspec draft distill --out DIR                                      build the gemma-3-270m draft

``align`` reads the traffic samples and rejected drafts a server recorded in its store
(``--data-dir`` / ``--store-url``, as for ``structspec serve``), and writes the aligned draft only
when it agrees with the target on the held-out share at least as well as the draft it started from
(``structspec.draft.align``). Exit status: 0 written, 1 refused (worse on the held-out share),
2 bad input (no traffic, an unreadable store, a missing draft folder).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer

from structspec.models.profiles import resolve_model
from structspec.service.settings import load_settings
from structspec.stats.counters import model_key
from structspec.store import DEFAULT_DB_NAME, StoreError, open_store, redact_url

# Aligning and distilling need torch (~6 s to import), the models and the assembly: their commands import them,
# so that `structspec --help` and the other commands start without them.

draft_app = typer.Typer(help="Draft models made from their target: build the gemma-3-270m draft, align a draft to "
                        "recorded traffic.",
                        no_args_is_help=True, add_completion=False)


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float) -> float:
    """``--since``: unix seconds, an ISO 8601 time (UTC where it names no zone) or an age (``90m``, ``6h``, ``2d``:
    that long before ``now``). Raises: ValueError (with what is accepted)."""
    value = text.strip()
    if value[-1:] in _UNITS and value[:-1].replace(".", "", 1).isdigit():
        return now - float(value[:-1]) * _UNITS[value[-1]]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since {text!r}: give unix seconds, an ISO 8601 time (2026-12-01T08:00) or an age "
                         "(90m, 6h, 2d)") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _open_and_read(settings: Any, model: str, schema: Optional[str], max_requests: int,
                   since: Optional[float] = None) -> tuple:
    from structspec.draft.align import AlignError, read_traffic  # torch: see the note at the imports

    where = redact_url(settings.store_url) if settings.store_url else str(Path(settings.data_dir) / DEFAULT_DB_NAME)
    if not settings.store_url and not (Path(settings.data_dir) / DEFAULT_DB_NAME).is_file():
        raise AlignError(f"no store at {where} (a server writes one there); give --data-dir or --store-url")

    async def read() -> tuple:
        store = open_store(settings.store_url, settings.data_dir)
        try:
            await store.open()
        except (StoreError, ValueError, OSError) as exc:
            raise AlignError(f"cannot read the store {where}: {exc}") from exc
        try:
            return await read_traffic(store, model, schema, max_requests, since)
        except StoreError as exc:
            raise AlignError(f"cannot read the store {where}: {exc}") from exc
        finally:
            try:
                await store.close()
            except StoreError:
                pass

    return asyncio.run(read())


def _table(report: Any) -> str:
    rows = [("held-out" + (f" ({report.schema})" if report.schema else ""), report.heldout)]
    rows += [(f"  {key}", c) for key, c in report.by_schema.items() if len(report.by_schema) > 1]
    if report.guard is not None:
        rows.append(("kept traffic (guard)", report.guard))
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':{width}}  requests  positions  top-1 before  after   gain    overlap before  after   gain"]
    for name, c in rows:
        lines.append(f"{name:{width}}  {c.before.requests:8d}  {c.before.positions:9d}  {c.before.top1:12.3f}  "
                     f"{c.after.top1:.3f}  {c.top1_gain:+.3f}  {c.before.overlap:14.3f}  {c.after.overlap:.3f}  "
                     f"{c.overlap_gain:+.3f}")
    return "\n".join(lines)


@draft_app.command("align")
def align(
    out: Annotated[Path, typer.Option("--out", help="folder to write the aligned draft to (replaced)")],
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="read the store in this data directory")] = None,
    store_url: Annotated[Optional[str], typer.Option("--store-url", help="read this store (sqlite:///path.db, "
                                                     "postgresql://...)")] = None,
    schema: Annotated[Optional[str], typer.Option("--schema", help="a registered schema id (its latest version), "
                                                  "id@version or a statistics key; default: every schema")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="the model key whose traffic is read (default: the "
                                                 "profile's with its current draft, as a server records it)")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="align to the traffic recorded since then (unix "
                                                 "seconds, ISO 8601, or an age: 90m, 6h, 2d); the earlier traffic is "
                                                 "kept: replayed, and guarded against forgetting")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", help="the target: a profile name, a GGUF file or a "
                                                   "model folder (default: the settings' model or profile; --model "
                                                   "here names the statistics key)")] = None,
    draft: Annotated[Optional[Path], typer.Option("--draft", help="draft folder to start from (default: the "
                                                  "profile's)")] = None,
    holdout: Annotated[float, typer.Option("--holdout", min=0.01, max=0.9, help="share of requests held out (by a "
                                           "hash of the request)")] = 0.2,
    steps: Annotated[int, typer.Option("--steps", min=0, help="training steps")] = 300,
    lr: Annotated[Optional[float], typer.Option("--lr", min=0.0, help="peak learning rate (default: the profile's: "
                                                "demo 5e-4, gemma-3-270m 1e-4)")] = None,
    replay_weight: Annotated[float, typer.Option("--replay-weight", min=0.0, help="the kept traffic's training "
                                                 "requests (other schemas', earlier), learned at this weight against "
                                                 "the aligned traffic's 1 (0: not replayed, only guarded)")] = 0.5,
    positions: Annotated[str, typer.Option("--positions", help="where agreement is learned and measured: free-text "
                                           "(where the router drafts with the draft model) | all")] = "free-text",
    device: Annotated[str, typer.Option("--device", help="cpu | cuda | auto")] = "cpu",
    seed: Annotated[int, typer.Option("--seed", help="seeds the training order and initialisation")] = 0,
    report_path: Annotated[Optional[Path], typer.Option("--report", help="JSON report (default: <out>/"
                                                        "align_report.json when written, else <out>.refused.json)")]
    = None,
) -> None:
    """Fine-tune the draft on recorded traffic (completed requests and rejected drafts, the target's distributions
    recomputed at those positions) and write it only if it is not worse on a held-out share of that traffic."""
    # torch: see the note at the imports
    import torch

    from structspec.draft.align import REPORT_FILE, AlignConfig, AlignError, AlignInputs, AlignReport, align_draft, \
        since_text, write_draft
    from structspec.models.loading import DTYPES, ModelLoadError, load_draft, load_models, weights_version

    settings = load_settings(None, overrides={"data_dir": data_dir, "store_url": store_url}, validate=False)
    try:
        prof = resolve_model(profile or settings.model_spec, served_name=settings.served_model_name or None)
    except KeyError as exc:
        _fail(str(exc.args[0]))
    try:
        config = AlignConfig(holdout=holdout, steps=steps, lr=lr if lr is not None else prof.align_lr,
                             positions=positions, seed=seed, replay_weight=replay_weight)
        since_s = parse_since(since, time.time()) if since is not None else None
    except ValueError as exc:
        _fail(str(exc))
    if device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    source = draft if draft is not None else (Path(prof.draft) if prof.draft else None)
    if source is None:
        _fail(f"profile {prof.name} has no draft model; give --draft FOLDER")
    if not source.is_dir() or not (source / "config.json").is_file():
        _fail(f"draft folder {source} is missing (or holds no config.json)")
    torch.manual_seed(seed)
    try:
        models = load_models(prof, device=device, dtype="float32", with_draft=False, executor="transformers")
        loaded = load_draft(str(source), models.tokenizer, prof.target, "transformers", models.device, torch.float32)
    except ModelLoadError as exc:
        _fail(str(exc))
    from structspec.assembly import make_executor, make_prompts  # torch: see the note at the imports

    if model is None:  # the key the server keeps this model's statistics under: its prompt format included
        model = model_key(prof.name, weights_version(prof.draft) if prof.draft else "", make_prompts(models).stats_format,
                          models.identity)
    try:
        traffic, others, rejected, schemas = _open_and_read(settings, model, schema, config.max_requests, since_s)
    except AlignError as exc:
        _fail(str(exc))
    key = traffic[0].schema_key if schema is not None else ""
    typer.echo(f"model {model}: {len(traffic)} traffic samples{' of ' + key if key else ''}"
               f"{since_text(since_s)}, "
               f"{len(rejected)} rejected drafts"
               f"{f', {len(others)} samples kept (other schemas, earlier)' if others else ''}")

    disk_dtype = DTYPES.get(str(json.loads((source / "config.json").read_text()).get("dtype", "float32")),
                            torch.float32)
    report = AlignReport(model, key, str(source), str(out), {**config.__dict__, "device": device}, since=since_s)
    inputs = AlignInputs(make_executor(models, models.target), loaded.model, loaded.vocab, models.tokenizer, traffic,
                         others, rejected, schemas)
    try:
        ok = align_draft(inputs, config, report, disk_dtype, log=typer.echo)
    except AlignError as exc:
        _fail(str(exc))
    typer.echo(_table(report))
    report.written = ok
    if ok:
        write_draft(loaded.model, source, out, disk_dtype)
        report_file = report_path or out / REPORT_FILE
    else:
        report_file = report_path or out.parent / f"{out.name}.refused.json"
    report_file.parent.mkdir(parents=True, exist_ok=True)
    report_file.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if not ok:
        typer.echo(f"refused: {report.verdict}; nothing written to {out} (report: {report_file})", err=True)
        raise typer.Exit(1)
    typer.echo(f"aligned draft written to {out} (version {weights_version(out)}; report: {report_file})")


@draft_app.command("distill")
def distill_command(
    out: Annotated[Path, typer.Option("--out", help="folder to write the draft to (the shipped one: "
                                      "structspec/models/gemma_draft)")],
    executor: Annotated[str, typer.Option("--executor", help="auto | llamacpp | transformers: what runs the target "
                                          "for its answers and distributions")] = "auto",
    minutes: Annotated[float, typer.Option("--minutes", min=1.0, help="training time cap (the schedule anneals "
                                           "over the steps or this, whichever ends first)")] = 90.0,
    measure_steps: Annotated[bool, typer.Option("--measure-steps/--no-measure-steps", help="then time the draft's "
                                                "step against the target's on each executor")] = True,
) -> None:
    """Build the gemma-3-270m draft from nothing but the target and the project's corpus (structspec.draft.gemma_draft:
    the target answers held-in workload items, a draft of Gemma's first two layers over the ids it emits is distilled
    towards its distributions; ~45-60 min on 2 cores). Writes the weights and distill_report.json into --out."""
    # torch: see the note at the imports
    from structspec.draft.gemma_draft import GemmaDraftPlan, build_gemma_draft, measure_steps as time_steps

    report = build_gemma_draft(out, replace(GemmaDraftPlan(), max_minutes=minutes), say=typer.echo, executor=executor)
    if measure_steps:
        report["step_ms"] = time_steps(out)
        (out / "distill_report.json").write_text(json.dumps(report, indent=2))
    after = report["agreement_after"]
    typer.echo(f"held-out free-text top-1 agreement {after['top1']:.3f} (overlap {after['overlap']:.3f}) "
               f"over {after['positions']} positions; written to {out}")


def register(app: typer.Typer) -> None:
    app.add_typer(draft_app, name="draft")
