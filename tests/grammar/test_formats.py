"""Format grammars against the post-check: every value the validator accepts is admitted.

Where jsonschema here checks a format (``email``, ``idn-email``, ``ipv6``, ...), the grammar admits
its whole set; where it has no checker (``date-time``, ``time``, ``duration``), the RFC 3339 and
ISO 8601 values its checkers accept when installed (rfc3339-validator, isoduration) are admitted.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
import re2

from structspec.engine.postcheck import check_json_text
from structspec.engine.types import Outcome
from structspec.grammar import GrammarOptions, formats
from structspec.grammar.postcheck import instance_errors

from .conftest import accepts

VALID = {
    "date-time": ["1963-06-19T08:30:06.283185Z", "1963-06-19t08:30:06.283185z", "1937-01-01T12:00:27.87+00:20",
                  "1990-12-31T15:59:50.123-08:00", "1998-12-31T23:59:60Z", "1998-12-31T15:59:60.123-08:00",
                  "2024-02-29T00:00:00+23:59"],
    "time": ["08:30:06Z", "08:30:06z", "23:59:60Z", "15:59:60-08:00", "08:30:06.283185+01:30", "01:01:01.1Z"],
    "duration": ["P4DT12H30M5S", "P4Y", "PT0S", "P0D", "P1M", "PT1M", "PT36H", "P1D", "P2W", "P1W", "PT0.5S",
                 "P0.5D", "PT1H5S", "P1Y2M3DT4H5M6.25S", "PT1,5H"],
    "email": ["joe.bloggs@example.com", "te~st@example.com", "\"joe bloggs\"@example.com", "\"joe..bloggs\"@x.com",
              "\"joe@bloggs\"@example.com", "joe.bloggs@[127.0.0.1]", "joe.bloggs@[IPv6:::1]", "\u00fc@x.com",
              "a@b", "@"],
    "idn-email": ["\uc2e4\ub840@\uc2e4\ub840.\ud14c\uc2a4\ud2b8", "joe.bloggs@example.com", "\u00fc@\u4f8b\u3048.jp"],
    "ipv6": ["::1", "::", "1::", "::abef", "1:d6::42", "::ffff:192.168.0.1", "1:2:3:4:5:6:1.2.3.4",
             "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::1:2:3:4:5:6:7", "ABCD:EF01:2345:6789:ABCD:EF01:2345:6789",
             "000a:0000::0001", "::42:ff:1", "::1.2.3.4"],
}
INVALID = {
    "date-time": ["1990-02-31T15:59:59.123-08:00", "1990-12-31T15:59:59-24:00", "06/19/1963 08:30:06 PST",
                  "2013-350T01:01:01", "1963-06-19", "1963-06-19T08:30:06", "1963-06-19 08:30:06Z",
                  "1963-06-1\u09eaT00:00:00Z"],
    "time": ["08:30:06", "24:00:00Z", "08:30:06 PST", "01:01:01,1111Z", "12:00:00+24:00", "\u09e8:00:00Z"],
    "duration": ["PT1D", "P", "P1YT", "PT", "P2D1Y", "P1D2H", "P2S", "P1Y2W", "P\u09e8Y", "P1", "1D", "P1.5Y2M",
                 "PT1.S"],
    "email": ["2962", "joe.example.com"],
    "idn-email": ["2962"],
    "ipv6": ["12345::", "::abcef", "1:1:1:1:1:1:1:1:1:1", "::laptop", "", "100:100:100:100:100:100:255.255.255.255.255",
             "1::d6::42", "::ffff:192.168.0.01", "::ffff:256.0.0.1", ":1:2::", "1:2:3:4:5:6:7:8::", "fe80::1%eth0",
             "1:2:3:4:5:6:7:1.2.3.4", " ::1", "::1 ", "1.2.3.4", "\u09ea::1"],
}


def cases(table):
    return [pytest.param(fmt, value, id=f"{fmt}:{value}") for fmt, values in table.items() for value in values]


@pytest.mark.parametrize("fmt,value", cases(VALID))
def test_a_valid_value_is_admitted_and_passes_the_post_check(compilers, view, fmt, value):
    schema = {"type": "string", "format": fmt}
    grammar = compilers["llguidance"].compile_schema(schema)
    text = json.dumps(value, ensure_ascii=False)  # as a model writes it (the grammar writes no \\u escape)
    assert accepts(grammar, view, text)
    assert check_json_text(text, schema, grammar.info.post_check_keywords).outcome is Outcome.VALID


@pytest.mark.parametrize("fmt,value", cases(INVALID))
def test_an_invalid_value_is_refused_by_the_grammar(compilers, view, fmt, value):
    grammar = compilers["llguidance"].compile_schema({"type": "string", "format": fmt})
    assert not accepts(grammar, view, json.dumps(value, ensure_ascii=False))


def test_email_is_the_validators_set_exactly(compilers):
    """jsonschema's ``email`` and ``idn-email`` are "has an @": the grammar's too, enforced in strict mode."""
    for fmt in ("email", "idn-email"):
        info = compilers["llguidance"].compile_schema({"type": "string", "format": fmt},
                                                      GrammarOptions(allow_post_check=False)).info
        assert info.warnings == () and info.post_check_keywords == ()
    for value in ("a@b", "x", "", "@@", "a b@", "\u00fc"):
        assert bool(re2.search(formats.REGEXES["email"], value)) is not instance_errors(value, {"format": "email"})


def _ipv6_candidates(n: int) -> list[str]:
    rng = random.Random(7)
    groups = ["0", "1", "ff", "abcd", "ABCD", "00000", "12345", "g", "", "1.2.3.4", "255.255.255.255", "01.2.3.4",
              "256.1.1.1"]
    out = []
    for _ in range(n):
        parts = [rng.choice(groups) for _ in range(rng.randint(1, 10))]
        out.append(":".join(parts))
    return out + ["::" + ":".join(p) for p in itertools.product(["1", "1.2.3.4"], repeat=2)]


def test_ipv6_is_pythons_set_exactly():
    """``ipaddress.IPv6Address`` without a scope: random colon-joined groups, IPv4 tails among them."""
    regex = re2.compile(formats.REGEXES["ipv6"])
    checked = 0
    for value in _ipv6_candidates(4000) + VALID["ipv6"] + INVALID["ipv6"]:
        valid = not instance_errors(value, {"format": "ipv6"})
        assert bool(regex.search(value)) is valid, value
        checked += valid
    assert checked > 30  # the sample holds valid addresses, not only invalid ones


def test_formats_looser_than_their_rfc_are_declared_approximated(compilers):
    for fmt in ("date-time", "time", "duration"):
        (warning,) = compilers["llguidance"].compile_schema({"type": "string", "format": fmt}).info.warnings
        assert "approximated" in warning.message
