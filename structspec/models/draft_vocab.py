"""A draft model over part of the target's vocabulary, and the executor that makes it look whole.

Gemma's vocabulary has 262,144 ids; its structured outputs use a few thousand of them. A
draft whose embedding and output layer cover only those (``DraftVocab.ids``, ranked by how
often the target emits them) costs a fraction of a full-vocabulary draft: with 262k ids the
output layer alone would be most of its step. Outside its ids the draft's q is 0, which
rejection sampling handles exactly (such a token is never drafted; the target may still
choose it as the recovered or bonus token).

The draft's folder holds a transformers model whose vocabulary is ``len(ids) + 1`` (the last
id stands for every target id outside the list, as input only) and ``draft_vocab.json``:

    {"target_vocab_size": 262144, "ids": [...], "tokenizer_sha256": "..."}

``tokenizer_sha256`` is ``vocabulary_hash`` of the tokenizer the ids belong to, checked at load
in place of the tokenizer copy a full-vocabulary draft carries (Gemma's is 33 MB).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from structspec.models.executor import ForwardStep, StepInput

VOCAB_FILE = "draft_vocab.json"


def vocabulary_hash(tokenizer) -> str:
    """A hash of a tokenizer's (token, id) pairs and EOS id: two tokenizers with the same hash map text alike."""
    pairs = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps([pairs, tokenizer.eos_token_id], ensure_ascii=False).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class DraftVocab:
    """Which target ids a restricted draft covers; draft id i is target id ``ids[i]``, draft id ``len(ids)``
    every other target id."""

    ids: tuple[int, ...]
    target_vocab_size: int
    tokenizer_sha256: str = ""

    def __post_init__(self):
        if len(set(self.ids)) != len(self.ids) or not all(0 <= i < self.target_vocab_size for i in self.ids):
            raise ValueError("draft vocabulary ids must be distinct target ids")

    @property
    def unknown(self) -> int:
        """The draft id of every target id outside ``ids`` (input only: its logit is never returned)."""
        return len(self.ids)

    @property
    def draft_vocab_size(self) -> int:
        return len(self.ids) + 1

    def to_draft_table(self) -> torch.Tensor:
        """[target_vocab_size] long: target id -> draft id."""
        table = torch.full((self.target_vocab_size,), self.unknown, dtype=torch.long)
        table[torch.tensor(self.ids, dtype=torch.long)] = torch.arange(len(self.ids))
        return table

    def save(self, folder: str | Path) -> None:
        payload = {"target_vocab_size": self.target_vocab_size, "ids": list(self.ids),
                   "tokenizer_sha256": self.tokenizer_sha256}
        (Path(folder) / VOCAB_FILE).write_text(json.dumps(payload))

    @classmethod
    def load(cls, folder: str | Path) -> "DraftVocab | None":
        """The folder's vocabulary map, or None for a full-vocabulary draft. Raises: ValueError (malformed)."""
        path = Path(folder) / VOCAB_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            return cls(tuple(int(i) for i in data["ids"]), int(data["target_vocab_size"]),
                       str(data.get("tokenizer_sha256", "")))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a draft vocabulary map ({exc})") from exc


class VocabMappedExecutor:
    """A ``ForwardStep`` over target ids around an executor over a restricted draft's ids.

    Inputs are mapped target -> draft id (outside ids -> ``unknown``); logits come back
    [n, target_vocab_size] with -inf outside ``ids``. Cost: one index lookup per input token and one
    scatter per returned row (~0.1 ms for 262k ids)."""

    def __init__(self, inner: ForwardStep, vocab: DraftVocab):
        if inner.vocab_size < vocab.draft_vocab_size:
            raise ValueError(f"draft model has {inner.vocab_size} logits, its vocabulary map {vocab.draft_vocab_size}")
        self.inner = inner
        self.vocab = vocab
        self.vocab_size = vocab.target_vocab_size
        self.restricted_logits_max = 0
        self.max_context = inner.max_context
        self._to_draft = vocab.to_draft_table()
        self._ids = torch.tensor(vocab.ids, dtype=torch.long)
        self.covered_ids = self._ids  # [C] the target ids ``step_covered``'s columns stand for

    def step_covered(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        """Like ``step``, but each result is [len(logits_at), C]: the logits of ``covered_ids`` only, which is
        all a proposer needs (no 262k-wide row is built, masked or scanned)."""
        mapped = [StepInput(i.seq_id, self._to_draft[torch.as_tensor(list(i.tokens), dtype=torch.long)].tolist(),
                            i.logits_at) for i in inputs]
        return [logits[:, : len(self.vocab.ids)].float() for logits in self.inner.step(mapped)]

    @property
    def forward_calls(self) -> int:
        return self.inner.forward_calls

    def new_sequence(self) -> int:
        return self.inner.new_sequence()

    def step(self, inputs: Sequence[StepInput]) -> list[torch.Tensor]:
        out = []
        for logits in self.step_covered(inputs):
            full = torch.full((logits.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32)
            full[:, self._ids] = logits
            out.append(full)
        return out

    def rollback(self, seq_id: int, n: int) -> None:
        self.inner.rollback(seq_id, n)

    def copy_prefix(self, seq_id: int, source_id: int, n: int) -> None:
        self.inner.copy_prefix(seq_id, source_id, n)

    def free(self, seq_id: int) -> None:
        self.inner.free(seq_id)

    def seq_len(self, seq_id: int) -> int:
        return self.inner.seq_len(seq_id)

    def footprint(self, sequences: int, longest: int) -> int:
        return self.inner.footprint(sequences, longest)
