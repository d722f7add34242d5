"""MaskBench-style check of a grammar backend: coverage, soundness and speed, without a model.

Each file holds ``{"schema": ..., "tests": [{"valid": bool, "data": ...}]}``. Every
schema goes through the real compile path (intake + backend, under a deadline);
every test instance is serialized as compact JSON in its own key order and walked
through a fresh matcher the way the engine decodes:

* where the grammar forces tokens (``forced_tokens()``), the instance text must
  start with the forced text, and those tokens are consumed as a block (they count
  towards ``ff_share``);
* elsewhere the instance's next token must be set in the mask (each ``fill_mask``
  is timed) and is then consumed;
* at the end the matcher must accept (EOS set in the mask).

Forced spans are matched on text, not on the instance's own token split: llguidance
only allows the canonical split of forced text, and the whole-instance tokenization
can differ from it at a span boundary (a token that straddles into the span). After
a forced span the rest of the instance is re-tokenized from that point when its
split does not line up (``resyncs``), which is what a decode does: the model
continues after fast-forwarded tokens. (llguidance's own MaskBench driver compares
forced tokens with the instance's tokens and reports a mismatch as a failure.)

A valid instance the grammar rejects is counted in one of three columns:

* ``key_order_errors``: the same instance with its object keys in schema order is
  accepted. Properties come out in the schema's order by design (llguidance fixes it
  and has no option to relax it), so a model's output always has them in that
  order; only instances written in another order fail.
* ``lenient_validation_errors``: the schema compiles only in lenient mode (the
  default), where llguidance approximates keywords it does not support (``oneOf`` as
  ``anyOf``, ``minProperties`` with optional keys, unknown formats, ...); its strict
  mode, llguidance's own default, refuses the schema outright.
* ``validation_errors``: the rest, in schemas the strict mode compiles too; with
  ``strict_valid_instances`` as denominator this is the figure comparable with
  llguidance's own MaskBench numbers (``validation_error_rate``).

Instances are split into tokens by the grammar engine's tokenizer, not the model's:
the model's may use ids the grammar never allows (Gemma's HTML tag tokens are special
to llguidance), which a decode spells with plain tokens instead.

An invalid instance the grammar accepts is an ``invalidation_error`` unless the gap
was declared by the compile: every jsonschema error on it is explained by a keyword
declared post-check-only (``post_check_caught``: the service would return it as a
schema_violation), or jsonschema here finds no error at all (a format without a
checker in this environment) and the compile listed unenforced keywords
(``accepted_unverifiable``). ``allow_post_check=False`` benchmarks the strict mode,
where any gap is refused at compile time.

Speed is measured beside the grammar engine alone (``raw_*``, llguidance backend only): every
schema structspec compiles is compiled again by raw llguidance (``LLMatcher`` on the same
``LLTokenizer``, JSON options and limits; a compile is ready when its first mask is computed,
which structspec's compile includes), and every walk is replayed on a copy of the raw matcher:

* ``raw_mask_us``: the same calls at the same positions (forced tokens asked where the walk asked
  them, masks where the walk masked: the positions fast-forward does not cover), so the ratio
  ``mask_ratio_p99`` is the layer's own cost, ``mask_overhead_us`` is structspec's time minus
  raw's at each of those positions and ``mask_time_ratio`` the ratio of their sums;
* ``raw_all_mask_us``: a plain raw walk over the same tokens that masks at every position, forced
  ones included (cheap ones), as a raw benchmark reports it; ``selection_p99`` =
  ``raw_mask_us_p99 / raw_all_mask_us_p99`` is how much of a naive comparison is the selection.

Compile times are the caller's wall time (``compile_schema``: cache key, intake, backend); the
raw compile runs right after structspec's, on warm caches (if anything, in raw's favour).
"""

from __future__ import annotations

import json
import re
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from io import StringIO
from pathlib import Path
from typing import Any, cast

import llguidance
import numpy as np
from rich.console import Console
from rich.table import Table

from structspec.grammar import (
    GrammarCompiler,
    GrammarOptions,
    SchemaError,
    TokenizerView,
    allocate_bitmask,
)
from structspec.grammar import schema_walk
from structspec.grammar.base import GrammarBackend, Matcher, token_allowed
from structspec.grammar.llguidance_backend import LLGuidanceBackend, json_overrides
from structspec.grammar.postcheck import instance_errors, is_post_check_error

MAX_FAILURES = 300  # examples kept in the report, per kind


def split_of(filename: str) -> str:
    """``Github_easy---o123.json`` -> ``Github_easy``; ``BFCL_simple_12.json`` -> ``BFCL_simple``."""
    stem = filename.removesuffix(".json")
    return stem.split("---", 1)[0] if "---" in stem else re.sub(r"_\d+$", "", stem)


def select_files(directory: Path, split_prefix: str | None = None, limit: int | None = None) -> list[Path]:
    """Files sorted by name; with ``limit``, a round-robin sample across splits (every split represented)."""
    files = sorted(p for p in Path(directory).glob("*.json") if not split_prefix or p.name.startswith(split_prefix))
    if limit is None or limit >= len(files):
        return files
    by_split: dict[str, list[Path]] = {}
    for p in files:
        by_split.setdefault(split_of(p.name), []).append(p)
    queues = [iter(v) for _, v in sorted(by_split.items())]
    picked: list[Path] = []
    while len(picked) < limit and queues:
        for q in list(queues):
            nxt = next(q, None)
            if nxt is None:
                queues.remove(q)
            elif len(picked) < limit:
                picked.append(nxt)
    return sorted(picked)


@dataclass
class _Tally:
    schemas: int = 0
    compiled: int = 0
    refused: int = 0  # every SchemaError but timeouts
    refused_metaschema: int = 0
    crashed: int = 0
    timed_out: int = 0
    valid_instances: int = 0
    invalid_instances: int = 0
    validation_errors: int = 0  # a valid instance rejected, in a schema the strict mode compiles too
    lenient_validation_errors: int = 0  # ... in a schema only the lenient mode compiles (its approximations)
    key_order_errors: int = 0  # a valid instance the grammar accepts with its keys in schema order (by design)
    strict_compiled: int = 0  # schemas the strict mode (no post-checks: llguidance's own) compiles too
    strict_valid_instances: int = 0  # their valid instances: the denominator of validation_errors
    invalidation_errors: int = 0  # an invalid instance accepted, not explained by a declared post-check
    post_check_caught: int = 0  # an invalid instance accepted, explained by a declared post-check
    accepted_unverifiable: int = 0  # accepted; the compile declared gaps and jsonschema here sees no error
    passing: int = 0  # compiled, and every instance judged right
    tokens: int = 0  # valid instances: tokens walked
    forced_tokens: int = 0  # ... of which forced
    resyncs: int = 0
    raw_refused: int = 0  # compiled by structspec, refused by raw llguidance (expected: none)
    compile_ms: list[float] = field(default_factory=list)
    mask_us: array = field(default_factory=lambda: array("d"))
    raw_compile_ms: list[float] = field(default_factory=list)  # ready: constructed and its first mask computed
    raw_construct_ms: list[float] = field(default_factory=list)  # ... constructed only
    raw_mask_us: array = field(default_factory=lambda: array("d"))  # at the positions of mask_us, in its order
    raw_all_mask_us: array = field(default_factory=lambda: array("d"))

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.__dict__.items() if isinstance(v, int)}
        ms, us = np.asarray(self.compile_ms), np.frombuffer(self.mask_us, dtype=np.float64)
        out.update(
            compile_ms_p50=_pct(ms, 50), compile_ms_p90=_pct(ms, 90), compile_ms_p99=_pct(ms, 99),
            mask_us_p50=_pct(us, 50), mask_us_p90=_pct(us, 90), mask_us_p99=_pct(us, 99),
            mask_us_max=round(float(us.max()), 1) if us.size else None,
            masks=int(us.size), ff_share=round(self.forced_tokens / self.tokens, 4) if self.tokens else None,
            # comparable with llguidance's own figure (its strict mode compiles these schemas, and no others)
            validation_error_rate=round(self.validation_errors / self.strict_valid_instances, 5)
            if self.strict_valid_instances else None,
        )
        if self.raw_compile_ms:
            out.update(self._raw_report(ms, us))
        return out

    def _raw_report(self, ms: np.ndarray, us: np.ndarray) -> dict[str, Any]:
        raw_ms, built_ms = np.asarray(self.raw_compile_ms), np.asarray(self.raw_construct_ms)
        raw_us = np.frombuffer(self.raw_mask_us, dtype=np.float64)
        all_us = np.frombuffer(self.raw_all_mask_us, dtype=np.float64)
        out: dict[str, Any] = {}
        for name, values, unit in (("raw_compile", raw_ms, "ms"), ("raw_construct", built_ms, "ms"),
                                   ("raw_mask", raw_us, "us"), ("raw_all_mask", all_us, "us")):
            out.update({f"{name}_{unit}_p{q}": _pct(values, q) for q in (50, 90, 99)})
        out["raw_all_masks"] = int(all_us.size)
        if raw_us.size == us.size:  # paired: the same positions in the same order
            diff = us - raw_us
            # p1 beside p99: a pause of either process (the scheduler) lands on either side
            out.update({f"mask_overhead_us_p{q}": _pct(diff, q) for q in (1, 50, 90, 99)})
            out["mask_time_ratio"] = _ratio(float(us.sum()), float(raw_us.sum()))  # all masking time, both sides
        out.update(
            compile_ratio_p50=_ratio(_pct(ms, 50), out["raw_compile_ms_p50"]),
            compile_ratio_p50_construct=_ratio(_pct(ms, 50), out["raw_construct_ms_p50"]),
            mask_ratio_p50=_ratio(_pct(us, 50), out["raw_mask_us_p50"]),
            mask_ratio_p99=_ratio(_pct(us, 99), out["raw_mask_us_p99"]),
            mask_ratio_p99_all=_ratio(_pct(us, 99), out["raw_all_mask_us_p99"]),
            selection_p99=_ratio(out["raw_mask_us_p99"], out["raw_all_mask_us_p99"]),
        )
        return out


def _pct(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values.size else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


@dataclass
class _Walk:
    accepted: bool
    reason: str = ""
    tokens: int = 0
    forced: int = 0
    resyncs: int = 0
    mask_us: list[float] = field(default_factory=list)
    key_order: bool = False  # rejected as written, accepted with its keys in schema order
    # the matcher calls in order: (FORCED, ()), (MASK, ()), (CONSUME, tokens), what a raw replay repeats
    trace: list[tuple[str, list[int]]] = field(default_factory=list)


FORCED, MASK, CONSUME = "forced", "mask", "consume"


def run_grammar_bench(
    directory: str | Path,
    backend: str,
    tokenizer: Any,
    split_prefix: str | None = None,
    limit: int | None = None,
    *,
    timeout_s: float = 10.0,
    allow_post_check: bool = True,
    raw_reference: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the check; returns a JSON-able report with per-split and ``overall`` counts and timings.

    ``raw_reference`` (llguidance backend only) adds the ``raw_*`` columns (module docstring)."""
    view = tokenizer if isinstance(tokenizer, TokenizerView) else TokenizerView(tokenizer)
    compiler = GrammarCompiler(view, backend=backend, cache_size=0)
    raw = RawLLGuidance(view, compiler.backend) if raw_reference and compiler.backend.name == "llguidance" else None
    options = GrammarOptions(compile_timeout_s=timeout_s, allow_post_check=allow_post_check)
    files = select_files(Path(directory), split_prefix, limit)
    bitmask = allocate_bitmask(1, view.n_vocab)
    words = bitmask.numpy().view(np.uint32)[0]
    tallies: dict[str, _Tally] = {}
    overall = _Tally()
    failures: dict[str, list[dict[str, str]]] = {}
    started = time.perf_counter()

    def note(kind: str, name: str, message: str) -> None:
        examples = failures.setdefault(kind, [])
        if len(examples) < MAX_FAILURES:
            examples.append({"file": name, "message": message[:400]})

    for n, path in enumerate(files):
        split = tallies.setdefault(split_of(path.name), _Tally())
        both = (split, overall)
        for t in both:
            t.schemas += 1
        raw_matcher = None
        try:
            doc = json.loads(path.read_text())
            schema, tests = doc["schema"], doc.get("tests", [])
            t0 = time.perf_counter()
            grammar = compiler.compile_schema(schema, options)
            compile_ms = (time.perf_counter() - t0) * 1e3
            if raw is not None:  # after: only schemas structspec compiles (a refused one may take its deadline)
                raw_matcher, raw_built_ms, raw_ms = raw.compile(schema, options)
        except SchemaError as exc:
            for t in both:
                if exc.kind == "timeout":
                    t.timed_out += 1
                else:
                    t.refused += 1
                    t.refused_metaschema += exc.kind == "metaschema"
            note("timeout" if exc.kind == "timeout" else f"refused:{exc.kind}", path.name, str(exc))
            continue
        except Exception as exc:  # a crash is recorded, never stops the run
            for t in both:
                t.crashed += 1
            note("crash:compile", path.name, f"{type(exc).__name__}: {exc}")
            continue
        for t in both:
            t.compiled += 1
            t.compile_ms.append(compile_ms)
            if raw is not None and raw_matcher is None:
                t.raw_refused += 1
            elif raw is not None:
                t.raw_compile_ms.append(raw_ms)
                t.raw_construct_ms.append(raw_built_ms)
        # a compile that approximated nothing is what strict mode compiles too: no second compile
        strict = not allow_post_check or not grammar.info.warnings or _strict_compiles(compiler, schema, options)
        valid_n = sum(1 for test in tests if test["valid"])
        for t in both:
            t.strict_compiled += strict
            t.strict_valid_instances += valid_n if strict else 0
        passing = True
        try:
            for test in tests:
                text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
                walked = walk(grammar.matcher(), view, text, bitmask, words)
                if raw is not None and raw_matcher is not None:
                    _raw_walks(raw, raw_matcher, walked, both)
                if test["valid"] and not walked.accepted:
                    ordered = json.dumps(schema_ordered(test["data"], schema), separators=(",", ":"),
                                         ensure_ascii=False)
                    if ordered != text and walk(grammar.matcher(), view, ordered, bitmask, words).accepted:
                        walked.key_order = True
                ok = _judge(test, walked, schema, grammar.info, both, path.name, note, strict)
                passing = passing and ok
        except Exception as exc:
            passing = False
            for t in both:
                t.crashed += 1
            note("crash:walk", path.name, f"{type(exc).__name__}: {exc}")
        for t in both:
            t.passing += passing
        if progress:
            progress(n + 1, len(files))

    return {
        "backend": compiler.backend.name,
        "tokenizer": view.fingerprint,
        "n_vocab": view.n_vocab,
        "directory": str(directory),
        "split_prefix": split_prefix,
        "limit": limit,
        "allow_post_check": allow_post_check,
        "raw_reference": raw is not None,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "splits": {name: t.report() for name, t in sorted(tallies.items())},
        "overall": overall.report(),
        "failures": failures,
    }


def _raw_walks(raw: RawLLGuidance, prototype: Any, walked: _Walk, tallies) -> None:
    same = raw.replay(prototype, walked.trace)
    every = raw.every_position(prototype, walked.trace)
    for t in tallies:
        t.raw_mask_us.extend(same)
        t.raw_all_mask_us.extend(every)


def schema_ordered(value: Any, schema: Any, root: Any = None, depth: int = 0) -> Any:
    """``value`` with each object's keys in the order its schema lists them (``properties``), others after.

    Follows properties, items, prefixItems and local ``$ref``s; where it cannot tell (a combinator)
    the instance keeps its own order below that point.
    """
    root = schema if root is None else root
    for _ in range(16):  # resolve a chain of local refs
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#")):
            break
        try:
            schema = schema_walk.resolve(root, schema["$ref"][1:])
        except KeyError:
            return value
    if depth > 64 or not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: schema_ordered(value[k], props.get(k), root, depth + 1) for k in keys}
    if isinstance(value, list):
        prefix = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
        items = schema.get("items")
        return [schema_ordered(v, prefix[i] if i < len(prefix) else items, root, depth + 1) for i, v in enumerate(value)]
    return value


def _strict_compiles(compiler: GrammarCompiler, schema: Any, options: GrammarOptions) -> bool:
    try:
        compiler.compile_schema(schema, replace(options, allow_post_check=False))
        return True
    except SchemaError:
        return False


def _judge(test, walked: _Walk, schema, info, tallies, name, note, strict: bool = True) -> bool:
    """Count one instance; True when the grammar judged it right (or the gap was declared)."""
    valid = bool(test["valid"])
    for t in tallies:
        t.mask_us.extend(walked.mask_us)
        t.resyncs += walked.resyncs
        if valid:
            t.valid_instances += 1
            t.tokens += walked.tokens
            t.forced_tokens += walked.forced
        else:
            t.invalid_instances += 1
    if valid:
        if walked.key_order:
            for t in tallies:
                t.key_order_errors += 1
            note("key_order_error", name, walked.reason)
            return True  # by design: an output has its keys in schema order
        if not walked.accepted:
            kind = "validation_errors" if strict else "lenient_validation_errors"
            for t in tallies:
                setattr(t, kind, getattr(t, kind) + 1)
            note(kind.removesuffix("s"), name, walked.reason)
        return walked.accepted
    if not walked.accepted:
        return True
    try:
        errors = instance_errors(test["data"], schema)
        if errors:
            verdict = "post_check_caught" if all(
                is_post_check_error(e, info.post_check_keywords) for e in errors) else "invalidation_errors"
        else:  # e.g. a format no checker here knows; only a bug when nothing was declared unenforced
            verdict = "accepted_unverifiable" if info.warnings else "invalidation_errors"
        why = "; ".join(f"{e.validator}: {e.message[:120]}" for e in errors[:3]) or "jsonschema here finds it valid"
    except Exception as exc:  # e.g. a pattern Python's re cannot compile
        verdict, why = "invalidation_errors", f"post-check could not run: {exc}"
    for t in tallies:
        setattr(t, verdict, getattr(t, verdict) + 1)
    if verdict != "post_check_caught":
        note(verdict, name, f"{test.get('description', '')}: {why}")
    return verdict != "invalidation_errors"


def walk(matcher: Matcher, view: TokenizerView, text: str, bitmask, words: np.ndarray) -> _Walk:
    """Walk ``text`` through ``matcher`` as a decode would (see the module docstring)."""
    data = text.encode()
    result = _Walk(accepted=False)
    trace = result.trace
    # The grammar engine's own split: the tokenizer's may use ids the grammar never allows (Gemma's HTML tag
    # tokens are special to llguidance), which a decode spells with plain tokens instead.
    tokens, starts = _split(view, _plain_tokens(view, text.encode()), 0)
    pos = i = 0
    while pos < len(data):
        forced = matcher.forced_tokens()
        trace.append((FORCED, []))
        if forced:
            forced_bytes = view.decode_bytes(forced)
            if not data.startswith(forced_bytes, pos):
                result.reason = f"at byte {pos}: grammar forces {forced_bytes[:60]!r}, text has {data[pos:pos + 60]!r}"
                return result
            if not matcher.consume(forced):
                result.reason = f"forced tokens rejected: {matcher.error}"
                return result
            trace.append((CONSUME, forced))
            pos += len(forced_bytes)
            result.tokens += len(forced)
            result.forced += len(forced)
            if pos in starts:
                i = starts[pos]
            elif pos < len(data):  # the instance's split straddles the span's end: re-split the rest
                tokens, starts = _split(view, _plain_tokens(view, data[pos:]), pos)
                i = 0
                result.resyncs += 1
            continue
        token = tokens[i]
        t0 = time.perf_counter_ns()
        matcher.fill_mask(bitmask, 0)
        result.mask_us.append((time.perf_counter_ns() - t0) / 1e3)
        trace.append((MASK, []))
        if not token_allowed(words, token):
            result.reason = f"at byte {pos}: token {view.decode_bytes([token])!r} not allowed"
            return result
        if not matcher.consume([token]):
            result.reason = f"at byte {pos}: {matcher.error}"
            return result
        trace.append((CONSUME, [token]))
        pos += len(view.decode_bytes([token]))
        i += 1
        result.tokens += 1
    t0 = time.perf_counter_ns()
    matcher.fill_mask(bitmask, 0)
    result.mask_us.append((time.perf_counter_ns() - t0) / 1e3)
    trace.append((MASK, []))
    eos = view.eos_token_id
    result.accepted = matcher.is_accepting() and token_allowed(words, eos)
    if not result.accepted:
        result.reason = "text complete but the grammar is not accepting"
    return result


class RawLLGuidance:
    """llguidance alone, the reference for speed: the same tokenizer object, JSON options and limits as
    the llguidance backend, masks written through a pointer into one preallocated buffer."""

    def __init__(self, view: TokenizerView, backend: GrammarBackend):
        self.tokenizer = view.ll_tokenizer
        self.limits = cast(LLGuidanceBackend, backend).limits  # (made for the llguidance backend only)
        self._overrides = json_overrides
        self.buffer = np.zeros(view.mask_words, dtype=np.int32)
        self._ptr, self._nbytes = self.buffer.ctypes.data, self.buffer.nbytes

    def compile(self, schema: dict[str, Any], options: GrammarOptions) -> tuple[Any, float, float]:
        """(matcher or None when refused, ms to construct it, ms until its first mask is computed)."""
        t0 = time.perf_counter()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=self._overrides(options))
        except Exception:  # noqa: BLE001 - refused: counted, never stops the run
            return None, 0.0, 0.0
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.limits)
        if matcher.is_error():
            return None, 0.0, 0.0
        t1 = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(self._ptr, self._nbytes)
        t2 = time.perf_counter()
        return matcher, (t1 - t0) * 1e3, (t2 - t0) * 1e3

    def replay(self, prototype: Any, trace: list[tuple[str, list[int]]]) -> list[float]:
        """The walk's calls on a copy of ``prototype``; the microseconds of each mask."""
        matcher, ptr, nbytes = prototype.deep_copy(), self._ptr, self._nbytes
        out: list[float] = []
        for op, tokens in trace:
            if op == MASK:
                t0 = time.perf_counter_ns()
                matcher.unsafe_compute_mask_ptr(ptr, nbytes)
                out.append((time.perf_counter_ns() - t0) / 1e3)
            elif op == FORCED:
                matcher.compute_ff_tokens()
            elif not matcher.consume_tokens(tokens):
                break
        return out

    def every_position(self, prototype: Any, trace: list[tuple[str, list[int]]]) -> list[float]:
        """A plain walk over the tokens the walk consumed: a mask before every token and one at the end."""
        matcher, ptr, nbytes = prototype.deep_copy(), self._ptr, self._nbytes
        out: list[float] = []
        for token in (t for op, tokens in trace if op == CONSUME for t in tokens):
            t0 = time.perf_counter_ns()
            matcher.unsafe_compute_mask_ptr(ptr, nbytes)
            out.append((time.perf_counter_ns() - t0) / 1e3)
            if not matcher.consume_token(token):
                return out
        t0 = time.perf_counter_ns()
        matcher.unsafe_compute_mask_ptr(ptr, nbytes)
        out.append((time.perf_counter_ns() - t0) / 1e3)
        return out


def _plain_tokens(view: TokenizerView, data: bytes) -> list[int]:
    """``data`` as tokens the grammar can produce: a special-token id (no bytes to the grammar) is spelled byte by byte."""
    out: list[int] = []
    for token in view.encode_bytes(data):
        if view.token_bytes[token] or token == view.eos_token_id:
            out.append(token)
        else:
            text = view.tokenizer.decode([token]).encode()
            out.extend(t for b in text for t in view.encode_bytes(bytes([b])))
    return out


def _split(view: TokenizerView, tokens: list[int], offset: int) -> tuple[list[int], dict[int, int]]:
    """Tokens and {byte offset where token k starts: k}."""
    starts: dict[int, int] = {}
    pos = offset
    for k, token in enumerate(tokens):
        starts[pos] = k
        pos += len(view.decode_bytes([token]))
    return tokens, starts


_COLUMNS = [
    ("schemas", "schemas"), ("compiled", "compiled"), ("refused", "refused"), ("refused_metaschema", "(meta)"),
    ("timed_out", "timeout"), ("crashed", "crash"), ("valid_instances", "valid"), ("invalid_instances", "invalid"),
    ("strict_compiled", "strict"), ("validation_errors", "val.err"), ("lenient_validation_errors", "val.err lenient"),
    ("key_order_errors", "key order"), ("invalidation_errors", "INVAL.ERR"),
    ("post_check_caught", "post-chk"),
    ("accepted_unverifiable", "unverif."),
    ("compile_ms_p50", "comp p50 ms"), ("compile_ms_p99", "comp p99 ms"), ("mask_us_p50", "mask p50 us"),
    ("mask_us_p99", "mask p99 us"), ("mask_us_max", "mask max us"), ("ff_share", "ff share"),
]

# structspec beside raw llguidance (module docstring); ratios are structspec / raw
_SPEED_COLUMNS = [
    ("compile_ms_p50", "comp p50 ms"), ("compile_ms_p90", "p90"), ("compile_ms_p99", "p99"),
    ("raw_compile_ms_p50", "raw comp p50 ms"), ("raw_compile_ms_p90", "p90"), ("raw_compile_ms_p99", "p99"),
    ("compile_ratio_p50", "comp ratio p50"),
    ("mask_us_p50", "mask p50 us"), ("mask_us_p90", "p90"), ("mask_us_p99", "p99"),
    ("raw_mask_us_p50", "raw mask p50 us"), ("raw_mask_us_p90", "p90"), ("raw_mask_us_p99", "p99"),
    ("mask_ratio_p99", "mask ratio p99"), ("mask_overhead_us_p50", "overhead p50 us"),
    ("mask_overhead_us_p99", "p99"), ("mask_time_ratio", "mask time ratio"),
    ("raw_all_mask_us_p50", "raw every pos. p50 us"), ("raw_all_mask_us_p99", "p99"), ("selection_p99", "selection p99"),
]


def format_table(report: dict[str, Any]) -> str:
    """Plain-text tables (rich box drawing, no colour or markup) of the per-split and overall rows:
    coverage, then speed beside raw llguidance when the report has it."""
    title = f"grammar bench: {report['backend']} ({report['elapsed_s']} s)"
    text = _table(title, _COLUMNS, report)
    if report.get("raw_reference"):
        text += _table("speed: structspec beside raw llguidance (same schemas, tokenizer and positions)",
                       _SPEED_COLUMNS, report)
    return text


def _table(title: str, columns: list[tuple[str, str]], report: dict[str, Any]) -> str:
    table = Table(title=title, title_justify="left")
    table.add_column("split")
    for _, header in columns:
        table.add_column(header, justify="right")
    rows = list(report["splits"].items()) + [("overall", report["overall"])]
    for i, (name, row) in enumerate(rows):
        table.add_row(name, *(_cell(row.get(key)) for key, _ in columns), end_section=i == len(rows) - 2)
    buffer = StringIO()
    Console(file=buffer, width=240, color_system=None, force_terminal=False).print(table)
    return buffer.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 1 else f"{value:.1f}"
    return str(value)
