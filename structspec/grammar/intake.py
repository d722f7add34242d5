"""Schema intake, before any compile: size budget, metaschema, references; the schema the backends compile.

Backend-independent refusals, as plain data (``SchemaError`` with pointer + keyword):
too_deep (nesting past ``json_text``'s limits), too_large, metaschema (against the draft named by ``$schema``, default 2020-12),
external_ref (a ``$ref`` that leaves the document), unsupported (a dynamic reference whose target
depends on the evaluation path, integers past 2^53 in numeric keywords, const or enum), invalid_schema (neither an object nor ``true``, the schema
``false``, a local ``$ref`` that resolves to nothing).

``for_backends`` spells a schema the way every backend reads it, with the same meaning in JSON
Schema: ``true`` as ``{}`` (any JSON value), an integer-valued count such as ``"maxLength": 2.0``
as ``2`` (JSON Schema counts 2.0 as an integer; the engines want an integer literal), a
pattern's class escapes as ECMA-262's explicit classes (``ecma_regex``), and a ``$dynamicRef`` or
``$recursiveRef`` whose target is the same on every evaluation path as a ``$ref`` to that target
(``static_references``). The post-check validates against the caller's own schema.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from functools import cache
from typing import Any, Iterator, TypeGuard
from urllib.parse import quote, unquote

import jsonschema
from jsonschema.protocols import Validator

from structspec.grammar import ecma_regex, json_text, metaschema, schema_walk
from structspec.grammar.base import GrammarOptions, SchemaError, SchemaIssue
from structspec.grammar.keywords import REFUSED
from structspec.grammar.postcheck import linear_regex

MAX_ISSUES = 20  # a broken schema can have thousands; the first ones are enough to fix it
_MESSAGE_CHARS = 240


def check_schema(schema: Any, options: GrammarOptions, at: str = "") -> str:
    """Refuse what no backend should compile; returns the schema's compact JSON text (``for_backends`` takes it).

    ``at`` prefixes every pointer (a tool's parameters live at ``/tools/2/function/parameters``).
    """
    if schema is True:  # any JSON value
        return "true"
    if schema is False:
        raise SchemaError([SchemaIssue(at, "", "the schema false allows no value: nothing could be generated")],
                          kind="invalid_schema")
    if not isinstance(schema, dict):
        raise SchemaError([SchemaIssue(at, "", "a schema must be a JSON object or true")], kind="invalid_schema")
    try:  # first: everything below recurses (json.dumps, the metaschema check, the compile)
        json_text.check_schema_depth(schema)
    except json_text.TooDeep as exc:
        raise SchemaError([SchemaIssue(at + exc.pointer, "", f"schema {exc}")], kind="too_deep") from None
    try:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        size = len(text.encode())
    except (TypeError, ValueError) as exc:
        raise SchemaError([SchemaIssue(at, "", f"not JSON: {exc}")], kind="invalid_schema") from exc
    if size > options.max_schema_bytes:
        raise SchemaError([SchemaIssue(at, "", f"{size} bytes, over the budget of {options.max_schema_bytes}")],
                          kind="too_large")
    cls = _draft(schema, at)
    issues = [_metaschema_issue(e, at) for e in metaschema_errors(cls, schema)]
    if issues:
        issues.sort(key=lambda i: i.pointer)
        raise SchemaError(issues[:MAX_ISSUES], kind="metaschema")
    _check_references(schema, at)
    _check_patterns(schema, at)
    if _BIG_NUMBER.search(text):  # the walk below only when the text has a number it could be about
        _check_numbers(schema, at)
    return text


# Keywords whose value is a count: JSON Schema's non-negative integer, which 2.0 is.
COUNT_KEYWORDS = frozenset({"maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties",
                            "maxContains", "minContains"})
# Bounds, and the side a bound that no 64-bit float holds is rounded to (inward: only narrows).
BOUND_KEYWORDS = {"minimum": math.inf, "exclusiveMinimum": math.inf, "maximum": -math.inf, "exclusiveMaximum": -math.inf}


# What ``for_backends`` and ``_check_numbers`` look for, in the schema's compact JSON text: a number
# past 2^53 (16+ digits, or a float in exponent form), an integer-valued float count, a class escape.
# A search over the text (microseconds) spares the walks (a Python loop over every subschema) for the
# schemas that have none, nearly all of them.
_BIG_NUMBER = re.compile(r"\d{16}|\de\+")
_REWRITES = re.compile(r"\d{16}|\de\+|\"(?:max|min)(?:Length|Items|Properties|Contains)\":-?\d+\.|\\\\[dwsDWS]"
                       r"|\"\$(?:dynamic|recursive)Ref\":")


def for_backends(schema: Any, text: str | None = None) -> Any:
    """The schema as backends compile it (see the module docstring); ``schema`` itself when nothing changes.
    ``text``: its compact JSON text, where the caller has it (``check_schema`` returns it)."""
    if schema is True:
        return {}
    if text is None:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if not _REWRITES.search(text):
        return schema
    changes: list[tuple[str, str | None, Any]] = []  # (pointer, keyword, new value) or (pointer, None, None)
    for pointer, node in schema_walk.iter_schemas(schema):
        for keyword in COUNT_KEYWORDS.intersection(node):
            value = node[keyword]
            if isinstance(value, float) and value.is_integer():
                changes.append((pointer, keyword, int(value)))
        for keyword, toward in BOUND_KEYWORDS.items():
            value = node.get(keyword)
            if _is_integer(value) and _inward(value, 0.0) != value and (inward := _inward(value, toward)) is not None:
                changes.append((pointer, keyword, float(inward)))
        if isinstance(node.get("pattern"), str) and ecma_regex.spell_out(node["pattern"]) != node["pattern"]:
            changes.append((pointer, "pattern", ecma_regex.spell_out(node["pattern"])))
    # llguidance takes no integer past 64 bits, anywhere (a default, an example): those go as floats
    changes += [(pointer, None, None) for pointer, value in _past_64_bits(schema) if _fits_float(value)]
    references, _ = static_references(schema)
    if not changes and not references:
        return schema
    out = copy.deepcopy(schema)
    for pointer, keyword, target in references:
        node = schema_walk.resolve(out, pointer)
        del node[keyword]
        if "$ref" in node:  # beside a $ref of its own: both apply
            node["allOf"] = [*node.get("allOf", []), {"$ref": target}]
        else:
            node["$ref"] = target
    for pointer, changed, value in changes:
        if changed is not None:
            schema_walk.resolve(out, pointer)[changed] = value
            continue
        parent, _, last = pointer.rpartition("/")
        container = schema_walk.resolve(out, parent)
        key = int(last) if isinstance(container, list) else schema_walk.unescape(last)
        if _is_integer(container[key]):  # (a bound rounded above is a float already)
            container[key] = float(container[key])
    return out


def _check_numbers(schema: dict[str, Any], at: str) -> None:
    """Numbers the grammar engines would not write or compare as they are: they read them as 64-bit floats.

    llguidance rounds 9007199254740993 to ...992, and writes a const or enum number past 2^53
    from its float (2^63 as 9223372036854776000): such const and enum values are refused, and an
    integer multipleOf no float holds. A bound no float holds is rounded inward for the backends
    (``for_backends``: a maximum of 2^62-1 holds as 2^62-512, which only narrows), refused only
    when no finite float lies inside it; an integer past the float range anywhere else is refused.
    Numbers at or below -2^63 are refused as bounds and const or enum values: llguidance 1.9 cannot
    build an integer range there, and one that starts and ends there (``{"const": -2**63}``)
    crashes the process.
    """
    issues = []
    for pointer, node in schema_walk.iter_schemas(schema):
        for keyword in ("const", "enum"):
            wrong = [v for v in _numbers(node.get(keyword)) if abs(v) > 2**53 and not _written_as_is(v)]
            if keyword in node and wrong:
                issues.append(SchemaIssue(schema_walk.join(at + pointer, keyword), keyword,
                                          f"{str(wrong[0])[:40]} is past 2^53: the grammar engine would write it "
                                          "rounded to a 64-bit float"))
        for keyword in COUNT_KEYWORDS.intersection(node):
            if isinstance(node[keyword], (int, float)) and node[keyword] >= 2**64:
                issues.append(SchemaIssue(schema_walk.join(at + pointer, keyword), keyword,
                                          f"{str(node[keyword])[:40]} is past 2^64, the largest count the grammar "
                                          "engines take"))
        value = node.get("multipleOf")
        if _is_integer(value) and _inward(value, 0.0) != value:
            issues.append(SchemaIssue(schema_walk.join(at + pointer, "multipleOf"), "multipleOf",
                                      f"integer {str(value)[:40]} has no exact 64-bit float: the grammar engine "
                                      "would divide by it rounded"))
        for keyword, toward in BOUND_KEYWORDS.items():
            value = node.get(keyword)
            if _is_integer(value) and _inward(value, toward) is None:
                issues.append(SchemaIssue(schema_walk.join(at + pointer, keyword), keyword,
                                          f"integer {str(value)[:40]} is past the 64-bit float range: no number the "
                                          "grammar engine can compare lies inside it"))
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and value <= -(2**63):
                issues.append(SchemaIssue(schema_walk.join(at + pointer, keyword), keyword,
                                          f"{str(value)[:40]} is at or below -2^63, where the grammar engine "
                                          "cannot build integer ranges (one ending there crashes it)"))
    if not issues:
        issues = [SchemaIssue(at + pointer, "", f"integer {str(value)[:40]}... is past the 64-bit float range")
                  for pointer, value in _past_64_bits(schema) if not _fits_float(value)]
    if issues:
        raise SchemaError(issues[:MAX_ISSUES], kind="unsupported")


def _is_integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits_float(number: int) -> bool:
    return abs(number) <= sys.float_info.max


def _numbers(value: Any) -> list[int | float]:
    found, stack = [], [value]
    while stack:  # const and enum values nest (bounded by json_text's depth check)
        item = stack.pop()
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _written_as_is(number: float) -> bool:
    """A const number past 2^53 that llguidance writes exactly: a 64-bit integer a float holds."""
    return _is_integer(number) and -(2**63) < number < 2**63 and _inward(number, 0.0) == number


def _past_64_bits(document: Any) -> list[tuple[str, int]]:
    """(pointer, integer) for every integer outside both int64 and uint64, anywhere in ``document``."""
    found, stack = [], [("", document)]
    while stack:
        pointer, item = stack.pop()
        if _is_integer(item) and not -(2**63) <= item < 2**64:
            found.append((pointer, item))
        elif isinstance(item, dict):
            stack.extend((schema_walk.join(pointer, k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((schema_walk.join(pointer, i), v) for i, v in enumerate(item))
    return found


def _inward(number: int, toward: float) -> int | None:
    """The value of the 64-bit float nearest ``number`` (``toward`` 0: either side; inf or -inf: not
    below / not above it), None when no finite float is there."""
    limit = sys.float_info.max
    if abs(number) > limit:
        nearest = limit if number > 0 else -limit
        return int(nearest) if toward == 0 or (nearest < number) == (toward < 0) else None
    nearest = float(number)
    if (toward > 0 and nearest < number) or (toward < 0 and nearest > number):
        nearest = math.nextafter(nearest, toward)
    return int(nearest)


def _check_patterns(schema: dict[str, Any], at: str) -> None:
    """Every regex must compile on RE2: the post-check runs them there, in linear time."""
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
                if "\\p{" in words or "\\P{" in words:
                    why = "uses a Unicode property RE2 has no name for (binary properties, script codes)"
                else:
                    why = "needs backtracking (back-references, look-arounds)"
                issues.append(SchemaIssue(where, keyword, f"regex {pattern[:100]!r} {why}: {words[:120]}"))
    if issues:
        raise SchemaError(issues[:MAX_ISSUES], kind="unsupported")


def _draft(schema: dict[str, Any], at: str) -> type[Validator]:
    if "$schema" not in schema:
        return jsonschema.Draft202012Validator
    if not isinstance(schema["$schema"], str):
        raise SchemaError([SchemaIssue(schema_walk.join(at, "$schema"), "$schema", "must be a string (a metaschema URI)")],
                          kind="metaschema")
    # ignore: for an unknown $schema it returns the default given, None here (the stubs allow only a class)
    cls = jsonschema.validators.validator_for(schema, default=None)  # type: ignore[arg-type]
    if cls is None:
        raise SchemaError([SchemaIssue(schema_walk.join(at, "$schema"), "$schema",
                                       f"unknown metaschema {str(schema['$schema'])[:100]!r}")], kind="metaschema")
    return cls


def metaschema_errors(cls: type[Validator], schema: Any) -> Iterator[jsonschema.ValidationError]:
    """Where ``schema`` breaks ``cls``'s metaschema (the one check of both the compile and the registry,
    each naming the errors its own way): none at once when the fast check finds it valid (most of a
    compile's time without it)."""
    if metaschema.surely_valid(cls, schema):
        return iter(())
    return _metaschema_validator(cls).iter_errors(schema)


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
    _, refused = static_references(schema, at)
    external: list[SchemaIssue] = []
    broken: list[SchemaIssue] = []
    for pointer, node in schema_walk.iter_schemas(schema):
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


def static_references(schema: Any, at: str = "") -> tuple[list[tuple[str, str, str]], list[SchemaIssue]]:
    """``$dynamicRef`` and ``$recursiveRef`` uses with one target on every evaluation path: (pointer of the
    schema using it, keyword, the ``$ref`` to write instead); and an issue for each of the others.

    A ``$dynamicRef`` to ``#name`` first resolves in its own schema resource (the subschema under the
    nearest ``$id``); when that finds a ``$dynamicAnchor``, the outermost resource on the evaluation
    path that declares the same ``$dynamicAnchor`` wins. Evaluation starts at the root, so the target
    is static when the root's resource declares it, or when no other resource does. A ``$recursiveRef``
    is static from the root's resource, or from a resource whose root has no ``$recursiveAnchor``.
    A ``$dynamicRef`` to a JSON pointer is a plain ``$ref``.
    """
    if not isinstance(schema, dict):
        return [], []
    nodes = list(schema_walk.iter_schemas(schema))
    if not any(k in node for _, node in nodes for k in REFUSED):
        return [], []
    roots = [""] + [p for p, node in nodes if p and isinstance(node.get("$id"), str) and not node["$id"].startswith("#")]

    def resource(pointer: str) -> str:
        return max((r for r in roots if pointer == r or pointer.startswith(r + "/")), key=len)

    dynamic: dict[tuple[str, str], str] = {}
    plain: dict[tuple[str, str], str] = {}
    for pointer, node in nodes:
        if isinstance(node.get("$dynamicAnchor"), str):
            dynamic.setdefault((resource(pointer), node["$dynamicAnchor"]), pointer)
        if isinstance(node.get("$anchor"), str):
            plain.setdefault((resource(pointer), node["$anchor"]), pointer)
    resolved: list[tuple[str, str, str]] = []
    issues: list[SchemaIssue] = []
    for pointer, node in nodes:
        for keyword in REFUSED.keys() & node.keys():
            target = _static_target(schema, keyword, node[keyword], resource(pointer), dynamic, plain)
            if target is None:
                issues.append(SchemaIssue(schema_walk.join(at + pointer, keyword), keyword, REFUSED[keyword]))
            else:
                resolved.append((pointer, keyword, target))
    return resolved, issues


def _static_target(schema: dict[str, Any], keyword: str, ref: Any, own: str,
                   dynamic: dict[tuple[str, str], str], plain: dict[tuple[str, str], str]) -> str | None:
    """The ``$ref`` one dynamic reference always means (see ``static_references``), or None."""
    if not isinstance(ref, str):
        return None
    base, _, fragment = ref.partition("#")
    node = schema_walk.resolve(schema, own) if own else schema
    if base and base != node.get("$id"):
        return None  # another resource by URI: not followed
    if keyword == "$recursiveRef":
        if fragment or (own and node.get("$recursiveAnchor") is True):
            return None
        return _pointer_ref(schema, own, own)
    if not fragment or fragment.startswith("/"):
        try:
            schema_walk.resolve(node, unquote(fragment))
        except KeyError:
            return None
        return _pointer_ref(schema, own + unquote(fragment), own)
    if (own, fragment) in plain and (own, fragment) not in dynamic:
        return _pointer_ref(schema, plain[(own, fragment)], own)
    if (own, fragment) not in dynamic:
        return None
    if ("", fragment) in dynamic:
        return _pointer_ref(schema, dynamic[("", fragment)], own)
    holders = {r for r, name in dynamic if name == fragment}
    return _pointer_ref(schema, dynamic[(own, fragment)], own) if holders == {own} else None


def _pointer_ref(schema: dict[str, Any], target: str, own: str) -> str | None:
    """A ``$ref`` to the schema at ``target``, written in resource ``own`` (a ``$ref`` there is relative to
    its ``$id``): a fragment within ``own``, else the root's absolute ``$id`` with the fragment; None
    when the root has none to name it by."""
    safe = "/~$!&'()*+,;=:@-._"
    if target == own or target.startswith(own + "/"):
        return "#" + quote(target[len(own):], safe=safe)
    root_id = schema.get("$id")
    if isinstance(root_id, str) and ":" in root_id:
        return root_id.partition("#")[0] + "#" + quote(target, safe=safe)
    return None
