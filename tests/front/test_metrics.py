"""The metrics registry's collectors in isolation (the served series are checked in test_schema_owners)."""

from __future__ import annotations

from prometheus_client import generate_latest

from structspec.front.metrics import ServiceMetrics
from structspec.stats.book import StatsBook
from structspec.stats.policy_states import PolicyChange


def _states(metrics: ServiceMetrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("structspec_schema_policy_state{"):
            labels, value = line.rsplit(" ", 1)
            out[labels] = float(value)
    return out


def test_the_policy_state_gauge_counts_the_serving_model_only():
    """The store seeds the book with every model's latest states (benchmark runs, older draft versions): a
    registered schema reads 1 for the serving model's state and 0 for the other, never 2."""
    book = StatsBook()
    serving = ["demo"]
    metrics = ServiceMetrics()
    metrics.bind_stats(book, lambda: serving[0])
    book.policy.seed([PolicyChange("demo/bench:all", "contact@1", "ngram", 1.0, "on", "drafted"),
                      PolicyChange("demo+draft:old", "contact@1", "ngram", 2.0, "off", "low_acceptance")])
    book.policy.observe("demo", "contact@1", "ngram", "drafted", 3.0)
    states = _states(metrics)
    on = 'structspec_schema_policy_state{proposer="ngram",schema="contact@1",state="on"}'
    off = 'structspec_schema_policy_state{proposer="ngram",schema="contact@1",state="off"}'
    assert states[on] == 1.0 and states[off] == 0.0
    serving[0] = None  # loading: no state is the server's yet
    assert _states(metrics) == {}
