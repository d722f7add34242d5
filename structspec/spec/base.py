"""The proposer seam: ``propose(context, k) -> Draft`` (tokens, and probabilities or None)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    q: torch.Tensor | None  # [k, V] the distributions the tokens were drawn from; None = point masses
    proposer: str


@dataclass
class DraftContext:
    """What a proposer may look at: the request's text so far and where the grammar stands."""

    seq_key: str  # the engine's handle on the sequence (``Sequence.key``): unique while it runs
    schema_key: str
    schema: dict[str, Any] | None
    prompt_text: str
    output_text: str
    prompt_ids: list[int]
    output_ids: list[int]
    matcher: Any  # the sequence's grammar matcher (consume/rollback freely, leave it as found)
    seed: int
    sampling: Any


class Proposer(Protocol):
    name: str

    def propose(self, ctx: DraftContext, k: int) -> Draft | None: ...
