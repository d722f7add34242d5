"""Walking a JSON Schema's subschemas with their JSON pointers (RFC 6901).

Only positions that hold schemas are visited: a property *named* ``$ref`` or the
value of a ``const`` is data, not a keyword.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

# keyword -> how its value holds subschemas
_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SINGLE = frozenset({
    "additionalProperties", "additionalItems", "contains", "propertyNames", "not", "if", "then", "else",
    "unevaluatedItems", "unevaluatedProperties", "contentSchema", "items",
})
SUBSCHEMA_KEYWORDS = _MAPS | _LISTS | _SINGLE
_REFERENCES = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def join(pointer: str, *tokens: str | int) -> str:
    return pointer + "".join("/" + escape(str(t)) for t in tokens)


def children(node: Mapping[str, Any], pointer: str) -> Iterator[tuple[str, Any]]:
    """(pointer, subschema) for the direct subschemas of one schema object, in document order."""
    for keyword, value in node.items():
        if keyword in _MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                if isinstance(sub, (Mapping, bool)):  # "dependencies" also maps to name lists
                    yield join(pointer, keyword, name), sub
        elif keyword in _LISTS or (keyword == "items" and isinstance(value, list)):
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    yield join(pointer, keyword, i), sub
        elif keyword in _SINGLE and isinstance(value, (Mapping, bool)):
            yield join(pointer, keyword), value


def iter_schemas(schema: Any, pointer: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema object (not boolean schemas) under ``schema``, depth first, in document order."""
    stack = [(pointer, schema)]
    while stack:
        at, node = stack.pop()
        if not isinstance(node, Mapping):
            continue
        yield at, node
        stack.extend(reversed(list(children(node, at))))


def keyword_pointers(schema: Any, keyword: str, where: Callable[[Any], bool] = lambda _: True) -> list[str]:
    """Pointers to every use of ``keyword`` (whose value satisfies ``where``) in schema positions."""
    return [join(at, keyword) for at, node in iter_schemas(schema) if keyword in node and where(node[keyword])]


def resolve(document: Any, pointer: str) -> Any:
    """The value at ``pointer`` (``""`` is the whole document); KeyError if absent."""
    node = document
    if not pointer:
        return node
    if not pointer.startswith("/"):
        raise KeyError(pointer)
    for raw in pointer[1:].split("/"):
        token = unescape(raw)
        if not isinstance(node, (list, Mapping)):
            raise KeyError(pointer)
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (ValueError, IndexError) as exc:
            raise KeyError(pointer) from exc
    return node


def path_keywords(path: Iterable[str | int]) -> list[str]:
    """The keywords along a path that starts at a schema (names and indices skipped).

    ``["properties", "a", "$ref", "minimum"]`` -> ``["properties", "$ref", "minimum"]``;
    used for metaschema error locations and for jsonschema's ``schema_path``.
    """
    tokens = list(path)
    keywords: list[str] = []
    expect = "keyword"  # keyword | name (map key or list index, then a schema) | data
    for i, token in enumerate(tokens):
        if expect == "keyword":
            if not isinstance(token, str):
                break
            keywords.append(token)
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if token in _MAPS or token in _LISTS or (token == "items" and isinstance(nxt, int)):
                expect = "name"
            elif token in _SINGLE or token in _REFERENCES:
                expect = "keyword"  # jsonschema continues into the referenced schema
            else:
                expect = "data"
        elif expect == "name":
            expect = "keyword"
        else:
            break
    return keywords
