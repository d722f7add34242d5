"""The engine's one typed configuration; every default is written here once.

Import-light (no torch): the service's settings take their defaults from these classes
and build an ``EngineConfig`` in one function (``ServiceSettings.engine_config``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch: int = 16  # sequences decoded together
    max_queue: int = 256  # waiting requests; one more is refused (backpressure, not an unbounded wait)
    kv_budget_tokens: int = 65536  # KV-cache tokens all running sequences may reserve
    prefill_chunk: int = 256  # prompt tokens one sequence feeds per step
    step_tokens: int = 512  # tokens one forward may carry in all (decodes first, prefill fills the rest)
    max_draft: int = 8  # drafted tokens per sequence per step (KV headroom reserved for them)
    max_spec_batch: int = 64  # no drafting at all while more sequences than this run (the policy decides below it)
    prefix_cache_tokens: int = 8192  # KV of finished requests (prompt and output) kept for reuse (0: no prefix caching)


@dataclass(frozen=True)
class PolicyConfig:
    """The drafting policy's thresholds (``structspec.speculation.policy``)."""

    acceptance_threshold: float = 0.55  # a proposer under this acceptance (at the batch bucket) is off ...
    acceptance_guard: str = "unmeasured"  # ... always, or unless measured step costs show its drafts paying
    min_evidence_tokens: int = 500  # drafted tokens of evidence before the guard or the cost model switch anything off
    evidence_window_tokens: int = 1000  # acceptance: over the newest whole hours holding this many drafted tokens
    evidence_max_age_hours: float = 168.0  # older drafting evidence is not read (newer evidence replaces it before)
    half_life_hours: float = 3.0  # output lengths and step costs an hour old weigh 2^(-1/3)
    min_predicted_length: int = 20  # predicted output tokens under this: fast-forward only
    min_length_evidence: int = 8  # finished requests before their p50 replaces the schema's own estimate
    draft_model_max_batch: int = 32  # no draft-model drafting with more sequences running
    min_arm_requests: int = 8  # complete requests with and without the draft model before the faster one is kept
    probe_rate: float = 0.02  # share of requests that still draft with switched-off proposers (and explore arms)
    probe_interval_hours: float = 6.0  # a switched-off proposer not drafting for this long is probed (the floor)
    probe_max_draft: int = 3  # a probe's draft-length cap
    probe_max_tokens: int = 24  # a probe's drafted tokens per request (its evidence), then it decodes plainly
    prior_acceptance: float = 0.4  # a cold proposer is priced at this acceptance at a draft's first position ...
    prior_continuation: float = 0.7  # ... and this at each later one, given the one before was accepted ...
    prior_tokens: float = 24.0  # ... held as this many examined tokens of evidence (its own evidence outweighs it)
    depth_prior_tokens: float = 8.0  # a position after a draft's first is pulled toward its proposer's pooled rate
    gain_margin: float = 0.05  # a draft length must beat plain decoding's time per token by this share
    max_draft: int = 8  # the longest draft (the scheduler's KV headroom)

    def problems(self) -> list[str]:
        """What is wrong with the values, each naming its field (empty when valid)."""
        checks = [
            (0.0 <= self.acceptance_threshold <= 1.0, "acceptance_threshold", "must be in [0, 1]"),
            (self.acceptance_guard in ("always", "unmeasured"), "acceptance_guard", "must be always or unmeasured"),
            (self.min_evidence_tokens >= 1, "min_evidence_tokens", "must be >= 1"),
            (self.evidence_window_tokens >= self.min_evidence_tokens, "evidence_window_tokens",
             "must be >= min_evidence_tokens"),
            (self.half_life_hours > 0 and math.isfinite(self.half_life_hours), "half_life_hours", "must be > 0"),
            (self.evidence_max_age_hours >= 1, "evidence_max_age_hours", "must be >= 1"),
            (self.min_predicted_length >= 0, "min_predicted_length", "must be >= 0"),
            (self.min_length_evidence >= 1, "min_length_evidence", "must be >= 1"),
            (self.draft_model_max_batch >= 0, "draft_model_max_batch", "must be >= 0"),
            (self.min_arm_requests >= 1, "min_arm_requests", "must be >= 1"),
            (0.0 <= self.probe_rate <= 1.0, "probe_rate", "must be in [0, 1]"),
            (self.probe_interval_hours >= 1 and math.isfinite(self.probe_interval_hours), "probe_interval_hours",
             "must be >= 1"),
            (self.probe_max_draft >= 1, "probe_max_draft", "must be >= 1"),
            (self.probe_max_tokens >= 1, "probe_max_tokens", "must be >= 1"),
            (0.0 <= self.prior_acceptance <= 1.0, "prior_acceptance", "must be in [0, 1]"),
            (0.0 <= self.prior_continuation <= 1.0, "prior_continuation", "must be in [0, 1]"),
            (self.prior_tokens >= 0 and math.isfinite(self.prior_tokens), "prior_tokens", "must be >= 0"),
            (self.depth_prior_tokens >= 0 and math.isfinite(self.depth_prior_tokens), "depth_prior_tokens",
             "must be >= 0"),
            (0.0 <= self.gain_margin < 1.0, "gain_margin", "must be in [0, 1)"),
            (self.max_draft >= 1, "max_draft", "must be >= 1"),
        ]
        return [f"{name}: {why} (got {getattr(self, name)!r})" for ok, name, why in checks if not ok]


@dataclass(frozen=True)
class VllmOptions:
    """vLLM's own engine arguments, passed through as its ``AsyncEngineArgs`` (``structspec.vllm_engine.build``).

    ``speculative_config``: vLLM's JSON (``{"method": "ngram", "num_speculative_tokens": 4, ...}``; "" none);
    ``extra``: any other ``AsyncEngineArgs`` field as JSON (``{"enforce_eager": true}``)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str = ""  # "": vLLM's choice; mp | ray (several machines) | uni
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 0  # 0: the model's own
    speculative_config: str = ""
    enable_prefix_caching: bool = True
    extra: str = ""


@dataclass(frozen=True)
class EngineConfig:
    profile: str = "gemma-3-270m"  # a model profile's name, a GGUF file or a model folder (profiles.resolve_model)
    draft: str = ""  # a draft folder instead of the profile's ("" : the profile's)
    tokenizer: str = ""  # a tokenizer folder for the target ("" : its own; a GGUF's vocabulary)
    served_name: str = ""  # what statistics, results and /v1/models call the model ("" : profiles.served_name_of)
    chat_template: str = ""  # a chat template file prompts are rendered with ("" : the model's own, if any)
    load_format: str = "auto"  # auto (the stored weights) | dummy (seeded random weights of a folder's config)
    executor: str = "auto"  # auto | llamacpp | transformers (auto: the profile's CPU choice when llama.cpp is installed)
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16
    grammar_backend: str = "llguidance"  # llguidance | outlines
    speculation: str = "policy"  # a name in structspec.speculation.configs.SPECULATION_CONFIGS
    max_tokens_cap: int = 4096  # a request may not ask for more
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    engine: str = "structspec"  # structspec (its own decode loop) | vllm (vLLM's AsyncLLM runs the requests)
    step_profile_dir: str = ""  # where measured step costs are kept per model and machine ("": this process only)
    step_profile_seconds: float = 20.0  # the step-cost measurement's time budget (0: none measured)
    copy_guard: bool = True  # an output never goes along a value of the server's worked examples past the input
    vllm: VllmOptions = field(default_factory=VllmOptions)

    def resolved_device(self, cuda_available: bool) -> str:
        return ("cuda" if cuda_available else "cpu") if self.device == "auto" else self.device

    def resolved_dtype(self, device: str) -> str:
        return ("bfloat16" if device == "cuda" else "float32") if self.dtype == "auto" else self.dtype
