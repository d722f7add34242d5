"""A verdict is recorded under its proposer, and a draft carried on the restricted cap under its narrow key."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from structspec.engine.speculator import DraftVerdict
from structspec.speculation.verdicts import record_verdict
from structspec.stats.counters import narrow_key


class Verifications:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record_verification(self, *args) -> None:
        self.calls.append(args)


@pytest.mark.parametrize("narrow", [False, True])
def test_a_draft_carried_on_the_restricted_cap_is_recorded_under_its_narrow_key(narrow: bool) -> None:
    stats = Verifications()
    seq = SimpleNamespace(schema_key="s@1", decision=None, output=[], prompt=[])
    record_verdict(stats, seq, DraftVerdict("ngram", 3, 3, 1, narrow=narrow), lambda ids: "")
    assert stats.calls == [("s@1", narrow_key("ngram") if narrow else "ngram", 1, 3, 3, False)]
