"""Schema intake, before any compile: size budget, metaschema, references.

Backend-independent refusals, as plain data (``SchemaError`` with pointer + keyword):
too_deep (nesting past ``json_text``'s limits), too_large, metaschema (against the draft named by ``$schema``, default 2020-12),
external_ref (a ``$ref`` that leaves the document), unsupported (dynamic references),
invalid_schema (not an object, a local ``$ref`` that resolves to nothing).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any
from urllib.parse import unquote

import jsonschema
from jsonschema.protocols import Validator

from structspec.grammar import json_text, metaschema, schema_walk
from structspec.grammar.base import GrammarOptions, SchemaError, SchemaIssue
from structspec.grammar.keywords import REFUSED

MAX_ISSUES = 20  # a broken schema can have thousands; the first ones are enough to fix it
_MESSAGE_CHARS = 240


def check_schema(schema: Any, options: GrammarOptions, at: str = "") -> type[Validator]:
    """Refuse what no backend should compile; returns the draft's validator class.

    ``at`` prefixes every pointer (a tool's parameters live at ``/tools/2/function/parameters``).
    """
    if not isinstance(schema, dict):
        raise SchemaError([SchemaIssue(at, "", "a schema must be a JSON object")], kind="invalid_schema")
    try:  # first: everything below recurses (json.dumps, the metaschema check, the compile)
        json_text.check_schema_depth(schema)
    except json_text.TooDeep as exc:
        raise SchemaError([SchemaIssue(at + exc.pointer, "", f"schema {exc}")], kind="too_deep") from None
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError) as exc:
        raise SchemaError([SchemaIssue(at, "", f"not JSON: {exc}")], kind="invalid_schema") from exc
    if size > options.max_schema_bytes:
        raise SchemaError([SchemaIssue(at, "", f"{size} bytes, over the budget of {options.max_schema_bytes}")],
                          kind="too_large")
    cls = _draft(schema, at)
    valid = metaschema.surely_valid(cls, schema)  # most of a compile's time without it
    issues = [] if valid else [_metaschema_issue(e, at) for e in _metaschema_validator(cls).iter_errors(schema)]
    if issues:
        issues.sort(key=lambda i: i.pointer)
        raise SchemaError(issues[:MAX_ISSUES], kind="metaschema")
    _check_references(schema, at)
    _check_patterns(schema, at)
    return cls


def _check_patterns(schema: dict[str, Any], at: str) -> None:
    """Every regex must compile on RE2: the post-check runs them there, in linear time."""
    from structspec.grammar.postcheck import linear_regex

    issues = []
    for pointer, node in schema_walk.iter_schemas(schema):
        found = [("pattern", node["pattern"], schema_walk.join(at + pointer, "pattern"))] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            found += [("patternProperties", p, schema_walk.join(at + pointer, "patternProperties", p)) for p in node["patternProperties"]]
        for keyword, pattern, where in found:
            try:
                linear_regex(pattern)
            except Exception as exc:  # noqa: BLE001 - re2.error; its words go to the caller
                words = exc.args[0] if exc.args else exc
                words = words.decode("utf-8", "replace") if isinstance(words, bytes) else str(words)
                issues.append(SchemaIssue(where, keyword, f"regex {pattern[:100]!r} needs backtracking "
                                                          f"(back-references, look-arounds): {words[:120]}"))
    if issues:
        raise SchemaError(issues[:MAX_ISSUES], kind="unsupported")


def _draft(schema: dict[str, Any], at: str) -> type[Validator]:
    if "$schema" not in schema:
        return jsonschema.Draft202012Validator
    if not isinstance(schema["$schema"], str):
        raise SchemaError([SchemaIssue(schema_walk.join(at, "$schema"), "$schema", "must be a string (a metaschema URI)")],
                          kind="metaschema")
    cls = jsonschema.validators.validator_for(schema, default=None)
    if cls is None:
        raise SchemaError([SchemaIssue(schema_walk.join(at, "$schema"), "$schema",
                                       f"unknown metaschema {str(schema['$schema'])[:100]!r}")], kind="metaschema")
    return cls


@cache
def _metaschema_validator(cls: type[Validator]) -> Validator:
    # No format checker: "format": "regex" would judge ECMA-262 patterns with Python's re.
    return cls(cls.META_SCHEMA)


def _metaschema_issue(error: jsonschema.ValidationError, at: str) -> SchemaIssue:
    path = list(error.absolute_path)
    keywords = schema_walk.path_keywords(path)
    message = error.message if len(error.message) <= _MESSAGE_CHARS else error.message[:_MESSAGE_CHARS] + "..."
    return SchemaIssue(schema_walk.join(at, *path), keywords[-1] if keywords else "", message)


def _check_references(schema: dict[str, Any], at: str) -> None:
    own_ids = {str(schema[k]).rstrip("#") for k in ("$id", "id") if isinstance(schema.get(k), str)}
    anchors = _anchors(schema)
    refused: list[SchemaIssue] = []
    external: list[SchemaIssue] = []
    broken: list[SchemaIssue] = []
    for pointer, node in schema_walk.iter_schemas(schema):
        for keyword, why in REFUSED.items():
            if keyword in node:
                refused.append(SchemaIssue(schema_walk.join(at + pointer, keyword), keyword, why))
        ref = node.get("$ref")
        if not isinstance(ref, str):
            continue
        where = schema_walk.join(at + pointer, "$ref")
        base, _, fragment = ref.partition("#")
        if base and base not in own_ids:
            external.append(SchemaIssue(where, "$ref", f"external reference {ref[:200]!r} is not fetched"))
        elif fragment and not fragment.startswith("/"):
            if fragment not in anchors:
                broken.append(SchemaIssue(where, "$ref", f"no anchor {fragment!r} in the schema"))
        elif not _resolves(schema, pointer, unquote(fragment)):
            broken.append(SchemaIssue(where, "$ref", f"{ref[:200]!r} points to nothing in the schema"))
    for kind, issues in (("external_ref", external), ("unsupported", refused), ("invalid_schema", broken)):
        if issues:
            raise SchemaError(issues[:MAX_ISSUES], kind=kind)


def _anchors(schema: dict[str, Any]) -> set[str]:
    names = set()
    for _, node in schema_walk.iter_schemas(schema):
        if isinstance(node.get("$anchor"), str):
            names.add(node["$anchor"])
        for key in ("$id", "id"):  # draft 4-7 spell anchors as "#name" ids
            if isinstance(node.get(key), str) and node[key].startswith("#"):
                names.add(node[key][1:])
    return names


def _resolves(schema: dict[str, Any], ref_site: str, fragment: str) -> bool:
    """Against the root, or against the nearest enclosing subschema with its own ``$id`` (its own resource)."""
    bases = [""] + [ref_site[: i] for i in range(len(ref_site)) if ref_site[i] == "/" and i > 0] + [ref_site]
    for base in bases:
        node = schema_walk.resolve(schema, base) if base else schema
        if base and not (isinstance(node, dict) and any(isinstance(node.get(k), str) for k in ("$id", "id"))):
            continue
        try:
            schema_walk.resolve(node, fragment)
            return True
        except KeyError:
            continue
    return False
