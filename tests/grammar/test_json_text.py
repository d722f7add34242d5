"""JSON nesting and position: linear scans that find where a document passes a depth limit (without recursion) and where a
partial document stands, read whole or as it grows."""

from __future__ import annotations

import json
import random

import pytest

from structspec.grammar import json_text


def test_scan_stops_where_the_limit_is_crossed_with_the_path():
    text = '{"a":[1,{"b":{"c":[[0]]}}]}'
    assert not json_text.scan(text, max_depth=6).too_deep  # exactly six levels
    position = json_text.scan(text, max_depth=5)
    assert position.too_deep and position.path == ("a", 1, "b", "c", 0)  # the sixth container
    assert json_text.text_too_deep(text, 5) == "/a/1/b/c/0"
    assert json_text.text_too_deep('{"s":"[[[[[[[["}', 2) is None  # brackets inside strings do not nest


def test_loads_refuses_before_parsing():
    assert json_text.loads("[[1]]", limit=2) == [[1]]
    with pytest.raises(json_text.TooDeep) as err:
        json_text.loads("[" * 100_000 + "]" * 100_000)
    assert err.value.limit == json_text.MAX_JSON_DEPTH and err.value.pointer == "/0" * json_text.MAX_JSON_DEPTH


def test_loads_refuses_a_lone_surrogate_escape_but_not_a_pair_or_an_escaped_backslash():
    with pytest.raises(json.JSONDecodeError, match=r"lone surrogate escape \(\\udc00\)"):
        json_text.loads('{"a": ["x", "\\udc00"]}')
    assert json_text.loads('"\\ud83d\\ude00"') == "\U0001f600"
    assert json_text.loads('"\\\\ud800"') == "\\ud800"  # a backslash, then the letters


def test_value_and_schema_depth_agree_with_the_text_scan():
    value = json.loads('{"a":[{"b":[1]}]}')
    assert json_text.value_too_deep(value, 4) is None
    assert json_text.value_too_deep(value, 3) == "/a/0/b"
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"anyOf": [{"type": "string"}]}}}}
    assert json_text.schema_too_deep(schema, 4) is None
    assert json_text.schema_too_deep(schema, 3) == "/properties/a/items/anyOf/0"
    # const/enum values are data, not subschemas
    assert json_text.schema_too_deep({"const": {"a": {"b": {"c": {}}}}}, 1) is None


def test_a_resumed_scan_stands_where_a_whole_scan_does():
    """``JsonScan`` read as a text grows (and restarted on a text that does not extend the last) agrees with
    ``scan`` of the whole text at every length, escapes and keys split between reads included."""
    doc = '{"a": {"k\\"ey": ["x,y", {"b": "q\\\\"}], "c": 2}, "d": [[1], {"e": "{["}], "f": "'
    rng = random.Random(2)
    for max_depth, most in ((None, 1), (None, 5), (2, 1), (2, 5)):  # a character a read: every split point
        resumed = json_text.JsonScan(max_depth)
        n = 0
        while n < len(doc):
            n = min(len(doc), n + rng.randint(1, most))
            assert resumed.position(doc[:n]) == json_text.scan(doc[:n], max_depth), (doc[:n], max_depth)
        other = '[{"z": "'  # not a continuation of what it read: read from its start
        assert resumed.position(other) == json_text.scan(other, max_depth)
        assert resumed.position(other + '1", "w') == json_text.scan(other + '1", "w', max_depth)
