"""llama.cpp's own generation as benchmark baselines: what a CPU user runs without structspec.

On the GGUF the llama.cpp executor loads, with the same prompt token ids, greedy, one
request at a time, through llama-cpp-python's high-level ``Llama`` (its prompt cache
reuses the prefix a request shares with the previous one, as structspec's prefix cache does):

  llamacpp_grammar         constrained by llama.cpp's JSON-schema grammar (``LlamaGrammar.from_json_schema``)
  llamacpp_grammar_lookup  the same grammar with llama.cpp's prompt-lookup drafting
                           (``LlamaPromptLookupDecoding``, 10 tokens a draft)
  llamacpp_generate        unconstrained, stopping at the first newline (as ``hf_generate`` does)

Forward passes are llama.cpp decode calls (counted by wrapping the context's ``decode``).
``LlamaCppBaseline`` keeps one baseline open across calls, so an interleaved benchmark can give
it its turn block by block beside the engine configurations.
Raises ``ValueError`` for a GGUF without a vocabulary (the ones structspec writes for its
own models: llama.cpp's samplers need the token strings). Cost: one model load per
baseline (~1 s), one grammar conversion per schema (kept across requests).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Callable, cast

from structspec.engine.postcheck import check_json_text
from structspec.engine.types import Outcome
from structspec.models.llamacpp_model import lib
from structspec.models.threads import cpu_budget

LLAMACPP_BASELINES = ("llamacpp_grammar", "llamacpp_grammar_lookup", "llamacpp_generate")
LOOKUP_TOKENS = 10  # llama-cpp-python's default draft length for prompt lookup


@contextlib.contextmanager
def unrepacked_weights():
    """llama-cpp-python's ``Llama`` loading its model without repacked weights (``use_extra_bufts`` off), as the
    engine's executor loads it (``models.llamacpp_model``): the same kernels on both sides of a ratio, and no AMX
    repack, whose matrix product segfaults on some AMX CPUs (llama.cpp issue 20824). ``Llama`` has no argument for
    it, so its default parameters are wrapped while it loads."""
    import llama_cpp.llama as high_level  # optional, as in LlamaCppBaseline

    default = high_level.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    high_level.llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        high_level.llama_cpp.llama_model_default_params = default


class LlamaCppBaseline:
    """One baseline's ``Llama`` (model, context, prompt cache, grammars), kept across calls of ``run``: an
    interleaved benchmark serves it block by block, like the engine configurations beside it."""

    def __init__(self, models, mode: str, n_ctx: int):
        # llama-cpp-python is optional (the llamacpp extra): imported where a baseline opens, so the decode
        # benchmark runs without it
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        if mode not in LLAMACPP_BASELINES:
            raise ValueError(f"unknown llama.cpp baseline {mode!r}")
        llama_cpp = lib()
        vocab = llama_cpp.llama_model_get_vocab(models.target.handle)
        if llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_NONE:
            raise ValueError(f"{models.target.info.path} has no vocabulary (written by structspec for its own "
                             "executor); llama.cpp's own generation needs one")
        self.mode = mode
        threads = cpu_budget()
        draft = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS) if mode == "llamacpp_grammar_lookup" else None
        # llama-cpp-python keeps logits for every context position with a draft model (n_ctx x 262k floats for
        # Gemma): the context is sized to the longest request, not to the model's window; logits_all is given with
        # the draft because it sizes that store by the argument, not by the draft
        with unrepacked_weights():
            self.llm = Llama(model_path=models.target.info.path, n_ctx=n_ctx, n_batch=512, n_threads=threads,
                             n_threads_batch=threads, seed=0, verbose=False, draft_model=draft,
                             logits_all=draft is not None)
        self.calls = 0
        decode = self.llm._ctx.decode

        def counted(batch):
            self.calls += 1
            return decode(batch)

        self.llm._ctx.decode = counted  # type: ignore[method-assign]  # counts llama.cpp's decode calls
        self._grammars: dict[str, Any] = {}

    def run(self, items: list, max_tokens: int, schema_of: Callable[[Any], dict], prompt_of: Callable[[Any], list[int]],
            record: Callable[..., Any], progress: Callable[[int, int, int], None] | None = None) -> tuple[list, float]:
        """(records, wall seconds) for ``items``, one at a time."""
        from llama_cpp import LlamaGrammar  # optional, as in __init__

        records = []
        t_all = time.perf_counter()
        for item in items:
            schema = schema_of(item)
            ids = prompt_of(item)  # the engine's prompt ids for the item
            before = self.calls
            t0 = time.perf_counter()
            kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "repeat_penalty": 1.0}
            if self.mode == "llamacpp_generate":
                kwargs["stop"] = ["\n"]
            else:
                key = json.dumps(schema, sort_keys=True)
                if key not in self._grammars:
                    self._grammars[key] = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
                kwargs["grammar"] = self._grammars[key]
            out = cast(dict[str, Any], self.llm.create_completion(ids, **kwargs))  # not streamed: one response
            latency = time.perf_counter() - t0
            text = out["choices"][0]["text"].strip()
            n_out = int(out["usage"]["completion_tokens"])
            checked = check_json_text(text, schema)
            right, total = item.score(checked.value)
            copied, counted_values = item.copied(checked.value)
            records.append(record(latency, n_out, self.calls - before, out["choices"][0]["finish_reason"] == "stop",
                                  checked.outcome is Outcome.VALID, right, total, prompt_tokens=len(ids), text=text,
                                  token_ids=[], schema=item.schema_name, phase=item.phase, copied=copied,
                                  copy_counted=counted_values))
            if progress is not None:
                progress(len(records), len(items), sum(r.output_tokens for r in records))
        return records, time.perf_counter() - t_all

    def close(self) -> None:
        self.llm.close()


def context_for(items: list, max_tokens: int, prompt_of: Callable[[Any], list[int]]) -> int:
    """A context that holds the longest prompt of ``items`` and ``max_tokens`` more (in cells of 256)."""
    longest = max((len(prompt_of(i)) for i in items), default=0)
    return 256 * -(-(longest + max_tokens + 16) // 256)


def run_llamacpp_baseline(models, items: list, max_tokens: int, mode: str,
                          progress: Callable[[int, int, int], None] | None = None,
                          schema_of: Callable[[Any], dict] | None = None,
                          prompt_of: Callable[[Any], list[int]] | None = None,
                          record: Callable[..., Any] | None = None) -> tuple[list, float]:
    """(records, wall seconds) for ``items`` on a fresh ``LlamaCppBaseline``; the callables come from
    ``decode_bench``."""
    if schema_of is None or prompt_of is None or record is None:
        raise ValueError("run_llamacpp_baseline needs schema_of, prompt_of and record")
    baseline = LlamaCppBaseline(models, mode, context_for(items, max_tokens, prompt_of))
    try:
        return baseline.run(items, max_tokens, schema_of, prompt_of, record, progress)
    finally:
        baseline.close()
