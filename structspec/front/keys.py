"""What a statistics read is addressed by: schema ids, statistics keys and windows.

A *schema id* names a registered schema (``SCHEMA_ID_RE``). A *statistics key* says which schema a counter
belongs to: ``<id>@<version>`` for a registered version, ``inline:<first 16 hex of the digest>`` for a schema sent
inline (the digest is ``registry.content_hash`` of its canonical text), ``tools:<...>`` for a tool list (made by
the engine). A *window* is how many seconds back a read sums the hourly counters.

Standard library only: the statistics reader (``front.stats``) and ``structspec stats`` use these names without
loading the registry's grammar layer (torch, transformers) or building the statistics' classes at start-up.
"""

from __future__ import annotations

import re

SCHEMA_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")

DEFAULT_WINDOWS = (3600, 86400, 7 * 86400)  # 1 h, 24 h, 7 d: the counters are hourly
MAX_WINDOWS = 8
MAX_WINDOW_SECONDS = 90 * 86400


def registered_stats_key(schema_id: str, version: int) -> str:
    """The statistics key of a registered schema version."""
    return f"{schema_id}@{version}"


def inline_key(digest: str) -> str:
    """The statistics key of a schema sent inline, from its digest."""
    return f"inline:{digest[:16]}"
