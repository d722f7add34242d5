"""Schema patterns are ECMA-262 regular expressions: their class escapes, spelled out for other engines.

In ECMA-262 (JSON Schema's regex dialect) ``\\d`` is the ASCII digits, ``\\w`` the ASCII word
characters and ``\\s`` white space plus line terminators (U+00A0, U+FEFF, U+2028 and the Unicode
space separators among them). The engines here read them otherwise: RE2 (the post-check) reads
``\\s`` as ASCII white space only, and the Rust engines behind the grammars read ``\\d`` and
``\\w`` as Unicode classes (outlines-core: ``é`` a word character, ``٣`` a digit) and ``\\s`` as
Unicode's White_Space. A grammar that reads a class wider than the post-check lets the model write
a string the post-check then rejects. ``spell_out`` writes each escape as an explicit class with
ECMA's members, so the grammars and the post-check match what the schema means, and each other.

Unicode property escapes (``\\p{...}``, ``\\P{...}``) are spelled the way RE2 names them: ECMA-262's
long General_Category names (``\\p{Letter}``, ``\\p{gc=Letter}``, ``\\p{General_Category=Lu}``) as
the short ones (``\\p{L}``, ``\\p{Lu}``), ``\\p{Script=Greek}`` and ``\\p{sc=Greek}`` as
``\\p{Greek}`` (RE2 knows scripts by their long names). The Rust engines read both spellings alike.
A property RE2 has no name for (binary properties such as ``Alphabetic``, ``Script_Extensions``, short
script codes such as ``Grek``) stays as written, and intake refuses the pattern.

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


# ECMA-262's General_Category values: long name -> the short one RE2 knows (Cased_Letter, LC,
# has no RE2 name and is left out).
_CATEGORIES = {
    "Letter": "L", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll", "Titlecase_Letter": "Lt",
    "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M", "Combining_Mark": "M", "Nonspacing_Mark": "Mn",
    "Spacing_Mark": "Mc", "Enclosing_Mark": "Me", "Number": "N", "Decimal_Number": "Nd", "digit": "Nd",
    "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P", "punct": "P", "Connector_Punctuation": "Pc",
    "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
    "Final_Punctuation": "Pf", "Other_Punctuation": "Po", "Symbol": "S", "Math_Symbol": "Sm",
    "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z",
    "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C", "Control": "Cc",
    "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn",
}
_SHORT_CATEGORIES = frozenset(_CATEGORIES.values())


def property_name(name: str) -> str:
    """The name RE2 knows for the Unicode property ``name`` (the text inside ``\\p{...}``); ``name``
    itself when it has none or already is one."""
    key, eq, value = name.partition("=")
    if eq and key in ("gc", "General_Category"):
        return _CATEGORIES.get(value, value if value in _SHORT_CATEGORIES else name)
    if eq and key in ("sc", "Script"):
        return value
    return _CATEGORIES.get(name, name)


def spell_out(pattern: str) -> str:
    """``pattern`` with ``\\d \\w \\s`` (and outside classes ``\\D \\W \\S``) as explicit ECMA classes and
    Unicode property names as RE2's; every other character as it was. Never raises (an unbalanced pattern is rewritten as far as it goes)."""
    out: list[str] = []
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            escape = pattern[i + 1]
            members = _SETS.get(escape.lower())
            end = pattern.find("}", i + 3) if escape in "pP" and pattern[i + 2: i + 3] == "{" else -1
            if end > 0:
                out.append(f"\\{escape}{{{property_name(pattern[i + 3: end])}}}")
                i = end + 1
                continue
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
