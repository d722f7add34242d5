"""The worked examples the server ships for the built-in schemas (``structspec.demo.worked_examples``)."""

from __future__ import annotations

import json

from structspec.demo.corpus import NOTE_PARTS
from structspec.demo.worked_examples import QUIET, QUIET_EXAMPLES, build, main, quiet
from structspec.schemas import BUILTIN_EXAMPLES_FILE


def test_a_quiet_example_holds_no_note_in_its_document_nor_in_its_output():
    value = {"vendor": "Acme", "notes": "Prices include VAT."}
    source = "INVOICE 1\nFrom: Acme\nTotal 5 EUR. Payment is due within 14 days.\nPrices include VAT."
    got, text = quiet(value, source, "notes", ("Payment is due within 14 days.",))
    assert got == {"vendor": "Acme", "notes": ""} and value["notes"] == "Prices include VAT."  # a copy
    assert text == "INVOICE 1\nFrom: Acme\nTotal 5 EUR."  # both sentences cut, the emptied line dropped


def test_the_first_examples_of_a_quiet_schema_are_quiet_and_the_rest_keep_their_prose():
    examples = build(QUIET_EXAMPLES)["schemas"]["invoice"]
    key, sentences = QUIET["invoice"]
    assert len(examples) > QUIET_EXAMPLES
    for i, example in enumerate(examples):
        note = json.loads(example["output"])[key]
        if i < QUIET_EXAMPLES:
            assert note == "" and not any(s in example["text"] for s in sentences)
        else:
            assert note and note in example["text"]  # taken from its own document
    noted = build(0)["schemas"]["invoice"]
    assert all(json.loads(e["output"])[key] for e in noted)  # without quiet examples every note is shown
    assert set(NOTE_PARTS["terms"]) <= set(sentences)


def test_the_shipped_file_is_what_the_generator_writes():
    assert main(["--check"]) == 0, f"rerun python -m structspec.demo.worked_examples to rewrite {BUILTIN_EXAMPLES_FILE}"
