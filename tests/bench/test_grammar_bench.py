"""`bench grammar`'s raw llguidance reference: the same schemas, tokenizer and positions as structspec's walk."""

from __future__ import annotations

import json

import numpy as np
import pytest

from structspec.bench.grammar_bench import MASK, RawLLGuidance, format_table, run_grammar_bench, walk
from structspec.grammar import GrammarCompiler, GrammarOptions, allocate_bitmask
from tests.grammar.conftest import tokenizer, view  # noqa: F401 - fixtures: a tiny byte-level BPE
from tests.grammar.test_maskbench import MASKBENCH, needs_maskbench

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@needs_maskbench
def test_the_report_has_raw_columns_beside_structspecs(view):  # noqa: F811
    report = run_grammar_bench(MASKBENCH, "llguidance", view, limit=14)
    assert report["raw_reference"]
    overall = report["overall"]
    assert overall["raw_refused"] == 0
    # paired: a raw mask at each position structspec masked, and more when every position is masked
    assert overall["masks"] > 0 and overall["raw_mask_us_p50"] > 0
    assert overall["raw_all_masks"] > overall["masks"]  # the forced positions (ff_share > 0)
    for name in ("compile_ms", "raw_compile_ms", "raw_construct_ms", "mask_us", "raw_mask_us", "raw_all_mask_us",
                 "mask_overhead_us"):
        p50, p90, p99 = (overall[f"{name}_p{q}"] for q in (50, 90, 99))
        assert p50 <= p90 <= p99, name
    assert overall["mask_overhead_us_p1"] <= overall["mask_overhead_us_p50"] and overall["mask_time_ratio"] > 0
    assert overall["raw_construct_ms_p50"] <= overall["raw_compile_ms_p50"]  # ready = constructed + first mask
    assert overall["compile_ratio_p50"] == pytest.approx(overall["compile_ms_p50"] / overall["raw_compile_ms_p50"],
                                                         rel=0.01)
    assert overall["mask_ratio_p99"] == pytest.approx(overall["mask_us_p99"] / overall["raw_mask_us_p99"], rel=0.01)
    assert overall["selection_p99"] == pytest.approx(overall["raw_mask_us_p99"] / overall["raw_all_mask_us_p99"],
                                                     rel=0.01)
    json.dumps(report)
    table = format_table(report)
    assert "beside raw llguidance" in table and "selection" in table and "overhead" in table
    assert "raw_mask_us_p99" not in run_grammar_bench(MASKBENCH, "llguidance", view, limit=2,
                                                      raw_reference=False)["overall"]


def test_the_raw_replay_masks_where_the_walk_masked_and_agrees_with_it(view):  # noqa: F811
    """Replayed on raw llguidance, a walk's calls give a mask at each position structspec masked, in order,
    and the same final mask; the every-position walk masks once per token and once at the end."""
    compiler = GrammarCompiler(view, cache_size=0)
    options = GrammarOptions()
    grammar = compiler.compile_schema(PERSON, options)
    raw = RawLLGuidance(view, compiler.backend)
    prototype, built_ms, ready_ms = raw.compile(PERSON, options)
    assert prototype is not None and 0 < built_ms <= ready_ms
    bitmask = allocate_bitmask(1, view.n_vocab)
    walked = walk(grammar.matcher(), view, '{"name":"Ada Lovelace","age":36}', bitmask, bitmask.numpy().view(np.uint32)[0])
    assert walked.accepted and 0 < walked.forced < walked.tokens
    same = raw.replay(prototype, walked.trace)
    assert len(same) == len(walked.mask_us) == sum(op == MASK for op, _ in walked.trace)
    assert (raw.buffer == bitmask.numpy()[0]).all()  # the final masks: the same words
    every = raw.every_position(prototype, walked.trace)
    assert len(every) == walked.tokens + 1
    assert (raw.buffer == bitmask.numpy()[0]).all()


def test_a_schema_raw_llguidance_refuses_is_counted_not_raised(view):  # noqa: F811
    compiler = GrammarCompiler(view, cache_size=0)
    raw = RawLLGuidance(view, compiler.backend)
    assert raw.compile({"type": "string", "pattern": "(?<=a)b"}, GrammarOptions())[0] is None
