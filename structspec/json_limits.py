"""How deep a caller's JSON may nest: the limits the server holds documents to, and a check that does not recurse.

Both ends walk a caller's JSON with code that recurses (``json.dumps`` and ``json.loads`` in C,
jsonschema's validators in Python), so nesting is bounded first, by walks that do not:

  MAX_JSON_DEPTH    objects and arrays within each other, in any document (a schema, a tool's
                    parameters, a worked example's output): the server refuses a deeper text
                    (``grammar.json_text``) and the client a deeper value before encoding it.
  MAX_SCHEMA_DEPTH  subschemas within subschemas (properties, items, anyOf, $defs, ...) in a schema.

Real schemas stay far below both (the deepest of the 7,773 MaskBench schemas nests 63 JSON
levels and 14 subschema levels). Pointers are JSON pointers (RFC 6901). Depends on nothing
of the project: the client imports it.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 128  # objects and arrays, in any document
MAX_SCHEMA_DEPTH = 48  # subschemas within subschemas (properties, items, anyOf, $defs, ...)


class TooDeep(ValueError):
    """A document nests past a limit; ``pointer`` is where (RFC 6901), ``limit`` which one."""

    def __init__(self, pointer: str, limit: int, what: str = "objects and arrays"):
        self.pointer = pointer
        self.limit = limit
        super().__init__(f"nests {what} more than {limit} levels deep (at {pointer or '/'})")


def value_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The pointer of the first dict/list/tuple nested past ``limit`` in a value, or None. Iterative; a value that
    contains itself counts as nesting without end. Raises: never."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        node, pointer, depth = stack.pop()
        if not isinstance(node, (dict, list, tuple)):  # what json.dumps nests (parsed JSON holds no tuples)
            continue
        if depth > limit:
            return pointer
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((child, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}", depth + 1)
                     for key, child in items)
    return None
