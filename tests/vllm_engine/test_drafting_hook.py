"""The parts of vLLM structspec's proposer stands on, checked against the installed vLLM without starting it: an
upgrade that moves one fails here, not in a request. Skipped where vLLM is not installed (``STRUCTSPEC_REQUIRE_VLLM=1``
makes it fail)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path


from tests.vllm_engine import need_vllm

need_vllm()

import vllm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_vllm_is_the_pinned_one():
    pins = set(re.findall(r'"vllm(?:-cpu)?==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()))
    assert pins == {vllm.__version__.split("+")[0]}, (pins, vllm.__version__)


def test_the_runner_calls_a_custom_class_proposer_with_the_cpu_tokens_after_bookkeeping():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    source = inspect.getsource(GPUModelRunner.propose_draft_token_ids)
    call = source[source.index('method == "custom_class"'):]
    assert re.search(r"\.propose\(\s*sampled_token_ids,\s*self\.input_batch\.num_tokens_no_spec,\s*"
                     r"self\.input_batch\.token_ids_cpu", call), call[:400]
    assert "self.drafter = create_custom_proposer" in inspect.getsource(GPUModelRunner.__init__)


def test_the_rows_the_proposer_reads_are_where_it_reads_them():
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    fields = {f.name for f in dataclasses.fields(CachedRequestState)}
    assert {"sampling_params", "prompt_token_ids", "output_token_ids"} <= fields
    init = inspect.getsource(InputBatch.__init__)
    assert "self.spec_token_ids" in init and "req_ids" in dir(InputBatch)
    # this step's scheduled drafts are written into spec_token_ids before the step runs
    assert "cur_spec_token_ids.extend(spec_token_ids)" in inspect.getsource(InputBatch.update_req_spec_token_ids)


def test_custom_class_runs_on_the_v1_runner_and_the_extension_is_an_engine_argument():
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    assert '"custom_class"' in inspect.getsource(VllmConfig._get_v2_model_runner_unsupported_features)
    assert "worker_extension_cls" in {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def test_drafts_without_probabilities_are_verified_as_one_hot():
    """vLLM's rejection sampler with ``draft_probs`` None: accept with the target's probability, recover from the
    target with the drafted token removed (what the exactness test relies on, and its broken twin patches)."""
    import vllm.v1.sample.rejection_sampler as rs

    assert "draft_probs" in inspect.signature(rs.sample_recovered_tokens).parameters
    kernel = inspect.getsource(rs)
    assert "vocab_offset != draft_token_id" in kernel and "NO_DRAFT_PROBS" in kernel
