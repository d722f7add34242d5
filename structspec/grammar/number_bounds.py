"""Bounded numbers: the digits a call's number may be written with, where its schema bounds none.

JSON's grammar allows a number any count of digits, and a small model asked for one can write ``0.0000…`` or
``1000000…`` until ``max_tokens``: worked examples cannot teach a number to end, a grammar that ends can. A JSON
number that other implementations read exactly is an IEEE 754 double (RFC 8259, section 6): an integer is exact
within +-(2**53 - 1). ``bound_numbers`` adds to each number subschema the bounds it lacks:

- ``minimum`` / ``maximum`` at -+(2**53 - 1): at most 16 integer digits, written in plain decimal (no exponent);
- for a ``number`` (not an ``integer``), ``multipleOf`` 1e-10: at most 10 fractional digits.

A bound the schema states is kept, and one that would contradict it is not added. The bounded schema is for the
grammar only: outputs are still checked against the caller's own schema. What cannot be written under these bounds
(a value below 1e-10, one beyond 2**53) is a documented limit of forced and automatic calls (docs/models.md).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from structspec.grammar import schema_walk

SAFE_INTEGER = 2**53 - 1  # RFC 8259: integers in this range are interoperable
FRACTION_STEP = 1e-10  # the finest step llguidance's decimal multipleOf compiles without rounding noise


def bound_numbers(schema: Any) -> Any:
    """A copy of ``schema`` with the missing bounds added to every ``number``/``integer`` subschema; a subschema
    with ``const`` or ``enum`` is left alone (its values are already finite). Raises: Never."""
    bounded = copy.deepcopy(schema)
    for _, node in schema_walk.iter_schemas(bounded):
        if isinstance(node, dict) and "const" not in node and "enum" not in node:
            _bound(node)
    return bounded


def _bound(node: dict[str, Any]) -> None:
    kinds = node.get("type")
    kinds = {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, list) else set()
    if not kinds & {"number", "integer"}:
        return
    low, high = _number(node, "minimum", "exclusiveMinimum"), _number(node, "maximum", "exclusiveMaximum")
    if low is _ABSENT and (high is _ABSENT or high > -SAFE_INTEGER):
        node["minimum"] = -SAFE_INTEGER
    if high is _ABSENT and (low is _ABSENT or low < SAFE_INTEGER):
        node["maximum"] = SAFE_INTEGER
    if "number" in kinds and "multipleOf" not in node:
        node["multipleOf"] = FRACTION_STEP


_ABSENT: Any = object()


def _number(node: Mapping[str, Any], *keywords: str) -> Any:
    """The first of ``keywords`` the node states as a number (draft 4's boolean exclusives are not bounds), or
    ``_ABSENT``; a stated non-number counts as a bound (the schema's own problem, left to it)."""
    for keyword in keywords:
        value = node.get(keyword, _ABSENT)
        if value is _ABSENT or isinstance(value, bool):
            continue
        return value if isinstance(value, (int, float)) else float("nan")
    return _ABSENT
