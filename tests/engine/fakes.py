"""Model-free stand-ins for the engine's seams: a forward step with real KV bookkeeping, a toy grammar.

``TableExecutor`` implements ``ForwardStep``: each sequence's cache is the list of tokens it
holds, a step appends every input's tokens, and the logits at a position depend only on the
tokens up to it (from a table: the last token -> the token it prefers). ``rollback``,
``copy_prefix`` and ``free`` have the real semantics, so a wrong rollback shows as a wrong
cache (and wrong logits) in the next step.

``SlotGrammar`` accepts fixed-length outputs: position i allows the token set ``slots[i]``
(a one-token set is forced), then EOS only.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from structspec.engine.sequence import EngineSequence
from structspec.engine.types import SamplingParams
from structspec.grammar.base import set_bits
from structspec.models.executor import ContextOverflow, StepInput

EOS = 0
VOCAB = 16


class TableExecutor:
    restricted_logits_max = 0

    def __init__(self, prefer: dict[int, int] | Callable[[tuple[int, ...]], int], vocab_size: int = VOCAB,
                 max_context: int = 4096):
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.forward_calls = 0
        self.prefer = prefer if callable(prefer) else (lambda ctx, t=dict(prefer): t.get(ctx[-1], EOS))
        self.cache: dict[int, list[int]] = {}
        self.steps: list[list[StepInput]] = []  # what each forward carried
        self._next_id = 0

    def logits(self, context: tuple[int, ...]) -> torch.Tensor:
        row = torch.zeros(self.vocab_size)
        row[self.prefer(context)] = 5.0
        row[(self.prefer(context) + 1) % self.vocab_size] = 2.0  # a clear second choice
        return row

    def new_sequence(self) -> int:
        self._next_id += 1
        self.cache[self._next_id] = []
        return self._next_id

    def step(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        over = {x.seq_id: "context overflow" for x in inputs if len(self.cache[x.seq_id]) + len(x.tokens) > self.max_context}
        if over:  # refused before running, as an executor does: nothing cached
            raise ContextOverflow(over)
        self.forward_calls += 1
        self.steps.append(list(inputs))
        out = []
        for inp in inputs:
            cached = self.cache[inp.seq_id]
            start = len(cached)
            cached.extend(inp.tokens)
            n = len(inp.tokens)
            rows = [self.logits(tuple(cached[: start + (i % n) + 1])) for i in inp.logits_at]
            out.append(torch.stack(rows) if rows else torch.empty((0, self.vocab_size)))
        return out

    def rollback(self, seq_id: int, n: int) -> None:
        assert 0 <= n <= len(self.cache[seq_id]), (n, len(self.cache[seq_id]))
        del self.cache[seq_id][len(self.cache[seq_id]) - n:]

    def copy_prefix(self, seq_id: int, source_id: int, n: int) -> None:
        assert not self.cache[seq_id] and n <= len(self.cache[source_id])
        self.cache[seq_id] = list(self.cache[source_id][:n])

    def free(self, seq_id: int) -> None:
        del self.cache[seq_id]

    def seq_len(self, seq_id: int) -> int:
        return len(self.cache[seq_id])

    def footprint(self, sequences: int, longest: int) -> int:
        return 0  # no physical cache: only the reservations bound admission


class SlotMatcher:
    def __init__(self, slots: Sequence[frozenset[int]]):
        self.slots = list(slots)
        self.pos = 0
        self._error: str | None = None
        self.eos_consumed = False

    def _allowed(self) -> frozenset[int]:
        return frozenset({EOS}) if self.pos == len(self.slots) else self.slots[self.pos]

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        bitmask[row] = 0
        if self._error is None:
            set_bits(bitmask[row], self._allowed())

    def consume(self, tokens: Sequence[int]) -> bool:
        for t in tokens:
            if self._error is not None or t not in self._allowed() or t == EOS:
                self._error = self._error or f"token {t} not allowed at {self.pos}"
                return False
            self.pos += 1
        return True

    def rollback(self, n: int) -> None:
        assert 0 <= n <= self.pos
        self.pos -= n

    def forced_tokens(self) -> list[int]:
        out, i = [], self.pos
        while i < len(self.slots) and len(self.slots[i]) == 1:
            out.append(next(iter(self.slots[i])))
            i += 1
        return out

    def is_accepting(self) -> bool:
        return self.pos == len(self.slots)

    def is_stopped(self) -> bool:
        return self.pos == len(self.slots)

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def limit_exceeded(self) -> str | None:
        return None


class ToyTokenizer:
    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) -> str:
        return "".join("." if i == EOS else chr(ord("a") + i - 1) for i in ids)


def free_slots(n: int, vocab: int = VOCAB) -> list[frozenset[int]]:
    return [frozenset(range(1, vocab))] * n


def make_seq(prompt: list[int], slots: Sequence[frozenset[int]], max_tokens: int = 64, *, fast_forward: bool = True,
             speculate: bool = True, deadline: float | None = None, events: list | None = None,
             params: SamplingParams | None = None) -> EngineSequence:
    return EngineSequence(
        request_id=f"r{len(prompt)}", prompt=list(prompt), grammar=None, matcher=SlotMatcher(slots),  # type: ignore[arg-type]
        params=params or SamplingParams(max_tokens=max_tokens), seed=1, deadline=deadline, fast_forward=fast_forward,
        speculate=speculate, schema_key="toy", schema=None,
        on_event=(lambda kind, payload: events.append((kind, payload))) if events is not None else (lambda *_: None),
    )


class AlwaysDrafts:
    """A speculator's ``decide``: every request may draft as far as the scheduler allows (a fixed configuration)."""

    def decide(self, seq, batch_size):
        from structspec.engine.types import SpeculationReport

        return SpeculationReport(True, "drafted", False, {"any": 1 << 20}, {})

    def on_verified(self, seq, verdict):
        pass

    def on_finish(self, seq):
        pass
