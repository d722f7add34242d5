"""The alignment run's ceiling rows: the perfect draft is accepted whole, beside ff+ngram+history and all."""

from __future__ import annotations

from structspec.bench.align_run import _ceiling_lines, measure_ceiling, prompt_ids, stdlib_documents


def test_the_ceiling_rows_on_documents_of_a_new_style(demo_models):
    docs = stdlib_documents(4, max_chars=300)
    assert len(docs) == 4 and len(set(docs)) == 4
    assert prompt_ids(demo_models, docs[0]) != prompt_ids(demo_models, docs[1])
    rows = measure_ceiling(demo_models, "summary", docs, block=2)
    assert list(rows) == ["ff+ngram+history", "all", "perfect_draft"]
    assert all(r["requests"] == 4 and r["output_tokens"] > 0 for r in rows.values())
    base, perfect = rows["ff+ngram+history"], rows["perfect_draft"]
    assert base["draft_drafted"] == 0 and base["x_ff_ngram_history"] == 1.0
    assert perfect["draft_drafted"] > 0 and perfect["draft_acceptance"] == 1.0
    assert perfect["output_tokens"] == base["output_tokens"]  # greedy: the same outputs
    assert "perfect_draft" in "\n".join(_ceiling_lines({"ceiling": {"shifted": rows}}))
