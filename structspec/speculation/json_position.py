"""Where in a JSON document a partial output stands, and whether that spot is free text.

The router drafts with the draft model inside free-text string values (no enum,
const, pattern or format) and with copy/history proposers elsewhere. It learns
where it is by scanning the output text (``grammar.json_text.scan``: a pushdown scan
over objects, arrays, keys and strings, cheap next to a model step).
"""

from __future__ import annotations

from typing import Any

from structspec.grammar.json_text import JsonPosition, scan

__all__ = ["JsonPosition", "is_free_text", "scan", "subschema"]


def subschema(schema: dict[str, Any] | None, path: tuple[str | int, ...]) -> dict[str, Any] | None:
    """Follow properties / items (and local $refs) down ``path``; None when it cannot tell."""
    node = schema
    for step in path:
        node = _deref(schema, node)
        if not isinstance(node, dict):
            return None
        if isinstance(step, int):
            items = node.get("items")
            node = items if isinstance(items, dict) else None
        else:
            node = (node.get("properties") or {}).get(step)
    found: dict[str, Any] | None = _deref(schema, node)
    return found


def _deref(root: Any, node: Any) -> Any:
    seen = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/") and seen < 16:
        target: Any = root
        for part in node["$ref"][2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        node, seen = target, seen + 1
    return node


def is_free_text(schema: dict[str, Any] | None, position: JsonPosition) -> bool:
    """Inside a string value whose schema is a plain string (no enum, const, pattern, format)."""
    if not position.in_string or position.in_key:
        return False
    node = subschema(schema, position.path)
    if not isinstance(node, dict):
        return False
    types = node.get("type")
    plain = types == "string" or (isinstance(types, list) and "string" in types)
    return plain and not any(k in node for k in ("enum", "const", "pattern", "format"))
