"""Every completed output is parsed and validated before it is returned.

A failure on a keyword the grammar layer declared post-check-only is a
``schema_violation`` (the schema asked for something the engine cannot enforce
while decoding); any other failure means the constrained decoder let through
something it should not have: a bug, logged and counted, never a success.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Iterable

from structspec.engine.types import Outcome
from structspec.grammar import json_text
from structspec.grammar.postcheck import instance_errors, is_post_check_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckResult:
    outcome: Outcome
    value: Any = None
    error: str | None = None


def check_instance(value: Any, schema: dict[str, Any], post_check_keywords: Iterable[str]) -> CheckResult:
    errors = instance_errors(value, schema)
    if not errors:
        return CheckResult(Outcome.VALID, value)
    post = tuple(post_check_keywords)
    first = errors[0]
    where = "/" + "/".join(str(p) for p in first.absolute_path)
    message = f"{where}: {first.validator}: {first.message[:300]}"
    if all(is_post_check_error(e, post) for e in errors):
        return CheckResult(Outcome.SCHEMA_VIOLATION, value, message)
    return CheckResult(Outcome.INTERNAL_ERROR, value, f"output failed validation despite the grammar: {message}")


def too_deep(text: str) -> CheckResult | None:
    """NOT_CHECKED for an output nesting past ``json_text.MAX_JSON_DEPTH`` (only a recursive schema
    allows one): parsing and validating it would recurse past Python's limit. The grammar still
    enforced its structure; the text is returned as it is, marked unchecked."""
    pointer = json_text.text_too_deep(text)
    if pointer is None:
        return None
    return CheckResult(Outcome.NOT_CHECKED, None, f"output {json_text.TooDeep(pointer, json_text.MAX_JSON_DEPTH)}: "
                                                  "too deep to validate after decoding")


def check_json_text(text: str, schema: dict[str, Any], post_check_keywords: Iterable[str] = ()) -> CheckResult:
    deep = too_deep(text)
    if deep is not None:
        return deep
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return CheckResult(Outcome.INTERNAL_ERROR, None, f"output is not JSON despite the grammar: {exc}")
    except ValueError as exc:  # an integer literal past Python's digit limit: valid JSON we cannot read
        return CheckResult(Outcome.NOT_CHECKED, None, f"output too large to validate after decoding: {str(exc)[:120]}")
    return check_instance(value, schema, post_check_keywords)
