"""The alternative backend: outlines-core (JSON schema -> regex -> token-level DFA index).

outlines-core turns each schema object into a regex by its *first* recognised key
(properties, allOf, anyOf, oneOf, prefixItems, enum, const, $ref, type) and
ignores the rest; it also ignores numeric bounds, ``required`` outside
``properties`` and more. ``audit`` mirrors that dispatch to list every keyword the
regex leaves out (post-checked or refused, see ``keywords.settle``) and rewrites
the schema where outlines-core would fail or mis-compile: ``{}`` and annotation-only
subschemas become an explicit any-value ``anyOf``, unknown formats are dropped,
patterns are wrapped as ``^(?:...)$`` (outlines-core pastes them unescaped
between quotes).

Known outlines-core 0.2 limits, not papered over (they only narrow the language):
its index drops some continuations out of accepting states (``a(bc)?`` accepts
``a`` but not ``abc``; a top-level ``4.5``; JSON objects and arrays only accept
at their end, so they are unaffected), exponents need a sign, strings exclude
U+007F..U+009F and ``\\u`` escapes, references nest at most 3 deep.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import jsonschema
import outlines_core
import torch

from structspec.grammar import keywords, schema_walk
from structspec.grammar.base import (
    CompileInfo,
    GrammarOptions,
    SchemaError,
    SchemaIssue,
    bitmask_row,
    set_bits,
)
from structspec.grammar.outlines_worker import IndexBuilder
from structspec.grammar.tokenizer_view import TokenizerView

ENGINE = "outlines"
FORMATS = frozenset({"date-time", "date", "time", "uuid", "email", "uri"})
APPROXIMATE_FORMATS = {  # outlines-core's regexes for these are looser than the formats
    "date": "any month has 31 days",
    "date-time": "any month has 31 days, time zone optional",
    "time": "time zone optional",
}
_DISPATCH = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")
_MAX_ROLLBACK = 1 << 16
_MAX_FORCED = 4096
# "Any value", spelled so that outlines-core groups it: its own regex for {} is an ungrouped
# alternation that breaks as soon as it is embedded (``{"a":{}}`` would accept ``{"a":true``).
_ANY = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null", "object", "array")]}
_TEXT_NOT_JSON = r"[^{\[](?s:.)*"
_TEXT_ANY = r"(?s:.)+"


class OutlinesBackend:
    name = ENGINE

    def __init__(self, view: TokenizerView):
        self.view = view
        self.builder = IndexBuilder(view.outlines_tokens, view.eos_token_id)

    def compile_json_schema(self, schema: dict[str, Any], options: GrammarOptions) -> OutlinesGrammar:
        return self.compile_text_or_json(schema, False, options)

    def compile_text_or_json(
        self, schema: dict[str, Any] | None, allow_text: bool, options: GrammarOptions
    ) -> OutlinesGrammar:
        warnings: tuple[SchemaIssue, ...] = ()
        post_check: tuple[str, ...] = ()
        schema_json = None
        if schema is not None:
            rewritten, unenforced = audit(schema)
            warnings, post_check = keywords.settle(unenforced, options)
            schema_json = json.dumps(rewritten)
        text = _TEXT_ANY if schema is None else _TEXT_NOT_JSON if allow_text else None
        whitespace = "" if options.whitespace == "compact" else None
        index, regex_chars = self.builder.build(schema_json, whitespace, text, options.compile_timeout_s)
        info = CompileInfo(warnings=warnings, post_check_keywords=post_check,
                           extra={"backend": self.name, "regex_chars": regex_chars})
        return OutlinesGrammar(self.view, index, info)


class OutlinesGrammar:
    def __init__(self, view: TokenizerView, index: outlines_core.Index, info: CompileInfo):
        self.view = view
        self.index = index
        self.info = info
        self._choices: dict[int, tuple[int, int | None]] = {}

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self)

    def choices(self, state: int) -> tuple[int, int | None]:
        """How many non-EOS tokens the state allows, and the token when it is the only one allowed,
        EOS included (cached per state)."""
        found = self._choices.get(state)
        if found is None:
            eos = self.view.eos_token_id
            allowed = self.index.get_allowed_tokens(state)
            single = allowed[0] if len(allowed) == 1 and allowed[0] != eos else None
            found = self._choices[state] = (len(allowed) - (eos in allowed), single)
        return found


class OutlinesMatcher:
    """State stack over the index (validate, rollback); a ``Guide`` kept in step writes the masks."""

    def __init__(self, grammar: OutlinesGrammar):
        self._g = grammar
        self._index = grammar.index
        self._eos = frozenset(grammar.view.eos_token_ids)
        self._guide = outlines_core.Guide(grammar.index, max_rollback=_MAX_ROLLBACK)
        self._states = [grammar.index.get_initial_state()]
        self._ended = False
        self._error: str | None = None

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def limit_exceeded(self) -> str | None:
        return None  # an outlines-core index is built whole at compile time: nothing runs out mid-decode

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        words = self._g.view.mask_words
        target = bitmask_row(bitmask, row, words)
        bitmask[row].zero_()
        if self._ended or self._error:
            set_bits(target, self._eos)
            return
        self._guide.write_mask_into(target.data_ptr(), words, 4)
        if self._index.is_final_state(self._states[-1]):
            set_bits(target, self._eos)  # the index knows one EOS id; the model may have several

    def consume(self, tokens: Sequence[int]) -> bool:
        if self._error:
            return False
        for token in tokens:
            state = self._states[-1]
            if self._ended:
                return self._fail("token after EOS")
            if token in self._eos:
                if not self._index.is_final_state(state):
                    return self._fail("EOS before the output is complete")
                self._ended = True
                continue
            nxt = self._index.get_next_state(state, token)
            if nxt is None:
                return self._fail(f"token {token} is not allowed here")
            self._guide.advance(token, return_tokens=False)
            self._states.append(nxt)
        return True

    def _fail(self, message: str) -> bool:
        self._error = message
        return False

    def rollback(self, n: int) -> None:
        if n > 0 and self._ended:
            self._ended = False
            n -= 1
        n = min(n, len(self._states) - 1)
        if n > 0:
            self._guide.rollback_state(n)
            del self._states[-n:]

    def forced_tokens(self) -> list[int]:
        """Only positions with a single allowed token: outlines allows every split of forced text."""
        if self._error or self._ended:
            return []
        forced: list[int] = []
        state = self._states[-1]
        while len(forced) < _MAX_FORCED:
            _, single = self._g.choices(state)
            if single is None:
                break
            forced.append(single)
            state = self._index.get_next_state(state, single)
        return forced

    def is_accepting(self) -> bool:
        return not self._error and (self._ended or self._index.is_final_state(self._states[-1]))

    def is_stopped(self) -> bool:
        if self._ended or self._error:
            return True
        state = self._states[-1]
        return self._index.is_final_state(state) and self._g.choices(state)[0] == 0


# -- audit: what the regex will leave out --------------------------------------------------------


def audit(schema: dict[str, Any]) -> tuple[dict[str, Any], list[keywords.Unenforced]]:
    """(schema rewritten for outlines-core, keyword uses it does not enforce); SchemaError if refused."""
    auditor = _Auditor(copy.deepcopy(schema))
    holder = {"root": auditor.root}
    auditor.visit(holder, "root", "")
    if auditor.refused:
        raise SchemaError(auditor.refused, kind="unsupported")
    return holder["root"], auditor.unenforced


class _Auditor:
    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.unenforced: list[keywords.Unenforced] = []
        self.refused: list[SchemaIssue] = []
        self._seen: set[str] = set()

    def refuse(self, pointer: str, keyword: str, why: str) -> None:
        self.refused.append(SchemaIssue(pointer, keyword, f"{why} (outlines)"))

    def leave(self, pointer: str, node: dict[str, Any], names: Sequence[str], why: str = "") -> None:
        for name in names:
            if name in node:
                self.unenforced.append(keywords.keyword(schema_walk.join(pointer, name), name, ENGINE, why))

    def visit(self, parent: Any, key: Any, pointer: str) -> None:
        """Audit (and rewrite in place) the subschema ``parent[key]`` the way outlines-core reads it."""
        node = parent[key]
        if node is True:
            parent[key] = copy.deepcopy(_ANY)
            return
        if node is False or not isinstance(node, dict):
            self.refuse(pointer, "", "a false schema cannot be expressed")
            return
        branch = next((k for k in _DISPATCH if k in node), None)
        assertions = {k for k in node if k in keywords.ASSERTIONS}
        if branch is None:  # {} or annotations only (plus assertions outlines cannot place): any value
            self.leave(pointer, node, sorted(assertions), "no type-giving keyword")
            parent[key] = copy.deepcopy(_ANY)
            return
        handled = getattr(self, "_" + branch.lstrip("$"))(node, pointer)
        self.leave(pointer, node, [k for k in node if k in assertions - handled])

    def _properties(self, node: dict[str, Any], pointer: str) -> set[str]:
        props = node["properties"] if isinstance(node["properties"], dict) else {}
        for name in props:
            self.visit(props, name, schema_walk.join(pointer, "properties", name))
        missing = [r for r in node.get("required", []) if r not in props]
        if missing:
            self.leave(pointer, node, ["required"], f"{missing} not in properties")
        handled = {"properties", "additionalProperties", "required"}  # only listed properties are generated
        if _types(node) >= {"object"} or "type" not in node:
            handled.add("type")
        return handled

    def _allOf(self, node: dict[str, Any], pointer: str) -> set[str]:
        if len(node["allOf"]) != 1:
            self.refuse(schema_walk.join(pointer, "allOf"), "allOf",
                        "allOf with several subschemas is concatenated, not intersected")
            return {"allOf"}
        self.visit(node["allOf"], 0, schema_walk.join(pointer, "allOf", 0))
        return {"allOf"}

    def _anyOf(self, node: dict[str, Any], pointer: str) -> set[str]:
        for i in range(len(node["anyOf"])):
            self.visit(node["anyOf"], i, schema_walk.join(pointer, "anyOf", i))
        return {"anyOf"}

    def _oneOf(self, node: dict[str, Any], pointer: str) -> set[str]:
        for i in range(len(node["oneOf"])):
            self.visit(node["oneOf"], i, schema_walk.join(pointer, "oneOf", i))
        self.leave(pointer, node, ["oneOf"], "approximated by anyOf: exclusivity")
        return {"oneOf"}

    def _prefixItems(self, node: dict[str, Any], pointer: str) -> set[str]:
        for i in range(len(node["prefixItems"])):
            self.visit(node["prefixItems"], i, schema_walk.join(pointer, "prefixItems", i))
        handled = {"prefixItems", "items", "additionalItems", "unevaluatedItems"}  # exactly the prefix
        return handled | ({"type"} if _types(node) >= {"array"} else set())

    def _enum(self, node: dict[str, Any], pointer: str) -> set[str]:
        return {"enum"} | self._values_satisfy(node, node["enum"] if isinstance(node["enum"], list) else [])

    def _const(self, node: dict[str, Any], pointer: str) -> set[str]:
        return {"const"} | self._values_satisfy(node, [node["const"]])

    def _values_satisfy(self, node: dict[str, Any], values: list[Any]) -> set[str]:
        """Sibling keywords every listed value already satisfies are enforced by the value list."""
        siblings = {k: v for k, v in node.items() if k in keywords.ASSERTIONS and k not in ("enum", "const")}
        if not siblings or any(k in siblings for k in ("$ref",)):
            return set()
        try:
            check = jsonschema.Draft202012Validator(siblings)
            return set(siblings) if all(check.is_valid(v) for v in values) else set()
        except Exception:  # a sibling that cannot be evaluated stays post-checked
            return set()

    def _ref(self, node: dict[str, Any], pointer: str) -> set[str]:
        ref = node["$ref"]
        target = ref.partition("#")[2] if isinstance(ref, str) else None
        if target is not None and target.startswith("/") and target not in self._seen:
            self._seen.add(target)
            head, _, last = target.rpartition("/")
            try:
                container = schema_walk.resolve(self.root, head)
                self.visit(container, int(last) if isinstance(container, list) else schema_walk.unescape(last), target)
            except (KeyError, ValueError):
                pass  # outlines-core reports the broken reference itself
        return {"$ref"}

    def _type(self, node: dict[str, Any], pointer: str) -> set[str]:
        handled = {"type"}
        for kind in _types(node):
            if kind == "string":
                handled |= self._string(node, pointer)
            elif kind == "array":
                handled |= self._array(node, pointer)
            elif kind == "object":
                handled |= self._object(node, pointer)
        return handled

    def _string(self, node: dict[str, Any], pointer: str) -> set[str]:
        if "minLength" in node or "maxLength" in node:
            return {"minLength", "maxLength"}  # pattern and format are then ignored
        if isinstance(node.get("pattern"), str):
            core = _strip_anchors(node["pattern"])
            if not _json_safe(core):
                self.refuse(schema_walk.join(pointer, "pattern"), "pattern",
                            "pattern can match characters a JSON string must escape")
            node["pattern"] = f"^(?:{core})$"  # anchored and grouped, as outlines-core pastes it verbatim
            return {"pattern"}
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt not in FORMATS:
            self.unenforced.append(keywords.unknown_format(schema_walk.join(pointer, "format"), fmt, ENGINE))
            del node["format"]
            return set()
        if fmt in APPROXIMATE_FORMATS:
            self.unenforced.append(keywords.approximate_format(schema_walk.join(pointer, "format"), fmt, ENGINE,
                                                               APPROXIMATE_FORMATS[fmt]))
        return {"format"}

    def _array(self, node: dict[str, Any], pointer: str) -> set[str]:
        items = node.get("items")
        if isinstance(items, list):
            self.refuse(schema_walk.join(pointer, "items"), "items", "tuple-form items (use prefixItems)")
        elif items is not None:
            self.visit(node, "items", schema_walk.join(pointer, "items"))
        return {"items", "minItems", "maxItems"}

    def _object(self, node: dict[str, Any], pointer: str) -> set[str]:
        extra = node.get("additionalProperties")
        if extra is False:
            self.refuse(schema_walk.join(pointer, "additionalProperties"), "additionalProperties",
                        "additionalProperties: false without properties")
        elif isinstance(extra, dict):
            self.visit(node, "additionalProperties", schema_walk.join(pointer, "additionalProperties"))
        return {"additionalProperties", "minProperties", "maxProperties"}


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    return {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()


def _strip_anchors(pattern: str) -> str:
    core = pattern.removeprefix("^")
    if core.endswith("$") and not core.endswith("\\$"):
        core = core[:-1]
    return core


def _json_safe(pattern: str) -> bool:
    """Conservative: no construct that can match a quote, a backslash or a control character."""
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1: i + 2] in ("S", "W", "D", "s", "P", "\\", "n", "t", "r", "f", "v", "x", "u", "0", "c", ""):
                return False
            i += 2
            continue
        if c == '"':
            return False
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1: i + 2] == "^":
                return False
        elif c == ".":
            return False
        i += 1
    return True
