"""What a verdict is recorded as: the verification by draft position and a sample of the rejected drafts.

The statistics are those the sequence records into (its draft version's model key); a rejected draft is kept
with the committed context before it (``CONTEXT_TOKENS``: the output's tail, the prompt's where the output is
shorter), so its rejections can be read as text later.
"""

from __future__ import annotations

from typing import Callable, Sequence

from structspec.engine.sequence import EngineSequence
from structspec.engine.speculator import DraftVerdict
from structspec.stats.book import Recorder
from structspec.stats.counters import Reason, narrow_key
from structspec.stats.samples import CONTEXT_TOKENS


def record_verdict(stats: Recorder, seq: EngineSequence, verdict: DraftVerdict,
                   decode: Callable[[Sequence[int]], str]) -> None:
    """Record ``verdict`` on ``seq``'s draft (a probe's as such) and, when a drafted token was rejected, the
    rejected draft with its context (``decode``: token ids -> text). A draft carried on its proposer's restricted
    cap is recorded under ``narrow_key``: the policy prices that cap with its own acceptance."""
    probe = seq.decision is not None and seq.decision.reasons.get(verdict.proposer) == Reason.PROBE
    proposer = narrow_key(verdict.proposer) if verdict.narrow else verdict.proposer
    stats.record_verification(seq.schema_key, proposer, verdict.batch_size, verdict.drafted,
                              verdict.accepted, probe)
    if verdict.accepted < len(verdict.tokens):
        context = seq.output[-CONTEXT_TOKENS:]
        if len(context) < CONTEXT_TOKENS:
            context = seq.prompt[len(context) - CONTEXT_TOKENS:] + context
        stats.record_rejection(seq.schema_key, verdict.proposer, verdict.batch_size, context,
                               verdict.tokens, verdict.accepted, verdict.target_token,
                               verdict.accepted < verdict.grammatical, decode)
