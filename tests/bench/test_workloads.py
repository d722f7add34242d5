"""Benchmark workloads: held-out items with ground truth, few-shot blocks fixed per schema."""

from __future__ import annotations

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
