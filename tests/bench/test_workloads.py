"""Benchmark workloads: held-out items with ground truth, few-shot blocks fixed per schema."""

from __future__ import annotations

import json

import pytest

from structspec.bench.workloads import build_workload


def test_extraction_examples_are_fixed_per_schema_and_held_out():
    items = build_workload("extraction", 30, few_shot=2)
    by_schema: dict[str, set] = {}
    for it in items:
        assert len(it.examples) == 2 and it.schema is not None
        by_schema.setdefault(it.schema_name, set()).add(it.examples)
        assert all(ex.text != it.source for ex in it.examples)  # the worked example is never the request itself
    assert all(len(v) == 1 for v in by_schema.values())  # one prompt prefix per schema: prefix caching applies


def test_toolcall_examples_cover_every_tool_the_same_for_every_request():
    items = build_workload("toolcall", 20, few_shot=1)
    assert len({it.examples for it in items}) == 1
    shown = [ex.output.split('"name":"')[1].split('"')[0] for ex in items[0].examples]
    assert sorted(shown) == sorted(t["function"]["name"] for t in items[0].tools)  # one worked call per tool
    assert all(ex.text != it.source for it in items for ex in it.examples)
    assert all(len(it.tools) == 6 and it.truth["name"] for it in items)
    assert len({it.truth["name"] for it in items}) >= 4  # the requests exercise several tools


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("poetry", 3)


def test_mixed_has_a_short_output_schema_and_shift_has_three_phases():
    from structspec.bench.workloads import SHIFT_SCHEMA, shift_phases
    from structspec.speculation.policy import estimate_output_tokens

    mixed = build_workload("mixed", 60)
    triage = [i for i in mixed if i.schema_name == "ticket_triage"]
    assert triage and estimate_output_tokens(triage[0].schema) < 20
    assert all(set(i.truth) == {"label", "confidence"} and i.freetext_fields == ("confidence",) for i in triage)
    items = shift_phases(build_workload("shift", 9))
    assert [i.phase for i in items] == ["before"] * 3 + ["shifted"] * 3 + ["after"] * 3
    assert all(i.schema_name == SHIFT_SCHEMA for i in items)
    shifted = [i for i in items if i.phase == "shifted"]
    assert all(i.truth == {} for i in shifted)  # other documents: nothing to score
    assert not {i.source for i in shifted} & {i.source for i in items if i.phase != "shifted"}


def test_copy_rate_counts_values_taken_from_the_worked_example_and_not_the_input():
    from dataclasses import replace

    from structspec.prompts import FewShotExample

    item = next(i for i in build_workload("extraction", 40, few_shot=1) if i.schema_name == "invoice")
    shown = json.loads(item.examples[0].output)
    assert item.copied(item.truth) == (0, item.copied(item.truth)[1]) and item.copied(item.truth)[1] >= 6
    # The example's line items and total in place of the document's: each is counted as copied.
    borrowed = {**item.truth, "line_items": shown["line_items"], "total": shown["total"]}
    copied, counted = item.copied(borrowed)
    expected = sum(1 for li in shown["line_items"] for k in ("description", "unit_price")
                   if str(li[k]) not in item.source) + (str(shown["total"]) not in item.source)
    assert copied >= expected >= 3 and counted >= 6
    # Enumerated values (a currency inferred from "US dollars") are never counted; nor without examples.
    assert item.copied({"currency": shown["currency"]}) == (0, 0)
    assert replace(item, examples=()).copied(borrowed) == (0, 0)
    # A summary paraphrasing the example's, with one name swapped, is a copy; the input's own words are not.
    prose = FewShotExample("Ticket TCK-00001 from Ana: my parcel is late", json.dumps(
        {"summary": "The customer is frustrated and got the wrong item in the box with the Kiro X1."}))
    ticket = replace(item, kind="extract", source="Ticket TCK-12206 from Tomas: I wonder whether students get a "
                     "discount on the Lumio lamp", examples=(prose,), schema={})
    assert ticket.copied({"summary": "The customer is frustrated and got the wrong item in the box with the "
                                     "Lumio lamp."}) == (1, 1)
    assert ticket.copied({"summary": "Tomas wonders whether students get a discount on the Lumio lamp."}) == (0, 1)


def test_toolcall_copy_rate_ignores_the_tool_name_and_counts_arguments():
    item = build_workload("toolcall", 20, few_shot=1)[0]
    shown = [json.loads(e.output) for e in item.examples]
    other = next(s for s in shown if s["name"] != item.truth["name"] and s["arguments"])
    copied, counted = item.copied(other)
    assert counted == sum(1 for v in other["arguments"].values() if not isinstance(v, bool)) - sum(
        1 for v in other["arguments"].values() if v in ("celsius", "fahrenheit", "USD", "EUR", "GBP", "JPY", "CHF"))
    assert copied >= 1
    assert item.copied(item.truth)[0] == 0


def test_synthesized_examples_are_what_a_schema_of_ones_own_gets():
    items = build_workload("extraction", 10, few_shot=1, examples="synthesized")
    for i in items:  # the built-in schemas hold free values: no made example, only a real one of another schema
        (real,) = i.examples
        assert real.title and real.title != i.schema.get("title")
        assert "sample" not in real.text + real.output  # never a placeholder a model would copy
    with pytest.raises(ValueError, match="unknown examples source"):
        build_workload("extraction", 3, few_shot=1, examples="nope")
