"""Draft versions: which draft model serves which sequences, and when a replaced one is released.

A sequence is bound at its first decision (its admission) to the draft model serving then (``DraftVersion``)
and drafts with it to its end: a draft loaded meanwhile (``DraftVersions.install``, on the engine thread,
between steps) serves the sequences admitted afterwards only, so no output is drafted by two models. The
version it replaces is retired, and released (its executor closed) when its last sequence finishes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from structspec.speculation.base import SequenceSpeculation
from structspec.speculation.draft_model import DraftModelProposer

log = logging.getLogger(__name__)


@dataclass(eq=False)
class DraftVersion:
    """A draft model and the sequences bound to it (admitted while it was the current one)."""

    proposer: DraftModelProposer | None  # None: no draft model (or released)
    version: str = ""
    sequences: int = 0  # running sequences bound to it
    retired: bool = False  # another draft serves new sequences: released when ``sequences`` reaches 0


class DraftVersions:
    """The current draft version and the retired ones that still serve sequences."""

    def __init__(self, current: DraftVersion):
        self.current = current
        self._live: set[DraftVersion] = set()  # retired versions that still serve sequences

    def install(self, proposer: DraftModelProposer, version: str) -> None:
        """Serve the sequences bound from now on with ``proposer``; the current one retires."""
        old = self.current
        old.retired = True
        self._live.add(old)
        self.current = DraftVersion(proposer, version)
        self._release_if_done(old)

    def live(self) -> dict[str, int]:
        """Draft version -> running sequences bound to it, for every version still loaded (the current one too)."""
        out = {d.version: d.sequences for d in self._live if d.proposer is not None}
        if self.current.proposer is not None:
            out[self.current.version] = out.get(self.current.version, 0) + self.current.sequences
        return out

    def bind(self, state: SequenceSpeculation) -> DraftVersion:
        """The version ``state``'s sequence drafts with: the current one, bound the first time."""
        if state.draft is None:
            state.draft = self.current
            self.current.sequences += 1
        draft: DraftVersion = state.draft  # (``SequenceSpeculation.draft``: the engine's side does not know its type)
        return draft

    def unbind(self, state: SequenceSpeculation) -> None:
        """``state``'s sequence ended: its draft releases what it held for it, and a retired version whose last
        sequence this was is released. Raises: what the proposer's ``release`` raises (counted off all the same)."""
        bound = state.draft
        if bound is None:
            return
        try:
            if bound.proposer is not None:
                bound.proposer.release(state)
        finally:  # counted off whatever the release did, so a replaced draft is still freed
            bound.sequences -= 1
            self._release_if_done(bound)

    def _release_if_done(self, draft: DraftVersion) -> None:
        if not draft.retired or draft.sequences > 0:
            return
        self._live.discard(draft)
        if draft.proposer is not None:
            draft.proposer.close()
            draft.proposer = None
            log.info("draft %s released (its last request finished)", draft.version)
