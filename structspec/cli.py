"""``structspec`` command line: serve, models, bench, and the client commands."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from structspec import cli_client, cli_draft, cli_serve, cli_stats
from structspec.bench.compare import compare_outputs
from structspec.models.profiles import ModelProfile, profiles, resolve_model

# The benchmarks, the trainer and model loading import torch (~6 s, transformers ~3 s more): the commands that run
# them import them, so `structspec --help`, serve and the client commands start without them.

app = typer.Typer(help="structspec: always-valid, fast structured outputs from language models.",
                  no_args_is_help=True, add_completion=False)
models_app = typer.Typer(help="Model profiles: list, prepare, train the demo pair.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (ratios against baselines measured in the same run).", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")
console = Console()


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


MODEL_HELP = "a profile name (demo | gemma-3-270m), a GGUF file or a model folder"


def _model(spec: str) -> ModelProfile:
    try:
        return resolve_model(spec)
    except KeyError as exc:
        console.print(f"[red]error:[/red] {exc.args[0]}")
        raise typer.Exit(2) from None


@models_app.command("list")
def models_list(model: Optional[list[str]] = typer.Option(None, "--model", help=f"also show this model ({MODEL_HELP}; "
                                                          "repeatable)")) -> None:
    """Show the named profiles (and --model paths), where their files are, their size and whether they are ready."""
    table = Table("model", "ready", "size", "target", "draft", "notes")
    for p in [*profiles().values(), *(_model(m) for m in model or ())]:
        ready = p.is_ready()
        table.add_row(p.name, "yes" if ready else "no", _human(p.size_bytes()) if ready else "-", p.target,
                      p.draft or "-", p.description + ("" if ready or not p.prepare_note else f"; {p.prepare_note}"))
    console.print(table)


@models_app.command("prepare")
def models_prepare(profile: Optional[str] = typer.Argument(None, help=MODEL_HELP),
                   model: Optional[str] = typer.Option(None, "--model", help=f"{MODEL_HELP} (instead of the "
                                                       "argument)"),
                   tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="tokenizer folder for a GGUF "
                                                           "(default: read from the GGUF once and cached)"),
                   executor: str = typer.Option("auto", help="auto | llamacpp | transformers (as structspec serve)")
                   ) -> None:
    """Make a model ready for an executor, then load it once (Gemma: assemble the GGUF; transformers also converts
    and caches it as safetensors; a GGUF of one's own: read its tokenizer into the cache)."""
    from structspec.models.loading import ModelLoadError, load_profile  # torch: see the note at the imports

    spec = model or profile
    if spec is None:
        console.print("[red]error:[/red] name the model: a profile name, --model PATH")
        raise typer.Exit(2)
    try:
        models = load_profile(spec, tokenizer=tokenizer, with_draft=True, executor=executor)
    except ModelLoadError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    n = models.parameter_count()
    console.print(f"{models.profile}: ready for {models.executor} ({n / 1e6:.1f} M parameters, "
                  f"vocab {len(models.tokenizer)})")


@models_app.command("train-demo")
def models_train_demo(out: Path = typer.Option(None, help="output folder (default: the shipped demo folder)"),
                      quick: bool = typer.Option(False, help="tiny smoke run (not the shipped pair)")) -> None:
    """Re-train the demo target/draft pair from scratch (fixed seeds, ~25 min on 2 cores)."""
    from structspec.demo import train  # torch: see the note at the imports

    sys.argv = ["train"] + (["--out", str(out)] if out else []) + (["--quick"] if quick else [])
    train.main()


@bench_app.command("grammar")
def bench_grammar(
    directory: Path = typer.Argument(..., help="folder of MaskBench-style {schema, tests} JSON files"),
    backend: str = typer.Option("llguidance", help="llguidance | outlines"),
    tokenizer: str = typer.Option("demo", help=f"the tokenizer of a model: {MODEL_HELP}"),
    split: Optional[str] = typer.Option(None, help="only files whose name starts with this prefix"),
    limit: Optional[int] = typer.Option(None, help="at most this many schemas"),
    out: Path = typer.Option(Path("reports/grammar.json"), help="where to write the JSON report"),
    strict: bool = typer.Option(False, help="strict mode (no post-checks, llguidance's own default): a schema with "
                                            "a keyword the grammar cannot enforce is refused instead of approximated"),
) -> None:
    """Compile every schema, walk every test instance through the matcher, report coverage and speed."""
    # torch: see the note at the imports
    from structspec.bench.grammar_bench import format_table, run_grammar_bench
    from structspec.models.loading import load_tokenizer, tokenizer_source

    prof = _model(tokenizer)
    if prof.prepare is not None and not prof.is_ready():
        prof.prepare()
    report = run_grammar_bench(directory, backend, load_tokenizer(tokenizer_source(prof)), split_prefix=split,
                               limit=limit,
                               allow_post_check=not strict)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(format_table(report))
    console.print(f"report written to {out}")


@bench_app.command("decode")
def bench_decode(
    profile: str = typer.Option("demo", "--profile", "--model", help=MODEL_HELP),
    workload: str = typer.Option("extraction", help="extraction | toolcall | freetext | mixed (with a short-output "
                                                    "schema) | shift (one schema's traffic changes, then back) | chat (free "
                                                    "text the model writes itself; engine configurations only)"),
    concurrency: str = typer.Option("1", help="requests in flight; a comma list runs each (e.g. 1,16; HF baselines "
                                              "run only at 1)"),
    requests: int = typer.Option(20, help="measured requests per configuration (after 2 warm-up ones)"),
    max_tokens: int = typer.Option(256, help="output cap per request"),
    configs: Optional[str] = typer.Option(None, help="comma-separated configurations to run, on the same prompts "
                                                     "(default: off, ff, ff+ngram, ff+ngram+history, all, policy and "
                                                     "the executor's baselines: hf_outlines, hf_generate, hf_assisted "
                                                     "on transformers; llamacpp_grammar, llamacpp_grammar_lookup, "
                                                     "llamacpp_generate on llamacpp); perfect_draft, asked for "
                                                     "by name: all with a draft model that drafts off's outputs, "
                                                     "the ceiling of any draft model (with off and --interleave)"),
    executor: str = typer.Option("auto", help="auto | llamacpp | transformers: what runs the engine configurations "
                                              "(auto: as structspec serve would; llamacpp for gemma-3-270m on a CPU "
                                              "where llama-cpp-python is installed)"),
    few_shot: Optional[int] = typer.Option(None, help="worked examples per prompt (default: 0 demo, 3 gemma)"),
    examples: str = typer.Option("shipped", help="shipped (the server's examples of the built-in schemas) | "
                                                 "synthesized (what a schema or tool list of one's own gets)"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 (all configurations and baselines alike)"),
    out: Path = typer.Option(Path("reports/decode.json"), help="where to write the JSON report"),
    save_outputs: bool = typer.Option(False, help="keep every request's output text and token ids in the report "
                                                  "(compare two reports with `structspec bench compare`)"),
    temperature: float = typer.Option(0.0, help="0: greedy; above: the engine configurations sample (request i has "
                                                "seed i; HF baselines stay greedy)"),
    warmup_requests: int = typer.Option(0, help="unmeasured requests (other items of the workload) each engine "
                                               "configuration serves first: the policy then starts from statistics"),
    acceptance_threshold: float = typer.Option(0.55, help="the policy configuration's acceptance guard"),
    interleave: bool = typer.Option(False, help="run the engine configurations (and llama.cpp's baselines) side by "
                                               "side, request by request (concurrency 1): comparisons the "
                                               "machine's drift does not bias"),
    interleave_block: int = typer.Option(10, help="with --interleave: requests each configuration serves a turn"),
    data_dir: Optional[Path] = typer.Option(None, help="record every engine configuration's traffic in the store "
                                                       "there (model <model>/bench:<config>), for `structspec stats "
                                                       "--data-dir`"),
    engine: str = typer.Option("structspec", help="structspec | vllm (the vLLM rows: vllm:off, vllm:ngram, "
                                                  "vllm:policy, vllm:structspec, vllm:structspec-policy) | both (structspec's off beside them: the share "
                                                  "of identical outputs); vLLM rows may also be named in --configs"),
    max_model_len: int = typer.Option(1024, help="vLLM rows: their context length"),
    speculative_config: str = typer.Option("", help="vLLM rows: the speculative config of vllm:ngram and "
                                                    "vllm:policy as JSON (default: ngram, 4 tokens, lookup 2-4)"),
    vllm_args: str = typer.Option('{"enforce_eager": true}', help="vLLM rows: other engine arguments as JSON"),
    tensor_parallel_size: int = typer.Option(1, help="vLLM rows: tensor parallel workers"),
    tokenizer: str = typer.Option("", help="a tokenizer folder, for a model folder without one"),
    load_format: str = typer.Option("auto", help="auto | dummy (seeded random weights of the folder's config, the "
                                                 "same on both engines: timings only)"),
) -> None:
    """Run every configuration on the same prompts; report tokens/s, latency, passes/token, validity, accuracy."""
    from structspec.bench.vllm_rows import VLLM_CONFIGS, VllmOptions  # the rows' engine options
    from structspec.bench.decode_bench import format_table, run_decode_bench, to_json  # torch: see the imports

    levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
    names = tuple(c.strip() for c in configs.split(",") if c.strip()) if configs else None
    if names is None and engine != "structspec":
        names = ("off",) * (engine == "both") + VLLM_CONFIGS
    vllm = VllmOptions(tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                       speculative_config=speculative_config, extra=vllm_args)
    with _request_progress() as progress:
        report = run_decode_bench(profile, workload, levels, requests, max_tokens, names, few_shot, device,
                                  dtype=dtype, save_outputs=save_outputs, temperature=temperature, progress=progress,
                                  warmup_requests=warmup_requests, interleave=interleave, examples=examples,
                                  policy={"acceptance_threshold": acceptance_threshold}, data_dir=data_dir,
                                  executor=executor, block=interleave_block, vllm=vllm, tokenizer=tokenizer,
                                  load_format=load_format)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_json(report) + "\n")
    out.with_suffix(".txt").write_text(format_table(report))
    console.print(format_table(report))
    console.print(f"report written to {out} (+ {out.with_suffix('.txt').name})")


class _request_progress:
    """A rich progress bar per configuration: request n of N, elapsed, tokens/s so far (on stderr)."""

    def __enter__(self):
        # rich.progress costs 7-25 ms to import (measured after this module's imports): only bench decode uses it
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

        self._time = time.perf_counter
        self._bars = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("{task.fields[rate]}"),
                              console=Console(stderr=True), transient=False)
        self._bars.__enter__()
        self._tasks: dict[tuple[str, int], tuple[TaskID, float]] = {}
        return self

    def __call__(self, config: str, concurrency: int, done: int, total: int, tokens: int) -> None:
        key = (config, concurrency)
        if key not in self._tasks:  # the measured run of a configuration starts (done == 0)
            self._tasks[key] = (self._bars.add_task(f"{config} (conc {concurrency})", total=total, rate=""),
                                self._time())
        task, started = self._tasks[key]
        elapsed = max(1e-9, self._time() - started)
        self._bars.update(task, completed=done, rate=f"{tokens / elapsed:.1f} tok/s")

    def __exit__(self, *exc):
        return self._bars.__exit__(*exc)


@bench_app.command("compare")
def bench_compare(first: Path = typer.Argument(..., help="a decode report written with --save-outputs"),
                  second: Path = typer.Argument(..., help="another one, on the same workload")) -> None:
    """Compare two decode reports token for token; exit 1 if any shared configuration's outputs differ."""
    diffs = compare_outputs(json.loads(first.read_text()), json.loads(second.read_text()))
    for line in diffs:
        console.print(line)
    if diffs:
        raise typer.Exit(1)
    console.print("identical outputs in every shared configuration")


@bench_app.command("step")
def bench_step(
    profile: str = typer.Option("gemma-3-270m", "--profile", "--model", help=MODEL_HELP),
    steps: int = typer.Option(20, help="timed decode steps and verifications per phase (medians)"),
    neighbour_cores: int = typer.Option(1, help="cores the neighbour process keeps busy in the second phase"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16"),
    out: Path = typer.Option(Path("reports/step.json"), help="where to write the JSON report"),
) -> None:
    """Time a target step alone and beside a CPU-bound neighbour (does it degrade in proportion?)."""
    from structspec.bench.step_bench import format_table, run_step_bench  # torch: see the note at the imports

    prof = _model(profile)
    if prof.prepare is not None and not prof.is_ready():
        prof.prepare()
    report = run_step_bench(profile, steps, neighbour_cores, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".txt").write_text(format_table(report))
    console.print(format_table(report))
    console.print(f"report written to {out} (+ {out.with_suffix('.txt').name})")


@bench_app.command("device")
def bench_device(
    model: Path = typer.Option(..., "--model", help="a model folder: its config.json is built with dummy weights"),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="the tokenizer folder the perfect draft's prompts use"),
    device: str = typer.Option("cuda", help="cuda | cpu"),
    dtype: str = typer.Option("bfloat16", help="bfloat16 | float32"),
    steps: int = typer.Option(20, help="timed steps per batch size and per draft length (medians)"),
    prompt_len: int = typer.Option(128, help="tokens each timed sequence holds before its steps"),
    perfect_draft: bool = typer.Option(True, help="also run off vs perfect_draft on the freetext workload"),
    requests: int = typer.Option(8, help="the perfect draft's measured requests"),
    max_tokens: int = typer.Option(128, help="the perfect draft's output cap per request"),
    out: Path = typer.Option(Path("reports/device.json"), help="where to write the JSON report"),
) -> None:
    """Time a decode step at batch 1, 4, 16, 32 and verification by draft length on dummy weights, and the perfect
    draft's ceiling on free text (bench/device_check.sh runs it on a GPU machine)."""
    from structspec.bench.device_bench import format_table, run_device_bench  # torch: see the note at the imports
    from structspec.models.loading import ModelLoadError

    try:
        report = run_device_bench(str(model), str(tokenizer), device, dtype, steps, prompt_len, perfect_draft,
                                  requests, max_tokens)
    except ModelLoadError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".txt").write_text(format_table(report))
    console.print(format_table(report))
    console.print(f"report written to {out} (+ {out.with_suffix('.txt').name})")


@bench_app.command("policy")
def bench_policy(
    hours: float = typer.Option(72.0, help="simulated hours per scenario"),
    seed: int = typer.Option(0, help="the arrivals' and the decoding's random seed"),
    out: Path = typer.Option(Path("reports/policy-sim.json"), help="where to write the JSON report"),
) -> None:
    """The drafting policy over days of one schema's traffic on a simulated clock (4 and 40 requests/h, two replicas
    sharing a store), against the fixed configurations, in a stated cost model (no model is loaded)."""
    from structspec.bench.policy_sim import main  # torch: see the note at the imports

    main(["--hours", str(hours), "--seed", str(seed), "--out", str(out)])


@bench_app.command("heldout")
def bench_heldout(
    setups: str = typer.Option(",".join(("gemma-3-270m:llamacpp", "gemma-3-270m:transformers", "smollm2:llamacpp",
                                         "demo:transformers")), help="profile:executor pairs, comma-separated"),
    workloads: str = typer.Option("manifest,classify,nested_tools", help="held-out workloads, comma-separated"),
    requests: int = typer.Option(8, help="measured requests per run"),
    warm_requests: int = typer.Option(16, help="requests every configuration serves first in the warm runs"),
    slow_requests: str = typer.Option("", help="setup=N pairs: fewer measured requests on a slow setup"),
    out: Path = typer.Option(Path("reports/policy-heldout.json"), help="where to write the JSON report (a .txt "
                                                                     "table beside it)"),
) -> None:
    """The drafting policy against off and the fixed configurations on held-out workloads (manifest, classify,
    nested_tools), cold and warm, per model setup: is it ever slower than off or than the best fixed one?"""
    from structspec.bench.policy_heldout import run_policy_heldout  # torch: see the note at the imports

    slow = {k: int(v) for k, _, v in (p.partition("=") for p in slow_requests.split(",") if p)}
    run_policy_heldout(out, [s for s in setups.split(",") if s], [w for w in workloads.split(",") if w], requests,
                       warm_requests, requests_for=slow)
    typer.echo(out.with_suffix(".txt").read_text())


# Commands owned by other modules (server, client, statistics, drafts) plug themselves in here.
cli_serve.register(app)
cli_client.register(app)
cli_stats.register(app)
cli_draft.register(app)

if __name__ == "__main__":
    app()
