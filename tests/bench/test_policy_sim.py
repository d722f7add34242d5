"""The drafting policy over days of a quiet schema's traffic, two replicas sharing a store (``bench.policy_sim``):
the slower arm's share and the probe share stay within probe_rate plus the stated floor, the bad proposer stays off,
and the policy is within 5% of the best fixed configuration."""

from __future__ import annotations

import math

from structspec.bench.policy_sim import BAD, CostModel, Scenario, format_table, simulate
from structspec.engine.config import PolicyConfig

CFG = PolicyConfig()


def slack(share: float, requests: int) -> float:
    """Three binomial standard deviations of a share over ``requests``."""
    return 3 * math.sqrt(max(share, 1e-9) * (1 - share) / requests)


def test_a_quiet_schema_on_two_replicas_stays_within_the_bounds():
    report = simulate(Scenario("4 requests/h, 2 replicas", 4.0, replicas=2, hours=72.0, seed=1), CFG)
    whole, late, bounds = report["whole_run"], report["after_warmup"], report["bounds"]
    n = whole["requests"]
    assert n > 200 and report["slower_arm"] == "draft"  # the cost model's draft model loses end to end
    assert whole["probe_share"] <= bounds["probe_share"] + slack(CFG.probe_rate, n), format_table({"scenarios": [report]})
    assert late["slower_arm_share"] <= bounds["slower_arm_share"] + slack(CFG.probe_rate, late["requests"])
    assert whole["slower_arm_share"] <= bounds["slower_arm_share_whole_run"] + slack(CFG.probe_rate, n)
    bad = report["bad_proposer"]
    assert bad["name"] == BAD and bad["first_off_hour"] is not None and bad["first_off_hour"] < 24
    assert bad["requests_drafting_after_off_outside_probes"] == 0  # known bad stays off
    assert report["speed_vs_best_fixed"] >= 0.95, report["fixed_tokens_per_s"]


def test_the_bounds_have_power_a_policy_probing_hourly_exceeds_them():
    """A probe interval of one hour (what "always when the schema had no probe this hour" made it) puts a quarter of
    a 4 requests/h schema's requests into probes: over the bound the 6-hour floor states."""
    hourly = PolicyConfig(probe_interval_hours=1.0)
    report = simulate(Scenario("4 requests/h", 4.0, replicas=2, hours=48.0, seed=2), hourly)
    stated = CFG.probe_rate + 1.0 / (4.0 * CFG.probe_interval_hours)
    assert report["whole_run"]["probe_share"] > stated + slack(CFG.probe_rate, report["whole_run"]["requests"])


def test_the_cost_model_decodes_what_its_parameters_say():
    cost = CostModel()
    plain = cost.fixed_speed((), 8, 50, 0)
    assert math.isclose(plain, (cost.free_tokens + cost.forced_tokens) / (cost.free_tokens * cost.step_ms / 1000))
    assert cost.fixed_speed(("ngram",), 8, 300, 0) > plain > cost.fixed_speed((BAD,), 8, 300, 0)
