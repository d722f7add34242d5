"""A worked example made from a schema alone, for the schemas and tool lists that bring none.

A base LM (Gemma 3 270M) shown only an instruction writes prose or repeats keys until
``max_tokens``; one worked example of the same shape first and it writes the object and
stops. The built-in schemas ship real examples (``default_examples``); a caller's own schema
or tool list gets one made here, shown as ``Key: value`` lines in the input and as JSON in
the output.

A *named value* is one the schema itself gives: ``const``, an ``enum`` member, an
``examples`` entry or the ``default`` (and a boolean or null). A *free value* is any other
string or number: whatever an example showed for it (``sample city``, ``7``) is a value the
model copies into real calls instead of reading the request (measured: Gemma 3 270M copied
placeholders into most forced calls). So an example holds named values only; a schema with
a free value anywhere in it gets no example (a partial one, its free properties left out,
teaches the model to leave them out too).

Contract: ``example_instance`` and the ``synthesize_*`` functions never raise; where they
cannot build an instance that the schema accepts (a free value, an unresolvable ``$ref``,
``not``), they return None / skip that tool, and the request goes out without an example.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from structspec.grammar.postcheck import validator
from structspec.prompts import FewShotExample, compact_json

MAX_DEPTH = 6
MAX_LEAVES = 40  # a worked example costs prompt tokens on every request that carries it


class _Unbuildable(Exception):
    pass


def _human(key: str) -> str:
    """``job_title`` / ``jobTitle`` -> ``job title``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).replace("_", " ").replace("-", " ")
    return " ".join(spaced.split()).lower() or "value"


class _Builder:
    def __init__(self, root: dict[str, Any], variant: int = 0):
        self.root = root
        self.variant = variant % 2
        self.leaves = 0
        self.dropped = 0  # optional properties (and empty lists) left out for a free value

    def resolve(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#"):
            raise _Unbuildable(ref)
        node: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise _Unbuildable(ref)
            node = node[part]
        if not isinstance(node, dict):
            raise _Unbuildable(ref)
        return node

    def value(self, schema: Any, key: str, depth: int) -> Any:
        if depth > MAX_DEPTH or self.leaves > MAX_LEAVES:
            raise _Unbuildable("too deep or too large")
        if schema is True or schema == {}:
            raise _Unbuildable("a free value")
        if not isinstance(schema, dict) or "not" in schema:
            raise _Unbuildable("not")
        if "$ref" in schema:
            return self.value({**self.resolve(schema["$ref"]), **{k: v for k, v in schema.items() if k != "$ref"}},
                              key, depth + 1)
        if "const" in schema:
            self.leaves += 1
            return schema["const"]
        for named in ("enum", "examples"):  # the schema's own values, the variant's member
            if isinstance(schema.get(named), list) and schema[named]:
                self.leaves += 1
                return schema[named][self.variant % len(schema[named])]
        if "default" in schema:
            self.leaves += 1
            return schema["default"]
        for combinator in ("anyOf", "oneOf"):
            if isinstance(schema.get(combinator), list):
                rest = {k: v for k, v in schema.items() if k != combinator}
                for branch in schema[combinator]:
                    try:
                        return self.value({**rest, **branch} if isinstance(branch, dict) else branch, key, depth + 1)
                    except _Unbuildable:
                        continue
                raise _Unbuildable(combinator)
        if isinstance(schema.get("allOf"), list):
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                part = self.resolve(part["$ref"]) if isinstance(part, dict) and "$ref" in part else part
                if isinstance(part, dict):
                    merged.setdefault("properties", {}).update(part.get("properties", {}))
                    merged["required"] = list(merged.get("required", [])) + list(part.get("required", []))
                    merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
            return self.value(merged, key, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
        if kind == "object":
            props = schema.get("properties") or {}
            out = {}
            for name, sub in props.items():
                try:
                    out[name] = self.value(sub, name, depth + 1)
                except _Unbuildable:
                    if name in (schema.get("required") or []):
                        raise
                    self.dropped += 1
            if any(r not in out for r in schema.get("required") or []):
                raise _Unbuildable("required property without a definition")
            return out
        if kind == "array":
            items = schema.get("items", {})
            if isinstance(schema.get("prefixItems"), list):
                return [self.value(s, key, depth + 1) for s in schema["prefixItems"]]
            count = max(1 + self.variant, int(schema.get("minItems", 1)))
            if "maxItems" in schema:
                count = min(count, int(schema["maxItems"]))
            if count > 3:
                raise _Unbuildable("minItems")
            try:
                return [self.value(items, key, depth + 1) for _ in range(count)]
            except _Unbuildable:
                if int(schema.get("minItems", 0)) > 0:
                    raise
                self.dropped += 1
                return []
        self.leaves += 1
        if kind == "boolean":
            return self.variant == 0
        if kind == "null":
            return None
        raise _Unbuildable("a free value")  # a string or number the schema names no value for


def example_instance(schema: Any, variant: int = 0, complete: bool = False) -> Any | None:
    """An instance of ``schema`` of named values only that the schema accepts, or None (never raises).

    ``variant`` 0 or 1: the enum / examples member each shows (they differ where the schema names two).
    ``complete``: None rather than an instance with optional properties left out."""
    try:
        with warnings.catch_warnings():  # a caller's odd regex ("possible nested set") is no server warning
            warnings.simplefilter("ignore")
            builder = _Builder(schema if isinstance(schema, dict) else {}, variant)
            value = builder.value(schema, "value", 0)
            if complete and builder.dropped:
                return None
            return value if validator(schema).is_valid(value) else None
    except Exception:  # noqa: BLE001 - a schema we cannot fill gets no example, never an error
        return None


def _lines(value: Any, prefix: str = "") -> list[str]:
    """``Key: value`` lines for the leaves of an instance (nested keys joined, list items numbered)."""
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in _lines(v, f"{prefix}{_human(k)} ".lstrip())]
    if isinstance(value, list):
        return [line for i, v in enumerate(value, 1) for line in _lines(v, f"{prefix}{i} " if len(value) > 1 else prefix)]
    shown = "yes" if value is True else "no" if value is False else "none" if value is None else str(value)
    label = prefix.strip() or "value"
    return [f"{label[0].upper()}{label[1:]}: {shown}"]


def synthesize_extraction_example(schema: Any, variant: int = 0) -> FewShotExample | None:
    """Input: the instance as ``Key: value`` lines; output: the instance as compact JSON (None: a free value)."""
    value = example_instance(schema, variant, complete=True)
    if value is None:
        return None
    return FewShotExample("\n".join(_lines(value)), compact_json(value))


def synthesize_extraction_examples(schema: Any, n: int = 2) -> tuple[FewShotExample, ...]:
    """``n`` (1 or 2) examples of different variants; the ones that could be built."""
    return tuple(ex for ex in (synthesize_extraction_example(schema, v) for v in range(n)) if ex is not None)


def synthesize_tool_examples(tools: list[dict[str, Any]] | tuple[dict[str, Any], ...],
                             n: int = 1) -> tuple[FewShotExample, ...]:
    """``n`` (1 or 2) worked calls per tool whose arguments are all named values (a tool with a free one gets
    none), round by round (every tool once, then again with the other variant): a request that names the
    tool's purpose and its arguments, then the call."""
    out = []
    for variant in range(n):
        out += _tool_round(tools, variant)
    return tuple(out)


def _tool_round(tools: list[dict[str, Any]] | tuple[dict[str, Any], ...], variant: int) -> list[FewShotExample]:
    out = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        name, params = fn.get("name"), fn.get("parameters") or {"type": "object", "properties": {}}
        args = example_instance(params, variant, complete=True)
        if not isinstance(name, str) or not isinstance(args, dict):
            continue
        purpose = (fn.get("description") or f"Use {name}").strip().rstrip(".")
        detail = "; ".join(_lines(args))
        out.append(FewShotExample(f"{purpose}. {detail}." if detail else f"{purpose}.",
                                  compact_json({"name": name, "arguments": args})))
    return out
