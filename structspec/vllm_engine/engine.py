"""``VllmEngine``: ``EngineAPI`` over vLLM's ``AsyncLLM``, in the server's process.

The request pipeline (``structspec.engine.pipeline``) validates, compiles and renders each request as on
structspec's own engine; ``_run`` hands the sequence to vLLM: its prompt as token ids (rendered by structspec,
so the prompt is the one the own engine would decode), its grammar as structured outputs on vLLM's ``guidance``
backend (``grammar.vllm_lark``), its sampling parameters and seed, its end-of-turn ids as stop ids and its stop
strings. Text is detokenized by structspec from the token ids (the own engine's ``OutputText``), so both engines
read outputs the same way.

Faults: a request vLLM refuses (``VLLMValidationError``: a prompt over ``max_model_len``, a grammar) is an
``InvalidRequest``/``ContextTooLong`` naming the field; a dead engine core (``EngineDeadError``, or ``errored``
seen by the watcher) fails every request with ``EngineStopped`` (UNAVAILABLE) and calls the health watchers
(the server turns NOT_SERVING); the deadline aborts the vLLM request (finish cancelled); a caller gone cancels
the consumer, and ``AsyncLLM.generate`` aborts the request on its way out.

Drafting: with structspec's own method (``proposer.StructspecProposer``, vLLM's ``custom_class``), each request
carries the plan the per-schema policy made for it (``planning.DraftingFront``) and its verdicts come back per
proposer (``StructspecWorker.structspec_drain`` when it ends). With one of vLLM's methods (ngram, EAGLE, a draft
model), vLLM drafts for every request or none: a request's ``speculation: off`` does not turn it off, the draft
length per batch size is fixed when the engine is built (``schedule``), and forced tokens are not drafted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Callable

from vllm import SamplingParams as VllmSampling
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase

from structspec.chat_template import PromptFormat
from structspec.engine.default_examples import ExampleBook
from structspec.engine.detok import IncrementalDetokenizer, OutputText
from structspec.engine.pipeline import RequestPipeline
from structspec.engine.sequence import EngineSequence
from structspec.engine.types import (ContextTooLong, EngineStopped, FinishReason, GenerationResult, InvalidRequest,
                                     Outcome, QueueFull, TextDelta, Timings, Usage)
from structspec.grammar import GrammarCompiler
from structspec.vllm_engine.drafting import EXTRA_ARGS_KEY, DraftingPlan, Journal
from structspec.vllm_engine.grammar import vllm_lark
from structspec.vllm_engine.planning import DraftingFront
from structspec.vllm_engine.steps import StepLog, record_verifications

log = logging.getLogger(__name__)

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.CANCELLED,
           "error": FinishReason.ERROR}


def step_logger(steps: StepLog) -> Callable[..., StatLoggerBase]:
    """A vLLM stat-logger factory whose loggers feed ``steps`` (one ``record`` per engine step)."""

    class StepLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            spec = scheduler_stats.spec_decoding_stats
            steps.record(time.monotonic(), scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs,
                         spec.num_drafts if spec is not None else 0, spec.num_draft_tokens if spec is not None else 0)

        def log_engine_initialized(self) -> None:
            pass

    return StepLogger


class VllmEngine(RequestPipeline):
    """``EngineAPI`` over ``llm`` (an ``AsyncLLM`` built with ``step_logger(steps)`` among its stat loggers).

    ``proposer``: vLLM's speculative method, the statistics' proposer ("" without one); ``stats``: a
    ``Recorder`` under ``model_key``; ``end_of_turn``: the ids any of which ends a turn; ``max_in_flight``: requests
    held at once (running and waiting in vLLM), past which QueueFull; ``drafting``: structspec's drafting inside
    vLLM (the engine built with ``StructspecProposer``; None: vLLM's own method or none); ``max_batch``: vLLM's
    running requests at most (the batch size a plan is made for is capped by it)."""

    def __init__(self, llm: Any, tokenizer: Any, compiler: GrammarCompiler, max_context: int, *, model_key: str,
                 end_of_turn: tuple[int, ...], steps: StepLog, proposer: str = "", stats: Any = None,
                 max_tokens_cap: int = 4096, examples: ExampleBook | None = None, prompts: PromptFormat | None = None,
                 max_in_flight: int = 1024, schedule: tuple[tuple[int, int, int], ...] = (),
                 drafting: DraftingFront | None = None, max_batch: int = 256):
        # forced tokens reach vLLM as drafts of structspec's proposer; without it vLLM decodes each one
        # vLLM masks the target's tokens with its own grammar: a copy guard around structspec's matcher would not
        # reach them
        super().__init__(tokenizer, compiler, max_context, max_tokens_cap, examples,
                         fast_forward=drafting is not None, prompts=prompts, copy_guard=False)
        self.llm = llm
        self._model_key = model_key
        self.eos = tuple(end_of_turn)
        self.steps = steps
        self.proposer = proposer
        self.stats = stats
        self.max_in_flight = max_in_flight
        self.max_batch = max_batch
        self.drafting = drafting
        self._attached: asyncio.Future[bool] | None = None  # the proposer reached in every worker
        self.schedule = schedule  # vLLM's draft length per batch-size range, as built
        self.lengths: tuple[Any, ...] = ()  # the batch-size rule's ``BucketLength``s behind it (empty: none)
        self.dead: str | None = None  # why the engine core is gone (None: alive)
        self._watchers: list[Callable[[], None]] = []
        self._in_flight = 0
        self._monitor: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def model_key(self) -> str:
        return self._model_key

    @property
    def draft_version(self) -> str:
        return ""

    def start(self) -> None:
        """Watch the engine core from the running event loop (the server calls this once it serves)."""
        if self._monitor is None:
            self._monitor = asyncio.get_running_loop().create_task(self._watch())
        if self.drafting is not None and self._attached is None:
            self._attached = asyncio.ensure_future(self._attach())

    async def _attach(self) -> bool:
        """Hand each worker's model runner to its proposer (``StructspecWorker.structspec_attach``).
        Raises: EngineStopped when a worker has no structspec proposer (vLLM built another method)."""
        ranks = await self.llm.collective_rpc("structspec_attach")
        if not ranks or not all(ranks):
            raise EngineStopped("vLLM's workers have no structspec proposer (the V2 model runner, or another "
                                "speculative method): structspec's drafting cannot run")
        log.info("structspec's proposer attached in %d vLLM worker(s)", len(ranks))
        return True

    def watch_health(self, on_dead: Callable[[], None]) -> None:
        """Call ``on_dead`` (on the event loop) once the engine core has died."""
        self._watchers.append(on_dead)

    async def _watch(self) -> None:
        while self.dead is None:
            await asyncio.sleep(0.5)
            if self.llm.errored:
                self._mark_dead("the vLLM engine core died")

    def _mark_dead(self, why: str) -> None:
        if self.dead is not None:
            return
        self.dead = why
        log.error("%s: failing requests with UNAVAILABLE", why)
        for watcher in self._watchers:
            try:
                watcher()
            except Exception:  # noqa: BLE001 - one watcher's failure is not the others'
                log.exception("a health watcher failed")

    def close(self) -> None:
        self._stopping = True
        if self._monitor is not None:
            self._monitor.cancel()
        self.llm.shutdown()

    stop = close

    def queue_depth(self) -> int:
        return self.steps.waiting

    def running(self) -> int:
        return self.steps.running

    # -- decoding --------------------------------------------------------------------------------
    def sampling(self, seq: EngineSequence, plan: DraftingPlan | None = None) -> VllmSampling:
        """vLLM's sampling parameters for ``seq``: its own, its grammar, its stops, its drafting ``plan`` (for
        structspec's proposer); deltas of token ids."""
        p = seq.params
        structured = None
        if seq.schema is not None or not seq.prose:  # free text has no grammar beyond its stops
            structured = StructuredOutputsParams(grammar=vllm_lark(seq.grammar))
        return VllmSampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=seq.seed,
                            max_tokens=p.max_tokens, stop_token_ids=list(self.eos), stop=list(seq.stop) or None,
                            structured_outputs=structured, output_kind=RequestOutputKind.DELTA,
                            skip_special_tokens=False, detokenize=bool(seq.stop),
                            include_stop_str_in_output=True,
                            extra_args={EXTRA_ARGS_KEY: plan.to_args()} if plan is not None else None)

    async def _run(self, seq: EngineSequence, stream: bool) -> AsyncIterator[TextDelta | GenerationResult]:
        if self.dead is not None:
            raise EngineStopped(self.dead)
        if self._stopping:
            raise EngineStopped("the engine is shutting down")
        if self._in_flight >= self.max_in_flight:
            raise QueueFull(f"{self._in_flight} requests in flight (the server's limit); retry later")
        plan = None
        if self.drafting is not None:
            if self._attached is None:
                self.start()
            await asyncio.shield(self._attached)  # type: ignore[arg-type]
            plan = self.drafting.plan(seq, min(self.max_batch, self._in_flight + 1))
        params = self.sampling(seq, plan)
        ids: list[int] = []
        text = OutputText(self.tokenizer)
        shown = IncrementalDetokenizer(text)
        started = time.monotonic()
        first_step, first_out = self.steps.number, None
        finish, error, metrics, cached = FinishReason.ERROR, None, None, 0
        self._in_flight += 1
        try:
            left = None if seq.deadline is None else max(0.0, seq.deadline - time.monotonic())
            async with asyncio.timeout(left):
                async for out in self.llm.generate({"prompt_token_ids": list(seq.prompt)}, params,
                                                   request_id=seq.key):
                    c = out.outputs[0]
                    first_out = first_out or time.monotonic()
                    ids.extend(c.token_ids)
                    cached = out.num_cached_tokens or cached
                    if c.finish_reason is not None:
                        finish = _FINISH.get(c.finish_reason, FinishReason.ERROR)
                        metrics = c.spec_decode_metrics
                    if stream:
                        delta = shown.delta(self._output(ids))
                        if delta:
                            yield TextDelta(seq.request_id, delta)
        except TimeoutError:
            finish, error = FinishReason.CANCELLED, "deadline exceeded"
        except EngineDeadError as exc:
            self._mark_dead(f"the vLLM engine core died: {exc}")
            raise EngineStopped(self.dead or "the vLLM engine died") from exc
        except VLLMValidationError as exc:
            raise _refusal(exc) from exc
        finally:
            self._in_flight -= 1
        ended = time.monotonic()
        output = self._output(ids)
        usage = Usage(prompt_tokens=len(seq.prompt), output_tokens=len(output), cached_prompt_tokens=cached)
        batch = self.steps.median_running(first_step)
        accepted = 0
        if self.drafting is not None:
            accepted = self.drafting.record(seq, await self._journal(seq.key), usage)
            self.drafting.finished(seq, output, text(output), finish)
        elif metrics is not None and self.proposer:
            accepted = record_verifications(self.stats, seq.schema_key, self.proposer, batch,
                                            metrics.per_step_drafted, metrics.per_step_accepted, usage)
        usage.target_forward_passes = max(1, len(ids) - accepted) if ids else 0
        first_out = first_out or ended
        timings = Timings(prefill_ms=(first_out - started) * 1000, decode_ms=(ended - first_out) * 1000,
                          total_ms=(ended - started) * 1000)
        if self.stats is not None:
            self.stats.record_request(seq.schema_key, len(output), usage.target_forward_passes, usage.forced_tokens,
                                      finish.value,
                                      timings.total_ms, decode_ms=timings.decode_ms, batch_size=batch)
            self.stats.record_traffic(seq.schema_key, seq.prompt, output, finish.value)
        if stream:
            rest = shown.delta(output, final=True)
            if rest:
                yield TextDelta(seq.request_id, rest)
        yield GenerationResult(request_id=seq.request_id, text=text(output), token_ids=output, finish_reason=finish,
                               outcome=Outcome.NOT_CHECKED, usage=usage, timings=timings, error=error,
                               model_key=self._model_key, speculation=seq.decision)

    async def _journal(self, key: str) -> Journal:
        """What structspec's proposer did for request ``key`` (the first rank's: every rank drafts alike); an empty
        journal where the workers cannot be asked (logged: the request's statistics are lost, not its answer)."""
        try:
            ranks = await self.llm.collective_rpc("structspec_drain", timeout=30, args=([key],))
            for rank in ranks:
                if key in rank:
                    return Journal.from_dict(rank[key])
        except Exception:  # noqa: BLE001 - statistics are never worth a request
            log.exception("reading structspec's drafting journal for %s failed", key)
        return Journal()

    def _output(self, ids: list[int]) -> list[int]:
        """The output without the end-of-turn id vLLM leaves at its end (it never joins structspec's outputs)."""
        return ids[:-1] if ids and ids[-1] in self.eos else ids


def _refusal(exc: VLLMValidationError) -> InvalidRequest:
    """What vLLM refused, as the error the own engine raises for it."""
    text = str(exc)
    if "context length" in text or "max_model_len" in text or "maximum model length" in text:
        return ContextTooLong(f"vLLM: {text}", field="max_tokens")
    if "rammar" in text:
        return InvalidRequest(f"vLLM's grammar backend refused the grammar: {text}", field="schema")
    return InvalidRequest(f"vLLM refused the request: {text}", field=getattr(exc, "parameter", None) or "")
