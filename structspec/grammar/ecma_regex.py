"""Schema patterns are ECMA-262 regular expressions: their class escapes, spelled out for other engines.

In ECMA-262 (JSON Schema's regex dialect) ``\\d`` is the ASCII digits, ``\\w`` the ASCII word
characters and ``\\s`` white space plus line terminators (U+00A0, U+FEFF, U+2028 and the Unicode
space separators among them). The engines here read them otherwise: RE2 (the post-check) reads
``\\s`` as ASCII white space only, and the Rust engines behind the grammars read ``\\d`` and
``\\w`` as Unicode classes (outlines-core: ``é`` a word character, ``٣`` a digit) and ``\\s`` as
Unicode's White_Space. A grammar that reads a class wider than the post-check lets the model write
a string the post-check then rejects. ``spell_out`` writes each escape as an explicit class with
ECMA's members, so the grammars and the post-check match what the schema means, and each other.

Inside a character class only ``\\d``, ``\\w``, ``\\s`` are spelled out (a class cannot hold a
negated one): there ``\\D``, ``\\W``, ``\\S`` keep each engine's reading, which only differs from
ECMA's at non-ASCII white space and non-ASCII digits and letters.
"""

from __future__ import annotations

# ECMA-262 WhiteSpace and LineTerminator (the Zs category: U+0020, U+00A0, U+1680, U+2000-U+200A,
# U+202F, U+205F, U+3000), in the syntax RE2 and Rust's regex both read.
_SETS = {
    "d": "0-9",
    "w": "0-9A-Za-z_",
    "s": "\\t\\n\\v\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}",
}


def spell_out(pattern: str) -> str:
    """``pattern`` with ``\\d \\w \\s`` (and outside classes ``\\D \\W \\S``) as explicit ECMA classes;
    every other character as it was. Never raises (an unbalanced pattern is rewritten as far as it goes)."""
    out: list[str] = []
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            escape = pattern[i + 1]
            members = _SETS.get(escape.lower())
            if members is not None and (escape.islower() or not in_class):
                out.append(members if in_class else ("[" if escape.islower() else "[^") + members + "]")
            else:
                out.append(pattern[i: i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            # a "]" first in a class is a literal to RE2 and Rust's regex: keep it inside the class
            j = i + 1 + (pattern[i + 1: i + 2] == "^")
            if pattern[j: j + 1] == "]":
                out.append(pattern[i: j + 1])
                i = j + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)
