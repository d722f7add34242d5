"""The built-in schemas shipped in the repository's ``schemas/`` folder."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"
TOOLS_FILE = "agent_tools.json"
# worked examples for the built-in schemas and tools (written by ``python -m structspec.demo.worked_examples``)
BUILTIN_EXAMPLES_FILE = SCHEMAS_DIR / "examples" / "builtin.json"


@lru_cache(maxsize=1)
def load_builtin_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schemas by file stem (``invoice``, ``contact``, ...), tool lists excluded."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(SCHEMAS_DIR.glob("*.json")) if p.name != TOOLS_FILE}


@lru_cache(maxsize=1)
def load_builtin_tools() -> list[dict[str, Any]]:
    """The agent tool list (OpenAI-style ``{"type": "function", "function": {...}}`` entries)."""
    return json.loads((SCHEMAS_DIR / TOOLS_FILE).read_text())["tools"]
