"""The typer sub-commands (``cli_serve``, ``cli_client``), mounted on a bare app the way the main CLI mounts them."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from structspec import cli_client, cli_serve
from structspec.service.server import EngineUnavailable, load_factory
from structspec.service.settings import SECRET_FIELDS, settings_fields
from tests.service.harness import ServerThread

runner = CliRunner()


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()

    @app.command("version")  # a command of the main CLI
    def version() -> None:
        typer.echo("0")

    cli_serve.register(app)
    cli_client.register(app)
    return app


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_commands_registered(app: typer.Typer) -> None:
    out = plain(runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output)
    for name in ("serve", "health", "extract", "call-tool", "schemas", "loadtest", "version"):
        assert name in out
    out = plain(runner.invoke(app, ["schemas", "--help"], env={"COLUMNS": "200"}).output)
    for name in ("list", "show", "register", "delete", "set-speculation", "stats"):
        assert name in out


def test_client_commands_share_the_connection_options(app: typer.Typer) -> None:
    root = typer.main.get_command(app)

    def options(*path: str) -> dict:
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        return {p.name: p for p in command.params}

    for path in (["extract"], ["call-tool"], ["schemas", "list"], ["schemas", "show"]):
        assert set(cli_client.CALL) <= set(options(*path)) and "admin_token_file" not in options(*path), path
    # the admin token reads every schema's statistics, another token the registered schemas' alone
    assert set(cli_client.CALL) | {"admin_token_file"} <= set(options("schemas", "stats"))
    for path in (["schemas", "register"], ["schemas", "delete"], ["schemas", "set-speculation"]):
        assert set(cli_client.ADMIN_CALL) <= set(options(*path)) and "token_file" not in options(*path), path
    assert {"target", "tls", "ca_file", "cert_file", "key_file", "timeout"} <= set(options("health"))
    assert options("health")["timeout"].default == 3.0 and options("extract")["timeout"].default is None
    assert options("loadtest")["target"].default == "127.0.0.1:50051" and "tls" not in options("loadtest")
    target = options("extract")["target"]
    assert target.opts == ["--target", "-t"] and target.envvar == "STRUCTSPEC_TARGET" and target.default == "localhost:50051"
    for path in (["health"], ["extract"], ["schemas", "delete"], ["loadtest"]):
        assert options(*path)["target"].help == target.help, path


def test_connection_reads_tokens_and_implies_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRUCTSPEC_TOKEN", "from-env")
    monkeypatch.delenv("STRUCTSPEC_ADMIN_TOKEN", raising=False)
    (tmp_path / "admin").write_text("from-file\n")
    conn = cli_client.Connection(admin_token_file=tmp_path / "admin")
    assert (conn.token(), conn.admin_token(), conn.use_tls) == ("from-env", "from-file", False)
    assert cli_client.Connection(ca_file=tmp_path / "ca.pem").use_tls and cli_client.Connection(tls=True).use_tls


def test_serve_help_documents_every_setting(app: typer.Typer) -> None:
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "250"})
    out = plain(result.output)
    assert result.exit_code == 0
    for f in settings_fields():
        if f.name in SECRET_FIELDS:
            assert f"--{f.name.replace('_', '-')} " not in out
            continue
        assert f"--{f.name.replace('_', '-')}" in out, f.name
        assert f"STRUCTSPEC_{f.name.upper()}" in out, f.name
    assert "--config" in out and "STRUCTSPEC_AUTH_TOKEN" in out


def test_serve_rejects_bad_settings(app: typer.Typer) -> None:
    result = runner.invoke(app, ["serve", "--device", "tpu", "--port", "0"])
    assert result.exit_code == 2 and "device" in result.output


def test_missing_engine_module_is_a_clear_error() -> None:
    with pytest.raises(EngineUnavailable, match="no_such_pkg.engine"):
        load_factory("no_such_pkg.engine:build_engine")
    with pytest.raises(EngineUnavailable, match="module:function"):
        load_factory("no-colon")
    assert load_factory("tests.service.fakes:make_fake_engine").__name__ == "make_fake_engine"


def test_a_build_without_the_engine_is_a_clear_error_at_the_composition_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "structspec.assembly", None)  # import of it fails as a missing module would
    with pytest.raises(EngineUnavailable, match="not available in this build.*--engine-factory"):
        cli_serve.assembly_engine(object())


def test_client_commands(app: typer.Typer, served: ServerThread, tmp_path: Path) -> None:
    t = ["--target", served.target]
    ok = lambda args, **kw: runner.invoke(app, args + t, **kw)  # noqa: E731
    served.engine.store = served.server.store  # type: ignore[union-attr]  # record statistics like the real engine

    r = ok(["health"])
    assert r.exit_code == 0 and "SERVING" in r.output
    r = ok(["extract", "--text", "Ada", "-s", "contact"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["email"] == "ada@example.com"  # the value alone on stdout
    assert r.stderr.strip() == "model fake: drafted (drafted); draft_model: drafted (up to 8)"  # why, on stderr
    r = ok(["extract", "-s", "contact", "--text-file", "-", "--speculation", "off"], input="from stdin")
    assert r.exit_code == 0 and json.loads(r.stdout)
    assert r.stderr.strip() == "model fake: no drafting (request_off); draft_model: request_off"
    r = ok(["extract", "--text", "Ada", "-s", "contact", "--stream", "--full"])
    assert r.exit_code == 0 and '"outcome": "valid"' in r.stdout and '"reason": "drafted"' in r.stdout
    assert "model fake: drafted" in r.stderr
    r = ok(["extract", "--text", "x", "-s", "nope"])
    assert r.exit_code == 1 and "NOT_FOUND" in r.output
    r = ok(["extract", "--text", "[length]", "-s", "contact"])
    assert r.exit_code == 3 and "partial output" in r.output

    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"q": {"type": "integer"}}}))
    r = ok(["schemas", "register", "cli-schema", str(schema), "--description", "from the cli"])
    assert r.exit_code == 0 and "cli-schema@1 registered" in r.output
    r = ok(["schemas", "register", "cli-schema", str(schema)])
    assert "unchanged" in r.output
    r = ok(["schemas", "list", "--json"])
    assert {"cli-schema", "invoice"} <= {s["schema_id"] for s in json.loads(r.output)}
    r = ok(["schemas", "list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "cli-schema" in r.output
    r = ok(["schemas", "show", "cli-schema"])
    assert json.loads(r.output)["schema"]["properties"]["q"]["type"] == "integer"
    r = ok(["extract", "--text", "x", "--schema-file", str(schema)])
    assert json.loads(r.stdout) == {"q": 1}
    ok(["extract", "--text", "x", "-s", "cli-schema"])
    r = ok(["schemas", "set-speculation", "cli-schema", "off"])
    assert r.exit_code == 0 and "cli-schema@1 speculation off" in r.output
    r = ok(["extract", "--text", "x", "-s", "cli-schema"])
    assert "no drafting (schema_off)" in r.stderr
    r = ok(["schemas", "set-speculation", "cli-schema", "sometimes"])
    assert r.exit_code == 2 and "auto, off, on" in r.output
    r = ok(["schemas", "set-speculation", "cli-schema", "on", "--version", "7"])
    assert r.exit_code == 1 and "NOT_FOUND" in r.output
    r = ok(["schemas", "list", "--json"])
    assert {s["schema_id"]: s["speculation"] for s in json.loads(r.stdout)}["cli-schema"] == "off"
    r = ok(["schemas", "stats", "cli-schema", "--json"])
    assert r.exit_code == 0, r.output
    (entry,) = json.loads(r.stdout)
    assert (entry["schema_key"], entry["model"]) == ("cli-schema@1", "fake")
    day = entry["windows"]["86400"]
    assert day["requests"] == 2 and day["proposers"][0]["proposer"] == "draft_model"
    assert day["output_length"][-1]["upper_bound"] == "inf"  # strict JSON: no Infinity
    r = ok(["schemas", "stats", "cli-schema"], env={"COLUMNS": "250"})
    out = plain(r.output)
    assert r.exit_code == 0 and "cli-schema@1 on fake: requests" in out and "cli-schema@1 on fake: drafting" in out
    assert "schema_off" in out and "(request)" in out and "stop 2" in out and "1.00" in out
    r = ok(["schemas", "stats", "--model", "fake"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "contact@1 on fake: requests" in plain(r.output)
    r = ok(["schemas", "stats", "--model", "nobody"])
    assert r.exit_code == 0 and "no statistics recorded" in r.output
    r = ok(["schemas", "delete", "cli-schema", "-y"])
    assert r.exit_code == 0 and "deleted cli-schema versions 1" in r.output

    examples = tmp_path / "examples.json"
    examples.write_text(json.dumps([{"text": "Bo Li, CTO at Acme (Oslo, Norway), bo@acme.no, +47 22 33 44 55", "output": {
        "name": "Bo Li", "email": "bo@acme.no", "phone": "+47 22 33 44 55", "company": "Acme", "job_title": "CTO",
        "city": "Oslo", "country": "Norway", "preferred_channel": "email"}}]))
    r = ok(["extract", "--text", "Ada", "-s", "contact", "--examples-file", str(examples)])
    assert r.exit_code == 0, r.output
    examples.write_text(json.dumps([{"text": "Bo", "output": {"name": 7}}]))  # not a contact: the server says so
    r = ok(["extract", "--text", "Ada", "-s", "contact", "--examples-file", str(examples)])
    assert r.exit_code == 1 and "INVALID_ARGUMENT" in r.output and "examples[0].output_json" in r.output
    examples.write_text(json.dumps({"text": "Bo"}))
    r = ok(["extract", "--text", "Ada", "-s", "contact", "--examples-file", str(examples)])
    assert r.exit_code == 2 and "expected a JSON list" in r.output

    r = ok(["call-tool", "-m", "user: weather in Oslo?"])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout)
    assert answer["calls"][0]["name"] == "get_weather" and answer["model"] == "fake"
    assert answer["speculation"]["drafted"] and answer["speculation"]["reason"] == "drafted"


def test_wait_holds_a_command_until_the_server_is_serving(app: typer.Typer, tmp_path: Path) -> None:
    """A server that listens while it loads its model answers UNAVAILABLE; --wait first waits for SERVING."""
    import asyncio
    import threading
    import time

    from tests.service.fakes import FakeEngine
    from tests.service.harness import settings_for

    with ServerThread(settings_for(tmp_path), None) as st:
        gave_up = runner.invoke(app, ["extract", "--target", st.target, "-s", "contact", "--text", "x", "--wait", "0.6"])
        assert gave_up.exit_code == 1 and "not SERVING after 0.6 s (NOT_SERVING)" in gave_up.output

        def slow_factory(settings: object) -> FakeEngine:
            time.sleep(1.0)
            return FakeEngine()

        threading.Timer(0.2, lambda: asyncio.run_coroutine_threadsafe(
            st.server.load_engine(slow_factory), st.loop)).start()  # type: ignore[union-attr]
        started = time.monotonic()
        done = runner.invoke(app, ["extract", "--target", st.target, "-s", "contact", "--text", "x", "--wait", "20"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout) and time.monotonic() - started >= 1.0
