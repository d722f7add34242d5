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
