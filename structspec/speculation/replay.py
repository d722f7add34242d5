"""Replayed drafts: what a proposer that did not draft in a request would have had accepted, read off its output.

A cold proposer the policy prices out (no draft length pays at the prior) drafts nothing, so it would gather
evidence only through probes. Yet a cheap proposer (copy lookup, the schema history) needs no model to draft: on a
finished output it can be asked, position by position, what it would have drafted, and the output itself says
what verification would have kept of it.

Why that is the acceptance it would have had. A draft carries no probabilities, so verification keeps a drafted
token x with the target's probability p(x) under the grammar mask (greedy: when x is the argmax), and the output
token at that position was drawn from the same p (greedy: is the argmax). So P(kept) = P(output token = x), at
every position given the ones before: the matched prefix of a draft against the output has the distribution of the
accepted prefix of a verification, and the counts by draft position (``Recorder.record_replay``) estimate the same
per-position acceptance, unbiased. Greedy and deterministic proposers make them equal to the verdicts the engine
would have recorded, draft for draft (``tests/speculation/test_replay.py``).

The walk mirrors the engine's step: forced tokens are fast-forwarded (never a proposer's turn); a draft is asked
(at the policy's longest length, or, for the comparison with the engine, the length ``draft_length`` would pick),
cut at the first token the grammar refuses (as ``Drafter.draft`` cuts it); the walk then moves past the matched
tokens and the one the target committed after them.

Cost: one matcher over the output, a proposer call and a decode of the output so far per replayed step. The router
replays a proposer only while its replayed evidence is thin (``Router.on_finish``).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Sequence

import torch

from structspec.engine.sequence import EngineSequence
from structspec.grammar.base import Matcher, allocate_bitmask, decision_end, token_allowed
from structspec.speculation.base import DraftContext, Proposer, SequenceSpeculation
from structspec.speculation.decisions import Decider
from structspec.speculation.history import history_key
from structspec.speculation.proposing import cut_to_key, key_lengths, remember_acceptance
from structspec.stats.book import Recorder
from structspec.stats.counters import Reason, draft_keys

log = logging.getLogger(__name__)

_REPLAYED = (Reason.PRICED_OUT, Reason.SHORT_OUTPUT)  # the decisions not to draft whose drafts are replayed


def replay_priced_out(seq: EngineSequence, output: Sequence[int], proposers: Iterable[Proposer | None],
                      decider: Decider, stats: Recorder | None, vocab_size: int,
                      decode: Callable[[list[int]], str], ends_at_decisions: bool = True) -> None:
    """Replay on ``seq``'s finished ``output`` the drafts of each of ``proposers`` its decision priced out (a short
    output's drafting refused included: its drafts' lengths price its cap, ``policy.short_draft_length``), while the
    schema's replayed evidence is thin (``Decider.wants_replay``), and record them. Call it before the output joins
    the schema history (it must not draft itself). ``ends_at_decisions``: the engine cuts a draft to end where the
    target decides (``Drafter._decision_end``; vLLM's drafting does not: it drafts forced tokens).
    Raises: Never (a failure is logged, the evidence lost)."""
    decision, policy = seq.decision, decider.policy
    if stats is None or decision is None or policy is None or seq.grammar is None or not output:
        return
    for proposer in proposers:
        keys = [] if proposer is None else [
            key for key in draft_keys(proposer.name)
            if decision.reasons.get(key) in _REPLAYED and decider.wants_replay(stats, seq.schema_key, key)]
        if proposer is None or not keys:
            continue
        try:
            verdicts = replay_drafts(proposer, output, seq.grammar.matcher(), vocab_size,
                                     sequence_context(seq, decode), policy.max_draft, seq.fast_forward, adapt=False,
                                     ends_at_decisions=ends_at_decisions)
        except Exception:  # noqa: BLE001 - evidence lost, never the answer
            log.exception("replaying %s's drafts on request %s failed", proposer.name, seq.request_id)
            continue
        for key in keys:  # each of its draft keys its own evidence (a long match's drafts apart)
            stats.record_replay(seq.schema_key, key, seq.decision_bucket,
                                [(drafted, accepted) for k, drafted, accepted in verdicts if k == key])
        decider.forget(stats, seq.schema_key)


def sequence_context(seq: EngineSequence, decode: Callable[[list[int]], str]
                     ) -> Callable[[list[int], Matcher, SequenceSpeculation], DraftContext]:
    """A proposer's view of ``seq`` with ``output`` committed (``decode``: ids -> text), for ``replay_drafts``."""
    prompt_text = decode(list(seq.prompt))

    def context(output: list[int], matcher: Matcher, state: SequenceSpeculation) -> DraftContext:
        return DraftContext(history_key(seq), seq.schema, prompt_text, decode(output), seq.prompt, output, matcher,
                            seq.seed, seq.params, state, seq.prose)

    return context


def replay_drafts(proposer: Proposer, output: Sequence[int], matcher: Matcher, vocab_size: int,
                  context: Callable[[list[int], Matcher, SequenceSpeculation], DraftContext], max_draft: int,
                  fast_forward: bool = True, end_of_turn: frozenset[int] = frozenset(),
                  adapt: bool = True, ends_at_decisions: bool = True) -> list[tuple[str, int, int]]:
    """(draft key, drafted, accepted) of each draft ``proposer`` would have made while ``output`` was decoded (the
    key: the name the draft is recorded under, ``stats.counters.draft_keys``).

    ``matcher``: a fresh matcher of the request's grammar (consumed here); ``context(output_so_far, matcher,
    state)``: the proposer's view at a position; ``end_of_turn``: ids a draft never runs past; ``adapt``: drafts as
    long as the engine's ``draft_length`` would ask (its verdicts, draft for draft), else every draft ``max_draft``
    long (what pricing wants: each position's acceptance measured as often as the drafts reach it, not only after
    a run of acceptances); ``ends_at_decisions`` (with ``fast_forward``): a draft is cut to end where the target
    decides, as the engine's drafter cuts it. Stops where the matcher refuses the output (one the grammar did not
    produce).
    Raises: whatever the proposer raises (the caller logs it and keeps the request's answer)."""
    out = list(output)
    state = SequenceSpeculation()
    mask = allocate_bitmask(max_draft + 1, vocab_size)  # a draft's rows (``key_lengths`` caps it at max_draft)
    verdicts: list[tuple[str, int, int]] = []
    t = 0
    while t < len(out) and not matcher.is_stopped():
        if fast_forward:
            forced = matcher.forced_tokens()
            n = 0
            while n < len(forced) and t + n < len(out) and out[t + n] == forced[n]:
                n += 1
            if n:
                if not matcher.consume(out[t:t + n]):
                    break
                t += n
                continue
        lengths = key_lengths(state, proposer.name, dict.fromkeys(draft_keys(proposer.name), max_draft), max_draft,
                              adapt)
        draft = cut_to_key(proposer.propose(context(out[:t], matcher, state), max(lengths.values())), lengths)
        step = 1
        if draft is not None:
            # counted as the engine counts it: drafted before the grammar's cut (a draft cut whole is a verdict of 0)
            tokens = list(draft.tokens)
            grammatical, carried = _grammatical(tokens, matcher, mask, end_of_turn)
            cut = fast_forward and ends_at_decisions and carried < grammatical
            drafted = carried if cut else len(tokens)
            if drafted:
                accepted = 0
                while accepted < min(grammatical, drafted) and t + accepted < len(out) \
                        and tokens[accepted] == out[t + accepted]:
                    accepted += 1
                verdicts.append((draft.proposer, drafted, accepted))
                remember_acceptance(state, draft.proposer, accepted)
                step = accepted + 1
        step = min(step, len(out) - t)
        if not matcher.consume(out[t:t + step]):
            break
        t += step
    return verdicts


def _grammatical(tokens: list[int], matcher: Matcher, mask: torch.Tensor, end_of_turn: frozenset[int]
                 ) -> tuple[int, int]:
    """How many of ``tokens`` the grammar takes in a row from here, and how many of those a draft carries once it
    ends where the target decides (``decision_end``, as the engine's drafter cuts it). ``mask``: [len(tokens)+1, W],
    row i filled with the mask after i tokens, as the engine's step fills its rows. The matcher is left as found."""
    consumed = filled = 0
    for i, tok in enumerate(tokens):
        matcher.fill_mask(mask, i)
        filled = i + 1
        if tok in end_of_turn or not token_allowed(mask[i], tok) or not matcher.consume([tok]):
            break
        consumed += 1
        if matcher.is_stopped():
            break
    if filled == consumed:  # the row after the last grammatical token is not filled yet
        matcher.fill_mask(mask, consumed)
    if consumed:
        matcher.rollback(consumed)
    return consumed, decision_end(mask, consumed)
