"""Tenants: with auth tokens configured each bearer token is a tenant. What one tenant's requests tell another: the
prefix cache reuses another tenant's prompt only as far as the public template (what ``cached_prompt_tokens``
counts, on gRPC and HTTP), and the statistics RPCs show a tenant registered schemas' statistics alone (the admin
token reads every key; without tokens there is one tenant)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner

from structspec.cli import app
from structspec.client import NO_RETRY, Client, PermissionDeniedError
from structspec.service.settings import Secret
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

TOKENS = "alice-token\nbob-token\ncarol-token\n"
INLINE = '{"type": "object", "properties": {"secret_field": {"type": "string"}}, "required": ["secret_field"]}'
TOOL = [{"name": "lookup", "parameters": {"type": "object"}}]
runner = CliRunner()


def _tenant_settings(tmp_path: Path, **overrides):
    (tmp_path / "tokens").write_text(TOKENS)
    return settings_for(tmp_path, auth_token_file=tmp_path / "tokens", admin_token=Secret("admin-token"), **overrides)


def _chat(st: ServerThread, token: str, body: dict) -> dict:
    assert st.server is not None and st.server.http_port is not None
    req = urllib.request.Request(f"http://127.0.0.1:{st.server.http_port}/v1/chat/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


# -- who the engine is told a request is from ------------------------------------------------------------


def test_each_token_is_a_tenant_whatever_the_history_scope(tmp_path: Path) -> None:
    """The tenant follows the token even where the schema history is shared; only a registered schema's template
    is public."""
    engine = FakeEngine()
    with ServerThread(_tenant_settings(tmp_path, history_scope="shared", http_port=0, profile="demo"), engine) as st:
        with Client(st.target, token="alice-token", retry=NO_RETRY) as alice:
            alice.extract("x", schema_id="contact")
            alice.extract("x", schema=INLINE)
            alice.call_tool([("user", "hi")], TOOL)
        with Client(st.target, token="bob-token", retry=NO_RETRY) as bob:
            bob.extract("x", schema_id="contact")
        _chat(st, "bob-token", {"model": "demo", "messages": [{"role": "user", "content": "x"}],
                                "structspec": {"schema_id": "contact"}})
    tenants = [r.tenant for r in engine.requests]
    a, b = tenants[0], tenants[3]
    assert a and b and a != b and tenants == [a, a, a, b, b]
    assert all("token" not in t for t in tenants)  # a digest, never the token
    assert all(r.history_scope == "" for r in engine.requests)  # shared history all the same
    assert [getattr(r, "public_template", None) for r in engine.requests] == [True, False, None, True, True]
    with ServerThread(settings_for(tmp_path / "open"), FakeEngine()) as st:  # no tokens: one tenant
        with Client(st.target, retry=NO_RETRY) as c:
            c.extract("x", schema_id="contact")
        assert st.engine.requests[0].tenant == ""


# -- the prefix cache, on the real engine ---------------------------------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory, demo_models, demo_compiler) -> Iterator[ServerThread]:
    """The demo models with the server's worked examples (a long public template before each document)."""
    from structspec.assembly import AssemblyConfig, assemble_engine
    from structspec.engine.config import SchedulerLimits
    from structspec.engine.default_examples import build_example_book

    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(prefix_cache_tokens=8192),
                                                         compiler=demo_compiler, examples=build_example_book(1)))
    settings = _tenant_settings(tmp_path_factory.mktemp("tenants"), http_port=0, profile="demo")
    with ServerThread(settings, engine) as st:
        yield st


def _template_tokens(st: ServerThread, text: str) -> tuple[int, list[int]]:
    """The tokens of the registered contact schema's template that the prompt for ``text`` starts with, and the
    prompt (built as the engine builds it)."""
    from structspec.engine.prefix_cache import common_prefix
    from structspec.prompts import encode_prompt, extraction_prompt, extraction_template
    from structspec.schemas import load_builtin_schemas

    engine = st.engine
    schema = load_builtin_schemas()["contact"]
    examples = engine.examples.for_schema(schema)
    prompt = encode_prompt(engine.tokenizer, extraction_prompt(schema, text, None, examples))
    template = encode_prompt(engine.tokenizer, extraction_template(schema, None, examples))
    return common_prefix(template, prompt), prompt


def test_a_tenant_reads_no_cached_tokens_of_another_tenants_document(real: ServerThread) -> None:
    """Alice extracts a contact; bob's (gRPC) and carol's (HTTP) 4-token requests on texts starting like hers read
    the template as cached and nothing of her document; alice's own request on the same text reads her document."""
    from structspec.bench.workloads import build_workload
    from structspec.engine.prefix_cache import common_prefix

    doc = next(it.source for it in build_workload("extraction", 40, seed=7) if it.schema_name == "contact")
    guesses = [doc[: 3 * len(doc) // 4] + " Call me.", doc[: 2 * len(doc) // 3] + " Thanks."]
    template, first = _template_tokens(real, doc)
    assert template > 50
    with Client(real.target, token="alice-token", retry=NO_RETRY, timeout=120) as alice:
        assert alice.extract_result(doc, schema_id="contact", max_tokens=24).usage.cached_prompt_tokens <= template
        with Client(real.target, token="bob-token", retry=NO_RETRY, timeout=120) as bob:
            guess = guesses[0]
            assert common_prefix(_template_tokens(real, guess)[1], first) > template + 20  # runs on into her document
            assert bob.extract_result(guess, schema_id="contact", max_tokens=4).usage.cached_prompt_tokens == template
        body = {"model": "demo", "messages": [{"role": "user", "content": guesses[1]}], "max_tokens": 4,
                "structspec": {"schema_id": "contact"}}
        assert _chat(real, "carol-token", body)["usage"]["prompt_tokens_details"]["cached_tokens"] == template
        own = alice.extract_result(guesses[0], schema_id="contact", max_tokens=4).usage.cached_prompt_tokens
        assert own == common_prefix(_template_tokens(real, guesses[0])[1], first)


# -- the statistics RPCs ------------------------------------------------------------------------------------


def _record(st: ServerThread) -> tuple[str, str]:
    """Counters of a registered schema, an inline schema and a tool list on the server's model ("fake")."""
    book = st.server.store.stats  # type: ignore[union-attr]
    rec = book.recorder("fake")
    inline, tools = "inline:0123456789abcdef", "tools:fedcba9876543210"
    for key in ("contact@1", inline, tools):
        rec.record_request(key, 10, 10, 0, "stop", 50.0)
    rec.record_name(inline, "alices_private_form")
    return inline, tools


def test_statistics_a_tenant_reads_registered_schemas_the_admin_every_key(tmp_path: Path) -> None:
    with ServerThread(_tenant_settings(tmp_path), FakeEngine()) as st:
        inline, tools = _record(st)
        with Client(st.target, token="bob-token", retry=NO_RETRY) as bob:
            assert [s.schema_key for s in bob.list_schema_stats()] == ["contact@1"]
            assert [s.schema_key for s in bob.list_schema_stats(include_timeline=True)] == ["contact@1"]
            assert bob.get_schema_stats("contact", windows=[3600]).windows[3600].requests == 1
            assert bob.get_schema_stats(schema_key="contact@1").schema_key == "contact@1"
            for key in (inline, tools):
                with pytest.raises(PermissionDeniedError) as err:
                    bob.get_schema_stats(schema_key=key)
                assert err.value.reason == "ADMIN_TOKEN_REQUIRED"
        with Client(st.target, token="bob-token", admin_token="admin-token", retry=NO_RETRY) as admin:
            assert [s.schema_key for s in admin.list_schema_stats()] == sorted(["contact@1", inline, tools])
            got = admin.get_schema_stats(schema_key=inline, windows=[3600])
            assert got.windows[3600].requests == 1 and got.windows[3600].names == {"alices_private_form": 1}
        tok, adm = tmp_path / "bob", tmp_path / "admin"
        tok.write_text("bob-token\n")
        adm.write_text("admin-token\n")

        def keys(*args: str) -> list[str]:
            out = runner.invoke(app, [*args, "--json"])
            assert out.exit_code == 0, out.output
            return [e["schema_key"] for e in json.loads(out.output)]

        for command in (["schemas", "stats", "--target", st.target], ["stats", "--server", st.target]):
            assert keys(*command, "--token-file", str(tok)) == ["contact@1"]
            assert keys(*command, "--admin-token-file", str(adm)) == sorted(["contact@1", inline, tools])
        denied = runner.invoke(app, ["schemas", "stats", "--target", st.target, "--token-file", str(tok),
                                     "--key", inline])
        assert denied.exit_code != 0 and "admin token" in denied.output
        report = tmp_path / "report.html"
        out = runner.invoke(app, ["stats", "report", "--server", st.target, "--token-file", str(tok), "--samples", "0",
                                  "--out", str(report)])
        assert out.exit_code == 0, out.output
        page = report.read_text()
        assert "contact@1" in page and inline not in page and "alices_private_form" not in page
    with ServerThread(settings_for(tmp_path / "open"), FakeEngine()) as st:  # no tokens: one tenant reads all
        inline, tools = _record(st)
        with Client(st.target, retry=NO_RETRY) as anyone:
            assert [s.schema_key for s in anyone.list_schema_stats()] == sorted(["contact@1", inline, tools])
            assert anyone.get_schema_stats(schema_key=inline).schema_key == inline
