"""Post-check: valid, declared gap (schema_violation) and bug (internal_error) are told apart."""

from structspec.engine.postcheck import check_json_text
from structspec.engine.types import Outcome

SCHEMA = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                                           "n": {"type": "integer", "maximum": 3}}, "required": ["tags", "n"]}


def test_valid():
    r = check_json_text('{"tags":["a","b"],"n":1}', SCHEMA, ("uniqueItems",))
    assert r.outcome is Outcome.VALID and r.value == {"tags": ["a", "b"], "n": 1}


def test_post_check_keyword_is_a_schema_violation():
    r = check_json_text('{"tags":["a","a"],"n":1}', SCHEMA, ("uniqueItems",))
    assert r.outcome is Outcome.SCHEMA_VIOLATION and "uniqueItems" in r.error


def test_enforced_keyword_failure_is_an_internal_error():
    r = check_json_text('{"tags":["a"],"n":9}', SCHEMA, ("uniqueItems",))
    assert r.outcome is Outcome.INTERNAL_ERROR and "maximum" in r.error
    assert check_json_text('{"tags":', SCHEMA).outcome is Outcome.INTERNAL_ERROR


# -- hostile outputs: regexes that backtrack, nesting that recurses -------------------------------

import time  # noqa: E402

import pytest  # noqa: E402

from structspec.grammar.json_text import MAX_JSON_DEPTH  # noqa: E402

EVIL = "a" * 64 + "!"


@pytest.mark.parametrize("schema,outcome", [
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}, Outcome.INTERNAL_ERROR),
    ({"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}}}, Outcome.VALID),  # no key matches
    ({"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}, "additionalProperties": False},
     Outcome.INTERNAL_ERROR),
], ids=["pattern", "patternProperties", "additionalProperties"])
def test_backtracking_patterns_are_checked_in_linear_time(schema, outcome):
    text = '{"s":"%s"}' % EVIL if "properties" in schema else '{"%s":"x"}' % EVIL
    started = time.monotonic()
    r = check_json_text(text, schema)
    assert time.monotonic() - started < 1.0  # Python's re: 2^64 steps
    assert r.outcome is outcome


def test_linear_patterns_keep_jsonschema_semantics():
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}
    assert check_json_text('{"code":"INV-12","x-a":1}', schema).outcome is Outcome.VALID
    assert check_json_text('{"code":"inv-12"}', schema).outcome is Outcome.INTERNAL_ERROR
    assert check_json_text('{"x-a":"one"}', schema).outcome is Outcome.INTERNAL_ERROR  # patternProperties' schema
    bad = check_json_text('{"other":1}', schema)
    assert bad.outcome is Outcome.INTERNAL_ERROR and "'other'" in bad.error  # additionalProperties


def test_output_nesting_past_the_limit_is_returned_unchecked():
    tree = {"type": "array", "items": {"$ref": "#"}}  # recursive: any depth is valid
    fine = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert check_json_text(fine, tree).outcome is Outcome.VALID
    deep = "[" * 3000 + "]" * 3000  # json.loads alone would raise RecursionError
    r = check_json_text(deep, tree)
    assert r.outcome is Outcome.NOT_CHECKED and r.value is None and "128 levels" in r.error
