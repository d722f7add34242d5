"""The fast subset's list is derived from measured durations (``tests/slow_tests.py``)."""

from __future__ import annotations

from tests.slow_tests import is_listed, measured

LOG = """
============================= slowest durations ==============================
160.02s setup    tests/draft/test_align.py::test_aligned_draft_accepts_more
2.50s call     tests/engine/test_exactness.py::test_broken_verifier_fails[greedy]
0.90s call     tests/engine/test_exactness.py::test_broken_verifier_fails[sampled]
1.00s call     tests/grammar/test_tools.py::test_single_call
0.20s setup    tests/grammar/test_tools.py::test_single_call
0.40s teardown tests/grammar/test_tools.py::test_single_call
0.10s call     tests/grammar/test_tools.py::test_parallel_calls
3.00s call     tests/draft/test_align.py::test_other
"""


def test_modules_with_costly_setups_then_tests_by_their_own_time():
    modules, tests = measured(LOG.splitlines())
    assert modules == ["tests/draft/test_align.py"]
    # a parametrized test's cases add up; setup, call and teardown add up; a slow module's tests are not listed again
    assert tests == ["tests/engine/test_exactness.py::test_broken_verifier_fails",
                     "tests/grammar/test_tools.py::test_single_call"]


def test_a_listed_module_or_test_marks_every_case():
    modules, tests = {"tests/draft/test_align.py"}, {"tests/engine/test_exactness.py::test_broken_verifier_fails"}
    assert is_listed("tests/draft/test_align.py::test_x[1]", modules, tests)
    assert is_listed("tests/engine/test_exactness.py::test_broken_verifier_fails[greedy]", modules, tests)
    assert not is_listed("tests/engine/test_exactness.py::test_broken_verifier_fails_not", modules, tests)
    assert not is_listed("tests/grammar/test_tools.py::test_single_call", modules, tests)
