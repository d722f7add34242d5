"""``structspec bench decode``: every configuration on the same prompts, in one run, as ratios.

Engine configurations (structspec's decode loop, grammar-constrained):
  off                no fast-forward, no drafting: one model decision per token
  ff                 fast-forward of forced tokens
  ff+ngram           + prompt/output lookup drafts
  ff+ngram+history   + schema-history drafts
  all                + the draft model (profiles that have one)
  policy             every proposer, as the drafting policy decides per schema and batch size from the
                     statistics this run records (the server's default)
  perfect_draft      ``all`` with a perfect draft model: it drafts the ``off`` row's output of the same
                     request (``bench.perfect_draft``), the ceiling of what any draft model adds here
                     (greedy, with ``--interleave``; asked for by name, not in the default list)
Baselines (HF transformers ``generate``, batch 1; with ``--executor transformers``):
  hf_outlines        constrained by outlines' logits processor
  hf_generate        unconstrained greedy
  hf_assisted        unconstrained, HF assisted generation (the draft model where the profile has one,
                     else prompt lookup)
Baselines (llama.cpp's own generation on the same GGUF, batch 1; with ``--executor llamacpp``;
``structspec.bench.llamacpp_baselines``):
  llamacpp_grammar, llamacpp_grammar_lookup, llamacpp_generate

Per configuration: tokens/s (output tokens / wall time), request latency p50/p99,
time per output token, target forward passes per output token (counted where
the model runs), validity, share finished by ``stop``, field accuracy against the
ground truth, and acceptance per proposer (accepted / drafted; the mean accepted
length per drafting step includes the bonus/recovered token). The same per schema
(``by_schema``) and, on the ``shift`` workload, per phase (``by_phase``), with the
drafting decisions by reason. Engine rows also say where the time went (``executor``): forward calls,
milliseconds per forward inside the model (llama.cpp's ``llama_decode``; transformers: not split) and the
rest of each step (grammar masks, verification, bookkeeping). On ``shift`` the policy's statistics run on a simulated
clock (``SHIFT_MINUTES_PER_REQUEST`` a request), so its hourly windows turn over
within the run. With ``data_dir`` every engine configuration records its traffic in the store
there, under the model key ``<model>/bench:<config>``, so ``structspec stats --data-dir`` shows a
benchmark as it shows a server.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from io import StringIO
from typing import Any, Callable, Sequence

import torch
from rich.console import Console
from rich.table import Table

from structspec.assembly import AssemblyConfig, assemble_engine, engine_model_key, make_prompts
from structspec.engine.default_examples import build_example_book
from structspec.bench.llamacpp_baselines import (LLAMACPP_BASELINES, LlamaCppBaseline, context_for,
                                                 run_llamacpp_baseline)
from structspec.bench.perfect_draft import install_perfect_draft
from structspec.bench.workloads import WorkItem, build_workload, shift_phases
from structspec.engine.api import ChatMessage, ExtractionRequest, TextRequest, ToolCallRequest
from structspec.bench.vllm_rows import VLLM_CONFIGS, run_vllm_row, vllm_model
from structspec.engine.config import PolicyConfig, SchedulerLimits, VllmOptions
from structspec.engine.postcheck import check_json_text
from structspec.engine.types import FinishReason, Outcome, SamplingParams, SpeculationMode
from structspec.models.loading import load_profile
from structspec.models.profiles import resolve_model
from structspec.models.worker_thread import run_in_worker
from structspec.chat_template import Prompt, PromptFormat
from structspec.prompts import ToolSpec
from structspec.speculation.configs import SPECULATION_CONFIGS, ProposerSet, speculation_config
from structspec.stats.book import StatsBook
from structspec.store import open_store

ENGINE_CONFIGS = tuple(SPECULATION_CONFIGS)  # off, ff, ff+ngram, ff+ngram+history, all, policy
SHIFT_MINUTES_PER_REQUEST = 15.0
INTERLEAVE_BLOCK = 10  # requests each configuration serves before the next one takes its turn
HF_BASELINES = ("hf_outlines", "hf_generate", "hf_assisted")
BASELINES = HF_BASELINES + LLAMACPP_BASELINES  # one request at a time, concurrency 1 only
PERFECT_DRAFT = "perfect_draft"  # all, its draft model replaced by the off row's outputs (bench.perfect_draft)


def default_configs(executor: str) -> tuple[str, ...]:
    """Every engine configuration and the baselines that run on ``executor``'s model files."""
    return ENGINE_CONFIGS + (LLAMACPP_BASELINES if executor == "llamacpp" else HF_BASELINES)


@dataclass
class Record:
    latency_s: float
    output_tokens: int
    forward_passes: int
    stop: bool
    valid: bool
    fields_right: int
    fields_total: int
    forced: int = 0
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    draft_steps: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    text: str = ""  # the output (kept in the report with --save-outputs)
    token_ids: list[int] = field(default_factory=list)
    schema: str = ""
    phase: str = ""
    reason: str = ""  # the drafting decision's reason (``structspec.stats.counters.Reason``)
    reasons: dict[str, str] = field(default_factory=dict)  # proposer -> its own reason
    copied: int = 0  # output values a worked example holds but the input does not (``WorkItem.copied``)
    copy_counted: int = 0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _draft_totals(records: list[Record]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Drafted tokens, accepted tokens and verifications that carried a draft, per proposer, summed."""
    drafted: dict[str, int] = {}
    accepted: dict[str, int] = {}
    steps: dict[str, int] = {}
    for r in records:
        for total, part in ((drafted, r.drafted), (accepted, r.accepted), (steps, r.draft_steps)):
            for k, v in part.items():
                total[k] = total.get(k, 0) + v
    return drafted, accepted, steps


def _copy_rate(records: list[Record]) -> float:
    """The share of counted output values taken from a worked example rather than the input."""
    return sum(r.copied for r in records) / max(1, sum(r.copy_counted for r in records))


def group_summary(records: list[Record]) -> dict[str, Any]:
    """A subset of one run's requests (one schema, one phase): throughput from their own latencies."""
    tokens = sum(r.output_tokens for r in records)
    busy = sum(r.latency_s for r in records)
    drafted, accepted, _ = _draft_totals(records)
    reasons: dict[str, int] = {}
    per_proposer: dict[str, dict[str, int]] = {}
    for r in records:
        reasons[r.reason or "-"] = reasons.get(r.reason or "-", 0) + 1
        for proposer, why in r.reasons.items():
            per_proposer.setdefault(proposer, {})
            per_proposer[proposer][why] = per_proposer[proposer].get(why, 0) + 1
    return {
        "requests": len(records),
        "output_tokens": tokens,
        "tokens_per_s": tokens / busy if busy else 0.0,  # output tokens per second of their own latency
        "latency_ms_p50": 1000 * _pct([r.latency_s for r in records], 0.5),
        "forward_passes_per_token": sum(r.forward_passes for r in records) / max(1, tokens),
        "acceptance": {k: accepted.get(k, 0) / v for k, v in drafted.items() if v},
        "field_accuracy": sum(r.fields_right for r in records) / max(1, sum(r.fields_total for r in records)),
        "copy_rate": _copy_rate(records),
        "decisions": reasons,
        "proposer_decisions": per_proposer,
    }


def _grouped(records: list[Record], key: Callable[[Record], str]) -> dict[str, Any]:
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return {name: group_summary(rs) for name, rs in groups.items()}


@dataclass
class ExecutorTime:
    """An executor's counters over a measured run (``forward_calls``; ``eval_seconds`` and ``head_seconds`` where
    it splits them out: the model's evaluation, inside llama_decode and in the restricted output layer)."""

    forward_calls: int = 0
    eval_s: float | None = None
    head_s: float = 0.0  # the restricted output layer (llamacpp_executor): model work done outside llama_decode
    tokens: int = 0  # tokens through the model (llama.cpp: counted; transformers: 0, not split out)
    rows: int = 0  # logit rows returned
    restricted: int = 0  # ... scored on their allowed ids alone

    @staticmethod
    def read(executor) -> "ExecutorTime":
        return ExecutorTime(executor.forward_calls, getattr(executor, "eval_seconds", None),
                            getattr(executor, "head_seconds", 0.0), getattr(executor, "tokens_evaluated", 0),
                            getattr(executor, "rows_scored", 0), getattr(executor, "rows_restricted", 0))

    def _combine(self, other: "ExecutorTime", sign: int) -> "ExecutorTime":
        ev = None if self.eval_s is None or other.eval_s is None else self.eval_s + sign * other.eval_s
        return ExecutorTime(self.forward_calls + sign * other.forward_calls, ev, self.head_s + sign * other.head_s,
                            self.tokens + sign * other.tokens, self.rows + sign * other.rows,
                            self.restricted + sign * other.restricted)

    def since(self, before: "ExecutorTime") -> "ExecutorTime":
        return self._combine(before, -1)

    def plus(self, other: "ExecutorTime") -> "ExecutorTime":
        return self._combine(other, 1)


def executor_summary(time_: ExecutorTime, wall_s: float) -> dict[str, Any]:
    """Where the time of a run went: per forward, inside the model and around it (the engine's own work)."""
    out: dict[str, Any] = {"forward_calls": time_.forward_calls}
    if time_.tokens and time_.forward_calls:
        out["tokens_per_forward"] = time_.tokens / time_.forward_calls
        out["rows_per_forward"] = time_.rows / time_.forward_calls
        out["restricted_row_share"] = time_.restricted / max(1, time_.rows)
    if time_.eval_s is not None and time_.forward_calls:
        # the model's evaluation: llama_decode, plus the output rows the restricted head scored instead of it;
        # the overhead is the rest of the wall time, the grammar's and the engine's work
        model_s = time_.eval_s + time_.head_s
        other = max(0.0, wall_s - model_s)
        out["eval_ms_per_forward"] = 1000 * time_.eval_s / time_.forward_calls
        out["head_ms_per_forward"] = 1000 * time_.head_s / time_.forward_calls
        out["overhead_ms_per_forward"] = 1000 * other / time_.forward_calls
        out["overhead_share_of_eval"] = other / model_s if model_s else 0.0
    return out


def summarize(records: list[Record], wall_s: float, save_outputs: bool = False) -> dict[str, Any]:
    out_tokens = sum(r.output_tokens for r in records)
    lat = [r.latency_s for r in records]
    drafted, accepted, steps = _draft_totals(records)
    fields_total = sum(r.fields_total for r in records)
    prompt_tokens = sum(r.prompt_tokens for r in records)
    return {
        "requests": len(records),
        "output_tokens": out_tokens,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": out_tokens / wall_s if wall_s else 0.0,
        "latency_ms_p50": 1000 * _pct(lat, 0.5),
        "latency_ms_p99": 1000 * _pct(lat, 0.99),
        "ms_per_output_token": 1000 * statistics.median(r.latency_s / max(1, r.output_tokens) for r in records),
        "forward_passes_per_token": sum(r.forward_passes for r in records) / max(1, out_tokens),
        "forced_share": sum(r.forced for r in records) / max(1, out_tokens),
        "valid_rate": sum(r.valid for r in records) / len(records),
        "stop_rate": sum(r.stop for r in records) / len(records),
        "field_accuracy": sum(r.fields_right for r in records) / max(1, fields_total),
        "copy_rate": _copy_rate(records),
        "cached_prompt_share": sum(r.cached_prompt_tokens for r in records) / max(1, prompt_tokens),
        # accepted / drafted per proposer, and tokens committed per verification step that carried its draft
        # (accepted + the recovered or bonus token)
        "acceptance": {k: accepted.get(k, 0) / v for k, v in drafted.items() if v},
        "mean_accepted_length": {k: (accepted.get(k, 0) + n) / n for k, n in steps.items() if n},
        "drafted": drafted,
        "accepted": accepted,
        "by_schema": _grouped(records, lambda r: r.schema),
        **({"by_phase": _grouped(records, lambda r: r.phase)} if any(r.phase for r in records) else {}),
        # every request's output, in workload order, so two runs compare token for token (``bench.compare``)
        **({"outputs": [{"text": r.text, "token_ids": r.token_ids, "latency_s": round(r.latency_s, 4), "stop": r.stop}
                        for r in records]} if save_outputs else {}),
    }


# -- structspec engine configurations ------------------------------------------------------------
def request_for(item: WorkItem, max_tokens: int, fast_forward: bool, speculate: bool, rid: str,
                temperature: float = 0.0, seed: int | None = None):
    """The engine request of a workload item: an extraction, or a required call of the item's tool list."""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed if temperature else None)
    mode = SpeculationMode.AUTO if speculate else SpeculationMode.OFF
    if item.kind == "chat":
        return TextRequest(messages=(ChatMessage("user", item.source),), sampling=params, speculation=mode,
                           fast_forward=fast_forward, request_id=rid)
    if item.kind == "toolcall":
        return ToolCallRequest(messages=(ChatMessage("user", item.source),), tools=item.tools, tool_choice="required",
                               sampling=params, speculation=mode, fast_forward=fast_forward, request_id=rid,
                               examples=item.examples)
    assert item.schema is not None  # an extraction item's (chat and tool call items are answered above)
    return ExtractionRequest(schema=item.schema, text=item.source, examples=() if item.served else item.examples,
                             sampling=params,
                             speculation=mode, fast_forward=fast_forward, request_id=rid, schema_key=item.schema_name)


Progress = Callable[[int, int, int], None]  # (requests done, requests in all, output tokens so far)


async def _run_engine(engine, items: list[WorkItem], concurrency: int, max_tokens: int, fast_forward: bool,
                      speculate: bool, temperature: float = 0.0, progress: Progress | None = None,
                      before_request: Callable[[], None] | None = None) -> tuple[list[Record], float]:
    sem = asyncio.Semaphore(concurrency)
    done = [0, 0]  # requests, output tokens

    async def one(i: int, item: WorkItem) -> Record:
        async with sem:
            if before_request is not None:
                before_request()
            t0 = time.perf_counter()
            req = request_for(item, max_tokens, fast_forward, speculate, f"bench-{i}", temperature, seed=i)
            if item.kind == "toolcall":
                out = await engine.call_tool(req)
                res = out.result
                value = {"name": out.calls[0].name, "arguments": out.calls[0].arguments} if out.calls else None
            elif item.kind == "chat":
                res, value = await engine.chat(req), None
            else:
                res = await engine.extract(req)
                value = res.value
            right, total = item.score(value)
            copied, counted = item.copied(value)
            u = res.usage
            done[0], done[1] = done[0] + 1, done[1] + u.output_tokens
            if progress is not None:
                progress(done[0], len(items), done[1])
            return Record(time.perf_counter() - t0, u.output_tokens, u.target_forward_passes,
                          res.finish_reason is FinishReason.STOP, res.outcome in (Outcome.VALID, Outcome.TEXT),
                          right, total,
                          u.forced_tokens, dict(u.drafted), dict(u.accepted), dict(u.draft_steps), u.prompt_tokens,
                          u.cached_prompt_tokens, res.text, list(res.token_ids), item.schema_name, item.phase,
                          res.speculation.reason if res.speculation is not None else "",
                          dict(res.speculation.reasons) if res.speculation is not None else {}, copied, counted)

    t0 = time.perf_counter()
    records = await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
    return list(records), time.perf_counter() - t0


# -- HF baselines --------------------------------------------------------------------------------
class _CountCalls:
    """Counts forward calls of a module (target passes are counted where they run)."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self._h = module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))

    def close(self) -> None:
        self._h.remove()


def _prompt(prompts: PromptFormat, item: WorkItem) -> Prompt:
    """The prompt the engine gives ``item`` in its format ``prompts`` (``assembly.make_prompts``: the model's chat
    template, or the plain format)."""
    if item.kind == "toolcall":
        return prompts.toolcall([ToolSpec.from_openai(t) for t in item.tools], [("user", item.source)], item.examples)
    if item.kind == "chat":
        return prompts.text([("user", item.source)])
    assert item.schema is not None  # an extraction item's
    return prompts.extraction(item.schema, item.source, None, item.examples)


def _prompt_ids(models) -> Callable[[WorkItem], list[int]]:
    """An item's prompt ids, as the engine on ``models`` gets them (what the baselines generate from)."""
    prompts = make_prompts(models)
    return lambda item: _prompt(prompts, item).ids


def _tool_schema(item: WorkItem) -> dict[str, Any]:
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                          "arguments": t["function"]["parameters"]},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in item.tools]}


def _run_hf(models, items: list[WorkItem], max_tokens: int, mode: str, progress: Progress | None = None
            ) -> tuple[list[Record], float]:
    if getattr(models, "executor", "transformers") != "transformers":
        raise ValueError(f"{mode} runs transformers generate: use --executor transformers")
    tok, model, prompts = models.tokenizer, models.target, make_prompts(models)
    counter = _CountCalls(model)
    if mode == "hf_outlines":
        # outlines costs 0.6-1.0 s to import (measured after torch); only this baseline uses it
        import outlines
        from outlines.types import JsonSchema

        ol_model = outlines.from_transformers(model, tok)
        generators: dict[str, Any] = {}  # compiled once per schema, like structspec's grammar cache
    records = []
    t_all = time.perf_counter()
    try:
        for item in items:
            schema = item.schema if item.kind == "extract" and item.schema is not None else _tool_schema(item)
            prompt = _prompt(prompts, item)
            before = counter.calls
            t0 = time.perf_counter()
            ids = torch.tensor([prompt.ids])
            common = dict(max_new_tokens=max_tokens, do_sample=False, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.eos_token_id)
            if mode == "hf_outlines":
                key = json.dumps(schema, sort_keys=True)
                if key not in generators:
                    generators[key] = outlines.Generator(ol_model, JsonSchema(json.dumps(schema)))
                text = generators[key](prompt.text, **common)
                token_ids = tok(text, add_special_tokens=False)["input_ids"]
                n_out = len(token_ids)
            else:
                extra: dict[str, Any] = {"stop_strings": ["\n"], "tokenizer": tok}
                if mode == "hf_assisted":
                    if models.draft is not None:  # the demo draft stops on EOS; HF's assistant path rejects stop strings
                        extra = {"assistant_model": models.draft}
                    else:
                        extra["prompt_lookup_num_tokens"] = 5
                out = model.generate(ids, **common, **extra)
                new = out[0, ids.shape[1]:].tolist()
                token_ids = new
                n_out = len(new)
                text = tok.decode(new, skip_special_tokens=True).strip()
            latency = time.perf_counter() - t0
            checked = check_json_text(text, schema)
            right, total = item.score(checked.value)
            copied, counted = item.copied(checked.value)
            stop = n_out < max_tokens
            records.append(Record(latency, n_out, counter.calls - before, stop, checked.outcome is Outcome.VALID,
                                  right, total, prompt_tokens=ids.shape[1], text=text, token_ids=list(token_ids),
                                  schema=item.schema_name, phase=item.phase, copied=copied, copy_counted=counted))
            if progress is not None:
                progress(len(records), len(items), sum(r.output_tokens for r in records))
    finally:
        counter.close()
    return records, time.perf_counter() - t_all


# -- the run -------------------------------------------------------------------------------------
def run_decode_bench(profile: str, workload: str, concurrency: int | tuple[int, ...] = 1, requests: int = 20,
                     max_tokens: int = 256, configs: tuple[str, ...] | None = None,
                     few_shot: int | None = None, device: str = "cpu", warmup: int = 2,
                     dtype: str = "float32", save_outputs: bool = False, temperature: float = 0.0,
                     progress: Callable[[str, int, int, int, int], None] | None = None, warmup_requests: int = 0,
                     policy: Any = None, interleave: bool = False, examples: str = "shipped",
                     data_dir: Any = None, executor: str = "auto", block: int = INTERLEAVE_BLOCK,
                     vllm: VllmOptions | None = None, tokenizer: str = "", load_format: str = "auto") -> dict[str, Any]:
    """All ``configs`` at every concurrency on the same prompts; ``{"runs": [...]}`` plus the setup.

    ``executor``: what runs the engine configurations (auto | llamacpp | transformers, as ``structspec serve``);
    ``configs`` None: every engine configuration and that executor's baselines (``default_configs``).

    HF baselines serve one request at a time, so they run at concurrency 1 only. Ratios are taken
    within this run: ``speedup_vs_off`` / ``speedup_vs_hf_outlines`` against those rows at the same
    concurrency (HF at 1), ``speedup_vs_c1`` against the same configuration at concurrency 1.
    ``examples``: the worked examples' source (``build_workload``: shipped or synthesized).
    ``save_outputs``: each row also carries ``outputs`` (every request's text and token ids, in order).
    ``temperature`` > 0: engine configurations sample (request i has seed i; HF baselines stay greedy).
    ``progress(config, concurrency, done, total, output_tokens)`` is called as each measured request finishes.
    ``warmup_requests``: every engine configuration first serves this many more requests (other items of the same
    workload, unmeasured), so the policy starts from statistics and the schema history is as warm in every row.
    ``policy``: the ``policy`` configuration's ``PolicyConfig``, or a dict of its fields that differ from the
    server's defaults.
    ``interleave``: the engine configurations run side by side, request by request (``run_interleaved``; at
    concurrency 1 only), for per-schema comparisons that the machine's drift does not bias; ``block`` requests a turn.
    ``data_dir``: where the engine configurations record their statistics (a server's data directory layout).
    ``vllm``: vLLM's engine options of the vLLM rows (``bench.vllm_rows``: vllm:off, vllm:ngram, vllm:policy).
    ``tokenizer``: a tokenizer folder for a model folder without one; ``load_format`` dummy: seeded random weights
    of the folder's config, the same ones on both engines (``vllm_rows.vllm_model``). Timings only: a random model
    seldom closes a string, so its outputs run to ``max_tokens`` (truncated, so not valid, but every token under
    the grammar) and the rows decode equal token counts.
    """
    levels = (concurrency,) if isinstance(concurrency, int) else tuple(concurrency)
    if isinstance(policy, dict):
        policy = PolicyConfig(**policy)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    # Model work never runs on the main thread: an OpenMP pool there slows the engine thread (worker_thread).
    models = run_in_worker(load_profile, profile, tokenizer=tokenizer or None, device=device, dtype=dtype,
                           with_draft=load_format != "dummy", executor=executor, load_format=load_format)
    if workload == "chat":  # free text: the baselines decode JSON (constrained, or cut at a line's end)
        baselines = [c for c in configs or () if c not in ENGINE_CONFIGS and c != PERFECT_DRAFT]
        if baselines:
            raise ValueError(f"the chat workload runs engine configurations only, not {', '.join(baselines)}")
        configs = configs or tuple(c for c in default_configs(models.executor) if c in ENGINE_CONFIGS)
    configs = tuple(configs) if configs is not None else default_configs(models.executor)
    shots = few_shot if few_shot is not None else resolve_model(profile).few_shot
    pool = build_workload(workload, requests + 24 + warmup_requests, few_shot=shots, examples=examples)
    items, spare = pool[:requests], pool[requests:]
    if workload == "shift":
        items = shift_phases(items)
    # Warm-up: one request per schema in the workload, so every configuration (and the outlines baseline)
    # has compiled its grammars before the clock starts.
    names = {i.schema_name for i in items}
    warm = [next((s for s in spare if s.schema_name == n), None) or next(i for i in items if i.schema_name == n)
            for n in sorted(names)][: max(warmup, len(names))]
    extra_warm = spare[len(spare) - warmup_requests:] if warmup_requests else []
    report: dict[str, Any] = {
        "profile": profile, "workload": workload, "concurrency": list(levels), "requests": requests,
        "max_tokens": max_tokens, "few_shot": shots, "examples": examples, "save_outputs": save_outputs, "temperature": temperature,
        "warmup_requests": warmup_requests, "policy": asdict(policy) if policy is not None else None,
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
                    "dtype": dtype if models.executor == "transformers" else "gguf", "executor": models.executor},
        "runs": [],
    }
    compiler = None
    vllm_book = StatsBook()  # the vLLM rows' statistics: vllm:policy reads what vllm:ngram measured
    on_vllm = None  # what the vLLM rows load: with dummy weights, the own engine's (written out by the first)
    if interleave and any(c in VLLM_CONFIGS for c in configs):
        raise ValueError("the vLLM rows run one after another, not --interleave")
    if PERFECT_DRAFT in configs and (not interleave or "off" not in configs or temperature > 0):
        raise ValueError(f"{PERFECT_DRAFT} drafts the off row's greedy outputs of the same block: run it with "
                         "off, --interleave and temperature 0")
    if interleave:
        if levels != (1,) or any(c in HF_BASELINES for c in configs):
            raise ValueError("interleave runs engine configurations and llama.cpp's baselines at concurrency 1 only")
        results = run_interleaved(list(configs), models, items, warm, extra_warm, max_tokens, save_outputs,
                                  temperature, policy, progress, block=block, data_dir=data_dir)
        report["interleaved"] = True
        report["runs"] = [{"profile": profile, "workload": workload, "config": name, "concurrency": 1, **result}
                          for name, result in results.items()]
        levels = ()
    for level in levels:
        for name in configs:
            if name in BASELINES and level != 1:
                continue  # HF generate serves one request at a time
            row: dict[str, Any] = {"profile": profile, "workload": workload, "config": name, "concurrency": level}
            try:
                step = None if progress is None else (lambda d, n, t, c=name, lv=level: progress(c, lv, d, n, t))
                if name in VLLM_CONFIGS:
                    on_vllm = on_vllm or run_in_worker(vllm_model, profile, tokenizer, load_format, models)
                    row.update(run_vllm_row(name, on_vllm, dtype, vllm or VllmOptions(), vllm_book, items, warm,
                                            extra_warm, level, max_tokens, temperature, _run_engine, summarize,
                                            save_outputs, step, policy))
                    report["runs"].append(row)
                    continue
                result = _run_config(name, models, items, warm, level, max_tokens, compiler, save_outputs, temperature,
                                     step, extra_warm, policy, data_dir)
                compiler = result.pop("_compiler", compiler)
                row.update(result)
            except Exception as exc:  # noqa: BLE001 - one broken configuration must not lose the others
                row["error"] = f"{type(exc).__name__}: {exc}"
            report["runs"].append(row)
    _add_ratios(report["runs"])
    _add_identity(report["runs"])
    return report


def off_of(config: str) -> str:
    """The row ``config`` is measured against: vLLM's rows against vLLM without speculation (``vllm:off``), the
    engine's against its own ``off``."""
    return "vllm:off" if config.startswith("vllm:") else "off"


def _add_ratios(runs: list[dict[str, Any]]) -> None:
    def rate(config: str, level: int) -> float:
        row = next((r for r in runs if r["config"] == config and r["concurrency"] == level), {})
        return row.get("tokens_per_s", 0.0)

    for row in runs:
        if "error" in row:
            continue
        for key, ref in (("speedup_vs_off", rate(off_of(row["config"]), row["concurrency"])),
                         ("speedup_vs_hf_outlines", rate("hf_outlines", 1)),
                         ("speedup_vs_llamacpp_grammar", rate("llamacpp_grammar", 1)),
                         ("speedup_vs_llamacpp_generate", rate("llamacpp_generate", 1)),
                         ("speedup_vs_c1", rate(row["config"], 1))):
            if ref:
                row[key] = row["tokens_per_s"] / ref


def _run_baseline(models, items: list[WorkItem], max_tokens: int, mode: str, progress: Progress | None = None
                  ) -> tuple[list[Record], float]:
    if mode in LLAMACPP_BASELINES:
        if getattr(models, "executor", "transformers") != "llamacpp":
            raise ValueError(f"{mode} runs llama.cpp on the profile's GGUF: use --executor llamacpp")
        return run_llamacpp_baseline(models, items, max_tokens, mode, progress,
                                     schema_of=lambda i: i.schema if i.kind == "extract" else _tool_schema(i),
                                     prompt_of=_prompt_ids(models), record=Record)
    return _run_hf(models, items, max_tokens, mode, progress)


def _run_config(name, models, items, warm, concurrency, max_tokens, compiler, save_outputs=False,
                temperature=0.0, progress: Progress | None = None, extra_warm: Sequence[WorkItem] = (),
                policy: Any = None, data_dir: Any = None) -> dict[str, Any]:
    if name in BASELINES:  # on a thread that exits after, like everything that computes outside the engine
        run_in_worker(_run_baseline, models, warm, max_tokens, name)
        if progress is not None:
            progress(0, len(items), 0)  # the measured run starts
        records, wall = run_in_worker(_run_baseline, models, items, max_tokens, name, progress)
        return summarize(records, wall, save_outputs)
    prepared = _start_engine(name, models, items, concurrency, compiler, policy, data_dir)
    engine, spec, speculate, tick, store = prepared
    try:
        _warm(prepared, warm, extra_warm, concurrency, max_tokens, temperature)
        if progress is not None:
            progress(0, len(items), 0)  # the measured run starts
        before = ExecutorTime.read(engine.core.executor)
        records, wall = asyncio.run(_run_engine(engine, items, concurrency, max_tokens, spec.fast_forward,
                                                speculate, temperature, progress, tick))
        spent = ExecutorTime.read(engine.core.executor).since(before)
    finally:
        engine.stop()
        if store is not None:
            asyncio.run(store.close())  # writes what the configuration recorded
    return {**summarize(records, wall, save_outputs), "executor": executor_summary(spent, wall),
            "_compiler": engine.compiler}  # grammars shared across configurations


def _start_engine(name, models, items, concurrency, compiler, policy, data_dir=None, references=None):
    """A started engine for configuration ``name``: (engine, its SpeculationConfig, drafting on, the clock's tick,
    the opened store in ``data_dir`` its statistics go to, or None). ``references``: the perfect draft's
    (``PERFECT_DRAFT``: prompt ids -> the off row's output ids)."""
    perfect = name == PERFECT_DRAFT
    spec = speculation_config("all" if perfect else name)
    proposers = spec.proposers
    if proposers is not None and proposers.draft and models.draft is None and not perfect:
        proposers = ProposerSet(proposers.ngram, proposers.history, draft=False)
    recorder, tick, store = None, None, None
    if spec.adaptive or data_dir is not None:  # the policy reads what this run records (from nothing: it starts
        clock = [time.time()]                  # cold, like a new server); the store is written, never read
        simulated = any(i.phase for i in items)
        book = StatsBook(clock=(lambda: clock[0]) if simulated else time.time)
        recorder = book.recorder(engine_model_key(models) + (f"/bench:{name}" if data_dir is not None else ""))
        if simulated:
            tick = lambda: clock.__setitem__(0, clock[0] + 60 * SHIFT_MINUTES_PER_REQUEST)  # noqa: E731
        if data_dir is not None:
            store = open_store("", data_dir, book)
            asyncio.run(store.open())
    # items whose examples are the server's own send none: the engine adds them from its book, as the server does
    served = max((len(i.examples) for i in items if i.served), default=0)
    engine = run_in_worker(assemble_engine, models, AssemblyConfig(
        limits=SchedulerLimits(max_batch=max(16, concurrency)), proposers=proposers, compiler=compiler, stats=recorder,
        policy=(policy or PolicyConfig()) if spec.adaptive else None, seed=0,
        examples=build_example_book(served) if served else None))
    if perfect:
        # the same dict the off row fills as the run goes (an empty one is not replaced)
        install_perfect_draft(engine, references if references is not None else {}, recorder)
    engine.start()
    return engine, spec, proposers is not None, tick, store


def _warm(prepared, warm, extra_warm, concurrency, max_tokens, temperature) -> None:
    engine, spec, speculate, tick, _ = prepared
    asyncio.run(_run_engine(engine, warm, 1, max_tokens, spec.fast_forward, speculate, temperature))
    if extra_warm:
        asyncio.run(_run_engine(engine, list(extra_warm), concurrency, max_tokens, spec.fast_forward,
                                speculate, temperature, None, tick))


def run_interleaved(names, models, items, warm, extra_warm, max_tokens, save_outputs=False, temperature=0.0,
                    policy: Any = None, progress: Callable[[str, int, int, int, int], None] | None = None,
                    block: int = INTERLEAVE_BLOCK, data_dir: Any = None) -> dict[str, dict[str, Any]]:
    """Every engine configuration (and llama.cpp baseline) in blocks of ``block`` requests, at concurrency 1: each
    block goes to every configuration in turn (the order rotating with the block) before the next block, so a slow
    minute of the machine falls on all of them alike. One engine thread is alive at a time (stopped and restarted
    between blocks, its state kept): a second live thread owning an OpenMP pool would slow every step; a baseline
    runs each block on a thread of its own that exits after.
    Each configuration's wall time is the sum of its requests' latencies."""
    compiler = None
    engines, baselines = {}, {}
    schema_of = lambda i: i.schema if i.kind == "extract" else _tool_schema(i)  # noqa: E731
    references: dict[tuple[int, ...], list[int]] = {}  # the perfect draft's: filled by the off row, block by block
    prompt_ids = _prompt_ids(models)
    prompt_key = lambda i: tuple(prompt_ids(i))  # noqa: E731 - as the engine's
    try:
        for name in names:
            if name in LLAMACPP_BASELINES:
                n_ctx = context_for([*items, *warm], max_tokens, prompt_ids)
                baselines[name] = baseline = run_in_worker(LlamaCppBaseline, models, name, n_ctx)
                run_in_worker(baseline.run, warm, max_tokens, schema_of, prompt_ids, Record)
                continue
            engines[name] = prepared = _start_engine(name, models, items, 1, compiler, policy, data_dir, references)
            compiler = prepared[0].compiler
            _warm(prepared, warm, extra_warm, 1, max_tokens, temperature)
            prepared[0].stop()
        records: dict[str, list[Record]] = {name: [] for name in names}
        spent = {name: ExecutorTime(0, 0.0) for name in names}
        for b, start in enumerate(range(0, len(items), block)):
            chunk = items[start: start + block]
            for name in _block_order(names, b):
                if name in baselines:
                    done, _ = run_in_worker(baselines[name].run, chunk, max_tokens, schema_of, prompt_ids, Record)
                    records[name] += done
                    if progress is not None:
                        progress(name, 1, len(records[name]), len(items),
                                 sum(r.output_tokens for r in records[name]))
                    continue
                engine, spec, speculate, tick, _ = engines[name]
                engine.start()
                before = ExecutorTime.read(engine.core.executor)
                try:
                    done, _ = asyncio.run(_run_engine(engine, chunk, 1, max_tokens, spec.fast_forward, speculate,
                                                      temperature, None, tick))
                finally:
                    engine.stop()
                spent[name] = spent[name].plus(ExecutorTime.read(engine.core.executor).since(before))
                records[name] += done
                if name == "off":
                    references.update((prompt_key(i), r.token_ids) for i, r in zip(chunk, done))
                if progress is not None:
                    progress(name, 1, len(records[name]), len(items), sum(r.output_tokens for r in records[name]))
    finally:
        for engine, *_, store in engines.values():
            engine.stop()
            if store is not None:
                asyncio.run(store.close())
        for baseline in baselines.values():
            baseline.close()
    out = {}
    for name, rs in records.items():
        wall = sum(r.latency_s for r in rs)
        out[name] = summarize(rs, wall, save_outputs)
        if name in engines:
            out[name]["executor"] = executor_summary(spent[name], wall)
    return out


def _block_order(names: list[str], block: int, reference: str = "off") -> list[str]:
    """The configurations' turns in block ``block``: rotated by one each block, the perfect draft moved to just
    after ``reference`` (it drafts that row's outputs of the same block)."""
    order = names[block % len(names):] + names[: block % len(names)]
    if PERFECT_DRAFT in order and reference in order:
        order.remove(PERFECT_DRAFT)
        order.insert(order.index(reference) + 1, PERFECT_DRAFT)
    return order


def _add_identity(runs: list[dict[str, Any]]) -> None:
    """With saved outputs: per engine row, the share of requests whose token ids equal those of its ``off_of`` row
    at the same concurrency (greedy, fp32: 1.0 unless a near-tie flipped; in bf16 near-ties are common)."""
    for row in runs:
        ref = next((r for r in runs if r["config"] == off_of(row["config"]) and r["concurrency"] == row["concurrency"]
                    and "outputs" in r), None)
        if ref is None or "outputs" not in row or row["config"] in BASELINES:
            continue
        same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(row["outputs"], ref["outputs"]))
        row["same_as_off"] = same / max(1, len(ref["outputs"]))


def format_table(report: dict[str, Any]) -> str:
    m = report["machine"]
    temperature = report.get("temperature") or 0.0
    mode = f"temperature {temperature:g}" if temperature else "greedy"
    t = Table(title=f"decode: {report['profile']} / {report['workload']} / {report['requests']} requests, {mode}, "
                    f"max_tokens {report['max_tokens']}, {report.get('few_shot', 0)}-shot ({report.get('examples', 'shipped')}) / {m['processor']} x{m['cpus']}, {m['device']}, {m.get('executor', 'transformers')} {m.get('dtype', 'float32')}")
    llamacpp = any(r["config"] in LLAMACPP_BASELINES for r in report["runs"])
    vs = ("x l.cpp+gram", "x l.cpp") if llamacpp else ("x hf+outl",)
    for col in ("config", "conc", "tok/s", "x off", *vs, "x c1", "p50 ms", "p99 ms", "ms/tok",
                "passes/tok", "eval ms/fwd", "head ms/fwd", "other ms/fwd", "other / model", "forced", "valid", "stop",
                "fields", "copied", "= off", "acceptance (mean accepted length)"):
        t.add_column(col)
    for r in report["runs"]:
        if "error" in r:
            t.add_row(r["config"], str(r["concurrency"]), f"error: {r['error'][:80]}")
            continue
        acc = ", ".join(f"{k} {v:.2f} ({r['mean_accepted_length'].get(k, 0):.1f})"
                        for k, v in r["acceptance"].items()) or "-"
        ratio = lambda key, r=r: f"{r[key]:.2f}" if key in r else "-"  # noqa: E731
        ex = r.get("executor", {})
        ms = lambda key, ex=ex: f"{ex[key]:.1f}" if key in ex else "-"  # noqa: E731
        ratios = (ratio("speedup_vs_llamacpp_grammar"), ratio("speedup_vs_llamacpp_generate")) if llamacpp else \
            (ratio("speedup_vs_hf_outlines"),)
        t.add_row(r["config"], str(r["concurrency"]), f"{r['tokens_per_s']:.1f}", ratio("speedup_vs_off"),
                  *ratios, ratio("speedup_vs_c1"), f"{r['latency_ms_p50']:.0f}",
                  f"{r['latency_ms_p99']:.0f}", f"{r['ms_per_output_token']:.1f}",
                  f"{r['forward_passes_per_token']:.2f}", ms("eval_ms_per_forward"), ms("head_ms_per_forward"),
                  ms("overhead_ms_per_forward"),
                  f"{ex['overhead_share_of_eval']:.1%}" if "overhead_share_of_eval" in ex else "-",
                  f"{r['forced_share']:.2f}", f"{r['valid_rate']:.2f}",
                  f"{r['stop_rate']:.2f}", f"{r['field_accuracy']:.2f}", f"{r.get('copy_rate', 0.0):.3f}",
                  f"{r['same_as_off']:.2f}" if "same_as_off" in r else "-", acc)
    buf = StringIO()
    console = Console(file=buf, width=260)
    console.print(t)
    for key, title in (("by_schema", "schema"), ("by_phase", "phase")):
        table = _group_table(report, key, title)
        if table is not None:
            console.print(table)
    return buf.getvalue()


def _group_table(report: dict[str, Any], key: str, title: str):
    """Per schema (or phase) and configuration: throughput against ``off`` on the same requests, and why it drafted."""
    rows = [r for r in report["runs"] if key in r]
    if not rows:
        return None
    t = Table(title=f"per {title} (tok/s: output tokens per second of the requests' own latency)")
    for col in (title, "config", "conc", "requests", "tok/s", "x off", "p50 ms", "passes/tok", "fields", "copied",
                "acceptance",
                "decisions"):
        t.add_column(col)
    groups = list(dict.fromkeys(g for r in rows for g in r[key]))  # in the order the requests came
    for g in groups:
        for r in rows:
            stats = r[key].get(g)
            if stats is None:
                continue
            off = next((o[key].get(g) for o in rows if o["config"] == off_of(r["config"])
                        and o["concurrency"] == r["concurrency"]), None)
            ratio = f"{stats['tokens_per_s'] / off['tokens_per_s']:.2f}" if off and off["tokens_per_s"] else "-"
            acc = ", ".join(f"{k} {v:.2f}" for k, v in stats["acceptance"].items()) or "-"
            why = ", ".join(f"{k} {v}" for k, v in sorted(stats["decisions"].items())) or "-"
            if r["config"] == "policy":
                why += "".join(f"; {p}: " + ", ".join(f"{k} {v}" for k, v in sorted(d.items()))
                               for p, d in sorted(stats.get("proposer_decisions", {}).items()))
            t.add_row(g or "-", r["config"], str(r["concurrency"]), str(stats["requests"]),
                      f"{stats['tokens_per_s']:.1f}", ratio, f"{stats['latency_ms_p50']:.0f}",
                      f"{stats['forward_passes_per_token']:.2f}", f"{stats['field_accuracy']:.2f}",
                      f"{stats.get('copy_rate', 0.0):.3f}", acc, why)
    return t


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
