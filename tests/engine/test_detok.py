"""``OutputText``: the text grown commit by commit is the whole decode's, on a byte-level BPE (the demo's) and on a
SentencePiece-style tokenizer with byte fallback (Llama 2's and Gemma's decoder), where characters split across
tokens and the window's edge."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from structspec.engine.detok import WINDOW, IncrementalDetokenizer, OutputText
from structspec.models.loading import load_tokenizer
from structspec.models.profiles import resolve_model

TEXTS = ['{"name": "Zoë Ångström", "city": "Zürich"}', "価格は 12,500 円です。", "ok 😀👍🏽 done\n\t", '{"a": [1, 2.5e3]}']


def _byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE: pieces with ``▁`` for a space, every other character as its UTF-8 bytes."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for piece in ["▁", "▁the", "▁name", "na", "me", "▁Z", "ü", "rich", '"', "{", "}", ":", ",", "▁1", "2"]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(BPE(vocab, [], byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module", params=["demo", "byte-fallback"])
def tokenizer(request):
    if request.param == "demo":
        return load_tokenizer(resolve_model("demo").target)
    return _byte_fallback_tokenizer()


def _whole(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _outputs(tokenizer, rng: random.Random) -> list[list[int]]:
    """Real texts' ids, and runs of random ids (byte tokens among them: characters split, bytes no character
    completes)."""
    real = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    noise = [[rng.randrange(len(tokenizer)) for _ in range(60)] for _ in range(20)]
    return real + noise + [ids * 3 for ids in real]


def test_the_text_grown_commit_by_commit_is_the_whole_decode(tokenizer):
    rng = random.Random(7)
    grown = 0
    for ids in _outputs(tokenizer, rng):
        text, n = OutputText(tokenizer), 0
        original = text._grown
        def counting(tokens, original=original):
            nonlocal grown
            out = original(tokens)
            grown += out is not None
            return out
        text._grown = counting  # type: ignore[method-assign]
        while n < len(ids):
            n = min(len(ids), n + rng.randint(1, 4))  # a commit: a token, or accepted draft tokens with it
            assert text(ids[:n]) == _whole(tokenizer, ids[:n]), (ids, n)
    assert grown > 100  # most commits were decoded from the window, not whole


def test_a_character_split_at_the_window_edge_is_decoded_whole():
    tokenizer = _byte_fallback_tokenizer()
    start = tokenizer("a ü", add_special_tokens=False)["input_ids"]
    euro = tokenizer("€", add_special_tokens=False)["input_ids"]  # three byte tokens, no piece
    a = tokenizer.convert_tokens_to_ids("<0x41>")
    assert len(euro) == 3
    # the window's text ends inside the character (its first two bytes)
    tokens = start + [a] * WINDOW + euro
    text = OutputText(tokenizer)
    assert text(tokens[:-1]).endswith("\ufffd")
    assert text._grown(tokens) is None
    assert text(tokens) == _whole(tokenizer, tokens) and text(tokens).endswith("AAAA€")
    # the window starts inside the character (at its second byte): its text does not end the old text
    tokens = start + euro + [a] * 3
    text = OutputText(tokenizer)
    assert text(tokens) == _whole(tokenizer, tokens)
    assert text._grown(tokens + [a]) is None
    assert text(tokens + [a]) == _whole(tokenizer, tokens + [a]) and text(tokens + [a]).endswith("€AAAA")


def test_deltas_handed_out_add_up_to_the_whole_text(tokenizer):
    """On text (random bytes are no prefix-stable text: byte fallback turns a valid byte grouped with invalid ones
    into U+FFFD, so what a delta handed out may not stand)."""
    rng = random.Random(3)
    for ids in [tokenizer(text, add_special_tokens=False)["input_ids"] * 2 for text in TEXTS]:
        detok, out, n = IncrementalDetokenizer(OutputText(tokenizer)), [], 0
        while n < len(ids):
            n = min(len(ids), n + rng.randint(1, 3))
            out.append(detok.delta(ids[:n], final=n == len(ids)))
        assert "".join(out) == _whole(tokenizer, ids)
