"""Validating an output against its schema after decoding, and telling declared gaps from bugs.

An error is *excused* when the keyword that failed is one the compile declared
post-check-only (``CompileInfo.post_check_keywords``): the grammar never promised
it. Any other error means the grammar let through something it should not have.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import jsonschema

from structspec.grammar import schema_walk
from structspec.grammar.base import SchemaIssue

_FORMATS = jsonschema.FormatChecker()


def validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """The validator of the draft named by ``$schema`` (default 2020-12), formats checked."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=_FORMATS)


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


def as_issue(error: jsonschema.ValidationError) -> SchemaIssue:
    """Where in the *instance* it failed, which keyword, why."""
    return SchemaIssue(schema_walk.join("", *error.absolute_path), str(error.validator), error.message[:300])
