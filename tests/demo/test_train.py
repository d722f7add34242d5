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


def test_the_whole_script_is_deterministic(tmp_path):
    """Two runs of the script at once (its tiny ``--quick`` plan: corpus, tokenizer, phases 1-3, draft, evaluation)
    write byte-identical models and the same figures, timings aside: every random draw is seeded. One thread:
    with two, thread scheduling moved the last bits of a reduction in about one run in four."""
    import json
    import subprocess
    import sys

    outs = [tmp_path / "a", tmp_path / "b"]
    # side by side, one thread each: the two runs share nothing but the machine
    runs = [subprocess.Popen([sys.executable, "-m", "structspec.demo.train", "--quick", "--threads", "1", "--out",
                              str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for out in outs]
    for run in runs:
        output, _ = run.communicate(timeout=600)
        assert run.returncode == 0, output.decode(errors="replace")[-2000:]
    for name in ("target/model.safetensors", "draft/model.safetensors", "target/tokenizer.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    timing = {"decode_step_ms", "decode_step_ratio", "train_seconds", "total_seconds"}
    a, b = (json.loads((out / "figures.json").read_text()) for out in outs)
    assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    assert a["target"]["prompts"] == 2 and a["params"]["target"] > 0  # the quick plan evaluates 2 prompts
