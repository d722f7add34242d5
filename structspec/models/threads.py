"""How many CPUs this process may really use, and torch's intra-op threads sized to it.

``os.cpu_count()`` counts the machine's CPUs; a container limited by affinity (``taskset``,
``cpuset``) or by a CFS quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in v1) gets fewer.
More intra-op threads than CPUs make every parallel region wait for a thread that is not
running, so threads are sized from the budget, never from the machine.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

_CGROUP = Path("/sys/fs/cgroup")


def _quota_cpus(root: Path = _CGROUP) -> float | None:
    """CPUs granted by a CFS quota (cgroup v2, then v1), or None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def cpu_budget(root: Path = _CGROUP) -> int:
    """CPUs this process may use: its affinity, capped by the cgroup quota (rounded up), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _quota_cpus(root)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def size_torch_threads(requested: int = 0) -> int:
    """Set torch's intra-op threads to ``requested`` (0: the CPU budget); returns the number set."""
    threads = requested if requested > 0 else cpu_budget()
    torch.set_num_threads(threads)
    return threads
