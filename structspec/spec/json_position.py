"""Where in a JSON document a partial output stands, and whether that spot is free text.

The router drafts with the draft model inside free-text string values (no enum,
const, pattern or format) and with copy/history proposers elsewhere. It learns
where it is by scanning the output text: a small pushdown scan over objects,
arrays, keys and strings, cheap next to a model step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JsonPosition:
    path: tuple[str | int, ...]  # keys / indices down to the current value
    in_string: bool  # inside an open string
    in_key: bool  # ... and that string is an object key


def scan(text: str) -> JsonPosition:
    stack: list[list] = []  # frames: ["obj", key or None, expecting_key] / ["arr", index]
    in_string = escaped = False
    key_chars: list[str] | None = None
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if key_chars is not None:
                    stack[-1][1] = "".join(key_chars)
                    key_chars = None
            elif key_chars is not None:
                key_chars.append(ch)
            continue
        if ch == '"':
            in_string = True
            if stack and stack[-1][0] == "obj" and stack[-1][2]:
                key_chars = []
        elif ch == "{":
            stack.append(["obj", None, True])
        elif ch == "[":
            stack.append(["arr", 0])
        elif ch in "}]":
            if stack:
                stack.pop()
        elif ch == ":" and stack and stack[-1][0] == "obj":
            stack[-1][2] = False
        elif ch == "," and stack:
            if stack[-1][0] == "obj":
                stack[-1][1], stack[-1][2] = None, True
            else:
                stack[-1][1] += 1
    path: list[str | int] = []
    for frame in stack:
        if frame[0] == "obj" and frame[1] is not None and not frame[2]:
            path.append(frame[1])
        elif frame[0] == "arr":
            path.append(frame[1])
    return JsonPosition(tuple(path), in_string, key_chars is not None)


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
    return _deref(schema, node)


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
