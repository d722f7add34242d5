"""The held-out invoice bench: its documents state what they score, its tally counts copies and made-up notes, and a
run scores every arm."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import jsonschema
import pytest

from structspec.bench.invoice_heldout import (LAYOUTS, Tally, fields_over, invoice_document, invoice_items, run,
                                               table)
from structspec.demo.corpus import flatten
from structspec.schemas import load_builtin_schemas
from tests.conftest import need_llamacpp


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_states_every_value_it_scores(layout):
    schema = load_builtin_schemas()["invoice"]
    r = random.Random(layout)
    for _ in range(6):
        doc, truth = invoice_document(r, layout)
        jsonschema.validate(truth, schema)
        assert 4 <= len(truth["line_items"]) <= 8
        for key, value in flatten(truth).items():
            if isinstance(value, str) and key != "currency" and not key.endswith("issue_date"):
                assert value in doc, (key, value, doc)


def test_items_cycle_the_layouts_and_the_example_is_not_among_them():
    items, example = invoice_items(10)
    assert example.text not in {i.source for i in items} and len({i.source for i in items}) == 10
    assert json.loads(example.output)["line_items"]
    # some documents hold a note and some none: where none, the right note is ""
    notes = [i.truth["notes"] for i in items]
    assert "" in notes and any(notes)
    assert all(i.freetext_fields == ("notes",) for i in items)
    assert items[0].schema["properties"]["line_items"]["maxItems"] == 8
    unbounded, _ = invoice_items(10, bounded_list=False)
    assert "maxItems" not in unbounded[0].schema["properties"]["line_items"]
    assert [i.source for i in unbounded] == [i.source for i in items]
    assert load_builtin_schemas()["invoice"]["properties"]["line_items"]["maxItems"] == 8  # the built-in: untouched


def test_the_tally_counts_copied_values_and_made_up_notes():
    items, example = invoice_items(2)
    item = replace(items[0], examples=(example,))
    borrowed = json.loads(example.output)
    t = Tally()
    t.add(item, True, item.truth, 100)  # the truth: nothing copied, no made-up note
    assert (t.right, t.copied, t.notes_made_up, t.notes_right) == (t.fields, 0, 0, 1) and t.fields > 10
    t.add(item, True, {**item.truth, "vendor": borrowed["vendor"], "notes": "Pay within 7 days."}, 100)
    assert (t.copied, t.notes_made_up, t.notes_right) == (1, 1, 1)  # the example's vendor; a note the document lacks
    t.add(item, False, None, 384)  # cut at max_tokens: nothing valid
    assert (t.items, t.finished, t.valid) == (3, 2, 2)
    assert "2/3" in table({"client/plain": t})


def test_fields_are_compared_per_document_with_the_llamacpp_arm():
    """Each arm's fields over llama.cpp's on the same documents, with a paired interval: an arm that gets every
    document's fields where llama.cpp gets half shows 2.0 and an interval that excludes 1."""
    items, _ = invoice_items(8)
    ours, theirs = Tally(), Tally()
    for k, item in enumerate(items):
        ours.add(item, True, item.truth, 100)
        half = {**item.truth, "vendor": "?", "customer": "?", "invoice_number": "?", "total": -1,
                "line_items": item.truth["line_items"][:1]} if k % 2 else item.truth
        theirs.add(item, True, half, 100)
    base, over = fields_over({"server/label": ours, "llamacpp": theirs})
    assert base == "llamacpp" and over["llamacpp"].ratio == 1.0
    r = over["server/label"]
    assert r.ratio == pytest.approx(ours.right / theirs.right) and 1.0 < r.low <= r.ratio <= r.high
    assert f"{r.ratio:.2f} ({r.low:.2f}-{r.high:.2f})" in table({"server/label": ours, "llamacpp": theirs})
    assert fields_over({"a": ours})[0] == "a"  # without llamacpp: the first arm


@pytest.mark.parametrize("arm", ["server", "client/json", "nobody/plain"])
def test_an_unknown_arm_is_refused_before_any_model_loads(arm):
    items, example = invoice_items(1)
    with pytest.raises(ValueError, match="unknown arm"):
        run("no-such-model", items, example, [arm], max_tokens=8)


@pytest.mark.slow
def test_a_run_scores_every_arm():
    need_llamacpp()
    items, example = invoice_items(1)
    arms = ["server/plain", "server/label", "client/instruction", "llamacpp"]
    results = run("smollm2", items, example, arms, max_tokens=24)
    assert list(results) == arms
    for t in results.values():  # 24 tokens cannot hold an invoice: cut, scored as nothing
        assert (t.items, t.finished, t.valid, t.right) == (1, 0, 0, 0) and 0 < t.tokens <= 24 and t.fields > 10
