"""A worked example made from a schema alone, for the schemas and tool lists that bring none.

A base LM (Gemma 3 270M) shown only an instruction writes prose or repeats keys until
``max_tokens``; one worked example of the same shape first and it writes the object and
stops. The built-in schemas ship real examples (``default_examples``); a caller's own schema
or tool list gets this one: every property filled with a placeholder that says what it
holds (``sample job title``, ``sample@example.com``), shown as ``Key: value`` lines in the
input and as JSON in the output. The placeholders are plainly not data, so a model that
copies them instead of the input's values is visible in the output (and in the benchmark's
copy rate).

Contract: ``example_instance`` and the ``synthesize_*`` functions never raise; where they
cannot build an instance that the schema accepts (a pattern no placeholder matches, an
unresolvable ``$ref``, ``not``), they return None / skip that tool, and the request goes out
without an example.
"""

from __future__ import annotations

import re
import re._parser as parser  # the standard library's own regex parser (``_shortest_match``)
import warnings
from typing import Any

from structspec.grammar.postcheck import linear_regex, validator
from structspec.prompts import FewShotExample, compact_json

MAX_DEPTH = 6
MAX_LEAVES = 40  # a worked example costs prompt tokens on every request that carries it

_WORDS = ("sample", "another")  # the placeholder word of each variant (examples differ, so values vary)
_FORMATS = (
    {"email": "sample@example.com", "date": "2000-01-31", "date-time": "2000-01-31T09:30:00Z", "time": "09:30:00",
     "uri": "https://example.com/sample", "url": "https://example.com/sample", "hostname": "example.com",
     "uuid": "00000000-0000-4000-8000-000000000001", "ipv4": "192.0.2.1", "ipv6": "2001:db8::1"},
    {"email": "another@example.org", "date": "2001-12-05", "date-time": "2001-12-05T17:45:00Z", "time": "17:45:00",
     "uri": "https://example.org/another", "url": "https://example.org/another", "hostname": "example.org",
     "uuid": "00000000-0000-4000-8000-000000000002", "ipv4": "192.0.2.2", "ipv6": "2001:db8::2"},
)
_NUMBERS = ((7, 12.5), (3, 40.25))  # (integer, number) per variant
_CATEGORY_CHAR = {"CATEGORY_DIGIT": "0", "CATEGORY_WORD": "a", "CATEGORY_SPACE": " ", "CATEGORY_NOT_DIGIT": "a",
                  "CATEGORY_NOT_WORD": "-", "CATEGORY_NOT_SPACE": "a"}


class _Unbuildable(Exception):
    pass


def _human(key: str) -> str:
    """``job_title`` / ``jobTitle`` -> ``job title``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).replace("_", " ").replace("-", " ")
    return " ".join(spaced.split()).lower() or "value"


class _Builder:
    def __init__(self, root: dict[str, Any], variant: int = 0):
        self.root = root
        self.variant = variant % len(_WORDS)
        self.leaves = 0

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
            return f"{_WORDS[self.variant]} {_human(key)}"
        if not isinstance(schema, dict) or "not" in schema:
            raise _Unbuildable("not")
        if "$ref" in schema:
            return self.value({**self.resolve(schema["$ref"]), **{k: v for k, v in schema.items() if k != "$ref"}},
                              key, depth + 1)
        if "const" in schema:
            self.leaves += 1
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            self.leaves += 1
            return schema["enum"][self.variant % len(schema["enum"])]
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
            return [self.value(items, key, depth + 1) for _ in range(count)]
        self.leaves += 1
        if kind == "boolean":
            return self.variant == 0
        if kind == "null":
            return None
        if kind in ("integer", "number"):
            return self.number(schema, kind == "integer")
        return self.string(schema, key)

    def number(self, schema: dict[str, Any], integer: bool) -> int | float:
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        value: float = _NUMBERS[self.variant][0 if integer else 1]
        if low is not None and value <= low:
            value = low + 1
        if high is not None and value >= high:
            value = high - 1 if low is None or high - 1 > low else (low + high) / 2
        if integer:
            value = int(value)
        step = schema.get("multipleOf")
        if isinstance(step, (int, float)) and step > 0:
            value = step * max(1, round(value / step))
        return value

    def string(self, schema: dict[str, Any], key: str) -> str:
        fmt = schema.get("format")
        text = f"{_WORDS[self.variant]} {_human(key)}"
        text = _FORMATS[self.variant].get(fmt, text) if isinstance(fmt, str) else text
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            try:  # RE2: linear time, whatever the caller's pattern (Python's re can backtrack for ages)
                rx = linear_regex(pattern)
            except Exception as exc:  # noqa: BLE001 - re2.error
                raise _Unbuildable("pattern") from exc
            if not rx.search(text):
                text = _shortest_match(pattern)
                if not rx.search(text):
                    raise _Unbuildable("pattern")
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        if high is not None and len(text) > int(high):
            text = text[: int(high)]
        if len(text) < low:
            text = text + "x" * (low - len(text))
        return text


def _shortest_match(pattern: str) -> str:
    """A short string the regex matches, built from the regex's parse tree (``re._parser``): every repeat
    at its minimum, the first branch, the first character of each class. Checked by the caller."""
    def walk(items) -> str:
        out = []
        for op, arg in items:
            name = str(op)
            if name == "LITERAL":
                out.append(chr(arg))
            elif name == "ANY":
                out.append("a")
            elif name == "NOT_LITERAL":
                out.append("a" if arg != ord("a") else "b")
            elif name == "IN":
                out.append(first_of(arg))
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, _high, sub = arg
                out.append(walk(sub) * low)
            elif name == "SUBPATTERN":
                out.append(walk(arg[-1]))
            elif name == "ATOMIC_GROUP":
                out.append(walk(arg))
            elif name == "BRANCH":
                out.append(walk(arg[1][0]))
            elif name in ("AT", "ASSERT", "ASSERT_NOT"):
                continue
            else:
                raise _Unbuildable(f"pattern: {name}")
        return "".join(out)

    def first_of(members) -> str:
        if members and str(members[0][0]) == "NEGATE":
            return "_"  # rarely excluded (the caller checks the whole string)
        for op, arg in members:
            name = str(op)
            if name == "LITERAL":
                return chr(arg)
            if name == "RANGE":
                return chr(arg[0])
            if name == "CATEGORY":
                return _CATEGORY_CHAR.get(str(arg), "a")
        raise _Unbuildable("pattern: empty class")

    return walk(parser.parse(pattern))


def example_instance(schema: Any, variant: int = 0) -> Any | None:
    """A placeholder instance of ``schema`` that the schema accepts, or None (never raises).

    ``variant`` 0 or 1: two instances whose every free value differs (``sample``/``another`` words,
    other numbers, dates and enum members, one or two list items), shown together so the model sees
    values change with the input."""
    try:
        with warnings.catch_warnings():  # a caller's odd regex ("possible nested set") is no server warning
            warnings.simplefilter("ignore")
            value = _Builder(schema if isinstance(schema, dict) else {}, variant).value(schema, "value", 0)
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
    """Input: the placeholder instance as ``Key: value`` lines; output: the instance as compact JSON."""
    value = example_instance(schema, variant)
    if value is None:
        return None
    return FewShotExample("\n".join(_lines(value)), compact_json(value))


def synthesize_extraction_examples(schema: Any, n: int = 2) -> tuple[FewShotExample, ...]:
    """``n`` (1 or 2) examples of different variants; the ones that could be built."""
    return tuple(ex for ex in (synthesize_extraction_example(schema, v) for v in range(n)) if ex is not None)


def synthesize_tool_examples(tools: list[dict[str, Any]] | tuple[dict[str, Any], ...],
                             n: int = 1) -> tuple[FewShotExample, ...]:
    """``n`` (1 or 2) worked calls per tool, round by round (every tool once, then again with the other
    variant): a request that names the tool's purpose and its arguments, then the call."""
    out = []
    for variant in range(n):
        out += _tool_round(tools, variant)
    return tuple(out)


def _tool_round(tools, variant: int) -> list[FewShotExample]:
    out = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        name, params = fn.get("name"), fn.get("parameters") or {"type": "object", "properties": {}}
        args = example_instance(params, variant)
        if not isinstance(name, str) or not isinstance(args, dict):
            continue
        purpose = (fn.get("description") or f"Use {name}").strip().rstrip(".")
        detail = "; ".join(_lines(args))
        out.append(FewShotExample(f"{purpose}. {detail}." if detail else f"{purpose}.",
                                  compact_json({"name": name, "arguments": args})))
    return out
