"""Shared pytest fixtures (imported by the conftest of tests/service and tests/client)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from structspec.client import NO_RETRY, Client
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, make_certs, settings_for


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def served(tmp_path: Path, engine: FakeEngine) -> Iterator[ServerThread]:
    with ServerThread(settings_for(tmp_path), engine) as st:
        yield st


@pytest.fixture
def client(served: ServerThread) -> Iterator[Client]:
    with Client(served.target, retry=NO_RETRY, timeout=20) as c:
        yield c


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found")
    return make_certs(tmp_path_factory.mktemp("certs"))
