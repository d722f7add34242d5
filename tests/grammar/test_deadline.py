"""Compiles under a deadline: workers are kept between compiles, an abandoned one never answers another caller."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from structspec.grammar import deadline
from structspec.grammar.base import SchemaError


def test_sequential_compiles_reuse_one_worker(monkeypatch):
    deadline.run_with_deadline(lambda: None, 1.0)  # a worker exists and is idle
    started = []
    original = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name) or original(self))
    assert [deadline.run_with_deadline(lambda i=i: i * i, 1.0) for i in range(20)] == [i * i for i in range(20)]
    assert started == []


def test_concurrent_compiles_each_get_their_own_answer():
    def square(i: int) -> int:
        time.sleep(0.01)  # several workers busy at once
        return i * i

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: deadline.run_with_deadline(lambda: square(i), 5.0), range(40))) == [
            i * i for i in range(40)]
    assert len(deadline._idle) <= deadline.IDLE_WORKERS


def test_an_abandoned_compile_finishes_apart_and_answers_no_one():
    release = threading.Event()
    before = deadline.abandoned()
    with pytest.raises(SchemaError) as info:
        deadline.run_with_deadline(lambda: release.wait(5) and "late", 0.05)
    assert info.value.kind == "timeout" and deadline.abandoned() == before + 1
    assert [deadline.run_with_deadline(lambda i=i: i, 1.0) for i in range(5)] == list(range(5))  # another worker
    release.set()
    for _ in range(100):
        if deadline.abandoned() == before:
            break
        time.sleep(0.01)
    assert deadline.abandoned() == before
    assert deadline.run_with_deadline(lambda: "fresh", 1.0) == "fresh"
