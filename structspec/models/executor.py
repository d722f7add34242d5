"""The forward-step API: what the decoding engine and the speculation need from a model.

A sequence lives in the executor as its KV cache. One ``step`` runs one forward
pass over a batch of sequences, each appending its own number of tokens:

    prefill      StepInput(seq, prompt_chunk, logits_at=(-1,))
    decode       StepInput(seq, [token], logits_at=(0,))
    verification StepInput(seq, [pending, *forced, *draft], logits_at=range(...))

and returns next-token logits only at the positions asked for (with Gemma's
262k vocabulary the output layer is most of a step's cost). ``rollback`` crops
one sequence's cache without touching the others. Implementations: transformers
(``hf_executor``); a llama.cpp executor can implement the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import torch


@dataclass(frozen=True)
class StepInput:
    """New tokens for one sequence and the indices (into ``tokens``, negative allowed) whose logits to return."""

    seq_id: int
    tokens: Sequence[int]
    logits_at: Sequence[int] = (-1,)
    # Per ``logits_at`` position: the token ids that may follow (a LongTensor), or None for any. An executor
    # may then return -inf for every other id instead of computing it: the caller masks them anyway.
    allowed: Sequence[torch.Tensor | None] | None = None


class InputError(ValueError):
    """Inputs of a step at fault, each for a reason of its own (its tokens, its positions, its allowed ids),
    never the model's: ``reasons`` maps their sequence ids to why. ``step`` raises it with every sequence as it
    was before the step (no token of it cached), so the step may run again without those inputs. Any other
    exception from ``step`` belongs to the whole step."""

    def __init__(self, reasons: Mapping[int, str]):
        self.reasons = dict(reasons)
        super().__init__("; ".join(f"sequence {sid}: {why}" for sid, why in self.reasons.items()))


class ContextOverflow(InputError):
    """Sequences would grow past the model's context window."""


def check_inputs(inputs: Sequence[StepInput], lengths: Sequence[int], vocab_size: int, max_context: int) -> None:
    """What a step checks before running, ``lengths`` being the sequences' cached tokens. Raises: ValueError (a
    sequence twice in one step: the step's own fault); ContextOverflow, or InputError when any other fault is among
    them, naming every input at fault."""
    if len({x.seq_id for x in inputs}) != len(inputs):
        raise ValueError("a step takes each sequence at most once")
    overflows, faults = {}, {}
    for x, n in zip(inputs, lengths):
        c = len(x.tokens)
        if n + c > max_context:
            overflows[x.seq_id] = f"would hold {n + c} tokens; the context is {max_context}"
        else:
            why = _input_fault(x, c, vocab_size)
            if why is not None:
                faults[x.seq_id] = why
    if faults:
        raise InputError({**overflows, **faults})
    if overflows:
        raise ContextOverflow(overflows)


def _input_fault(x: StepInput, count: int, vocab_size: int) -> str | None:
    if count < 1:
        return "a step input needs at least one token"
    if min(x.tokens) < 0 or max(x.tokens) >= vocab_size:
        return f"token ids must be in [0, {vocab_size})"
    for t in x.logits_at:
        if not -count <= t < count:
            return f"logits_at {t} is outside its {count} new tokens"
    if x.allowed is not None:
        if len(x.allowed) != len(x.logits_at):
            return f"{len(x.allowed)} allowed sets for {len(x.logits_at)} scored positions"
        for ids in x.allowed:
            if ids is not None and (ids.dtype not in (torch.int64, torch.int32) or ids.dim() != 1 or ids.numel() and (
                    int(ids.min()) < 0 or int(ids.max()) >= vocab_size)):
                return f"allowed ids must be a 1-D integer tensor of ids in [0, {vocab_size})"
    return None


class ForwardStep(Protocol):
    vocab_size: int  # width of the returned logits (may exceed the tokenizer's vocabulary)
    # Largest ``StepInput.allowed`` set the executor scores alone, skipping the rest of the output layer
    # (0: it always computes every logit, so callers need not build the sets).
    restricted_logits_max: int
    max_context: int  # tokens a sequence may hold
    @property
    def forward_calls(self) -> int: ...  # model forward passes run so far (counted here, not estimated)

    def new_sequence(self) -> int:
        """Allocate an empty sequence; returns its id."""

    def step(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        """One forward pass; for each input a float32 tensor [len(logits_at), vocab_size], on the CPU. An allowed
        set may be empty (a grammar dead end): its row is -inf everywhere. Raises: InputError (ContextOverflow)
        naming the inputs at fault, every sequence as it was; anything else fails the whole step."""

    def rollback(self, seq_id: int, n: int) -> None:
        """Forget the last ``n`` tokens of one sequence."""

    def copy_prefix(self, seq_id: int, source_id: int, n: int) -> None:
        """Give the empty sequence ``seq_id`` the first ``n`` cached tokens of ``source_id`` (prefix caching)."""

    def free(self, seq_id: int) -> None:
        """Release a sequence and its cache."""

    def seq_len(self, seq_id: int) -> int:
        """Tokens currently cached for the sequence."""

    def footprint(self, sequences: int, longest: int) -> int:
        """KV positions the cache would occupy holding ``sequences`` live sequences, the longest ``longest``
        tokens (what the scheduler keeps within the KV budget). Raises: Never."""
