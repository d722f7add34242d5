"""Plain-text tables the benchmarks print: each column padded to its widest cell."""

from __future__ import annotations

from typing import Sequence


def aligned(rows: Sequence[Sequence[str]], sep: str = "  ", right: bool = False) -> str:
    """``rows`` (the header first) as lines, each cell padded to its column's widest one (left-aligned, or
    right-aligned with ``right``) and joined by ``sep``."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(sep.join(c.rjust(w) if right else c.ljust(w) for c, w in zip(r, widths)) for r in rows)
