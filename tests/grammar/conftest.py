"""A tiny byte-level BPE tokenizer trained on the fly (no shipped files), and helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from structspec.bench.grammar_bench import walk
from structspec.grammar import (
    GrammarCompiler,
    TokenizerView,
    allocate_bitmask,
    bitmask_to_bool,
)

EOS = "<|endoftext|>"
END_OF_TURN = "<|end|>"  # a second special token: chat models often stop on either
_CORPUS = [
    {"name": "Ada Lovelace", "email": "ada@example.com", "age": 36, "tags": ["math", "poetry"]},
    {"kind": "summary", "summary": "The invoice lists three items and a total of 42.50 EUR."},
    {"invoice_number": "INV-2024-0193", "currency": "EUR", "total": 1234.5, "paid": False, "notes": None},
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    {"name": "send_email", "arguments": {"to": "bob@example.org", "subject": "Hello", "body": "See you."}},
    {"title": "Team sync", "date": "2024-05-01", "time": "09:30", "duration_minutes": 45},
]


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=[EOS, END_OF_TURN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [json.dumps(x, separators=(",", ":")) for x in _CORPUS] + ["Hello, how can I help you today?"]
    tk.train_from_iterator(texts * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=EOS)


@pytest.fixture(scope="session")
def view(tokenizer):
    # A model vocabulary a little larger than the tokenizer's, as real models pad theirs.
    return TokenizerView(tokenizer, n_vocab=len(tokenizer) + 45)


@pytest.fixture(scope="session", params=["llguidance", "outlines"])
def backend(request):
    return request.param


@pytest.fixture(scope="session")
def compilers(view):
    return {name: GrammarCompiler(view, backend=name) for name in ("llguidance", "outlines")}


@pytest.fixture
def compiler(compilers, backend):
    return compilers[backend]


def allowed(matcher, view) -> set[int]:
    mask = allocate_bitmask(1, view.n_vocab)
    matcher.fill_mask(mask, 0)
    return set(bitmask_to_bool(mask[0], view.n_vocab).nonzero().flatten().tolist())


def accepts(grammar, view, text: str) -> bool:
    """Decoded the engine's way (forced spans by text, other tokens through the mask) and complete."""
    mask = allocate_bitmask(1, view.n_vocab)
    return walk(grammar.matcher(), view, text, mask, mask.numpy().view(np.uint32)[0]).accepted
