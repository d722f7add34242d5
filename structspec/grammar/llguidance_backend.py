"""The default backend: llguidance (Earley parser + token trie; masks in microseconds).

Compiled in llguidance's lenient mode when post-checks are allowed: what it cannot
enforce it ignores *and reports* as a grammar warning ("Unimplemented keys: [...]",
"Unknown format: ...", oneOf approximated by anyOf, min/maxProperties); each report
is mapped back to the schema's keyword uses (pointers) and settled by
``keywords.settle``. Hard errors (unsupported regex features, unsatisfiable schemas)
are refused with the same mapping.

Two rewrites before llguidance reads a schema: formats whose llguidance grammar refuses values the
post-check accepts are written as patterns (``formats``); and patternProperties whose patterns
overlap, which llguidance refuses, are merged into one pattern per overlapping group
(``merge_overlapping_patterns``), looser where their schemas differ, and then declared
post-check-only.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
import torch

from structspec.grammar import formats, keywords, schema_walk
from structspec.grammar.base import (
    CompileInfo,
    GrammarOptions,
    SchemaError,
    SchemaIssue,
    bitmask_row,
    mask_layout,
    set_bits,
)
from structspec.grammar.tokenizer_view import TokenizerView

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # its TypedDict, not exported at the top

# Formats the grammar enforces with a regex that is looser than the format (found by testing).
APPROXIMATE_FORMATS = formats.APPROXIMATE
# embed(part, at): a JSON Schema a Lark grammar embeds, spelled as the backend compiles it (``at``: where it sits)
EmbedSchema = Callable[[dict[str, Any], str], dict[str, Any]]

# Plain text for tool_choice="auto" must not open JSON: "{" or "[" starts a call.
_TEXT_NOT_JSON = r"/[^{\[](?s:.)*/"
_TEXT_ANY = r"/(?s:.)+/"


# llguidance's resource limits, set explicitly (its defaults) so they are part of what a compile
# reports (``CompileInfo.extra["limits"]``). A schema whose grammar exhausts one mid-decode ends
# with ``limit_exceeded`` naming it: RESOURCE_EXHAUSTED (GRAMMAR_LIMIT) at the API, not a model failure.
DEFAULT_LIMITS = {
    "max_items_in_row": 2000,  # Earley items in one row of the parse
    "step_max_items": 50_000,  # Earley items computed in one step (mask, forced tokens)
    "initial_lexer_fuel": 1_000_000,  # building the lexer's regexes at compile time
    "step_lexer_fuel": 200_000,  # lexer work in one step
    "max_lexer_states": 250_000,
    "max_grammar_size": 500_000,  # symbols in the grammar's productions
}

# Phrases of llguidance's error messages -> the limit each one reports.
_LIMIT_MESSAGES = (
    ("Too many items", "step_max_items"),
    ("max_items_in_row", "max_items_in_row"),
    ("initial_lexer_fuel", "initial_lexer_fuel"),
    ("fuel exhausted", "step_lexer_fuel"),
    ("lex fuel", "step_lexer_fuel"),
    ("too many expressions constructed", "step_lexer_fuel"),
    ("LexerTooComplex", "max_lexer_states"),
    ("lexer configuration (grammar) too big", "max_lexer_states"),
    ("grammar size (number of symbols) too big", "max_grammar_size"),
)


def limit_in(message: str | None) -> str | None:
    """The resource limit an llguidance error message reports, or None."""
    if not message:
        return None
    return next((limit for phrase, limit in _LIMIT_MESSAGES if phrase in message), None)


class LLGuidanceBackend:
    name = "llguidance"

    def __init__(self, view: TokenizerView, limits: dict[str, int] | None = None):
        self.view = view
        self.limit_values = {**DEFAULT_LIMITS, **(limits or {})}
        # verbose_errors=False: error texts go to API clients; no parser dumps in them.
        # ignore: mypy matches the **dict[str, int] against the bool parameters too (none of its keys is one)
        self.limits = llguidance.LLParserLimits(verbose_errors=False, **self.limit_values)  # type: ignore[arg-type]

    def compile_json_schema(self, schema: dict[str, Any], options: GrammarOptions) -> LLGuidanceGrammar:
        def build(merge: bool) -> LLGuidanceGrammar:
            compiled, unenforced = self.embedded(schema, merge)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(compiled, overrides=json_overrides(options))
            return self._build(grammar, schema, options, unenforced)

        return self._merging_overlaps(build)

    def compile_text_or_json(
        self, schema: dict[str, Any] | None, allow_text: bool, options: GrammarOptions
    ) -> LLGuidanceGrammar:
        if schema is None:
            grammar = llguidance.LLMatcher.grammar_from_lark(f"start: TEXT\nTEXT: {_TEXT_ANY}\n")
            return self._build(grammar, {}, options)
        if not allow_text:
            return self.compile_json_schema(schema, options)

        def build(merge: bool) -> LLGuidanceGrammar:
            compiled, unenforced = self.embedded(schema, merge)
            inline = {**compiled, "x-guidance": json_overrides(options)}  # %json reads its options from x-guidance
            lark = f"start: TEXT | call\nTEXT: {_TEXT_NOT_JSON}\ncall: %json {json.dumps(inline)}\n"
            return self._build(llguidance.LLMatcher.grammar_from_lark(lark), schema, options, unenforced)

        return self._merging_overlaps(build)

    def embedded(self, schema: dict[str, Any], merge: bool) -> tuple[dict[str, Any], list[keywords.Unenforced]]:
        """``schema`` spelled as this backend compiles it, alone or inside a Lark grammar: the formats it writes
        as patterns of its own (``formats``); with ``merge``, overlapping patternProperties merged (what that
        leaves to the post-check, pointed into ``schema``). Raises: Never."""
        compiled = formats.with_own_formats(schema)
        return merge_overlapping_patterns(compiled, self._disjoint) if merge else (compiled, [])

    @staticmethod
    def _merging_overlaps(build: Callable[[bool], LLGuidanceGrammar]) -> LLGuidanceGrammar:
        """``build(merge=False)``; again with overlapping patternProperties merged where llguidance refuses them
        (only then: the check is a compile per pair of patterns)."""
        try:
            return build(False)
        except SchemaError as exc:
            if exc.kind != "unsupported" or not any(_NOT_DISJOINT.search(i.message) for i in exc.issues):
                raise
        return build(True)

    def _disjoint(self, first: str, second: str) -> bool:
        probe = {"type": "object", "patternProperties": {first: {}, second: {}}}
        grammar = llguidance.LLMatcher.grammar_from_json_schema(probe, overrides={"lenient": True})
        matcher = llguidance.LLMatcher(self.view.ll_tokenizer, grammar, log_level=0, limits=self.limits)
        return not (matcher.is_error() and _NOT_DISJOINT.search(matcher.get_error()))

    def compile_lark(self, lark_of: Callable[[EmbedSchema], str], schema: dict[str, Any],
                     options: GrammarOptions) -> LLGuidanceGrammar:
        """A Lark grammar (a call format's: ``call_formats.lark_grammar``), written by ``lark_of(embed)``, which
        passes each JSON Schema it embeds in a ``%json`` through ``embed(part, at)`` (``at``: where the part sits
        in ``schema``, the JSON Schema its parts come from, where warnings and errors are pointed). Each part is
        spelled as ``compile_json_schema`` spells a schema, so a call format takes and refuses what the generic
        JSON call does."""

        def build(merge: bool) -> LLGuidanceGrammar:
            unenforced: list[keywords.Unenforced] = []

            def embed(part: dict[str, Any], at: str) -> dict[str, Any]:
                compiled, found = self.embedded(part, merge)
                unenforced.extend(dataclasses.replace(u, issue=dataclasses.replace(u.issue, pointer=at + u.issue.pointer))
                                  for u in found)
                return compiled

            lark = lark_of(embed)
            return self._build(llguidance.LLMatcher.grammar_from_lark(lark), schema, options, unenforced)

        return self._merging_overlaps(build)

    def special_token(self, text: str) -> int | None:
        """The id of the special token spelled ``text`` in this tokenizer (None: not one; then text spells it)."""
        found = self.view.tokenizer.get_added_vocab().get(text)
        return found if found is not None and self.view.ll_tokenizer.is_special_token(found) else None

    def _build(self, grammar: str, schema: dict[str, Any], options: GrammarOptions,
               unenforced: Sequence[keywords.Unenforced] = ()) -> LLGuidanceGrammar:
        """``schema``: the caller's (warnings and errors point into it; the approximated formats are its)."""
        matcher = llguidance.LLMatcher(self.view.ll_tokenizer, grammar, log_level=0, limits=self.limits)
        if matcher.is_error():
            kind, issues = explain_error(matcher.get_error(), schema)
            raise SchemaError(issues, kind=kind)
        unenforced = [*unenforced, *(u for w in matcher.get_grammar_warnings() for u in explain_warning(w, schema))]
        for pointer in schema_walk.keyword_pointers(schema, "format", lambda v: v in APPROXIMATE_FORMATS):
            fmt = schema_walk.resolve(schema, pointer)
            unenforced.append(keywords.approximate_format(pointer, fmt, self.name, APPROXIMATE_FORMATS[fmt]))
        warnings, post_check = keywords.settle(unenforced, options)
        # The first mask builds the lexer lazily: pay it here, not on the first request.
        scratch = np.empty(self.view.mask_words, dtype=np.int32)  # written, never read (torch.zeros: 10x slower)
        matcher.unsafe_compute_mask_ptr(scratch.ctypes.data, scratch.nbytes)
        if matcher.is_error():
            kind, issues = explain_error(matcher.get_error(), schema)
            raise SchemaError(issues, kind=kind)
        _trial_walk(matcher.deep_copy(), scratch, schema)
        info = CompileInfo(warnings=warnings, post_check_keywords=post_check,
                           extra={"backend": self.name, "limits": dict(self.limit_values)})
        return LLGuidanceGrammar(self.view, matcher, info, source=grammar)


def merge_overlapping_patterns(schema: dict[str, Any], disjoint: Callable[[str, str], bool]
                               ) -> tuple[dict[str, Any], list[keywords.Unenforced]]:
    """``schema`` with each group of overlapping patternProperties (``disjoint(a, b)`` False, joined
    transitively) as one pattern, their alternation. A name matching several patterns must satisfy
    all their schemas; merged, it is held to one: the schema itself where the group's schemas are
    equal (exact), else their ``anyOf`` (looser, every valid instance still admitted), a
    patternProperties use declared post-check-only. Which names fall to additionalProperties does
    not change."""
    out = copy.deepcopy(schema)
    unenforced = []
    for pointer, node in list(schema_walk.iter_schemas(out)):
        if not isinstance(node, dict):
            continue
        patterns = node.get("patternProperties")
        if not isinstance(patterns, dict) or len(patterns) < 2:
            continue
        names = list(patterns)
        group = list(range(len(names)))  # union-find over the patterns

        def root(i: int, group: list[int] = group) -> int:
            while group[i] != i:
                i = group[i]
            return i

        for i, j in itertools.combinations(range(len(names)), 2):
            if root(i) != root(j) and not disjoint(names[i], names[j]):
                group[root(j)] = root(i)
        groups: dict[int, list[str]] = {}
        for i, name in enumerate(names):
            groups.setdefault(root(i), []).append(name)
        if all(len(g) == 1 for g in groups.values()):
            continue
        merged: dict[str, Any] = {}
        loose = False
        for members in groups.values():
            if len(members) == 1:
                merged[members[0]] = patterns[members[0]]
                continue
            schemas = [patterns[m] for m in members]
            same = all(json.dumps(s, sort_keys=True) == json.dumps(schemas[0], sort_keys=True) for s in schemas)
            loose = loose or not same
            merged["|".join(f"(?:{m})" for m in members)] = schemas[0] if same else {"anyOf": schemas}
        node["patternProperties"] = merged
        if loose:
            unenforced.append(keywords.keyword(
                schema_walk.join(pointer, "patternProperties"), "patternProperties", "llguidance",
                "overlapping patterns: a name matching several is held to one of their schemas"))
    return out, unenforced


TRIAL_STEPS = 16


def _trial_walk(matcher: llguidance.LLMatcher, scratch: np.ndarray, schema: dict[str, Any]) -> None:
    """Walk the path every request takes (the forced tokens, mask by mask, on a copy): a grammar
    that exhausts a resource limit there is refused now rather than failing every request.
    Microseconds: forced runs are short and each mask is one step."""
    for _ in range(TRIAL_STEPS):
        forced = matcher.compute_ff_tokens()
        if matcher.is_error() or not forced:
            break
        matcher.consume_tokens(forced)
        if not matcher.is_error():
            matcher.unsafe_compute_mask_ptr(scratch.ctypes.data, scratch.nbytes)
        if matcher.is_error():
            break
    if matcher.is_error():
        kind, issues = explain_error(matcher.get_error(), schema)
        raise SchemaError(issues, kind=kind)


def json_overrides(options: GrammarOptions) -> JsonCompileOptions:
    """llguidance's JSON options for ``options`` (also what a raw llguidance reference compiles with)."""
    # Overrides, not defaults: a schema's own "x-guidance" cannot turn lenient mode on behind our back.
    return {"whitespace_flexible": options.whitespace == "flexible", "lenient": options.allow_post_check}


class LLGuidanceGrammar:
    """A compiled grammar: a prototype matcher that every sequence deep-copies (microseconds)."""

    def __init__(self, view: TokenizerView, prototype: llguidance.LLMatcher, info: CompileInfo, source: str = ""):
        self.view = view
        self.info = info
        self.source = source  # the serialized llguidance grammar the prototype was built from (what vLLM is sent)
        self._prototype = prototype
        self._lock = threading.Lock()

    def matcher(self) -> LLGuidanceMatcher:
        with self._lock:
            return LLGuidanceMatcher(self.view, self._prototype.deep_copy())


class LLGuidanceMatcher:
    """EOS is handled here, not by llguidance: once the grammar is complete llguidance treats a
    further EOS as a no-op that ``rollback(1)`` would then count as the last real token."""

    def __init__(self, view: TokenizerView, matcher: llguidance.LLMatcher):
        self._view = view
        self._words = view.mask_words
        self._m = matcher
        self._eos = frozenset(view.eos_token_ids)
        self._ended = False  # EOS consumed
        self._error: str | None = None
        # see ``rollback``: a copy no mask is ever computed on, and the tokens consumed since its state;
        # the state before any token and every token since, for a rollback deeper than that
        self._clean: llguidance.LLMatcher | None = None
        self._since: list[int] = []
        self._origin = matcher.deep_copy()
        self._log: list[int] = []

    @property
    def error(self) -> str | None:
        if self._error is None and self._m.is_error():
            self._error = _first_line(self._m.get_error())
        return self._error

    @property
    def limit_exceeded(self) -> str | None:
        return limit_in(self.error)

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        # Every decode position: a microsecond here is a fifth of a cheap llguidance mask.
        words = self._words
        layout = mask_layout(bitmask, words)  # no tensor view, no torch call
        address = layout.row_address(row)
        if layout.width > words:
            bitmask[row, words:] = 0
        if self._ended or self._error is not None or self._m.is_error():
            _ = self.error  # sticky
            target = bitmask_row(bitmask, row, words)
            target.zero_()  # EOS only: a finished or broken sequence can only end
            set_bits(target, self._eos)
            return
        self._m.unsafe_compute_mask_ptr(address, words * 4)

    def consume(self, tokens: Sequence[int]) -> bool:
        if self.error:
            return False
        tokens = list(tokens)
        if tokens and self._ended:
            self._error = "token after EOS"
            return False
        cut = next((i for i, t in enumerate(tokens) if t in self._eos), len(tokens))
        if cut and not self._consume_llg(tokens[:cut]):
            return False  # llguidance is now in its (sticky) error state
        if cut == len(tokens):
            return True
        if not self._m.is_accepting():
            self._error = "EOS before the output is complete"
            return False
        self._ended = True
        if cut + 1 < len(tokens):
            self._error = "token after EOS"
            return False
        return True

    def _consume_llg(self, tokens: list[int]) -> bool:
        if self._clean is None:
            self._clean, self._since = self._m.deep_copy(), []
        if not self._m.consume_tokens(tokens):
            _ = self.error  # kept: sticky, whatever is rolled back later
            return False
        self._since.extend(tokens)
        self._log.extend(tokens)
        return True

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` tokens: bring the clean copy up to the tokens that stay and continue on a copy of it.

        llguidance's own ``rollback`` can leave a wrong mask behind: after a mask computed inside one
        string value (a draft walked into another tool's arguments), rolling back and consuming into a
        string value with other followers, the mask there still refuses what only the first forbade
        (``"}}`` closing the call), so decoding is steered off the target's choice and can end with a
        token the grammar then rejects. The clean copy has never computed a mask, so it holds no such
        state. Cost: one copy of the parser state per rollback (tens of microseconds at a thousand
        tokens) and the tokens committed since the last rollback consumed twice. A rollback past the
        copy's state (into tokens it has not seen: a proposer that rolled part of its own draft back,
        then failed) rebuilds from the state before any token, consuming the whole kept output again
        (rare; linear in the output). Raises: Never (a re-consume the grammar refuses, which would be a
        bug, becomes the matcher's sticky error, failing that request alone).
        """
        if n <= 0:
            return
        if self._ended:
            self._ended = False
            n -= 1
        if not n:
            return
        n = min(n, len(self._log))
        del self._log[len(self._log) - n:]
        if self._clean is not None and n <= len(self._since):
            base, keep = self._clean, self._since[: len(self._since) - n]
        else:
            base, keep = self._origin.deep_copy(), list(self._log)
        if keep and not base.consume_tokens(keep):
            self._error = f"internal: the grammar refused tokens it accepted before ({_first_line(base.get_error())})"
            return
        self._clean, self._m, self._since = base, base.deep_copy(), []

    def forced_tokens(self) -> list[int]:
        if self.error or self._ended:
            return []
        return self._m.compute_ff_tokens()

    def is_accepting(self) -> bool:
        return not self.error and (self._ended or self._m.is_accepting())

    def is_stopped(self) -> bool:
        return self._ended or bool(self.error) or self._m.is_stopped()


def _first_line(message: str) -> str:
    """llguidance's message without the parser dump (or its ``<non-verbose/>`` placeholder)."""
    return message.split("\n<state>", 1)[0].replace("<non-verbose/>", "").strip()


# -- mapping llguidance's messages to schema keywords -------------------------------------------

_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[.*?\])")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")
_NOT_DISJOINT = re.compile(r"patternProperty regexes /(.*)/ and /(.*)/ are not disjoint")


def _uses(schema: dict[str, Any], keyword: str, where: Callable[[Any], bool] = lambda _: True) -> list[str]:
    return schema_walk.keyword_pointers(schema, keyword, where) or [""]


def explain_warning(message: str, schema: dict[str, Any]) -> list[keywords.Unenforced]:
    """One lenient-mode warning -> the keyword uses it leaves to the post-check."""
    engine = "llguidance"
    if m := _UNIMPLEMENTED.search(message):
        names = json.loads(m.group(1))
        return [keywords.keyword(p, k, engine) for k in names for p in _uses(schema, k)]
    if m := _UNKNOWN_FORMAT.search(message):
        fmt = m.group(1)
        return [keywords.unknown_format(p, fmt, engine) for p in _uses(schema, "format", lambda v: v == fmt)]
    if "oneOf" in message:
        return [keywords.keyword(p, "oneOf", engine, "approximated by anyOf: exclusivity")
                for p in _uses(schema, "oneOf")]
    if "min/maxProperties" in message:
        return [keywords.keyword(p, k, engine, "only enforced when every listed property is required")
                for k in ("minProperties", "maxProperties") for p in schema_walk.keyword_pointers(schema, k)]
    # Unknown warning: visible, never silently dropped, but no keyword to point at.
    return [keywords.Unenforced(SchemaIssue("", "", f"llguidance: {_first_line(message)[:300]}"), checkable=False)]


def explain_error(message: str, schema: dict[str, Any]) -> tuple[str, list[SchemaIssue]]:
    """A compile error -> (SchemaError kind, issues with pointers where they can be found)."""
    text = _first_line(message)
    short = text if len(text) <= 300 else text[:300] + "..."
    if limit := limit_in(text):
        return "grammar_limit", [SchemaIssue("", "", f"its grammar exceeds the grammar engine's limit {limit} "
                                                     f"({DEFAULT_LIMITS.get(limit, '?')}): {short}")]
    if text.startswith("NoExtension"):  # the parser cannot take a single step: nothing can be generated
        why = "no JSON value can be generated for this schema"
        refs = _uses(schema, "$ref")
        if refs:
            return "invalid_schema", [SchemaIssue(p, "$ref", f"{why}: the reference loops back with nothing "
                                                              "else to generate") for p in refs]
        return "invalid_schema", [SchemaIssue("", "", why)]
    if m := _UNIMPLEMENTED.search(text):
        names = json.loads(m.group(1))
        return "unsupported", [SchemaIssue(p, k, "not supported by llguidance") for k in names for p in _uses(schema, k)]
    if m := _UNKNOWN_FORMAT.search(text):
        fmt = m.group(1)
        return "unsupported", [SchemaIssue(p, "format", f"format {fmt!r} is not supported")
                               for p in _uses(schema, "format", lambda v: v == fmt)]
    if "regex parse error" in text or " in regex /" in text:  # a pattern llguidance cannot take, named by its text
        found = [p for k in ("pattern",) for p in schema_walk.keyword_pointers(
            schema, k, lambda v: isinstance(v, str) and bool(v) and v in text)]
        found += [p for p in schema_walk.keyword_pointers(
            schema, "patternProperties", lambda v: isinstance(v, dict) and any(k and k in text for k in v))]
        return "unsupported", [SchemaIssue(p, p.rsplit("/", 1)[-1], short) for p in found] or [
            SchemaIssue("", "pattern", short)]
    if m := _NOT_DISJOINT.search(text):
        return "unsupported", [SchemaIssue(p, "patternProperties", short) for p in _uses(schema, "patternProperties")]
    if "oneOf" in text:
        return "unsupported", [SchemaIssue(p, "oneOf", short) for p in _uses(schema, "oneOf")]
    if "min/maxProperties" in text:
        found = schema_walk.keyword_pointers(schema, "minProperties") + schema_walk.keyword_pointers(schema, "maxProperties")
        return "unsupported", [SchemaIssue(p, p.rsplit("/", 1)[-1], short) for p in found] or [SchemaIssue("", "", short)]
    if "Unsatisfiable" in text or "not present in a registry" in text:
        return "invalid_schema", [SchemaIssue("", "", short)]
    return "unsupported", [SchemaIssue("", "", short)]
