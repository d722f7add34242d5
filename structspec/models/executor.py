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
from typing import Protocol, Sequence

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


class ContextOverflow(ValueError):
    """A sequence would grow past the model's context window."""


class ForwardStep(Protocol):
    vocab_size: int  # width of the returned logits (may exceed the tokenizer's vocabulary)
    # Largest ``StepInput.allowed`` set the executor scores alone, skipping the rest of the output layer
    # (0: it always computes every logit, so callers need not build the sets).
    restricted_logits_max: int
    max_context: int  # tokens a sequence may hold
    forward_calls: int  # model forward passes run so far (counted here, not estimated)

    def new_sequence(self) -> int:
        """Allocate an empty sequence; returns its id."""

    def step(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        """One forward pass; for each input a float32 tensor [len(logits_at), vocab_size], on the CPU."""

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
