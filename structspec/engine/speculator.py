"""The speculation seam as the engine sees it: a ``Speculator`` drafts, the engine verifies and reports the verdict.

The engine depends on this protocol only; ``structspec.speculation`` implements it (and
imports the engine's types, never the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from structspec.engine.sequence import EngineSequence
from structspec.engine.types import SpeculationReport


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    q: torch.Tensor | None  # [k, V] the distributions the tokens were drawn from; None = point masses
    proposer: str


@dataclass(frozen=True)
class DraftVerdict:
    """What verification made of one step's draft."""

    proposer: str
    drafted: int  # tokens the proposer drafted (before the engine cut an ungrammatical tail)
    accepted: int  # drafted tokens kept (the recovered or bonus token is not counted)
    batch_size: int  # sequences running in the step
    tokens: tuple[int, ...] = ()  # the drafted tokens (before the grammatical cut)
    grammatical: int = 0  # of those, how many the grammar took (a refused one ends the verified draft)
    target_token: int = -1  # the token the target chose after the accepted ones (recovered or bonus)
    narrow: bool = False  # carried past the proposer's cap on its restricted one (every scored set small)


class Speculator(Protocol):
    def decide(self, seq: EngineSequence, batch_size: int) -> SpeculationReport:
        """Who may draft for ``seq`` with ``batch_size`` sequences running, how far, and why.

        Asked at admission and whenever the running batch crosses a batch-size bucket. Raises: Never."""

    def propose(self, seq: EngineSequence, max_tokens: int, narrow: bool = True) -> Draft | None:
        """At most ``max_tokens`` drafted tokens after ``seq``'s committed text, or None. ``narrow``: the first drafted
        position allows few tokens (the executor scores it without its output layer), so a proposer's restricted
        cap (``SpeculationReport.restricted_max_draft``) applies; False: its cap alone.

        Leaves ``seq.matcher`` as found. Per-sequence state lives in ``seq.speculation``.
        """

    def on_verified(self, seq: EngineSequence, verdict: DraftVerdict) -> None:
        """Told after every step that carried one of its drafts."""

    def on_finish(self, seq: EngineSequence) -> None:
        """Told once when ``seq`` ends (any reason); releases what it holds for it."""
