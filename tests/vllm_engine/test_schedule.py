"""The batch-size rule on vLLM: cold buckets measure, low acceptance turns a bucket off, the cost model prices k."""

from __future__ import annotations

from structspec.engine.config import PolicyConfig
from structspec.stats.book import StatsBook
from structspec.vllm_engine.schedule import batch_schedule, schedule_entries

NOW = 1_800_000_000.0
MODEL = "target@abc+plain-v4+vllm:ngram"


def book_with(acceptance_per_position: float, batch: int = 1, drafts: int = 200, k: int = 4,
              steps: dict[int, float] | None = None, model: str = MODEL, schema: str = "s1") -> StatsBook:
    """``drafts`` verifications of ``k``-token drafts at ``batch``, each position accepted with the given
    probability once examined (recorded as its expected counts, deterministically), and ``steps``: step seconds
    per draft length at that batch (20 steps each)."""
    book = StatsBook(clock=lambda: NOW)
    rec = book.recorder(model)
    # Deterministic: a fraction of drafts accepts exactly j tokens, j = 0..k, matching the geometric model.
    c = acceptance_per_position
    shares = [(c ** j) * (1 - c) for j in range(k)] + [c ** k]
    done = 0
    for j, share in enumerate(shares):
        n = round(share * drafts) if j < k else drafts - done
        for _ in range(max(0, n)):
            rec.record_verification(schema, "ngram", batch, k, j, probe=False)
        done += n
    for length, seconds in (steps or {}).items():
        for _ in range(20):
            rec.record_step(batch, length, seconds)
    return book


def test_a_cold_model_drafts_the_configured_length_at_every_bucket():
    lengths = batch_schedule(StatsBook(clock=lambda: NOW).rows(), MODEL, "ngram", 4, 16, now=NOW)
    assert [(b.first, b.last) for b in lengths] == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16)]
    assert {b.reason for b in lengths} == {"cold"} and {b.draft_length for b in lengths} == {4}
    assert schedule_entries(lengths) == [(1, 16, 4)]


def test_the_last_bucket_ends_at_max_batch():
    lengths = batch_schedule({}, MODEL, "ngram", 3, 5, now=NOW)
    assert [(b.first, b.last, b.bucket) for b in lengths] == [(1, 1, 1), (2, 2, 2), (3, 4, 4), (5, 5, 8)]


def test_low_acceptance_without_measured_costs_turns_drafting_off():
    book = book_with(0.1)  # 800 drafted tokens, ~10% of the first position accepted
    lengths = batch_schedule(book.rows(), MODEL, "ngram", 4, 1, now=NOW)
    assert lengths[0].reason == "low_acceptance" and lengths[0].draft_length == 0
    assert lengths[0].acceptance is not None and lengths[0].acceptance < 0.55


def test_high_acceptance_without_measured_costs_keeps_the_configured_length():
    lengths = batch_schedule(book_with(0.95).rows(), MODEL, "ngram", 4, 1, now=NOW)
    assert (lengths[0].reason, lengths[0].draft_length) == ("unmeasured_cost", 4)


def test_measured_cheap_verification_with_good_acceptance_drafts():
    book = book_with(0.9, steps={0: 0.010, 1: 0.0105, 2: 0.011, 3: 0.0115, 4: 0.012})
    b = batch_schedule(book.rows(), MODEL, "ngram", 4, 1, now=NOW)[0]
    assert b.reason == "cost_model" and b.draft_length == 4
    assert abs(b.plain_step_ms - 10.0) < 1e-6 and abs(b.step_ms - 12.0) < 1e-6


def test_a_verification_costing_k_forwards_is_off_even_at_fair_acceptance():
    # k rows cost k forwards (the issue-43 executor): a 0.7 per-position draft never beats plain decoding.
    book = book_with(0.7, steps={0: 0.010, 1: 0.020, 2: 0.030, 3: 0.040, 4: 0.050})
    b = batch_schedule(book.rows(), MODEL, "ngram", 4, 1, now=NOW)[0]
    assert (b.reason, b.draft_length) == ("cost_model", 0)


def test_buckets_decide_apart_and_neighbours_merge():
    cheap = {0: 0.010, 1: 0.0105, 2: 0.011, 3: 0.0115, 4: 0.012}
    dear = {0: 0.010, 1: 0.030, 2: 0.050, 3: 0.070, 4: 0.090}
    book = book_with(0.9, batch=1, steps=cheap)
    for batch in (2, 4):
        other = book_with(0.9, batch=batch, steps=cheap if batch == 2 else dear)
        book.add(other.rows().items())
    lengths = batch_schedule(book.rows(), MODEL, "ngram", 4, 16, now=NOW)
    assert [b.draft_length for b in lengths[:3]] == [4, 4, 0]
    # buckets 8 and 16 have no steps measured but the pooled acceptance is high: the configured length.
    assert [b.reason for b in lengths[3:]] == ["unmeasured_cost", "unmeasured_cost"]
    assert schedule_entries(lengths) == [(1, 2, 4), (3, 4, 0), (5, 16, 4)]


def test_another_models_evidence_is_not_read():
    book = book_with(0.1, model="other@1+plain-v4+vllm:ngram")
    assert batch_schedule(book.rows(), MODEL, "ngram", 4, 1, now=NOW)[0].reason == "cold"


def test_evidence_is_pooled_over_schemas():
    book = book_with(0.1, drafts=70, schema="a")  # 280 drafted tokens each: cold alone, not together
    book.add(book_with(0.1, drafts=70, schema="b").rows().items())
    assert batch_schedule(book.rows(), MODEL, "ngram", 4, 1, now=NOW)[0].reason == "low_acceptance"


def test_the_always_guard_overrides_a_cost_model_that_pays():
    book = book_with(0.5, steps={0: 0.010, 1: 0.0101, 2: 0.0102, 3: 0.0103, 4: 0.0104})
    pays = batch_schedule(book.rows(), MODEL, "ngram", 4, 1, now=NOW)[0]
    assert pays.draft_length > 0 and pays.acceptance is not None and pays.acceptance < 0.55
    guarded = batch_schedule(book.rows(), MODEL, "ngram", 4, 1, PolicyConfig(acceptance_guard="always"), now=NOW)[0]
    assert (guarded.reason, guarded.draft_length) == ("low_acceptance", 0)
