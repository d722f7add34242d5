"""What a schema's owner sees, on a real server (the demo models, the drafting policy) after real traffic: the
per-schema Prometheus series and the server-wide ones, GetSchemaStats with the policy's state, the timeline and the
speedup, ListRejectedDrafts (admin), and `structspec stats` reading the store itself or asking the server, alike.
One server for the module."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from structspec.bench.workloads import build_workload
from structspec.cli import app
from structspec.client import Client, NO_RETRY, PermissionDeniedError
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

INLINE = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
          "required": ["city", "country"]}
runner = CliRunner()


@pytest.fixture(scope="module")
def served(tmp_path_factory, demo_models, demo_compiler):
    from structspec.assembly import AssemblyConfig, assemble_engine, engine_model_key
    from structspec.engine.config import PolicyConfig, SchedulerLimits
    from structspec.speculation.configs import speculation_config
    from structspec.stats.book import StatsBook
    from structspec.store import open_store

    data = tmp_path_factory.mktemp("owners")
    store = open_store("", data, StatsBook(samples_per_hour=50))
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=8), compiler=demo_compiler,
                             proposers=speculation_config("policy").proposers, policy=PolicyConfig(), seed=0,
                             stats=store.stats.recorder(engine_model_key(demo_models))))
    srv = ServerThread(settings_for(data, metrics_port=0), engine, store=store).start()
    items = [i for i in build_workload("extraction", 12) if i.schema_name in ("contact", "invoice")][:6]
    with Client(srv.target, retry=NO_RETRY) as client:
        for item in items:
            client.extract_result(item.source, schema_id=item.schema_name, max_tokens=160)
        client.extract_result("Meet me in Lyon, France.", schema=INLINE, max_tokens=40)
        client.extract_result("Oslo is in Norway.", schema=INLINE, max_tokens=40)
        deltas = list(client.extract_stream(items[0].source, schema_id=items[0].schema_name, max_tokens=160))
        assert len(deltas) > 3
    srv.run(store.flush())
    yield srv, data, engine.model_key
    srv.stop()


def scrape(srv: ServerThread) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{srv.server.metrics_port}/metrics", timeout=5).read().decode()


def samples(body: str, name: str) -> dict[str, float]:
    """``{labels text: value}`` of one metric's samples."""
    out = {}
    for line in body.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def test_per_schema_series_are_bounded_and_agree_with_the_statistics(served):
    srv, _, model = served
    body = scrape(srv)
    requests = samples(body, "structspec_schema_requests_total")
    schemas = {re.search(r'schema="([^"]+)"', k).group(1) for k in requests}
    assert schemas == {"contact@1", "invoice@1", "inline"}, schemas  # two inline requests share one label
    assert sum(requests.values()) == 9
    assert sum(v for k, v in requests.items() if 'schema="inline"' in k) == 2
    with Client(srv.target) as client:
        stats = {s.schema_key: s for s in client.list_schema_stats([86400], model=model)}
    drafted = samples(body, "structspec_schema_drafted_tokens_total")
    accepted = samples(body, "structspec_schema_accepted_tokens_total")
    for key in ("contact@1", "invoice@1"):
        window = stats[key].windows[86400]
        for proposer in {p.proposer for p in window.proposers}:
            want = sum(p.drafted for p in window.proposers if p.proposer == proposer)
            got = sum(v for k, v in drafted.items() if f'schema="{key}"' in k and f'proposer="{proposer}"' in k)
            assert got == want > 0, (key, proposer)
            assert sum(v for k, v in accepted.items() if f'schema="{key}"' in k and f'proposer="{proposer}"' in k) \
                == sum(p.accepted for p in window.proposers if p.proposer == proposer)
        passes = samples(body, "structspec_schema_target_passes_total")[f'{{schema="{key}"}}']
        assert passes == window.target_passes
    assert all('batch_bucket="' in k for k in drafted)
    decisions = samples(body, "structspec_schema_policy_decisions_total")
    assert any('proposer=""' in k and 'reason="cold"' in k for k in decisions)
    state = samples(body, "structspec_schema_policy_state")
    assert state['{proposer="ngram",schema="contact@1",state="on"}'] + \
        state['{proposer="ngram",schema="contact@1",state="off"}'] == 1
    assert samples(body, "structspec_schema_policy_switches_total")


def test_server_wide_series(served):
    srv, _, _ = served
    body = scrape(srv)
    peak = samples(body, "structspec_kv_cache_tokens_peak")[""]
    assert peak > 100 and 0 <= samples(body, "structspec_kv_cache_tokens")[""] <= peak
    assert samples(body, "structspec_kv_cache_allocated_bytes")[""] > 0
    assert samples(body, "structspec_grammar_compile_wait_seconds_count")[""] >= 9  # every request waited (or not)
    assert samples(body, "structspec_grammar_compile_seconds_count")[""] >= 1  # the inline schema compiled here
    assert samples(body, "structspec_stream_delta_interval_seconds_count")[""] >= 3
    assert samples(body, "structspec_stream_first_delta_seconds_count")[""] == 1


def test_stats_rpcs_say_the_policy_state_the_speedup_and_the_timeline(served):
    srv, _, model = served
    with Client(srv.target) as client:
        s = client.get_schema_stats("contact", windows=[86400], include_timeline=True)
        plain = client.get_schema_stats("contact", windows=[86400])
    w = s.windows[86400]
    assert s.model == model and w.requests >= 2 and w.estimated_speedup > 0
    assert {p.proposer for p in s.policy} == {"draft", "ngram", "ngram/long", "history"}  # a long match apart
    assert all(p.state in ("on", "off") and p.since > 0 for p in s.policy)
    assert s.timeline and sum(h.requests for h in s.timeline) == w.requests
    assert s.policy_changes and s.policy_changes[0].previous == ""
    assert plain.timeline == [] and plain.policy_changes == [] and plain.policy == s.policy


def test_rejected_drafts_need_the_admin_token_where_tokens_are_configured(served, tmp_path):
    srv, _, model = served
    with Client(srv.target) as client:
        drafts = client.list_rejected_drafts("invoice", limit=5)
        assert 0 < len(drafts) <= 5 and all(d.schema_key == "invoice@1" and d.model == model for d in drafts)
        assert [d.created_at for d in drafts] == sorted((d.created_at for d in drafts), reverse=True)
        d = drafts[0]
        assert d.rejected_token == d.draft_tokens[d.position] != d.target_token and d.context_text
        assert all(x.proposer == "ngram" for x in client.list_rejected_drafts(proposer="ngram", limit=50))
    (tmp_path / "tok").write_text("user-token\n")
    (tmp_path / "adm").write_text("admin-token\n")
    settings = settings_for(tmp_path, auth_token_file=tmp_path / "tok", admin_token_file=tmp_path / "adm")
    with ServerThread(settings, FakeEngine()) as st:
        with Client(st.target, token="user-token", retry=NO_RETRY) as user:
            with pytest.raises(PermissionDeniedError):
                user.list_rejected_drafts()
            assert user.list_schema_stats() == []  # statistics themselves are for every caller
        with Client(st.target, token="user-token", admin_token="admin-token", retry=NO_RETRY) as admin:
            assert admin.list_rejected_drafts() == []


def test_the_cli_reads_the_store_and_the_server_alike(served):
    srv, data, model = served
    local = runner.invoke(app, ["stats", "--data-dir", str(data), "--window", "1d", "--json"])
    assert local.exit_code == 0, local.output
    remote = runner.invoke(app, ["stats", "--server", srv.target, "--window", "24h", "--json"])
    assert remote.exit_code == 0, remote.output
    assert json.loads(local.output) == json.loads(remote.output)
    keys = [(e["model"], e["schema_key"]) for e in json.loads(local.output)]
    assert (model, "contact@1") in keys and any(k.startswith("inline:") for _, k in keys)
    pricing = [p for e in json.loads(local.output) for p in e["pricing"]]  # the same on both: compared above
    assert pricing and all(len(p["prices"]) == 9 and p["prices"][0]["k"] == 0 for p in pricing)
    table = runner.invoke(app, ["stats", "invoice", "--data-dir", str(data)], env={"COLUMNS": "220"})
    assert table.exit_code == 0, table.output
    out = table.output
    for heading in ("invoice@1 on", "last 7d: requests", "drafting", "drafting policy", "est. speedup",
                    "truncated", "acceptance by draft position", "last switched off", "ngram at batch",
                    "step / plain"):
        assert heading in out, heading
    one = runner.invoke(app, ["stats", "show", "invoice@1", "--server", srv.target, "--json"])
    assert [e["schema_key"] for e in json.loads(one.output)] == ["invoice@1"]
    rejected = runner.invoke(app, ["stats", "rejections", "invoice", "--data-dir", str(data), "--limit", "3",
                                   "--json"])
    assert rejected.exit_code == 0 and len(json.loads(rejected.output)) == 3
    assert "target chose" in runner.invoke(app, ["stats", "rejections", "--server", srv.target],
                                           env={"COLUMNS": "200"}).output


def test_the_cli_refuses_bad_input_clearly(served, tmp_path):
    srv, data, _ = served
    cases = [
        (["stats", "--window", "7x", "--data-dir", str(data)], "give a duration such as 7d"),
        (["stats", "--window", "400d", "--data-dir", str(data)], "at most 90d"),
        (["stats", "nope", "--data-dir", str(data)], "no registered schema nope"),
        (["stats", "invoice@x", "--data-dir", str(data)], "a version after @ is a number"),
        (["stats", "--data-dir", str(tmp_path / "empty")], "no store at"),
        (["stats", "--server", srv.target, "--data-dir", str(data)], "not both"),
        (["stats", "nope", "--server", srv.target], "nope"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code != 0 and message in result.output, (args, result.output)
    assert not (tmp_path / "empty").exists()  # reading makes no store


def test_the_report_has_every_section_and_fetches_nothing(served, tmp_path):
    srv, data, _ = served
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["stats", "report", "--data-dir", str(data), "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    sections = page.count('<section class="schema"')
    assert sections == 3 and page.count('class="plotly-graph-div"') == 5 * sections
    assert "refused" in page and "threshold" in page and "Drafting policy" in page and "Draft pricing" in page
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="(https?:)?//', page)  # nothing fetched at view time
    remote = tmp_path / "remote.html"
    result = runner.invoke(app, ["stats", "report", "--server", srv.target, "--out", str(remote)])
    assert result.exit_code == 0 and remote.read_text().count('<section class="schema"') == 3


DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_the_grafana_dashboard_queries_only_series_the_server_exports(served):
    srv, _, _ = served
    exported = {re.split(r"[{ ]", line)[0] for line in scrape(srv).splitlines() if line.startswith("structspec_")}
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "structspec-schemas.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs.append(dashboard["templating"]["list"][0]["query"]["query"])
    queried = {n for e in exprs for n in re.findall(r"\bstructspec_[a-z_]+", e)}
    assert queried and queried <= exported, queried - exported
    per_schema = {n for n in exported if n.startswith("structspec_schema_")}
    assert per_schema <= queried, per_schema - queried  # every per-schema series has a panel
    uids = {t["datasource"]["uid"] for t in dashboard["panels"] if "datasource" in t}
    datasource = (DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert uids == {"prometheus"} and "uid: prometheus" in datasource and "url: http://prometheus:9090" in datasource
    compose = (DOCKER / "compose.yaml").read_text()
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in compose
    assert "path: /var/lib/grafana/dashboards" in (DOCKER / "grafana" / "provisioning" / "dashboards"
                                                   / "structspec.yml").read_text()


def test_the_service_readme_documents_every_series(served):
    srv, _, _ = served
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(structspec_[a-z_]+)` \|", section, re.M))
    families = {f.name + ("_total" if f.type == "counter" else "") for f in srv.server.metrics.registry.collect()
                if f.name.startswith("structspec_")}
    assert len(families) > 25 and families == documented, (families - documented, documented - families)


def test_the_report_keeps_a_deleted_schemas_statistics_and_samples(tmp_path):
    """A schema deleted since its traffic still has statistics under its key: the report reads its samples by
    that key instead of failing on the missing registration."""
    import asyncio

    from structspec.store import open_store

    data = tmp_path / "gone"
    data.mkdir()

    async def record() -> None:
        store = open_store("", data)
        await store.open()
        await store.put_schema("gone", '{"type":"object"}', "abc", "", "test", 0.0)
        store.stats.recorder("demo").record_request("gone@1", 10, 5, 2, "stop", 100.0)
        await store.delete_schema("gone")
        await store.close()

    asyncio.run(record())
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["stats", "report", "--data-dir", str(data), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "gone@1" in out.read_text()
