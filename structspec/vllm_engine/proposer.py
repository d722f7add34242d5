"""``StructspecProposer``: structspec's drafting as vLLM's ``custom_class`` speculative method.

vLLM builds it in each worker (``speculative_config = {"method": "custom_class", "model":
"structspec.vllm_engine.proposer.StructspecProposer", "num_speculative_tokens": K}``) and, after every step that
sampled (the method drafts from the CPU's tokens, after bookkeeping), calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` with one row per request of
the input batch: it returns one draft per row (up to K tokens; ``[]`` drafts nothing). vLLM's scheduler drops the
tail of a draft its grammar refuses, and its rejection sampler verifies the rest against the target's masked
distribution.

The call names no request, so the proposer reads the model runner the worker extension attached
(``extension.StructspecWorker.structspec_attach``): ``input_batch.req_ids`` (the rows' requests),
``input_batch.spec_token_ids`` (the draft each row verified this step) and ``requests`` (each request's sampling
parameters, prompt and output). Those are the runner's own attributes, not an interface vLLM promises: the pinned
vLLM version is tested (``tests/vllm_engine/test_drafting_hook.py``), so an upgrade that moves them fails a test.

Per request it keeps a ``drafting.RequestDrafter`` built from the request's plan (``extra_args["structspec"]``)
and grammar (``structured_outputs.grammar``, the Lark text structspec sent), and a journal of its verdicts that
the front drains when the request ends (``drain``). A request without a plan drafts nothing.
Cost: per row and step, the matcher's consumption of the new tokens, a forced-token query, and one proposer's
text lookup (the output decoded once per step).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Sequence

from structspec.speculation.base import Proposer
from structspec.speculation.history import HistoryProposer, SchemaHistory
from structspec.speculation.ngram import NgramProposer
from structspec.stats.counters import draft_keys
from structspec.vllm_engine.drafting import EXTRA_ARGS_KEY, DraftingPlan, Journal, RequestDrafter

log = logging.getLogger(__name__)

CLASS_PATH = "structspec.vllm_engine.proposer.StructspecProposer"
MAX_JOURNALS = 8192  # journals of ended requests kept for the front to drain (oldest dropped first)
MAX_GRAMMARS = 256  # compiled grammars kept (a prototype matcher per Lark text)


class StructspecProposer:
    """``vllm_config``: the engine's (its model's tokenizer and vocabulary, the method's K)."""

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        model = vllm_config.model_config
        self._tokenizer_name = str(model.tokenizer)
        self._trust = bool(getattr(model, "trust_remote_code", False))
        self._vocab = int(model.get_vocab_size())
        self.runner: Any = None
        self._tokenizer: Any = None
        self._view: Any = None
        self._ngram: Any = None
        self._grammars: OrderedDict[str, Any] = OrderedDict()
        self._drafters: dict[str, RequestDrafter | None] = {}  # vLLM request id -> (None: no plan)
        self._journals: OrderedDict[str, Journal] = OrderedDict()  # structspec request key -> its journal
        self.failures = 0  # steps whose drafting raised (logged once; those steps drafted nothing)

    # -- vLLM's interface ------------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No weights: the proposers draft from text and the grammar."""

    def attach(self, runner: Any) -> None:
        """Read the rows' requests from ``runner`` (vLLM's model runner)."""
        self.runner = runner

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any = None,
                token_ids_cpu: Any = None, slot_mappings: Any = None, **kwargs: Any) -> list[list[int]]:
        """One draft per row of ``sampled_token_ids`` (the tokens each request committed this step).
        Raises: RuntimeError when no runner is attached (the engine was built without the worker extension);
        otherwise Never (a failure drafts nothing that step, logged once)."""
        runner = self.runner
        if runner is None:
            raise RuntimeError("StructspecProposer has no model runner: build the engine with "
                               "worker_extension_cls='structspec.vllm_engine.extension.StructspecWorker' and call "
                               "structspec_attach (structspec.vllm_engine.build does)")
        try:
            return self._propose(runner, sampled_token_ids)
        except Exception:  # noqa: BLE001 - a runner that moved its attributes costs drafts, never the engine core
            self.failures += 1
            if self.failures == 1:
                log.exception("structspec's proposer failed on vLLM's runner: no drafts this step")
            return [[] for _ in sampled_token_ids]

    def _propose(self, runner: Any, sampled_token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        batch = runner.input_batch
        rows = list(batch.req_ids)[: len(sampled_token_ids)]
        size = sum(1 for r in rows if r is not None)
        drafts: list[list[int]] = []
        for i, rid in enumerate(rows):
            drafter = self._drafter(rid, runner) if rid is not None else None
            sampled = sampled_token_ids[i]
            if drafter is None or not sampled:  # no plan, or a step that committed nothing (a prefill's part)
                drafts.append([])
                continue
            drafter.settle(batch.spec_token_ids[i], sampled, size)
            drafter.advance(runner.requests[rid].output_token_ids)
            drafts.append(drafter.draft(self.k, size))
        drafts += [[] for _ in range(len(sampled_token_ids) - len(drafts))]
        self._forget(set(rows))
        return drafts

    # -- the front's side ------------------------------------------------------------------------
    def drain(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The journals of the requests ``keys`` (structspec's request keys), removed from here."""
        out = {}
        for key in keys:
            journal = self._journals.pop(key, None)
            if journal is not None:
                out[key] = journal.to_dict()
        return out

    # -- requests --------------------------------------------------------------------------------
    def _drafter(self, rid: str, runner: Any) -> RequestDrafter | None:
        if rid in self._drafters:
            return self._drafters[rid]
        state = runner.requests[rid]
        drafter = None
        params = state.sampling_params
        args = (getattr(params, "extra_args", None) or {}).get(EXTRA_ARGS_KEY)
        if args is not None:
            try:
                drafter = self._start(DraftingPlan.from_args(args), params, state.prompt_token_ids or [])
            except Exception:  # noqa: BLE001 - a request we cannot draft for runs undrafted
                log.exception("structspec drafting could not start for request %s; it runs without drafts", rid)
        self._drafters[rid] = drafter
        return drafter

    def _start(self, plan: DraftingPlan, params: Any, prompt: Sequence[int]) -> RequestDrafter:
        tokenizer = self._load_tokenizer(plan.end_of_turn)
        structured = getattr(params, "structured_outputs", None)
        lark = getattr(structured, "grammar", None) if structured is not None else None
        matcher = self._matcher(lark) if lark else None
        proposers: dict[str, Proposer] = {}
        if any(plan.caps.get(key) for key in draft_keys("ngram")):
            proposers["ngram"] = self._ngram
        if plan.caps.get("history") and plan.history:
            history = SchemaHistory()
            history.load((plan.history_key, text) for text in plan.history)
            proposers["history"] = HistoryProposer(tokenizer, history)
        journal = self._journals.get(plan.request)
        if journal is None:  # (a preempted request that comes back keeps its journal)
            journal = self._journals[plan.request] = Journal()
            while len(self._journals) > MAX_JOURNALS:
                self._journals.popitem(last=False)
        drafter = RequestDrafter(plan, matcher, prompt, self._decode, proposers, self._view.n_vocab)
        drafter.journal = journal
        return drafter

    def _forget(self, live: set[str | None]) -> None:
        """Drop the drafting state of requests no longer in the batch (their journals stay until drained)."""
        for rid in [r for r in self._drafters if r not in live]:
            del self._drafters[rid]

    # -- tokenizer and grammars --------------------------------------------------------------------
    def _load_tokenizer(self, end_of_turn: Sequence[int]) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from structspec.grammar.tokenizer_view import TokenizerView

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_name, trust_remote_code=self._trust)
            self._ngram = NgramProposer(self._tokenizer)  # stateless: one serves every request
            self._view = TokenizerView(self._tokenizer, n_vocab=max(self._vocab, len(self._tokenizer)),
                                       eos_token_ids=list(end_of_turn) or None)
        return self._tokenizer

    def _matcher(self, lark: str) -> Any:
        """A fresh matcher of the Lark grammar ``lark`` (compiled once, copied per request).
        Raises: ValueError (a grammar llguidance refuses: vLLM refused the request before this)."""
        import llguidance

        from structspec.grammar.llguidance_backend import LLGuidanceMatcher

        prototype = self._grammars.get(lark)
        if prototype is None:
            prototype = llguidance.LLMatcher(self._view.ll_tokenizer, llguidance.grammar_from("grammar", lark),
                                             log_level=0)
            if prototype.is_error():
                raise ValueError(prototype.get_error())
            self._grammars[lark] = prototype
            while len(self._grammars) > MAX_GRAMMARS:
                self._grammars.popitem(last=False)
        self._grammars.move_to_end(lark)
        return LLGuidanceMatcher(self._view, prototype.deep_copy())

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))
