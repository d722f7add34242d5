"""The post-check's own keyword code: exact multipleOf, if/then/else errors that name their branch."""

from __future__ import annotations

import pytest

from structspec.grammar import is_post_check_error
from structspec.grammar.postcheck import error_keywords, instance_errors


@pytest.mark.parametrize("multiple,instance,valid", [
    (0.01, 0.07, True),  # 0.07 / 0.01 is 7.000000000000001 in floats
    (0.1, 0.3, True),
    (0.01, 0.075, False),
    (1.5, 4.5, True),
    (3, 9, True),
    (3, 10, False),
    (2, 7.5, False),
    (1e-5, 1e300, True),  # jsonschema's float quotient overflows here
    (0.01, float("inf"), False),
    (7, True, True),  # a boolean is no number: multipleOf does not apply
])
def test_multiple_of_is_exact(multiple, instance, valid):
    errors = instance_errors(instance, {"multipleOf": multiple})
    assert (not errors) is valid
    assert all(error_keywords(e) == ["multipleOf"] for e in errors)


@pytest.mark.parametrize("schema,instance,keywords", [
    ({"if": {"const": 1}, "then": False}, 1, ["then"]),
    ({"if": {"const": 1}, "else": False}, 2, ["else"]),
    ({"if": {"const": 1}, "then": {"type": "string"}}, 1, ["then", "type"]),
    ({"properties": {"a": {"if": {"type": "integer"}, "then": False}}}, {"a": 1}, ["properties", "then"]),
])
def test_a_false_branch_is_named_on_its_error(schema, instance, keywords):
    (error,) = instance_errors(instance, schema)
    assert error_keywords(error) == keywords
    assert is_post_check_error(error, ("if", "then", "else"))


def test_if_passes_when_its_branch_allows():
    assert not instance_errors(2, {"if": {"const": 1}, "then": False})
    assert not instance_errors(1, {"if": {"const": 1}, "else": False})
    assert not instance_errors(1, {"then": False})  # no "if": then/else never apply


def test_draft_4_has_no_if():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "if": {"const": 1}, "then": False}
    assert not instance_errors(1, schema)


def test_formats_are_checked_as_the_schemas_draft_defines_them():
    """2020-12's time is RFC 3339's (an offset required), not draft 3's ``%H:%M:%S``."""
    schema = {"type": "string", "format": "time"}
    assert not instance_errors("12:00:00Z", schema)
    assert not instance_errors("23:59:60.5+01:00", schema)
    assert not instance_errors("2024-02-30", {"$schema": "http://json-schema.org/draft-04/schema#", "format": "date"})
    assert instance_errors("2024-02-30", {"format": "date"})


def test_errors_under_a_dynamic_reference_name_the_keywords_below_it():
    schema = {"$dynamicAnchor": "n", "type": "object",
              "properties": {"c": {"$dynamicRef": "#n"}, "tags": {"type": "array", "uniqueItems": True}}}
    (error,) = instance_errors({"c": {"tags": [1, 1]}}, schema)
    assert error_keywords(error) == ["properties", "$dynamicRef", "properties", "uniqueItems"]
    assert is_post_check_error(error, ["uniqueItems"])
