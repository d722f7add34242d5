"""Format grammars written here, where llguidance's own refuses values the post-check accepts.

The rule: for each format the grammar constrains, every value the post-check's validator accepts
(jsonschema with the schema's draft's checkers here) is admitted. Where no checker here knows the
format, the values its RFC admits are, and those of the checker jsonschema uses when installed.

* ``email``, ``idn-email``: jsonschema checks only that the string holds an ``@``; so does the
  grammar, exactly (llguidance's refused quoted local parts, IPv6 literals and non-ASCII mail).
* ``ipv6``: Python's ``ipaddress.IPv6Address`` without a scope, exactly: RFC 4291's text forms,
  an IPv4 tail among them (``::ffff:1.2.3.4``, which llguidance's refused).
* ``duration``: RFC 3339's form and ISO 8601's beside it (isoduration, jsonschema's checker:
  ``PT0.5S``, ``PT1H5S``), weeks alone (``P1W``), a fraction on the last unit only: looser than
  RFC 3339, declared approximated (``APPROXIMATE``).

Kept from llguidance, each admitting every value of its RFC (``tests/grammar/test_formats.py``):
``date``, ``date-time`` and ``time`` (looser: no leap-year check, a leap second at any minute;
declared approximated), ``uuid`` (the 8-4-4-4-12 form only; jsonschema's check also passes forms
with dashes, braces or ``urn:`` after position 23), ``ipv4``, ``hostname``, ``uri``.
"""

from __future__ import annotations

import copy
from typing import Any

from structspec.grammar import schema_walk

_H16 = "[0-9A-Fa-f]{1,4}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"  # no leading zero, as ipaddress
_IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    # RFC 3986's IPv6address: n groups before "::", up to 7 - n after it, or all 8 with none
    forms = [f"(?:{_H16}:){{6}}{_LS32}", f"::(?:{_H16}:){{5}}{_LS32}"]
    for before in range(7):
        head = f"(?:(?:{_H16}:){{0,{before}}}{_H16})?" if before else f"(?:{_H16})?"
        after = 4 - before
        if after >= 1:
            forms.append(f"{head}::(?:{_H16}:){{{after}}}{_LS32}" if after > 1 else f"{head}::{_H16}:{_LS32}")
        elif after == 0:
            forms.append(f"{head}::{_LS32}")
        elif after == -1:
            forms.append(f"{head}::{_H16}")
        else:
            forms.append(f"{head}::")
    return "^(?:" + "|".join(forms) + ")$"


def _duration() -> str:
    number, fraction = "[0-9]+", "[.,][0-9]+"
    units = [("Y", False), ("M", False), ("D", False), ("H", True), ("M", True), ("S", True)]

    def tail(i: int, in_time: bool) -> str:
        """A non-empty run of the units from ``i`` on, in order; the last one may have a fraction."""
        alts = []
        for j in range(i, len(units)):
            unit, is_time = units[j]
            rest = tail(j + 1, in_time or is_time)
            prefix = "T" if is_time and not in_time else ""
            more = f"|{unit}(?:{rest})" if rest else ""
            alts.append(f"{prefix}{number}(?:(?:{fraction})?{unit}{more})")
        return "|".join(alts)

    return f"^P(?:{tail(0, False)}|{number}(?:{fraction})?W)$"


# JSON Schema patterns (unanchored, ECMA-262 syntax that RE2 and llguidance read alike).
REGEXES = {"email": "@", "idn-email": "@", "ipv6": _ipv6(), "duration": _duration()}

# Formats the grammar enforces more loosely than the format: the reason, declared on each use.
APPROXIMATE = {
    "date": "no leap-year check",
    "date-time": "no leap-year check; a leap second at any minute",
    "time": "a leap second at any minute",
    "duration": "ISO 8601's forms beside RFC 3339's: units left out, a fraction of the last one",
}


def with_own_formats(schema: Any) -> Any:
    """``schema`` with each ``format`` that ``REGEXES`` writes as a ``pattern`` (beside one of its own, in an
    ``allOf``); ``schema`` itself when it has none."""
    uses = [p for p, node in schema_walk.iter_schemas(schema) if node.get("format") in REGEXES]
    if not uses:
        return schema
    out = copy.deepcopy(schema)
    for pointer in uses:
        node = schema_walk.resolve(out, pointer)
        regex = REGEXES[node.pop("format")]
        if "pattern" in node:
            node["allOf"] = [*node.get("allOf", []), {"pattern": regex}]
        else:
            node["pattern"] = regex
    return out
