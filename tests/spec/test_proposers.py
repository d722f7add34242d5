"""Proposers in isolation: text-level lookup, schema history, JSON position."""

from __future__ import annotations

from structspec.schemas import load_builtin_schemas
from structspec.spec.history import SchemaHistory, majority_prefix
from structspec.spec.json_position import is_free_text, scan, subschema
from structspec.spec.ngram import NgramConfig, find_continuation

INVOICE = load_builtin_schemas()["invoice"]


def test_lookup_copies_across_token_boundaries():
    doc = "Bill to: Tyrell Corporation\nDate: 2024-01-05"
    out = '{"customer":"Tyr'
    assert find_continuation(doc, out, NgramConfig()).startswith("ell Corporation\n")


def test_lookup_prefers_longest_match():
    doc = "vendor Acme Labs; customer Acme Foods"
    assert find_continuation(doc, '"customer":"Acme F', NgramConfig()).startswith("oods")
    assert find_continuation(doc, "xyz", NgramConfig()) is None


def test_lookup_inside_output_repeats():
    out = '[{"sku":"A-1","qty":1},{"sku":"'
    cont = find_continuation("unrelated prompt", out, NgramConfig())
    assert cont is not None and cont.startswith("A-1")


def test_history_majority_continuation_and_bounds():
    h = SchemaHistory()
    for cur in ("EUR", "EUR", "USD"):
        h.add("invoice", f'{{"total":12,"currency":"{cur}","notes":"ok"}}')
    assert h.continuation("invoice", '{"total":99,"currency":"').startswith("EUR")
    assert h.continuation("other", '{"currency":"') is None
    small = SchemaHistory(type(h.config)(per_schema=2, max_schemas=2))
    for i in range(3):
        small.add(f"s{i}", "x")
    assert small.outputs("s0") == [] and small.outputs("s2") == ["x"]
    for i in range(5):
        small.add("s2", str(i))
    assert small.outputs("s2") == ["3", "4"]


def test_majority_prefix_stops_where_outputs_disagree():
    assert majority_prefix(["abcX", "abcY", "abcZ"]) == "abc"
    assert majority_prefix(["a", "b"]) == ""


def test_json_position_and_free_text():
    pos = scan('{"invoice_number":"INV-1","line_items":[{"description":"des')
    assert pos.path == ("line_items", 0, "description") and pos.in_string and not pos.in_key
    assert is_free_text(INVOICE, pos)
    assert not is_free_text(INVOICE, scan('{"currency":"E'))  # enum
    assert not is_free_text(INVOICE, scan('{"issue_date":"2024'))  # format
    assert not is_free_text(INVOICE, scan('{"invoice_number":"A","curr'))  # a key
    assert not is_free_text(INVOICE, scan('{"total":1'))  # a number
    pos = scan('{"notes":"say \\"hi\\", then')
    assert pos.in_string and pos.path == ("notes",)
    assert subschema({"$defs": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a"}}},
                     ("x",)) == {"type": "string"}
