"""JSON documents as text and as values: where a partial document stands, and how deep one nests.

Every JSON document structspec takes from a caller (a schema, a tool's parameters, a worked
example's output) or makes (an output) is walked by code that recurses: ``json.loads`` and
``json.dumps`` in C, jsonschema's validators in Python. Nesting is bounded before any of them
runs, by scans that do not recurse, to the limits of ``structspec.json_limits`` (which the
client checks too): ``MAX_JSON_DEPTH`` levels of objects and arrays in any document,
``MAX_SCHEMA_DEPTH`` levels of subschemas in a schema. jsonschema checks a schema at the limit
well inside Python's default recursion limit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from structspec.grammar import schema_walk
from structspec.json_limits import (  # ours too: re-exported
    MAX_JSON_DEPTH as MAX_JSON_DEPTH, MAX_SCHEMA_DEPTH as MAX_SCHEMA_DEPTH, TooDeep as TooDeep,
    value_too_deep as value_too_deep)


@dataclass(frozen=True)
class JsonPosition:
    path: tuple[str | int, ...]  # keys / indices down to the current value
    in_string: bool  # inside an open string
    in_key: bool  # ... and that string is an object key
    too_deep: bool = False  # the scan stopped where nesting first passed ``max_depth``


def scan(text: str, max_depth: int | None = None) -> JsonPosition:
    """Where the (possibly partial) document ``text`` stands at its end: a pushdown scan over
    objects, arrays, keys and strings, no recursion, cheap next to a model step.

    With ``max_depth``, stops at the first object or array that opens past that depth and
    returns the path to it with ``too_deep`` set. Keys appear as written (escapes not decoded).
    """
    return JsonScan(max_depth).position(text)


class JsonScan:
    """``scan`` that resumes: ``position(text)`` reads only what ``text`` adds to the text it read last (a growing
    output, asked at every step, is read once in all, not once a step); a text that does not begin with the last
    is read from its start. Raises: Never."""

    def __init__(self, max_depth: int | None = None):
        self.max_depth = max_depth
        self._restart()

    def _restart(self) -> None:
        self._read = ""  # the text read so far
        self._stack: list[list[Any]] = []  # frames: ["obj", key or None, expecting_key] / ["arr", index]
        self._in_string = self._escaped = False
        self._key_chars: list[str] | None = None
        self._too_deep: JsonPosition | None = None  # where nesting first passed ``max_depth``

    def position(self, text: str) -> JsonPosition:
        if not text.startswith(self._read):
            self._restart()
        if self._too_deep is None:
            self._feed(text[len(self._read):])
        self._read = text
        if self._too_deep is not None:
            return self._too_deep
        return JsonPosition(_path(self._stack), self._in_string, self._key_chars is not None)

    def _feed(self, text: str) -> None:
        stack, in_string, escaped, key_chars = self._stack, self._in_string, self._escaped, self._key_chars
        max_depth = self.max_depth
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
            elif ch in "{[":
                if max_depth is not None and len(stack) >= max_depth:
                    self._too_deep = JsonPosition(_path(stack), False, False, too_deep=True)
                    break
                stack.append(["obj", None, True] if ch == "{" else ["arr", 0])
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
        self._in_string, self._escaped, self._key_chars = in_string, escaped, key_chars


def _path(stack: list[list[Any]]) -> tuple[str | int, ...]:
    path: list[str | int] = []
    for frame in stack:
        if frame[0] == "obj" and frame[1] is not None and not frame[2]:
            path.append(frame[1])
        elif frame[0] == "arr":
            path.append(frame[1])
    return tuple(path)


def text_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The pointer where ``text`` first nests past ``limit`` objects/arrays, or None. Linear, no recursion."""
    position = scan(text, max_depth=limit)
    return schema_walk.join("", *position.path) if position.too_deep else None


# a \uD800-\uDFFF escape: paired ones decode to one character, a lone one to a surrogate no UTF-8 can hold
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(text: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that raises ``TooDeep`` (before parsing) instead of hitting the recursion limit,
    and ``json.JSONDecodeError`` for every text it cannot parse (Python also refuses integer literals
    of more than ``sys.get_int_max_str_digits()`` digits, with a plain ValueError) and for a lone
    surrogate escape (``"\\ud800"``: JSON's grammar admits it, but it is no Unicode character, and
    every hash, store and grammar engine downstream encodes text as UTF-8)."""
    pointer = text_too_deep(text, limit)
    if pointer is not None:
        raise TooDeep(pointer, limit)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        raise json.JSONDecodeError(f"cannot parse a number: {str(exc)[:120]}", text, 0) from None
    if _SURROGATE_ESCAPE.search(text):  # rare: only then is the value encoded once to find out
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            lone = exc.object[exc.start:exc.end]
            raise json.JSONDecodeError(f"a lone surrogate escape (\\u{ord(lone[0]):04x}) is no Unicode character",
                                       text, 0) from None
    return value


def schema_too_deep(schema: Any, limit: int = MAX_SCHEMA_DEPTH) -> str | None:
    """The pointer of the first subschema nested past ``limit`` subschema levels, or None (iterative)."""
    stack: list[tuple[Any, str, int]] = [(schema, "", 1)]
    while stack:
        node, pointer, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        if depth > limit:
            return pointer
        stack.extend((child, at, depth + 1) for at, child in schema_walk.children(node, pointer))
    return None


def check_schema_depth(schema: Any) -> None:
    """Raise ``TooDeep`` when a parsed schema passes either limit."""
    pointer = value_too_deep(schema)
    if pointer is not None:
        raise TooDeep(pointer, MAX_JSON_DEPTH)
    pointer = schema_too_deep(schema)
    if pointer is not None:
        raise TooDeep(pointer, MAX_SCHEMA_DEPTH, "subschemas")
