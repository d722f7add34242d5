"""Does a re-run of the training script reproduce the shipped demo pair's figures?

    python -m structspec.demo.compare structspec/models/demo/figures.json /tmp/demo-rerun/figures.json

"Within noise" is decided per figure, not by eye:

- the quality figures are proportions measured on a fixed held-out set (valid JSON over ``prompts``,
  field accuracy over ``fields``, draft/target agreement over ``freetext_positions``). Two models that are
  equally good differ on such a set by sampling noise alone; a re-run reproduces a figure when the
  difference is within ``Z`` standard errors of a difference of two proportions, sqrt(2 p (1 - p) / n),
  at the pooled p (this is a tolerance from the figures themselves, no hand-picked margin);
- the decode-step ratio is a timing on a noisy machine: within ``TIMING_REL`` (relative);
- the parameter counts and the plan must be equal (else it is another recipe, not a re-run);
- each run must also meet the issue's goals on its own (valid >= 0.95, fields >= 0.90, agreement in
  0.6-0.85, target step >= 5x a draft step).

Exit status 0 when every row passes, 1 otherwise; the table says which row failed and why.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Z = 3.0  # standard errors: a re-run of an equally good model falls outside this about 0.3% of the time
TIMING_REL = 0.25

# (figure, path in figures.json, path of its sample size, goal as (low, high))
_PROPORTIONS = (
    ("valid JSON rate", ("target", "valid_json_rate"), ("target", "prompts"), (0.95, 1.0)),
    ("field accuracy", ("target", "field_accuracy"), ("target", "fields"), (0.90, 1.0)),
    ("draft/target agreement", ("freetext_greedy_agreement",), ("freetext_positions",), (0.60, 0.85)),
)


@dataclass(frozen=True)
class Row:
    figure: str
    shipped: Any
    rerun: Any
    tolerance: str
    ok: bool
    why: str = ""


def _get(figures: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        figures = figures[key]
    return figures


def proportion_tolerance(p_a: float, n_a: int, p_b: float, n_b: int, z: float = Z) -> float:
    """``z`` standard errors of the difference of two proportions, at their pooled value."""
    p = (p_a * n_a + p_b * n_b) / (n_a + n_b)
    return z * math.sqrt(p * (1 - p) * (1 / n_a + 1 / n_b))


def compare(shipped: dict, rerun: dict) -> list[Row]:
    rows: list[Row] = []
    same_plan = shipped.get("plan") == rerun.get("plan")
    rows.append(Row("plan", "", "", "equal", same_plan, "" if same_plan else "different TrainPlan: not a re-run"))
    for name in ("target", "draft"):
        a, b = shipped["params"][name], rerun["params"][name]
        rows.append(Row(f"{name} parameters", a, b, "equal", a == b, "" if a == b else "different shape"))
    for figure, path, n_path, (low, high) in _PROPORTIONS:
        a, b = _get(shipped, path), _get(rerun, path)
        na, nb = _get(shipped, n_path), _get(rerun, n_path)
        tol = proportion_tolerance(a, na, b, nb)
        why = []
        if abs(a - b) > tol:
            why.append(f"differs by {abs(a - b):.3f} > {tol:.3f}")
        for label, v in (("shipped", a), ("re-run", b)):
            if not low <= v <= high:
                why.append(f"{label} {v:.3f} outside the goal {low}-{high}")
        rows.append(Row(figure, round(a, 4), round(b, 4), f"+-{tol:.3f} ({Z:g} s.e., n={na}/{nb})", not why,
                        "; ".join(why)))
    a, b = shipped["decode_step_ratio"], rerun["decode_step_ratio"]
    why = []
    if abs(a - b) > TIMING_REL * a:
        why.append(f"differs by {abs(a - b) / a:.0%} > {TIMING_REL:.0%}")
    if min(a, b) < 5:
        why.append("a target step costs < 5 draft steps")
    rows.append(Row("target step / draft step", round(a, 2), round(b, 2), f"+-{TIMING_REL:.0%} (timing)", not why,
                    "; ".join(why)))
    return rows


def render(rows: list[Row]) -> str:
    head = ("figure", "shipped", "re-run", "tolerance", "result")
    body = [(r.figure, str(r.shipped), str(r.rerun), r.tolerance, "ok" if r.ok else f"FAIL: {r.why}") for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [head, *body])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shipped", type=Path, help="figures.json of the shipped pair")
    ap.add_argument("rerun", type=Path, help="figures.json written by the re-run")
    args = ap.parse_args(argv)
    rows = compare(json.loads(args.shipped.read_text()), json.loads(args.rerun.read_text()))
    print(render(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
