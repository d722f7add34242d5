"""The fast metaschema verdict: it agrees with jsonschema, and a refusal still names jsonschema's errors."""

from __future__ import annotations

import json

import jsonschema
import pytest

from structspec.bench.grammar_bench import select_files
from structspec.grammar import GrammarOptions, SchemaError, intake, metaschema

from .test_maskbench import MASKBENCH, needs_maskbench

DRAFTS = [jsonschema.Draft4Validator, jsonschema.Draft6Validator, jsonschema.Draft7Validator,
          jsonschema.Draft201909Validator, jsonschema.Draft202012Validator]

# valid in some drafts, invalid in others, or invalid in all: each a keyword of the metaschema
CASES = [
    {"type": "string"},
    {"type": "strin"},
    {"type": ["string", "null"]},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": "1"}}},
    {"type": "number", "minimum": 1, "exclusiveMinimum": True},
    {"type": "number", "exclusiveMinimum": 1},
    {"type": "array", "items": [{"type": "string"}], "additionalItems": False},
    {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
    {"required": "a"},
    {"required": []},
    {"enum": []},
    {"$defs": {"a": {"type": 3}}, "$ref": "#/$defs/a"},
    {"definitions": {"a": {"type": 3}}},
    {"anyOf": []},
    {"anyOf": [{"type": "string"}, {"minLength": -1}]},
    {"pattern": "^[a-z]+$", "format": "not-a-format"},
    {"dependentRequired": {"a": ["b", "b"]}},
    {"dependencies": {"a": ["b"], "c": {"type": "string"}}},
    {"$schema": 3},
    {"properties": {"$ref": {"type": "string"}}, "const": {"$ref": 7}},
    {"minLength": 1.5},
    {"minLength": 2.0},
    {"multipleOf": 0},
    {"if": {"type": "string"}, "then": {"minLength": 1}, "else": "x"},
]


@pytest.mark.parametrize("cls", DRAFTS, ids=lambda c: c.__name__)
def test_agrees_with_jsonschema_on_each_case(cls):
    """A schema it calls valid is valid for jsonschema (a "valid" is final); every invalid case
    (several per draft) is sent to jsonschema, and so, here, is no valid one."""
    slow = intake._metaschema_validator(cls)
    invalid = 0
    for schema in CASES:
        valid = not any(True for _ in slow.iter_errors(schema))
        invalid += not valid
        assert metaschema.surely_valid(cls, schema) == valid, (cls.__name__, schema)
    assert invalid >= 4


@needs_maskbench
def test_agrees_with_jsonschema_on_maskbench():
    """On a sample of real schemas of every split; the whole set (7,773) agrees too."""
    for path in select_files(MASKBENCH, limit=150):
        schema = json.loads(path.read_text())["schema"]
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        valid = not any(True for _ in intake._metaschema_validator(cls).iter_errors(schema))
        assert metaschema.surely_valid(cls, schema) == valid, path.name


def test_what_it_cannot_judge_goes_to_jsonschema():
    """A draft it has no validator for, or a value outside JSON: "ask jsonschema", never an exception."""
    assert not metaschema.surely_valid(jsonschema.Draft3Validator, {"type": "string"})
    assert not metaschema.surely_valid(jsonschema.Draft202012Validator, {"maximum": float("nan")})
    assert metaschema.surely_valid(jsonschema.Draft202012Validator, {"maximum": 2**70})  # JSON has no size limit


def test_a_valid_schema_skips_jsonschemas_walk(monkeypatch):
    """The slow walk runs only for schemas the fast check does not pass (most of a compile's time)."""
    slow = type(intake._metaschema_validator(jsonschema.Draft202012Validator))
    walked = []
    original = slow.iter_errors
    monkeypatch.setattr(slow, "iter_errors", lambda self, s: walked.append(s) or original(self, s))
    intake.check_schema({"type": "object", "properties": {"a": {"type": "string"}}}, GrammarOptions())
    assert walked == []
    with pytest.raises(SchemaError) as info:  # an invalid one is walked: its refusal names jsonschema's errors
        intake.check_schema({"type": "object", "properties": {"a": {"type": "strin"}}}, GrammarOptions())
    assert len(walked) == 1 and info.value.kind == "metaschema"
    assert [(i.pointer, i.keyword) for i in info.value.issues] == [("/properties/a/type", "type")]
