"""Keywords a grammar does not enforce, and the policy that either post-checks or refuses them.

Ignoring an assertion keyword only widens what the grammar accepts, so every output
can still be validated by ``jsonschema`` after decoding: such a keyword is either
listed (``CompileInfo.warnings`` + ``post_check_keywords``) or, with
``GrammarOptions(allow_post_check=False)``, refused. Nothing is dropped silently: an
unknown ``format`` that no validator here can check is listed as annotation-only.
``tests/grammar/test_keywords.py`` probes each assertion keyword and ``false`` subschemas for this.

A grammar generates one spelling of what a schema allows, where JSON Schema accepts several:
object keys in the schema's order, and a ``const`` or ``enum`` number as one literal, ``1`` for
``1`` (never ``1.0`` or ``1e0``, which JSON Schema counts equal); for ``1.0`` llguidance writes
``1`` and outlines-core ``1.0``. That only narrows what is generated: the post-check accepts
every equal spelling.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import jsonschema

from structspec.grammar.base import GrammarOptions, SchemaError, SchemaIssue

# No assertion semantics: nothing to enforce.
ANNOTATIONS = frozenset({
    "$schema", "$id", "id", "$anchor", "$comment", "$vocabulary", "$defs", "definitions", "title",
    "description", "default", "examples", "readOnly", "writeOnly", "deprecated", "contentEncoding",
    "contentMediaType", "contentSchema", "$dynamicAnchor", "$recursiveAnchor",
})

# Keywords with assertion semantics (anything else in a schema object is an annotation or unknown,
# and unknown keywords have no meaning in JSON Schema).
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "properties",
    "patternProperties", "additionalProperties", "items", "prefixItems", "additionalItems", "contains",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if",
    "then", "else", "dependentSchemas", "dependencies", "$ref",
})

# Dropping these would drop whole subschemas (what the reference points to): resolved statically by
# intake where every evaluation path gives one target, refused otherwise (by every backend).
REFUSED = {
    "$dynamicRef": "a dynamic reference whose target depends on the evaluation path (another schema resource "
                   "declares its $dynamicAnchor) is not supported",
    "$recursiveRef": "a recursive reference whose target depends on the evaluation path is not supported",
}

# Formats the post-check validator can verify: 2020-12's checkers available here (the post-check
# uses each draft's own; the default draft's set names what is checked).
CHECKABLE_FORMATS = frozenset(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)


@dataclass(frozen=True)
class Unenforced:
    """A keyword use the grammar leaves out (or only ``approximates``, e.g. a date format without
    leap years); ``checkable`` if ``jsonschema`` here can verify it after decoding."""

    issue: SchemaIssue
    checkable: bool = True
    approximate: bool = False


def keyword(pointer: str, name: str, engine: str, why: str = "") -> Unenforced:
    reason = f" ({why})" if why else ""
    return Unenforced(SchemaIssue(pointer, name, f"not enforced by {engine} while decoding{reason}; checked after decoding"))


def unknown_format(pointer: str, fmt: str, engine: str) -> Unenforced:
    if fmt in CHECKABLE_FORMATS:
        return Unenforced(SchemaIssue(pointer, "format", f"format {fmt!r} is not enforced by {engine}; checked after decoding"))
    return Unenforced(
        SchemaIssue(pointer, "format", f"format {fmt!r} is unknown to {engine} and to the validator: an annotation only"),
        checkable=False,
    )


def approximate_format(pointer: str, fmt: str, engine: str, why: str) -> Unenforced:
    checked = "checked after decoding" if fmt in CHECKABLE_FORMATS else "no validator here checks the rest"
    return Unenforced(SchemaIssue(pointer, "format", f"format {fmt!r} is approximated by {engine} ({why}); {checked}"),
                      checkable=fmt in CHECKABLE_FORMATS, approximate=True)


def settle(unenforced: Iterable[Unenforced], options: GrammarOptions) -> tuple[tuple[SchemaIssue, ...], tuple[str, ...]]:
    """(warnings, post_check_keywords); with ``allow_post_check=False`` a keyword the grammar
    ignores is SchemaError(kind="unsupported") (approximations stay: they are enforced, but loosely)."""
    items = list(dict.fromkeys(unenforced))  # dedupe, keep order
    ignored = [u.issue for u in items if not u.approximate]
    if ignored and not options.allow_post_check:
        raise SchemaError(ignored, kind="unsupported")
    return tuple(u.issue for u in items), tuple(sorted({u.issue.keyword for u in items if u.checkable}))
