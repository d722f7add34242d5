"""``build_engine`` with a store: the engine claims its served name's legacy rows before it records or drafts
anything, under its weights' identity and prompt format; dummy weights claim nothing."""

from __future__ import annotations

import asyncio

import pytest

from structspec.assembly import build_engine, engine_model_key, history_model_key
from structspec.engine.config import EngineConfig
from structspec.stats.book import StatsBook
from structspec.stats.counters import Series
from structspec.store.sqlite import SQLiteStore


def requests(store, model: str) -> float:
    counters = asyncio.run(store.read_counters(0, model=model))
    return sum(v for k, v in counters.items() if k.series == Series.REQUESTS)


@pytest.fixture
def legacy_store(tmp_path):
    """A store written before the keys carried identities: the demo's rows under the bare name."""
    store = SQLiteStore(tmp_path / "stats.sqlite", StatsBook())
    asyncio.run(store.open())
    store.stats.recorder("demo").record_request("contact@1", 10, 4, 2, "stop", 12.0)
    store.append_history("demo", "contact@1", '{"name": "Ada"}', 1.0)
    asyncio.run(store.flush())
    yield store
    asyncio.run(store.close())


def test_a_starting_engine_claims_its_names_legacy_rows(legacy_store):
    engine = build_engine(EngineConfig(profile="demo", executor="transformers", device="cpu", speculation="all"),
                          legacy_store)
    try:
        model = engine.model_key
        assert model.startswith("demo@") and model.endswith("+draft:" + model.rpartition("+draft:")[2])
        legacy = model.replace("+plain-v5", "+plain-v3").rpartition("+draft:")[0]
        assert requests(legacy_store, legacy) == 1 and requests(legacy_store, "demo") == 0
        history = model.rpartition("+draft:")[0]  # the history key: the statistics key without the draft
        assert asyncio.run(legacy_store.load_history(history, 64, 64)) == [("contact@1", '{"name": "Ada"}')]
        # the engine drafts from the claimed history at once
        assert engine.core.drafter.speculator.history.outputs("contact@1") == ['{"name": "Ada"}']
    finally:
        engine.stop()


def test_dummy_weights_claim_nothing(legacy_store):
    engine = build_engine(EngineConfig(profile="demo", executor="transformers", device="cpu", speculation="off",
                                       load_format="dummy"), legacy_store)
    try:
        assert "@dummy-" in engine.model_key
        assert requests(legacy_store, "demo") == 1  # still the bare name's, for the real weights to claim
    finally:
        engine.stop()


def test_the_keys_name_the_weights_and_the_format(demo_models):
    assert engine_model_key(demo_models) == (f"demo@{demo_models.identity}+plain-v5+draft:{demo_models.draft_version}")
    assert history_model_key(demo_models) == f"demo@{demo_models.identity}+plain-v5"


def test_another_chat_template_keeps_a_history_of_its_own(demo_models):
    """A ``--chat-template`` change writes calls in another format: its history must not draft the old one's."""
    from dataclasses import replace

    templated = replace(demo_models, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert history_model_key(templated) != history_model_key(demo_models)
    assert history_model_key(templated).startswith(f"demo@{demo_models.identity}+chat-v2:")
