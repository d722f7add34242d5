"""Class escapes spelled out with ECMA-262's members, for RE2 and the grammar engines alike."""

from __future__ import annotations

import pytest

from structspec.grammar.ecma_regex import spell_out
from structspec.grammar.postcheck import linear_regex


@pytest.mark.parametrize("pattern,spelled", [
    ("^\\d+$", "^[0-9]+$"),
    ("\\D\\W", "[^0-9][^0-9A-Za-z_]"),
    ("[a\\d_]", "[a0-9_]"),
    ("[^\\w-]", "[^0-9A-Za-z_-]"),
    ("[\\D]", "[\\D]"),  # a negated escape inside a class stays the engine's
    ("\\\\d", "\\\\d"),  # an escaped backslash, then a plain "d"
    ("[]\\d]", "[]0-9]"),  # "]" first in a class is a literal
    ("[^]\\d]\\d", "[^]0-9][0-9]"),
    ("\\.\\[\\d", "\\.\\[[0-9]"),  # "\\[" opens no class
    ("a\\", "a\\"),
])
def test_spelled_out(pattern, spelled):
    assert spell_out(pattern) == spelled


@pytest.mark.parametrize("pattern,text,matches", [
    ("^\\s$", "\u00a0", True),  # no-break space: ECMA white space, not RE2's
    ("^\\s$", "\ufeff", True),
    ("^\\s$", "\u2003", True),
    ("^\\s$", "\u0085", False),  # next line: Unicode White_Space, not ECMA's
    ("^\\S$", "\u00a0", False),
    ("^[\\s,]+$", "\u3000,", True),
    ("^\\w+$", "\u00e9", False),  # ASCII word characters only
    ("^\\d$", "\u0663", False),  # ASCII digits only
    ("^\\d\\w\\s$", "7_ ", True),
])
def test_post_check_reads_them_as_ecma(pattern, text, matches):
    assert bool(linear_regex(pattern).search(text)) is matches


@pytest.mark.parametrize("pattern,spelled", [
    ("\\p{Letter}", "\\p{L}"),
    ("\\P{Uppercase_Letter}", "\\P{Lu}"),
    ("[\\p{Decimal_Number}_]", "[\\p{Nd}_]"),
    ("\\p{gc=Lowercase_Letter}", "\\p{Ll}"),
    ("\\p{General_Category=Nd}", "\\p{Nd}"),
    ("\\p{Script=Greek}\\p{sc=Latin}", "\\p{Greek}\\p{Latin}"),
    ("\\p{L}\\p{Greek}", "\\p{L}\\p{Greek}"),  # names RE2 knows as they are
    ("\\p{Alphabetic}", "\\p{Alphabetic}"),  # no RE2 spelling: left for intake to refuse
    ("\\\\p{Letter}", "\\\\p{Letter}"),  # an escaped backslash, then plain text
])
def test_unicode_property_names_spelled_for_re2(pattern, spelled):
    assert spell_out(pattern) == spelled


@pytest.mark.parametrize("pattern,text,matches", [
    ("^\\p{Letter}+$", "h\u00e9\u03bb", True),
    ("^\\p{Letter}+$", "h1", False),
    ("^\\P{Letter}$", "1", True),
    ("^[\\p{Uppercase_Letter}\\d]+$", "A1\u00c9", True),
    ("^\\p{Script=Greek}$", "\u03bb", True),
    ("^\\p{sc=Greek}$", "l", False),
])
def test_long_property_names_match_on_re2(pattern, text, matches):
    assert bool(linear_regex(pattern).search(text)) is matches
