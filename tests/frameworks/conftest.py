"""A real structspec server for the frameworks' own tests, and the count of model requests an agent loop made.

- *Server*: ``StructSpecServer`` with its gRPC port and its OpenAI-compatible HTTP port, in a background thread
  (``tests.service.harness.ServerThread``), started once per test module. ``demo_server`` serves the demo pair (fast;
  trained on the plain prompt format); ``smollm2_server`` serves SmolLM2-135M-Instruct's GGUF on llama.cpp (a real
  instruct model with a ChatML template, for the agent loops, which need a model that reads a tool's result).
- *Model request*: one ``POST /v1/chat/completions`` or ``POST /v1/responses`` the server finished, counted from
  its own ``structspec_requests_total`` metric, so a framework is called unchanged (no transport of ours in between)
  and every request it sends is counted, retries included. A *turn* of an agent loop is one model request.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import need_llamacpp, smollm2_gguf
from tests.frameworks.tools import RUNS
from tests.service.harness import ServerThread, settings_for

# LiteLLM fetches its model price map from GitHub at import unless told to read its bundled copy (no network here).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL_ROUTES = ("POST /v1/chat/completions", "POST /v1/responses")
MAX_TURNS = 4  # the bound: an agent loop ends with a text answer within 4 model requests


@dataclass
class Served:
    """A running server and the name it serves its model under."""

    thread: ServerThread
    model: str

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (what ``OpenAI(base_url=...)`` takes)."""
        server = self.thread.server
        assert server is not None and server.http_port is not None
        return f"http://127.0.0.1:{server.http_port}/v1"

    def finished(self) -> Counter[tuple[str, str, str]]:
        """Model requests finished so far, by (route, status code, finish reason)."""
        server = self.thread.server
        assert server is not None
        counts: Counter[tuple[str, str, str]] = Counter()
        for metric in server.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == "structspec_requests_total" and sample.labels["rpc"] in MODEL_ROUTES:
                    key = (sample.labels["rpc"], sample.labels["code"], sample.labels["finish_reason"])
                    counts[key] += int(sample.value)
        return counts

    def turns(self) -> Turns:
        return Turns(self, self.finished(), len(RUNS))


@dataclass
class Turns:
    """The model requests made since it was taken (``served.turns()``): ``count``, their routes and codes, and the
    tools run meanwhile. (The metric's finish reason is the engine's: a tool-call answer is "stop" there too, so
    whether the loop ended in text is read from what the framework returned.)"""

    served: Served
    before: Counter[tuple[str, str, str]]
    runs_before: int

    def since(self) -> Counter[tuple[str, str, str]]:
        now = self.served.finished()
        now.subtract(self.before)
        return +now  # drop zero entries

    @property
    def count(self) -> int:
        return sum(self.since().values())

    @property
    def tools_run(self) -> list[str]:
        return RUNS[self.runs_before:]

    def assert_loop(self, max_turns: int = MAX_TURNS) -> None:
        """A tool ran, then the model answered: 2..max_turns model requests, all OK (the caller checks that the
        framework's final result is the text or the value it asked for)."""
        since = self.since()
        assert self.tools_run, f"no tool ran: {dict(since)}"
        assert 2 <= self.count <= max_turns, f"{self.count} model requests, tools {self.tools_run}: {dict(since)}"
        assert all(code == "OK" for (_, code, _) in since), dict(since)


def _serve(tmp: Path, models, name: str, compiler=None) -> Iterator[Served]:
    from structspec.assembly import AssemblyConfig, assemble_engine
    from structspec.engine.config import SchedulerLimits

    settings = settings_for(tmp, http_port=0, served_model_name=name)
    engine = assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(max_batch=4, max_queue=32),
                                                    compiler=compiler))
    with ServerThread(settings, engine) as st:
        yield Served(st, name)


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory, demo_models, demo_compiler) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("frameworks-demo"), demo_models, "demo", demo_compiler)


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory) -> Iterator[Served]:
    need_llamacpp()
    from structspec.models.loading import load_profile

    models = load_profile(str(smollm2_gguf()), executor="llamacpp")
    yield from _serve(tmp_path_factory.mktemp("frameworks-smollm2"), models, "smollm2")
