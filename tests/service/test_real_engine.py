"""The real server on loopback with the real engine on the demo models, called with the real client."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel

from structspec.bench.loadtest import run_load
from structspec.bench.workloads import build_workload
from structspec.client import Client
from tests.service.harness import ServerThread, settings_for


class Contact(BaseModel):
    name: str
    email: str
    city: str


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_models, demo_compiler):
    from structspec.engine.config import SchedulerLimits
    from structspec.assembly import AssemblyConfig, assemble_engine
    from structspec.speculation.configs import speculation_config

    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=32, max_queue=256),
                             proposers=speculation_config("all").proposers, compiler=demo_compiler))
    srv = ServerThread(settings_for(tmp_path_factory.mktemp("real")), engine).start()
    yield srv
    srv.stop()


def test_extract_by_registered_schema_id(server):
    item = build_workload("extraction", 3)[2]
    with Client(server.target) as client:
        result = client.extract_result(item.source, schema_id=item.schema_name, max_tokens=200)
    assert result.finish_reason.lower().endswith("stop"), result
    value = json.loads(result.json)
    assert list(value) == list(item.schema["properties"])  # schema order, through the registry
    jsonschema.validate(value, item.schema)
    assert result.usage.target_forward_passes < result.usage.output_tokens


def test_typed_extraction_stream_and_tool_call(server):
    with Client(server.target) as client:
        doc = next(it for it in build_workload("extraction", 20) if it.schema_name == "contact")
        contact = client.extract(doc.source, model=Contact, max_tokens=200)
        assert isinstance(contact, Contact) and contact.email
        parts = list(client.extract_stream("Ticket TCK-12345 from Bo Li: the app crashes.",
                                           schema_id="support_ticket", max_tokens=200))
        assert len(parts) > 2 and json.loads(parts[-1].json)["ticket_id"].startswith("TCK-")
        assert "".join(p.text for p in parts[:-1]) == parts[-1].json
        item = build_workload("toolcall", 1)[0]
        out = client.call_tool([{"role": "user", "content": item.source}], list(item.tools), tool_choice="required",
                               max_tokens=120)
        assert len(out.calls) == 1 and out.calls[0].name == item.truth["name"]


def test_load_1_8_32_clients_no_request_lost(server):
    report = run_load(server.target, (1, 8, 32), requests_per_level=32, schema_id="contact", max_tokens=96)
    for level in report.levels:
        assert level.ok == level.requests and level.failed == 0
    out = Path(__file__).resolve().parents[2] / "reports"
    out.mkdir(exist_ok=True)
    (out / "loadtest-demo.txt").write_text(report.table() + "\n")


def test_registered_schema_keeps_property_order(server):
    from structspec.schemas import load_builtin_schemas

    with Client(server.target) as client:
        stored = client.get_schema("invoice").schema
    assert list(stored["properties"]) == list(load_builtin_schemas()["invoice"]["properties"])
