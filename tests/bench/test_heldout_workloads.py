"""The held-out workloads: their ground truth is valid against their own schemas, their worked examples hold other
values than the documents, and a scoring pass survives whatever a model writes."""

from __future__ import annotations

import jsonschema
import pytest

from structspec.bench.heldout_workloads import HELDOUT_WORKLOADS, build_heldout_workload
from structspec.bench.workloads import WORKLOADS, build_workload


@pytest.mark.parametrize("workload", HELDOUT_WORKLOADS)
def test_every_item_is_valid_and_its_example_is_another_document(workload):
    assert workload in WORKLOADS
    items = build_workload(workload, 40)
    assert items == build_heldout_workload(workload, 40, 7)  # reproducible from the benchmark's seed
    for item in items:
        if item.kind == "toolcall":
            tool = next(t for t in item.tools if t["function"]["name"] == item.truth["name"])
            jsonschema.validate(item.truth["arguments"], tool["function"]["parameters"])
        else:
            jsonschema.validate(item.truth, item.schema)
        assert len(item.examples) == 1 and item.examples[0].text != item.source
        right, total = item.score(item.truth)
        assert right == total > 0
    assert len({i.source for i in items}) > 30  # varied documents


def test_the_workloads_differ_in_output_length():
    manifest, classify = build_workload("manifest", 10), build_workload("classify", 10)
    assert min(len(str(i.truth)) for i in manifest) > 3 * max(len(str(i.truth)) for i in classify)
    assert {i.truth["name"] for i in build_workload("nested_tools", 30)} == {"schedule_meeting", "ship_parcel",
                                                                            "open_account"}


def test_scoring_an_output_with_a_number_too_large_for_a_float_does_not_raise():
    item = build_workload("manifest", 1)[0]
    value = dict(item.truth, items=[dict(item.truth["items"][0], quantity=10 ** 400)])
    assert item.copied(value)[1] > 0
    assert item.score(value)[0] < item.score(item.truth)[0]
