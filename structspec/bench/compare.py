"""``structspec bench compare``: two decode reports' saved outputs, token for token.

A report row is one (configuration, concurrency) run of ``structspec bench decode``; with
``--save-outputs`` it keeps every request's output text and token ids in workload order. This
module reads only those JSON values (no model, no torch), so comparing two reports starts at once.
"""

from __future__ import annotations

from typing import Any


def compare_outputs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Differences between the saved outputs of two reports, per (config, concurrency) row they share.

    Empty when every request's token ids and text are identical. Rows without saved outputs, or present in
    only one report, are named as differences too: "nothing to compare" is never read as "identical".
    """
    def rows(report):
        return {(r["config"], r["concurrency"]): r for r in report["runs"] if "error" not in r}

    ra, rb = rows(a), rows(b)
    diffs = [f"{k}: only in the {'first' if k in ra else 'second'} report" for k in sorted(ra.keys() ^ rb.keys())]
    for key in sorted(ra.keys() & rb.keys()):
        oa, ob = ra[key].get("outputs"), rb[key].get("outputs")
        if oa is None or ob is None:
            diffs.append(f"{key}: no saved outputs (run with --save-outputs)")
            continue
        if len(oa) != len(ob):
            diffs.append(f"{key}: {len(oa)} vs {len(ob)} requests")
            continue
        for i, (x, y) in enumerate(zip(oa, ob)):
            if x["token_ids"] != y["token_ids"] or x["text"] != y["text"]:
                at = next((j for j, (s, t) in enumerate(zip(x["token_ids"], y["token_ids"])) if s != t),
                          min(len(x["token_ids"]), len(y["token_ids"])))
                diffs.append(f"{key}: request {i} differs from token {at}")
    return diffs
