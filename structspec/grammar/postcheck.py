"""Validating an output against its schema after decoding, and telling declared gaps from bugs.

An error is *excused* when the keyword that failed is one the compile declared
post-check-only (``CompileInfo.post_check_keywords``): the grammar never promised
it. Any other error means the grammar let through something it should not have.

Regular expressions from schemas (``pattern``, ``patternProperties`` and the
``additionalProperties`` that depends on them) run on RE2, in time linear in the
text: jsonschema's own ``re.search`` backtracks, and ``^(a+)+$`` against 40
characters would pin a core for minutes. Intake refuses a pattern RE2 cannot
compile (``intake``), so every pattern that reaches a check has a linear matcher. Their class
escapes mean ECMA-262's sets (``ecma_regex``), as they do in the grammars.

Two keywords are checked here with their own code, where jsonschema's could not be told from a
grammar bug: ``multipleOf`` in exact decimal arithmetic (the grammars' and JSON Schema's meaning;
jsonschema divides floats, and 0.07 is then no multiple of 0.01), and ``if`` with the branch that
applied (``then``/``else``) on the error's schema path (jsonschema's error from a ``false``
branch has no path at all, so a declared post-check-only ``then`` could not excuse it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from decimal import Decimal
from fractions import Fraction
from functools import cache, lru_cache
from typing import Any, cast

import jsonschema
import re2

from structspec.grammar import ecma_regex, schema_walk


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the caller's error, reported to them, not logged


@lru_cache(maxsize=1024)
def linear_regex(pattern: str) -> re2._Regexp:
    """The RE2 form of a schema's pattern. Raises: ``re2.error`` when RE2 cannot compile it
    (back-references, look-arounds): intake refuses those schemas."""
    return re2.compile(ecma_regex.spell_out(pattern), _RE2_OPTIONS)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "string") and not linear_regex(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = linear_regex(pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    regexes = [linear_regex(p) for p in schema.get("patternProperties", {})]
    extras = [k for k in instance if k not in properties and not any(r.search(k) for r in regexes)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        yield jsonschema.ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)")


def _multiple_of(validator: Any, multiple: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "number") and not _is_multiple(instance, multiple):
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {multiple}")


def _is_multiple(instance: float, multiple: float) -> bool:
    """Exactly, on the decimals the numbers were written as (a float's shortest repr is its JSON text)."""
    if isinstance(instance, float) and not math.isfinite(instance):
        return False
    quotient = _exact(instance) / _exact(multiple)
    return quotient.denominator == 1


def _exact(number: float) -> Fraction:
    return Fraction(number) if isinstance(number, int) else Fraction(Decimal(repr(number)))


def _if(validator: Any, if_schema: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    branch = "then" if validator.evolve(schema=if_schema).is_valid(instance) else "else"
    if branch not in schema:
        return
    if schema[branch] is False:  # jsonschema's descend() returns this error with no schema path
        yield jsonschema.ValidationError(f"{instance!r} is not allowed: {branch!r} is false here", schema_path=[branch])
    else:
        yield from validator.descend(instance, schema[branch], schema_path=branch)


_OWN = {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties,
        "multipleOf": _multiple_of, "if": _if}


@cache
def _post_check_class(cls: type[jsonschema.protocols.Validator]) -> type[jsonschema.protocols.Validator]:
    # only the keywords the draft has ("if" is draft 7 on): a draft 4 schema's "if" is an unknown keyword
    extended = jsonschema.validators.extend(cls, {k: v for k, v in _OWN.items() if k in cls.VALIDATORS})
    return cast("type[jsonschema.protocols.Validator]", extended)  # extend() is untyped in the stubs


def validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """The validator of the draft named by ``$schema`` (default 2020-12): formats checked as that draft defines
    them (the checkers jsonschema has here), patterns on RE2,
    ``multipleOf`` exact, ``if`` errors with their branch."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    # the draft's own checker: jsonschema's default FormatChecker() holds every draft's checkers under one
    # name each, and checks "time" as draft 3's %H:%M:%S, which refuses RFC 3339's offset
    return _post_check_class(cls)(schema, format_checker=cls.FORMAT_CHECKER)


def instance_errors(instance: Any, schema: dict[str, Any]) -> list[jsonschema.ValidationError]:
    return sorted(validator(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])


def error_keywords(error: jsonschema.ValidationError) -> list[str]:
    """Schema keywords on the way to a failure, e.g. ``["properties", "if", "then", "required"]``."""
    return schema_walk.path_keywords(error.absolute_schema_path)


def is_post_check_error(error: jsonschema.ValidationError, post_check_keywords: Iterable[str]) -> bool:
    """The failure is explained by a post-check-only keyword (on its path, or in every failing
    branch of an ``anyOf``/``oneOf``: the grammar accepted one branch with that keyword ignored)."""
    post = set(post_check_keywords)
    if not post:
        return False
    if post.intersection(error_keywords(error)):
        return True
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict[Any, list[jsonschema.ValidationError]] = defaultdict(list)
        for sub in error.context:
            branches[sub.relative_schema_path[0]].append(sub)
        return any(all(is_post_check_error(e, post) for e in errs) for errs in branches.values())
    return False
