"""The prompt-format bench: its own workloads state what they score, its variants say what they claim, and a run
counts every item under every variant."""

from __future__ import annotations

import jsonschema
import pytest
from transformers import AutoTokenizer

from structspec.bench.prompt_formats import OWN_SCHEMAS, VARIANTS, own_workload, run, table
from structspec.demo.corpus import flatten
from structspec.models.profiles import get_profile
from structspec.prompts import extraction_prompt


@pytest.mark.parametrize("kind", sorted(OWN_SCHEMAS))
def test_own_workloads_state_every_value_they_score(kind):
    items = own_workload(kind, 6)
    example = items[0].examples[0]
    assert len({i.source for i in items}) == 6 and example.text not in {i.source for i in items}
    for item in items:
        jsonschema.validate(item.truth, item.schema)
        for value in flatten(item.truth).values():
            if isinstance(value, str):
                assert value in item.source, (value, item.source)
        assert item.score(item.truth) == (len(flatten(item.truth)), len(flatten(item.truth)))


def test_variants_word_the_same_request_differently():
    tok = AutoTokenizer.from_pretrained(get_profile("demo").target)
    item = own_workload("order", 1)[0]
    texts = {name: make(tok).extraction(item.schema, item.source, None, item.examples).text
             for name, make in VARIANTS.items()}
    assert texts["plain"] == extraction_prompt(item.schema, item.source, None, item.examples)
    assert texts["instruction"].endswith(f"{item.source}\nJSON:\n") and "###" not in texts["instruction"]
    assert "Fields: order_id, customer, lines." in texts["plain+fields"]
    for text in texts.values():  # each shows the worked example's output, then asks for the item's
        assert item.examples[0].output in text and text.count(item.source) == 1


def test_a_run_counts_every_item_under_every_variant():
    workloads = {"flight": own_workload("flight", 2)}
    results = run("demo", workloads, ["plain", "instruction"], max_tokens=24)
    assert set(results) == {"plain", "instruction"}
    for per in results.values():
        t = per["flight"]
        assert t.items == 2 and t.valid <= t.finished <= 2 and t.fields == 14 and 0 < t.tokens <= 48
    assert "instruction" in table(results)
