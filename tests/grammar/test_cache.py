"""The compiled-grammar cache: identity, LRU bound, one compile per key under concurrency, cached refusals."""

from __future__ import annotations

import threading
import time

import pytest

from structspec.grammar import (
    GrammarCompiler,
    GrammarOptions,
    SchemaError,
    make_backend,
)
from structspec.grammar.cache import GrammarCache, canonical_json, schema_digest
from structspec.grammar.tools import ToolSet


class CountingBackend:
    """Wraps a real backend; counts (and can slow down) compiles."""

    def __init__(self, inner, delay_s: float = 0.0):
        self.inner = inner
        self.name = inner.name
        self.delay_s = delay_s
        self.compiles = 0
        self._lock = threading.Lock()

    def compile_json_schema(self, schema, options):
        with self._lock:
            self.compiles += 1
        time.sleep(self.delay_s)
        return self.inner.compile_json_schema(schema, options)

    def compile_text_or_json(self, schema, allow_text, options):
        with self._lock:
            self.compiles += 1
        return self.inner.compile_text_or_json(schema, allow_text, options)


@pytest.fixture
def counting(view):
    return CountingBackend(make_backend("llguidance", view))


def schema(n: int) -> dict:
    return {"type": "object", "properties": {f"field{n}": {"type": "integer"}}, "required": [f"field{n}"]}


def test_same_key_same_object(view, counting):
    compiler = GrammarCompiler(view, backend=counting)
    first = compiler.compile_schema(schema(1))
    assert compiler.compile_schema({"required": ["field1"], "type": "object",
                                    "properties": {"field1": {"type": "integer"}}}) is first  # key order irrelevant
    assert counting.compiles == 1
    assert compiler.compile_schema(schema(1), GrammarOptions(whitespace="flexible")) is not first  # options in key
    assert compiler.cache.stats.hits == 1 and compiler.cache.stats.misses == 2


def test_a_digest_the_caller_brings_is_the_key_it_would_compute(view, counting):
    """The front hashes a schema once and hands the digest on: the same entry as the compiler's own key."""
    compiler = GrammarCompiler(view, backend=counting)
    first = compiler.compile_schema(schema(1))
    assert compiler.compile_schema(schema(1), digest=schema_digest(schema(1))) is first
    assert counting.compiles == 1 and compiler.cache.stats.hits == 1


def test_property_order_is_part_of_the_key():
    a = {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "string"}}}
    b = {"type": "object", "properties": {"y": {"type": "string"}, "x": {"type": "string"}}}
    assert canonical_json(a) != canonical_json(b)
    assert canonical_json(a) == canonical_json({"properties": a["properties"], "type": "object"})


def test_lru_bound(view, counting):
    compiler = GrammarCompiler(view, backend=counting, cache_size=2)
    one = compiler.compile_schema(schema(1))
    compiler.compile_schema(schema(2))
    assert compiler.compile_schema(schema(1)) is one  # refreshes 1: 2 is now the oldest
    compiler.compile_schema(schema(3))
    assert len(compiler.cache) == 2 and compiler.cache.stats.evictions == 1
    assert compiler.compile_schema(schema(1)) is one
    compiler.compile_schema(schema(2))  # evicted: compiled again
    assert counting.compiles == 4


def test_concurrent_compiles_of_one_key_happen_once(view):
    slow = CountingBackend(make_backend("llguidance", view), delay_s=0.2)
    compiler = GrammarCompiler(view, backend=slow)
    start = threading.Barrier(8)
    results = []

    def request():
        start.wait()
        results.append(compiler.compile_schema(schema(7)))

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slow.compiles == 1
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_failures_are_cached_with_their_reason(view, counting):
    compiler = GrammarCompiler(view, backend=counting)
    bad = {"type": "string", "pattern": "^$a"}  # an anchor mid-pattern: RE2 takes it, llguidance refuses it
    with pytest.raises(SchemaError) as first:
        compiler.compile_schema(bad)
    with pytest.raises(SchemaError) as second:
        compiler.compile_schema(bad)
    assert second.value is first.value and first.value.kind == "unsupported"
    assert counting.compiles == 1 and compiler.cache.stats.failures == 1


def test_crashes_are_not_cached():
    cache = GrammarCache(4)
    calls = []

    def crash():
        calls.append(1)
        raise RuntimeError("boom")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            cache.get_or_compile("k", crash)
    assert len(calls) == 2 and len(cache) == 0


def test_tool_grammars_are_cached(view, counting):
    compiler = GrammarCompiler(view, backend=counting)
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}]
    required, auto = ToolSet.parse(tools, "required"), ToolSet.parse(tools, "auto")
    assert compiler.compile_tools(required) is compiler.compile_tools(ToolSet.parse(tools, "required"))
    assert compiler.compile_tools(auto) is not compiler.compile_tools(required)
    assert counting.compiles == 2


def test_observers_hear_each_compile_and_every_wait(view):
    slow = CountingBackend(make_backend("llguidance", view), delay_s=0.2)
    compiler = GrammarCompiler(view, backend=slow)
    heard: list[tuple[str, float]] = []
    compiler.cache.observers.append(lambda kind, s: heard.append((kind, s)))
    compiler.cache.observers.append(lambda kind, s: 1 / 0)  # a broken observer changes nothing
    start = threading.Barrier(3)
    threads = [threading.Thread(target=lambda: (start.wait(), compiler.compile_schema(schema(3)))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    compiler.compile_schema(schema(3))  # cached
    compiles = [s for k, s in heard if k == "compile"]
    waits = sorted(s for k, s in heard if k == "wait")
    assert len(compiles) == 1 and compiles[0] >= 0.2
    assert len(waits) == 4 and waits[0] < 0.05 and all(w >= 0.15 for w in waits[1:])  # the waiters waited too
