"""LoadDraft through the real server, client and CLI: a draft swapped under gRPC load, every response naming the draft
version that served it; the admin token; clear statuses for bad folders and for servers that take no draft."""

from __future__ import annotations

import json
from dataclasses import replace
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from structspec import cli_client
from structspec.assembly import AssemblyConfig, assemble_engine, engine_model_key
from structspec.bench.workloads import build_workload
from structspec.client import (Client, FailedPreconditionError, InvalidArgumentError, NO_RETRY,
                               PermissionDeniedError)
from structspec.engine.config import SchedulerLimits
from structspec.engine.types import FinishReason, GenerationResult, Outcome, Timings, Usage
from structspec.models.loading import weights_version
from structspec.service.http import render
from structspec.service.settings import Secret
from structspec.speculation.configs import ProposerSet, speculation_config
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for
from tests.speculation.test_draft_swap import perturbed_draft

ADMIN, USER = "admin-secret", "user-token"
FIRST, SECOND = 8, 4


@pytest.fixture(scope="module")
def second_draft(tmp_path_factory) -> Path:
    return perturbed_draft(tmp_path_factory.mktemp("drafts") / "draft-b", seed=1)


def _settings(tmp: Path):
    tokens = tmp / "tokens"
    tokens.write_text(USER + "\n")
    return settings_for(tmp, auth_token_file=tokens, admin_token=Secret(ADMIN))


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_models, demo_compiler):
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=32, max_queue=128),
                             proposers=speculation_config("all").proposers, compiler=demo_compiler))
    srv = ServerThread(_settings(tmp_path_factory.mktemp("load-draft")), engine).start()
    yield srv
    srv.stop()


def test_a_draft_loaded_under_grpc_load_serves_the_requests_after_it(server, demo_models, second_draft):
    engine = server.engine
    old = (demo_models.draft_version, engine_model_key(demo_models))
    new = (weights_version(second_draft), engine_model_key(replace(demo_models, draft_version=weights_version(second_draft))))
    items = build_workload("freetext", FIRST + SECOND)
    with Client(server.target, token=USER, admin_token=ADMIN) as client, ThreadPoolExecutor(FIRST + SECOND) as pool:
        def extract(i: int):
            return client.extract_result(items[i].source, schema=items[i].schema, max_tokens=64,
                                         request_id=f"load-{i}")

        first = [pool.submit(extract, i) for i in range(FIRST)]
        admitted: set[str] = set()
        deadline = time.monotonic() + 120
        while len(admitted) < FIRST:  # every first-wave request admitted, so bound to the draft serving now
            admitted |= {s.request_id for s in list(engine.core.scheduler.running)}
            assert time.monotonic() < deadline and not any(f.done() and f.exception() for f in first), admitted
            time.sleep(0.002)
        swap = client.load_draft(str(second_draft))
        in_flight = engine.running()
        second = [pool.submit(extract, i) for i in range(FIRST, FIRST + SECOND)]
        results = [f.result() for f in first + second]  # none fails
    assert swap.loaded and (swap.draft_version, swap.model) == new
    assert (swap.previous_draft_version, swap.previous_model) == old
    assert in_flight > 0, "the first wave finished before the swap: nothing was swapped under load"
    for i, res in enumerate(results):
        assert res.finish_reason in ("stop", "length"), res
        assert (res.draft_version, res.model) == (old if i < FIRST else new), (i, res.request_id)

    again = client_call(server, lambda c: c.load_draft(str(second_draft)))  # the version serving: a no-op
    assert not again.loaded and (again.draft_version, again.model) == new == (engine.draft_version, engine.model_key)

    app = typer.Typer()
    cli_client.register(app)
    r = CliRunner().invoke(app, ["load-draft", str(second_draft), "--target", server.target],
                           env={"STRUCTSPEC_ADMIN_TOKEN": ADMIN})
    assert r.exit_code == 0 and f"draft {new[0]} is serving already: model {new[1]}" in r.output, r.output
    r = CliRunner().invoke(app, ["load-draft", "/no/such/draft", "--target", server.target],
                           env={"STRUCTSPEC_ADMIN_TOKEN": ADMIN})
    assert r.exit_code != 0 and "INVALID_ARGUMENT" in r.output and "/no/such/draft" in r.output, r.output


def client_call(server, fn, **kwargs):
    with Client(server.target, token=USER, admin_token=ADMIN, retry=NO_RETRY, **kwargs) as client:
        return fn(client)


def test_bad_folders_and_non_admins_get_clear_statuses(server, tmp_path, second_draft):
    serving = server.engine.draft_version  # whichever draft an earlier test left (the module's server is shared)
    with Client(server.target, token=USER, retry=NO_RETRY) as user:
        with pytest.raises(PermissionDeniedError) as err:
            user.load_draft(str(second_draft))
    assert err.value.reason == "ADMIN_TOKEN_REQUIRED"
    other = shutil.copytree(second_draft, tmp_path / "other-tokenizer")
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["Ġw"], vocab["ĠS"] = vocab["ĠS"], vocab["Ġw"]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    for path, words in (("", "required"), (str(tmp_path / "missing"), "not a folder"),
                        (str(tmp_path), "no config.json"), (str(other), "does not share the tokenizer")):
        with pytest.raises(InvalidArgumentError) as err:
            client_call(server, lambda c, path=path: c.load_draft(path))
        assert [v.field for v in err.value.field_violations] == ["path"] and words in str(err.value), (path, err.value)
    assert server.engine.draft_version == serving  # nothing changed


@pytest.mark.parametrize("kind", ["fake", "no_draft"])
def test_servers_that_take_no_draft_say_so(tmp_path, demo_models, demo_compiler, second_draft, kind):
    engine = (FakeEngine() if kind == "fake" else
              assemble_engine(demo_models, AssemblyConfig(proposers=ProposerSet(draft=False), compiler=demo_compiler)))
    with ServerThread(_settings(tmp_path), engine) as srv:
        with pytest.raises(FailedPreconditionError) as err:
            client_call(srv, lambda c: c.load_draft(str(second_draft)))
    assert err.value.reason == "DRAFT_UNSUPPORTED" and "draft" in str(err.value)


def test_the_http_usage_names_the_model_and_draft_version():
    result = GenerationResult("r", "{}", [], FinishReason.STOP, Outcome.VALID, Usage(), Timings(),
                              model_key="demo+draft:abc", draft_version="abc")
    ext = render.usage(result, "contact@1")[render.EXTENSION]
    assert (ext["model_key"], ext["draft_version"]) == ("demo+draft:abc", "abc")
    assert "model_key" not in render.usage_extension(GenerationResult("r", "{}", [], FinishReason.STOP, Outcome.VALID,
                                                                      Usage(), Timings()), None)
