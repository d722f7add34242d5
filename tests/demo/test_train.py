"""The training script's drills: what the target is taught to copy and look up."""

from __future__ import annotations

from transformers import AutoTokenizer

from structspec.demo.train import drill_rows
from structspec.models.profiles import get_profile


def _tokenizer():
    return AutoTokenizer.from_pretrained(get_profile("demo").target)


def test_copy_drills_label_exactly_the_repeated_span():
    tok = _tokenizer()
    xc, yc, xr, yr = drill_rows(tok, seed=3, rows=4, recall=False)
    assert xr is None and xc.shape == yc.shape and xc.shape[1] == 256
    ids, labels = xc[0].tolist(), yc[0].tolist()
    again = tok("\n### Again:\n", add_special_tokens=False)["input_ids"]
    repeat = tok("### Repeat:\n", add_special_tokens=False)["input_ids"]
    # the first complete drill in the row: its labelled tokens are the span between "Repeat:" and "Again:"
    start = next(i for i in range(len(ids)) if ids[i:i + len(repeat)] == repeat) + len(repeat)
    mid = next(i for i in range(start, len(ids)) if ids[i:i + len(again)] == again)
    span = ids[start:mid]
    out = labels[mid + len(again): mid + len(again) + len(span) + 1]
    assert out == span + [tok.eos_token_id]
    assert all(v == -100 for v in labels[start:mid + len(again)])  # no loss on the prompt side


def test_lookup_drills_ask_for_one_of_the_record_values():
    tok = _tokenizer()
    _, _, xr, yr = drill_rows(tok, seed=4, rows=4, recall=True)
    assert xr is not None and xr.shape == yr.shape
    text = tok.decode(xr[0].tolist())
    assert "### Record:\n" in text and "### Field " in text
    labelled = [t for t in yr[0].tolist() if t != -100]
    assert tok.eos_token_id in labelled and 0 < len(labelled) < 256
