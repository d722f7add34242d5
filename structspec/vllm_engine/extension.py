"""``StructspecWorker``: the worker extension (``worker_extension_cls``) the front reaches the proposer through.

vLLM mixes this class into each worker; the front calls its methods on every worker with
``AsyncLLM.collective_rpc`` (through the engine core, between steps):

- ``structspec_attach``: hands the worker's model runner to its ``StructspecProposer`` (the proposer's
  ``propose`` names no request; the runner's input batch does). Returns whether a proposer was there;
- ``structspec_drain(keys)``: the drafting journals of the ended requests ``keys``.

Every rank drafts the same tokens from the same rows, so the front reads the first rank's answer.
"""

from __future__ import annotations

from typing import Any, Sequence

EXTENSION_PATH = "structspec.vllm_engine.extension.StructspecWorker"


class StructspecWorker:
    model_runner: Any  # (the worker's own)

    def structspec_attach(self) -> bool:
        from structspec.vllm_engine.proposer import StructspecProposer

        drafter = getattr(self.model_runner, "drafter", None)
        if not isinstance(drafter, StructspecProposer):
            return False
        drafter.attach(self.model_runner)
        return True

    def structspec_drain(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        drafter = getattr(self.model_runner, "drafter", None)
        drain = getattr(drafter, "drain", None)
        return drain(list(keys)) if drain is not None else {}
