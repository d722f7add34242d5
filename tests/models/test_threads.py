"""The CPU budget: affinity capped by a cgroup quota (v2 and v1 files), at least one CPU."""

from __future__ import annotations

import os

from structspec.models.threads import cpu_budget


def test_budget_follows_affinity_and_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert cpu_budget(tmp_path) == affinity  # no quota files: affinity alone
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_budget(tmp_path) == affinity  # unlimited
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a CPU: rounds up to one
    assert cpu_budget(tmp_path) == 1
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_budget(tmp_path) == 1  # cgroup v1: one CPU
