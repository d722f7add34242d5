"""One request's drafting inside vLLM: what the front decided for it, its draft at each step, and the verdicts.

Terms:

- *plan* (``DraftingPlan``): what structspec's front decided for one request when it admitted it, carried to
  vLLM's workers in ``SamplingParams.extra_args["structspec"]``: the proposers the policy let draft and each one's
  length cap, whether forced tokens are drafted, the probe's token budget, the schema (where a value is free text
  decides who drafts first) and a snapshot of the schema's history (the front's persisted, tenant-scoped one);
- *draft*: forced tokens first (the grammar allows exactly one token there, so the target's masked distribution
  accepts them with probability 1), then one proposer's tokens, walked through the request's grammar and cut at
  the first token it cannot take (vLLM's scheduler would drop that tail anyway);
- *verdict* (``Verification``): what vLLM's verification made of the proposer's part of one draft. vLLM's
  rejection sampler keeps a prefix of the scheduled draft and samples one token after it, so the tokens accepted
  are the longest prefix of the scheduled draft that the step's sampled tokens repeat (a rejected position's
  recovered token is never the drafted one: a draft without probabilities is one-hot, and the recovered token is
  drawn from max(p - q, 0), which is 0 at the drafted token).

``RequestDrafter`` is pure (no vLLM): the worker's proposer (``proposer``) drives one per running request with
the rows vLLM gives it (``settle``, ``advance``, ``draft``). Raises: Never from ``settle``/``advance``/``draft``
once built (a grammar that breaks stops that request's drafting; the request runs on undrafted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from structspec.engine.types import SamplingParams
from structspec.grammar.base import Matcher, allocate_bitmask, token_allowed
from structspec.speculation.base import DraftContext, Proposer, SequenceSpeculation
from structspec.speculation.proposing import cut_to_key, key_lengths, proposer_order, remember_acceptance

EXTRA_ARGS_KEY = "structspec"  # the plan's key in ``SamplingParams.extra_args``
FORCED = "forced"  # the name forced tokens are counted under (never a policy's proposer)


@dataclass(frozen=True)
class DraftingPlan:
    """What the front decided for one request (``to_args``/``from_args``: the form ``extra_args`` carries)."""

    request: str  # structspec's key of the request (the front reads its verdicts by it)
    schema_key: str
    history_key: str
    caps: dict[str, int] = field(default_factory=dict)  # proposer -> draft-length cap (the policy's); {}: none
    forced: bool = True  # draft the tokens the grammar forces (the engine's fast-forward; a request's
    # ``speculation: off`` keeps it, as on the own engine: they are accepted with probability 1)
    probe_budget: int | None = None  # a recovery probe drafts at most this many proposer tokens in all
    schema: dict[str, Any] | None = None
    prose: bool = False  # the whole output is free text
    end_of_turn: tuple[int, ...] = ()
    history: tuple[str, ...] = ()  # the schema history's outputs (oldest first) the history proposer drafts from

    def to_args(self) -> dict[str, Any]:
        return {"request": self.request, "schema_key": self.schema_key, "history_key": self.history_key,
                "caps": dict(self.caps), "forced": self.forced, "probe_budget": self.probe_budget,
                "schema": self.schema, "prose": self.prose, "end_of_turn": list(self.end_of_turn),
                "history": list(self.history)}

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> DraftingPlan:
        """Raises: KeyError, TypeError, ValueError (not a plan the front wrote)."""
        return cls(str(args["request"]), str(args["schema_key"]), str(args["history_key"]),
                   {str(p): int(k) for p, k in dict(args.get("caps") or {}).items()}, bool(args.get("forced", True)),
                   None if args.get("probe_budget") is None else int(args["probe_budget"]), args.get("schema"),
                   bool(args.get("prose", False)), tuple(int(t) for t in args.get("end_of_turn") or ()),
                   tuple(str(h) for h in args.get("history") or ()))


@dataclass(frozen=True)
class Verification:
    """One verification of a proposer's draft inside vLLM: ``drafted`` tokens scheduled, ``accepted`` kept, at a
    step of ``batch_size`` requests; ``tokens``: the scheduled draft's tokens (the proposer's part)."""

    proposer: str
    drafted: int
    accepted: int
    batch_size: int
    tokens: tuple[int, ...] = ()


@dataclass
class Journal:
    """What one request's drafting did, read by the front when the request ends."""

    verifications: list[Verification] = field(default_factory=list)
    forced_drafted: int = 0  # forced tokens scheduled as drafts
    forced_accepted: int = 0
    mismatches: int = 0  # steps whose scheduled draft was not a prefix of this request's draft (none expected)
    failures: int = 0  # drafting attempts that raised (each ended the request's drafting)

    def to_dict(self) -> dict[str, Any]:
        return {"verifications": [[v.proposer, v.drafted, v.accepted, v.batch_size, list(v.tokens)]
                                  for v in self.verifications],
                "forced_drafted": self.forced_drafted, "forced_accepted": self.forced_accepted,
                "mismatches": self.mismatches, "failures": self.failures}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Journal:
        return cls([Verification(str(p), int(n), int(a), int(b), tuple(t)) for p, n, a, b, t in d["verifications"]],
                   int(d["forced_drafted"]), int(d["forced_accepted"]), int(d["mismatches"]), int(d["failures"]))

    def merge(self, other: Journal) -> None:
        self.verifications += other.verifications
        self.forced_drafted += other.forced_drafted
        self.forced_accepted += other.forced_accepted
        self.mismatches += other.mismatches
        self.failures += other.failures


@dataclass(frozen=True)
class _Proposed:
    tokens: tuple[int, ...]
    forced: int  # the first ``forced`` tokens are forced ones
    proposer: str  # who drafted the rest ("" none)


class RequestDrafter:
    """One running request's drafting. ``matcher``: a fresh matcher of the request's grammar (None: free text,
    no grammar) over a vocabulary of ``vocab_size`` ids; ``decode``: token ids -> text; ``proposers``: by name,
    those the plan may use."""

    def __init__(self, plan: DraftingPlan, matcher: Matcher | None, prompt_ids: Sequence[int],
                 decode: Callable[[Sequence[int]], str], proposers: Mapping[str, Proposer], vocab_size: int = 0):
        self.plan = plan
        self.matcher = matcher
        self.prompt_ids = list(prompt_ids)
        self.decode = decode
        self.proposers = proposers
        self.state = SequenceSpeculation()
        self.journal = Journal()
        self.output: list[int] = []  # the committed output the matcher has consumed
        self.broken = False  # the grammar refused the committed output, or drafting raised: no more drafts
        self._last: _Proposed | None = None
        self._prompt_text: str | None = None
        self._eos = frozenset(plan.end_of_turn)
        self._mask = allocate_bitmask(1, vocab_size) if matcher is not None and vocab_size else None

    def settle(self, scheduled: Sequence[int], sampled: Sequence[int], batch_size: int) -> None:
        """Count what this step's verification made of the draft vLLM scheduled (``scheduled``: a prefix of the
        last ``draft``, the scheduler having dropped what the grammar or the length limit refused), given the
        tokens the step sampled for this request."""
        last, self._last = self._last, None
        if not scheduled:
            return
        if last is None or tuple(scheduled) != last.tokens[: len(scheduled)]:
            self.journal.mismatches += 1
            return
        accepted = 0
        while accepted < len(scheduled) and accepted < len(sampled) and sampled[accepted] == scheduled[accepted]:
            accepted += 1
        forced = min(last.forced, len(scheduled))
        self.journal.forced_drafted += forced
        self.journal.forced_accepted += min(accepted, forced)
        drafted = len(scheduled) - forced
        if drafted > 0 and last.proposer:
            kept = max(0, accepted - forced)
            self.journal.verifications.append(Verification(last.proposer, drafted, kept, batch_size,
                                                           tuple(scheduled[forced:])))
            remember_acceptance(self.state, last.proposer, kept)

    def advance(self, output: Sequence[int]) -> None:
        """Consume the output committed since the last call (``output``: the request's whole output so far)."""
        if self.broken or len(output) <= len(self.output):
            return
        new = list(output[len(self.output):])
        self.output.extend(new)
        if self.matcher is not None and not self.matcher.consume([t for t in new if t not in self._eos]):
            self.broken = True  # (a stop string, say, the grammar never saw): drafting ends, the request runs on

    def draft(self, k: int, batch_size: int) -> list[int]:
        """At most ``k`` tokens to verify next: forced tokens, then the first proposer (in ``proposer_order``) the
        plan allows that drafts, cut where the grammar refuses; the matcher left as found."""
        if self.broken or k <= 0 or (self.matcher is not None and self.matcher.is_stopped()):
            return []
        consumed = 0
        try:
            tokens: list[int] = []
            if self.plan.forced and self.matcher is not None:
                for t in self.matcher.forced_tokens()[:k]:
                    if t in self._eos or not self.matcher.consume([t]):
                        break
                    tokens.append(t)
                    consumed += 1
            forced, proposer = len(tokens), ""
            room = self._room(k - forced)
            if room > 0 and not (self.matcher is not None and self.matcher.is_stopped()):
                ctx = self._context(tokens)
                for p in proposer_order(ctx, self.proposers.get("ngram"), None, self.proposers.get("history")):
                    lengths = key_lengths(self.state, p.name, self.plan.caps, room)
                    if not lengths:
                        continue
                    made = cut_to_key(p.propose(ctx, max(lengths.values())), lengths)
                    if made is None:
                        continue
                    for t in made.tokens:
                        if t in self._eos or not self._take(t):
                            break
                        tokens.append(t)
                        consumed += 1
                        if self.matcher is not None and self.matcher.is_stopped():
                            break
                    proposer = made.proposer if len(tokens) > forced else ""
                    break
            if proposer and self.plan.probe_budget is not None:
                self.state.probe_drafted += len(tokens) - forced
            if tokens:
                self._last = _Proposed(tuple(tokens), forced, proposer)
            return tokens
        except Exception:  # noqa: BLE001 - a proposer's bug costs this request its drafts, never the request
            self.broken = True
            self.journal.failures += 1
            return []
        finally:
            if consumed and self.matcher is not None:
                self.matcher.rollback(consumed)

    def _take(self, token: int) -> bool:
        """Consume ``token`` if the grammar allows it here; a refused token is tested against the mask first, so
        the matcher never enters its (sticky) error state."""
        if self.matcher is None:
            return True
        if self._mask is None:
            raise ValueError("a grammar's drafts need the vocabulary size")
        self.matcher.fill_mask(self._mask, 0)
        return token_allowed(self._mask[0], token) and self.matcher.consume([token])

    def _room(self, room: int) -> int:
        """Proposer tokens this step may carry: ``room``, within a probe's remaining budget."""
        if self.plan.probe_budget is None:
            return room
        return min(room, self.plan.probe_budget - self.state.probe_drafted)

    def _context(self, pending: list[int]) -> DraftContext:
        if self._prompt_text is None:
            self._prompt_text = self.decode(self.prompt_ids)
        output = self.output + pending
        return DraftContext(self.plan.history_key, self.plan.schema, self._prompt_text, self.decode(output),
                            self.prompt_ids, output, self.matcher if self.matcher is not None else _NO_GRAMMAR, 0,
                            SamplingParams(), self.state, self.plan.prose)


class _NoGrammar:
    """The matcher of free text: every token goes (a proposer may consume and roll back; nothing is kept)."""

    def consume(self, tokens: Sequence[int]) -> bool:
        return True

    def rollback(self, n: int) -> None:
        pass

    def forced_tokens(self) -> list[int]:
        return []

    def is_stopped(self) -> bool:
        return False

    def is_accepting(self) -> bool:
        return True

    def fill_mask(self, bitmask: Any, row: int = 0) -> None:
        raise NotImplementedError("free text has no mask here: vLLM masks")

    error = None
    limit_exceeded = None


_NO_GRAMMAR: Any = _NoGrammar()
