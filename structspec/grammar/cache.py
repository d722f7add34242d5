"""A bounded LRU of compiled grammars (and of refusals), compiling each key once.

Keys come from ``cache_key``: the digest of the canonical schema text, the tokenizer fingerprint,
the backend and the options. Concurrent requests for a key being compiled wait
for that compile instead of starting their own. ``observers`` are told each compile's
seconds (``"compile"``) and how long each request waited for its grammar (``"wait"``:
about 0 for a cached one). A ``SchemaError`` is cached like
a grammar and re-raised (the same object) on every later request; any other
exception is a crash, not a property of the schema, and is not cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import astuple, dataclass
from typing import Any

from structspec.grammar.base import CompiledGrammar, GrammarOptions, SchemaError, SchemaIssue
from structspec.json_limits import MAX_JSON_DEPTH, TooDeep, value_too_deep

log = logging.getLogger(__name__)
Observer = Callable[[str, float], None]  # ("compile" | "wait", seconds)


def canonical_json(value: Any) -> str:
    """Sorted-keys compact JSON, except that ``properties`` maps keep their order.

    Property order is part of the grammar (properties are generated in schema order),
    so two schemas that differ only there must not share a cache entry.
    """
    return json.dumps(_canonical(value), separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any, ordered: bool = False) -> Any:
    if isinstance(value, dict):
        items = value.items() if ordered else sorted(value.items())
        return {k: _canonical(v, ordered=(k == "properties" and isinstance(v, dict))) for k, v in items}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def caller_canonical_json(value: Any, at: str = "") -> str:
    """``canonical_json`` of a caller's value (a schema; a tool list ``at`` its pointer in the request), its nesting
    bounded first (canonical JSON recurses): the levels above ``at`` count against ``MAX_JSON_DEPTH``.
    Raises: SchemaError (too_deep, pointing into the request; invalid_schema: not JSON, pointing at ``at``)."""
    pointer = value_too_deep(value, MAX_JSON_DEPTH - at.count("/"))
    if pointer is not None:
        pointer = at + pointer
        raise SchemaError([SchemaIssue(pointer, "", f"schema {TooDeep(pointer, MAX_JSON_DEPTH)}")], kind="too_deep")
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise SchemaError([SchemaIssue(at, "", f"not JSON: {exc}")], kind="invalid_schema") from exc


def text_digest(canonical: str) -> str:
    """SHA-256 of a canonical JSON text (``schema_digest`` of the value it spells)."""
    return hashlib.sha256(canonical.encode()).hexdigest()


def schema_digest(value: Any) -> str:
    """SHA-256 of the canonical JSON of a schema (or tool list): the same content, the same digest."""
    return text_digest(canonical_json(value))


def cache_key(kind: str, digest: str, fingerprint: str, backend: str, options: GrammarOptions) -> str:
    """``digest``: the ``schema_digest`` of the schema (or tool list)."""
    return hashlib.sha256(json.dumps([kind, digest, fingerprint, backend, list(astuple(options))]).encode()).hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0  # each one compiled (waiters on an in-flight compile count as hits)
    failures: int = 0  # compiles that raised SchemaError (cached)
    evictions: int = 0


class GrammarCache:
    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self.stats = CacheStats()
        self._entries: OrderedDict[str, CompiledGrammar | SchemaError] = OrderedDict()
        self._inflight: dict[str, Future[CompiledGrammar | SchemaError]] = {}
        self._lock = threading.Lock()
        self.observers: list[Observer] = []

    def _tell(self, kind: str, seconds: float) -> None:
        for observe in list(self.observers):
            try:
                observe(kind, seconds)
            except Exception:  # noqa: BLE001 - an observer's bug never fails a compile
                log.exception("grammar cache observer failed")

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_compile(self, key: str, compile: Callable[[], CompiledGrammar]) -> CompiledGrammar:
        started = time.perf_counter()
        try:
            return self._get_or_compile(key, compile)
        finally:
            self._tell("wait", time.perf_counter() - started)

    def _get_or_compile(self, key: str, compile: Callable[[], CompiledGrammar]) -> CompiledGrammar:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return _unwrap(self._entries[key])
            future = self._inflight.get(key)
            owner = future is None
            if future is None:
                future = self._inflight[key] = Future()
                self.stats.misses += 1
            else:
                self.stats.hits += 1
        if not owner:
            return _unwrap(future.result())
        compiling = time.perf_counter()
        try:
            result: CompiledGrammar | SchemaError = compile()
        except SchemaError as exc:
            result = exc
        except BaseException as exc:
            with self._lock:
                del self._inflight[key]
            future.set_exception(exc)
            raise
        self._tell("compile", time.perf_counter() - compiling)
        with self._lock:
            del self._inflight[key]
            if isinstance(result, SchemaError):
                self.stats.failures += 1
            if self.capacity > 0:
                self._entries[key] = result
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
                    self.stats.evictions += 1
        future.set_result(result)
        return _unwrap(result)


def _unwrap(entry: CompiledGrammar | SchemaError) -> CompiledGrammar:
    if isinstance(entry, SchemaError):
        raise entry.with_traceback(None)  # the same error each time, without piling up tracebacks
    return entry
