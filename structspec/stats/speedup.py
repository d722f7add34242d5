"""The estimated speedup of a schema's requests over decoding them without drafts, from counters alone.

Without drafting, the same outputs (the verifier keeps them exact) would take one target pass
more per accepted drafted token: P + A passes instead of P. A pass that carried a k-token draft
at batch bucket b costs more than a plain one: T(b, k) / T(b, 0) plain passes, plus the
proposer's drafting time D(k) / T(b, 0), with T and D the step and drafting times the engine
measured (the model's own series). So

    speedup = (P + A) / (P + sum over (proposer, bucket) of V * ((T(b, k) - T(b, 0) + D(k)) / T(b, 0)))

with V the verifications that carried the proposer's drafts and k their mean length. Where
the step times at a bucket are not measured, a drafted pass counts as a plain one (the
estimate is then the pass ratio alone, and says so: ``measured_costs`` False).
"""

from __future__ import annotations

from dataclasses import dataclass

from structspec.stats.evidence import CostEvidence
from structspec.stats.summary import SchemaSummary


@dataclass(frozen=True)
class SpeedupEstimate:
    speedup: float  # time without drafts / time with them (1: no gain; under 1: drafting cost time)
    passes_without: int  # P + A
    passes: int  # P
    measured_costs: bool  # every bucket's drafted passes were priced with measured step times


def estimate_speedup(summary: SchemaSummary, costs: CostEvidence) -> SpeedupEstimate | None:
    """None when the schema has no target passes in the window."""
    passes = summary.target_passes
    if passes <= 0:
        return None
    accepted = sum(p.accepted for p in summary.proposers)
    extra, measured = 0.0, True
    for p in summary.proposers:
        if p.verifications <= 0:
            continue
        k = max(1, round(p.drafted / p.verifications))
        plain, step = costs.step_seconds(p.batch_bucket, 0), costs.step_seconds(p.batch_bucket, k)
        if not plain or step is None:
            measured = False
            continue
        extra += p.verifications * (step - plain + costs.propose_seconds(p.proposer, k)) / plain
    cost = max(passes + extra, 1e-9)
    return SpeedupEstimate((passes + accepted) / cost, passes + accepted, passes, measured)
