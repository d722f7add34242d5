"""The OpenAI-compatible HTTP API, called with the official openai SDK (and httpx where the SDK hides the wire).

One real server on the demo models serves the generation tests (a few hundred ms per request on 2
cores); servers on the fake engine cover auth, TLS, loading, deadlines, a full queue, disconnects and
the size limit, where the model's words do not matter.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI
from prometheus_client import generate_latest
from pydantic import BaseModel

from structspec.client import Client
from structspec.front.registry import canonical_json, inline_stats_key
from structspec.service.settings import Secret, ServiceSettings
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

CHAT = "POST /v1/chat/completions"
CARD = "Name: Hiro Gupta\nCompany: Northwind Studios\nLocation: Boston, United States\nContact: hiro.gupta@northwind.de"
CONTACT = {
    "title": "Contact",
    "type": "object",
    "properties": {"name": {"type": "string"}, "email": {"type": "string"}, "company": {"type": "string"},
                   "city": {"type": "string"}},
    "required": ["name", "email", "company", "city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "lookup_order", "description": "Look up an order by its id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                       "required": ["order_id"], "additionalProperties": False}}},
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def contact_format(schema: dict[str, Any] = CONTACT, name: str = "contact") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


class Contact(BaseModel):
    name: str
    email: str
    city: str


@pytest.fixture(scope="module")
def real(tmp_path_factory, demo_models, demo_compiler) -> Iterator[ServerThread]:
    from structspec.assembly import AssemblyConfig, assemble_engine, engine_model_key
    from structspec.engine.config import SchedulerLimits
    from structspec.speculation.configs import speculation_config
    from structspec.store import open_store

    settings = settings_for(tmp_path_factory.mktemp("http"), http_port=0, profile="demo")
    store = open_store(settings.store_url, settings.data_dir)  # the engine records its statistics in the server's
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=8, max_queue=64),
                             proposers=speculation_config("all").proposers, compiler=demo_compiler,
                             stats=store.stats.recorder(engine_model_key(demo_models))))
    with ServerThread(settings, engine, store=store) as st:
        yield st
        st.run(store.close())


def base_url(st: ServerThread, scheme: str = "http") -> str:
    assert st.server is not None and st.server.http_port is not None
    return f"{scheme}://127.0.0.1:{st.server.http_port}"


@pytest.fixture(scope="module")
def sdk(real: ServerThread) -> OpenAI:
    return OpenAI(base_url=base_url(real) + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat(sdk: OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "demo")
    kwargs.setdefault("messages", [{"role": "user", "content": CARD}])
    return sdk.chat.completions.create(**kwargs)


# -- generation on the demo models ------------------------------------------------------------------


def test_json_schema_completion(sdk: OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="demo", max_tokens=200, response_format=contact_format(),
        messages=[{"role": "system", "content": "Extract the contact."}, {"role": "user", "content": CARD}],
        extra_headers={"x-request-id": "req-json-1"})
    assert raw.headers["x-request-id"] == "req-json-1"
    out = raw.parse()
    assert out.id == "chatcmpl-req-json-1" and out.object == "chat.completion" and out.model == "demo"
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant" and not choice.message.tool_calls
    value = json.loads(choice.message.content)
    jsonschema.validate(value, CONTACT)
    assert list(value) == list(CONTACT["properties"])  # properties in schema order
    u = out.usage
    assert u.prompt_tokens > 0 and u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    ext = u.model_extra["structspec"]
    assert 0 < ext["target_forward_passes"] <= u.completion_tokens
    assert ext["forced_tokens"] > 0 and ext["outcome"] == "valid"
    assert set(ext["drafted_tokens"]) >= set(ext["accepted_tokens"])
    assert ext["speculation"]["reason"] and isinstance(ext["speculation"]["proposer_reasons"], dict)
    assert ext["schema_key"] == inline_stats_key(canonical_json(CONTACT))


def test_json_schema_stream(sdk: OpenAI, real: ServerThread) -> None:
    chunks = list(chat(sdk, max_tokens=200, response_format=contact_format(), stream=True,
                       stream_options={"include_usage": True}))
    deltas = [c for c in chunks if c.choices]
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in deltas)
    assert len([c for c in deltas if c.choices[0].delta.content]) > 2  # streamed, not one blob
    jsonschema.validate(json.loads(text), CONTACT)
    assert [c.choices[0].finish_reason for c in deltas][-1] == "stop"
    assert not any(c.choices[0].finish_reason for c in deltas[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0  # include_usage: the last chunk
    assert chunks[-1].usage.model_extra["structspec"]["outcome"] == "valid"
    # on the wire: server-sent events ending with [DONE]
    body = {"model": "demo", "messages": [{"role": "user", "content": CARD}], "max_tokens": 200,
            "response_format": contact_format(), "stream": True}
    with httpx.stream("POST", base_url(real) + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert all("usage" not in json.loads(e[6:]) for e in events[:-1])  # not asked for


def test_parse_with_a_pydantic_model(sdk: OpenAI) -> None:
    out = sdk.chat.completions.parse(model="demo", messages=[{"role": "user", "content": CARD}],
                                     response_format=Contact, max_tokens=200)
    contact = out.choices[0].message.parsed
    assert isinstance(contact, Contact) and contact.name and contact.email


def test_truncated_output_is_length_and_parse_raises(sdk: OpenAI) -> None:
    out = chat(sdk, max_tokens=5, response_format=contact_format())
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.message.content.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)  # a prefix, never an object
    assert out.usage.completion_tokens == 5 and out.usage.model_extra["structspec"]["outcome"] == "truncated"
    with pytest.raises(openai.LengthFinishReasonError):
        sdk.chat.completions.parse(model="demo", messages=[{"role": "user", "content": CARD}],
                                   response_format=Contact, max_completion_tokens=5)
    streamed = list(chat(sdk, max_tokens=5, response_format=contact_format(), stream=True))
    assert streamed[-1].choices[0].finish_reason == "length"


def test_json_object_registered_schema_and_speculation_off(sdk: OpenAI) -> None:
    any_object = chat(sdk, max_tokens=120, response_format={"type": "json_object"})
    assert any_object.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(any_object.choices[0].message.content), dict)
    out = chat(sdk, max_tokens=200, extra_body={"structspec": {"schema_id": "contact", "speculation": "off"}})
    ext = out.usage.model_extra["structspec"]
    assert ext["schema_key"] == "contact@1" and ext["speculation"]["reason"] == "request_off"
    assert not ext["drafted_tokens"]
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_tool_calls_named_required_and_a_round_trip(sdk: OpenAI) -> None:
    ask = [{"role": "user", "content": "Where is my order ORD-538485?"}]
    named = chat(sdk, messages=ask, tools=TOOLS, max_tokens=120,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].finish_reason == "tool_calls"
    (call,) = named.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS["get_weather"])

    required = chat(sdk, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=120)
    message = required.choices[0].message
    assert required.choices[0].finish_reason == "tool_calls" and message.content is None
    (call,) = message.tool_calls
    assert call.function.name in PARAMETERS
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])

    several = chat(sdk, messages=ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=True, max_tokens=300)
    if several.choices[0].finish_reason == "length":  # the demo model, never shown a list of calls, may go on
        assert several.choices[0].message.content is None  # a cut call is neither a call nor text
    else:
        assert several.choices[0].finish_reason == "tool_calls" and several.choices[0].message.tool_calls
    for c in several.choices[0].message.tool_calls or ():
        jsonschema.validate(json.loads(c.function.arguments), PARAMETERS[c.function.name])

    streamed = list(chat(sdk, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=120, stream=True))
    parts = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert parts and parts[0].id.startswith("call_") and parts[0].function.name in PARAMETERS
    assert streamed[-1].choices[0].finish_reason == "tool_calls"

    # the SDK's own message back in the conversation, then the tool's answer
    history = [*ask, message, {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped"}'}]
    follow = chat(sdk, messages=history, tools=TOOLS, max_tokens=120)
    assert follow.choices[0].finish_reason in ("tool_calls", "stop")
    none = chat(sdk, messages=history, tools=TOOLS, tool_choice="none", max_tokens=20)
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")


# -- errors --------------------------------------------------------------------------------------------


def error_of(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    body = exc.value.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}, body  # the SDK unwraps "error"
    return body


def test_bad_schema_is_400_with_pointer_and_keyword(sdk: OpenAI, real: ServerThread) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a)\\1$"}}}
    with pytest.raises(openai.BadRequestError) as exc:
        chat(sdk, response_format=contact_format(schema, "codes"))
    err = error_of(exc)
    assert err["param"] == "response_format.json_schema.schema#/properties/code/pattern"
    assert "/properties/code" in err["message"] and "pattern" in err["message"]
    assert err["message"].startswith("response_format.json_schema.schema:") and err["type"] == "invalid_request_error"
    assert err["code"] == "unsupported_schema"

    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(a)\\1"}}}}}]
    with pytest.raises(openai.BadRequestError) as exc:
        chat(sdk, tools=tools)
    assert error_of(exc)["param"] == "tools[0].function.parameters#/properties/x/pattern"

    body = '{"model":"demo","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",' \
           '"json_schema":{"name":"lone","schema":{"type":"string","description":"\\ud800"}}}}'  # JSON admits it
    r = httpx.post(base_url(real) + "/v1/chat/completions", content=body.encode(), timeout=10)
    assert r.status_code == 400 and "lone surrogate escape (\\ud800)" in r.json()["error"]["message"]
    anything = chat(sdk, response_format=contact_format(True, "anything"), max_tokens=8)  # true: any JSON value
    assert anything.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"n": 2}, "n"),
    ({"stop": ["\n"]}, "stop"),
    ({"logprobs": True}, "logprobs"),
    ({"extra_body": {"audio": {"voice": "alloy"}}}, "audio"),  # an unknown field is refused, not ignored
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"logit_bias": {"1": 5.0}}, "logit_bias"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"max_tokens": 10, "max_completion_tokens": 20}, "max_completion_tokens"),
    ({"temperature": 11.0}, "temperature"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"tools": TOOLS, "stop": "\n"}, "stop"),  # stop is for free text only
    ({"tools": TOOLS, "response_format": {"type": "text", "json_schema": contact_format()["json_schema"]}},
     "response_format.json_schema"),  # a schema beside type text would otherwise be dropped
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
])
def test_refused_fields_are_400_naming_them(sdk: OpenAI, kwargs: dict[str, Any], param: str) -> None:
    kwargs.setdefault("response_format", contact_format())
    with pytest.raises(openai.BadRequestError) as exc:
        chat(sdk, **kwargs)
    assert error_of(exc)["param"] == param


def test_unknown_schema_id_and_model_are_404(sdk: OpenAI, real: ServerThread) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        chat(sdk, extra_body={"structspec": {"schema_id": "no_such_schema"}})
    assert error_of(exc)["param"] == "structspec.schema_id" and error_of(exc)["code"] == "schema_not_found"
    with pytest.raises(openai.NotFoundError) as exc:
        chat(sdk, model="gpt-4o", response_format=contact_format())
    assert error_of(exc)["param"] == "model"
    r = httpx.get(base_url(real) + "/v1/no/such/route")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(base_url(real) + "/v1/chat/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_models_health_metrics_and_statistics(sdk: OpenAI, real: ServerThread) -> None:
    assert [m.id for m in sdk.models.list().data] == ["demo"]
    assert httpx.get(base_url(real) + "/health").json() == {"status": "SERVING"}
    schema = {**CONTACT, "description": "statistics test"}  # its own content key
    for _ in range(2):
        chat(sdk, max_tokens=200, response_format=contact_format(schema, "contact_card"))
    key = inline_stats_key(canonical_json(schema))
    with Client(real.target) as grpc_client:
        stats = grpc_client.get_schema_stats(schema_key=key, windows=[3600])
    window = stats.windows[3600]
    assert window.requests == 2 and window.names == {"contact_card": 2}
    text = generate_latest(real.server.metrics.registry).decode()  # type: ignore[union-attr]
    assert f'structspec_requests_total{{code="OK",finish_reason="stop",rpc="{CHAT}"}}' in text
    assert f'structspec_requests_total{{code="INVALID_ARGUMENT",finish_reason="",rpc="{CHAT}"}}' in text
    assert 'rpc="GET /v1/models"' in text
    assert f'structspec_output_tokens_total{{rpc="{CHAT}"}}' in text


# -- on the fake engine ----------------------------------------------------------------------------


def fake_sdk(st: ServerThread, key: str = "unused", scheme: str = "http", **kwargs: Any) -> OpenAI:
    return OpenAI(base_url=base_url(st, scheme) + "/v1", api_key=key, max_retries=0, timeout=20, **kwargs)


def fake_chat(client: OpenAI, content: str = "Bo", **kwargs: Any) -> Any:
    return client.chat.completions.create(model=ServiceSettings().profile, messages=[{"role": "user", "content": content}],
                                          response_format=contact_format(), **kwargs)


def test_bearer_tokens(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, http_port=0, auth_token=Secret("user-token"))
    with ServerThread(settings, FakeEngine()) as st:
        with pytest.raises(openai.AuthenticationError) as exc:
            fake_chat(fake_sdk(st, "wrong-token"))
        assert error_of(exc)["code"] == "invalid_api_key"
        body = {"model": ServiceSettings().profile, "messages": [{"role": "user", "content": "Bo"}],
                "response_format": contact_format()}
        r = httpx.post(base_url(st) + "/v1/chat/completions", json=body)  # no token at all
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
        r = httpx.get(base_url(st) + "/v1/models")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(base_url(st) + "/health").status_code == 200  # no token needed
        assert fake_chat(fake_sdk(st, "user-token")).choices[0].finish_reason == "stop"
        text = generate_latest(st.server.metrics.registry).decode()  # type: ignore[union-attr]
        assert f'structspec_requests_total{{code="UNAUTHENTICATED",finish_reason="",rpc="{CHAT}"}} 2.0' in text


def test_tls(tmp_path: Path, certs: dict[str, Path]) -> None:
    settings = settings_for(tmp_path, http_port=0, tls_cert_file=certs["server.crt"], tls_key_file=certs["server.key"])
    with ServerThread(settings, FakeEngine()) as st:
        trust = ssl.create_default_context(cafile=str(certs["ca.crt"]))
        client = fake_sdk(st, scheme="https", http_client=httpx.Client(verify=trust))
        assert fake_chat(client).choices[0].finish_reason == "stop"
        with pytest.raises(httpx.HTTPError):
            httpx.get(base_url(st) + "/health", timeout=3)  # plaintext against TLS


def test_loading_is_503_with_retry_after(tmp_path: Path) -> None:
    with ServerThread(settings_for(tmp_path, http_port=0), None) as st:
        with pytest.raises(openai.InternalServerError) as exc:
            fake_chat(fake_sdk(st))
        assert exc.value.status_code == 503 and error_of(exc)["code"] == "model_loading"
        assert exc.value.response.headers["retry-after"] == "5"
        assert httpx.get(base_url(st) + "/health").status_code == 503


def test_deadline_is_504_and_mid_stream_an_error_event(tmp_path: Path) -> None:
    engine = FakeEngine()
    with ServerThread(settings_for(tmp_path, http_port=0), engine) as st:
        client = fake_sdk(st)
        with pytest.raises(openai.APIStatusError) as exc:
            fake_chat(client, "[slow=0.5]", extra_body={"structspec": {"timeout_seconds": 0.3}})
        assert exc.value.status_code == 504 and error_of(exc)["code"] == "deadline_exceeded"
        with pytest.raises(openai.APIError, match="deadline"):
            for _ in fake_chat(client, "[slow=0.2]", stream=True, extra_body={"structspec": {"timeout_seconds": 0.5}}):
                pass


def test_queue_full_is_429_and_a_client_that_leaves_is_cancelled(tmp_path: Path) -> None:
    engine = FakeEngine(max_running=1, max_queue=0)
    with ServerThread(settings_for(tmp_path, http_port=0), engine) as st:
        body = {"model": ServiceSettings().profile, "messages": [{"role": "user", "content": "[slow=0.3]"}],
                "response_format": contact_format()}
        url = base_url(st) + "/v1/chat/completions"
        left: list[BaseException] = []

        def leave() -> None:  # gives up after 0.5 s: the engine would take about 2.5 s
            try:
                httpx.post(url, json=body, headers={"x-request-id": "leaves"}, timeout=0.5)
            except httpx.ReadTimeout as exc:
                left.append(exc)

        gone = threading.Thread(target=leave)
        gone.start()
        time.sleep(0.2)
        r = httpx.post(url, json=body, timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"
        gone.join(10)
        assert left
        deadline = time.monotonic() + 5
        while "leaves" not in engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "leaves" in engine.cancelled and "leaves" not in engine.finished  # decoding stopped with its client


def test_body_size_limit_is_413(tmp_path: Path) -> None:
    with ServerThread(settings_for(tmp_path, http_port=0, max_message_bytes=2000), FakeEngine()) as st:
        with pytest.raises(openai.APIStatusError) as exc:
            fake_chat(fake_sdk(st), "x" * 5000)
        assert exc.value.status_code == 413 and error_of(exc)["code"] == "message_too_large"


def test_http_port_setting(tmp_path: Path) -> None:
    assert ServiceSettings().http_port == 8000  # on by default, on its own port
    with ServerThread(settings_for(tmp_path, http_port=-1), FakeEngine()) as st:
        assert st.server is not None and st.server.http_port is None


def test_the_readme_example_runs(tmp_path: Path) -> None:
    import contextlib
    import io
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## OpenAI-compatible HTTP API", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert 'base_url="http://localhost:8000/v1"' in code
    out = io.StringIO()
    with ServerThread(settings_for(tmp_path, http_port=0), FakeEngine()) as st, contextlib.redirect_stdout(out):
        exec(compile(code.replace("http://localhost:8000/v1", base_url(st) + "/v1"), "README.md", "exec"),
             {"__name__": "readme"})
    lines = out.getvalue().splitlines()
    assert len(lines[0].split()) >= 2  # the contact's name and email
    passes, tokens = map(int, lines[1].split())
    assert 0 < passes <= tokens
    assert lines[2].startswith("tool_calls get_weather {")
    assert "invoice_number" in json.loads(lines[3])  # the registered invoice schema's keys


def test_a_client_gone_mid_upload_is_cancelled_not_a_server_failure() -> None:
    """The body arrives in part, then the connection drops: counted CANCELLED, never INTERNAL (no 500)."""
    import asyncio

    from prometheus_client import generate_latest

    from structspec.front.auth import AuthConfig
    from structspec.front.limits import Limits
    from structspec.service.http.app import OpenAIApp
    from structspec.front.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    app = OpenAIApp(None, None, None, metrics, Limits(), AuthConfig(), "demo").build()
    incoming = [{"type": "http.request", "body": b'{"model":', "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 1234), "headers": [(b"content-type", b"application/json"),
                                                         (b"content-length", b"100")]}
    asyncio.run(app(scope, receive, send))
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] != [500]
    counted = [line for line in generate_latest(metrics.registry).decode().splitlines()
               if line.startswith("structspec_requests_total")]
    assert counted and all('code="INTERNAL"' not in line for line in counted)
    assert any('code="CANCELLED"' in line for line in counted)
