"""The engine's one typed configuration; every default is written here once.

Import-light (no torch): the service's settings take their defaults from these classes
and build an ``EngineConfig`` in one function (``ServiceSettings.engine_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch: int = 16  # sequences decoded together
    max_queue: int = 256  # waiting requests; one more is refused (backpressure, not an unbounded wait)
    kv_budget_tokens: int = 65536  # KV-cache tokens all running sequences may reserve
    prefill_chunk: int = 256  # prompt tokens one sequence feeds per step
    step_tokens: int = 512  # tokens one forward may carry in all (decodes first, prefill fills the rest)
    max_draft: int = 8  # drafted tokens per sequence per step (KV headroom reserved for them)
    max_spec_batch: int = 8  # no drafting while more sequences than this run (verification stops paying)
    prefix_cache_tokens: int = 8192  # prompt KV kept after requests finish, for reuse (0: no prefix caching)


@dataclass(frozen=True)
class EngineConfig:
    profile: str = "gemma-3-270m"  # model profile (structspec.models.profiles)
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16
    grammar_backend: str = "llguidance"  # llguidance | outlines
    speculation: str = "all"  # a name in structspec.speculation.configs.SPECULATION_CONFIGS
    max_tokens_cap: int = 4096  # a request may not ask for more
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)

    def resolved_device(self, cuda_available: bool) -> str:
        return ("cuda" if cuda_available else "cpu") if self.device == "auto" else self.device

    def resolved_dtype(self, device: str) -> str:
        return ("bfloat16" if device == "cuda" else "float32") if self.dtype == "auto" else self.dtype
