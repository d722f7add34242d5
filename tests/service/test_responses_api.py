"""``POST /v1/responses``, called with the openai SDK's ``responses.create`` and ``responses.stream``: free text,
``text.format`` json_schema and json_object, function calls and a ``function_call_output`` round trip, text a model
writes before its calls (a message item before the function_call items), ``tools: []`` (no tools), a cut output
(incomplete), the streamed events, and the refusals (``previous_response_id``, a tool named like a ``tool_choice``
mode chosen by name). The fake engine covers the wire; the demo models (the ``real`` server of
``test_openai_http``) a schema and a call decoded by a real model.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from structspec.engine.api import TextRequest, ToolCallRequest, ExtractionRequest
from tests.service.fakes import PREAMBLE
from tests.service.harness import ServerThread, settings_for
from tests.service.test_http_free_text import MODEL, REPLY, TextFake
from tests.service.test_openai_http import CARD, CONTACT, PARAMETERS, base_url, error_of, real  # noqa: F401

TOOLS = [{"type": "function", "name": t, "description": f"the {t} tool", "parameters": p, "strict": True}
         for t, p in PARAMETERS.items()]
CONTACT_FORMAT = {"format": {"type": "json_schema", "name": "contact", "schema": CONTACT, "strict": True}}


class Contact(BaseModel):
    name: str
    email: str


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ServerThread, TextFake]]:
    engine = TextFake()
    with ServerThread(settings_for(tmp_path_factory.mktemp("responses"), http_port=0), engine) as st:
        yield st, engine


@pytest.fixture(scope="module")
def sdk(served: tuple[ServerThread, TextFake]) -> OpenAI:
    return OpenAI(base_url=base_url(served[0]) + "/v1", api_key="unused", max_retries=0, timeout=20)


def create(sdk: OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("input", "Say hello")
    return sdk.responses.create(**kwargs)


def test_text_response(sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    raw = sdk.responses.with_raw_response.create(model=MODEL, input="Say hello", instructions="Be brief.",
                                                 store=True, metadata={"k": "v"},
                                                 extra_headers={"x-request-id": "resp-1"})
    out = raw.parse()
    assert out.id == "resp_resp-1" and out.object == "response" and out.status == "completed"
    assert out.output_text == REPLY and out.output[0].type == "message" and out.output[0].role == "assistant"
    assert out.usage.output_tokens > 0 and out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    req = served[1].last_request
    assert isinstance(req, TextRequest)
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be brief."), ("user", "Say hello")]
    cut = create(sdk, max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == REPLY[:16]


def test_json_schema_and_json_object(sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    out = create(sdk, input=[{"role": "user", "content": [{"type": "input_text", "text": CARD}]}], text=CONTACT_FORMAT)
    jsonschema.validate(json.loads(out.output_text), CONTACT)
    req = served[1].last_request
    assert isinstance(req, ExtractionRequest) and req.schema == CONTACT and req.text == CARD
    parsed = sdk.responses.parse(model=MODEL, input=CARD, text_format=Contact)
    assert isinstance(parsed.output_parsed, Contact)
    any_object = create(sdk, input=CARD, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(any_object.output_text), dict)


def test_function_call_and_its_output_round_trip(sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    out = create(sdk, input="Weather in Oslo?", tools=TOOLS, tool_choice="required")
    (call,) = out.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), PARAMETERS["get_weather"])
    named = create(sdk, input="Weather?", tools=TOOLS, tool_choice={"type": "function", "name": "lookup_order"})
    assert named.output[0].name == "lookup_order"

    follow = [{"role": "user", "content": "Weather in Oslo?"}, call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 3}'}]
    answer = create(sdk, input=follow, tools=TOOLS, tool_choice="none")
    assert answer.output[0].type == "message" and answer.output_text
    req = served[1].last_request
    assert isinstance(req, ToolCallRequest) and req.tool_choice == "none"
    assistant, tool = req.messages[1], req.messages[2]
    assert assistant.tool_call_ids == (call.call_id,) and assistant.tool_calls[0].name == "get_weather"
    assert (tool.role, tool.tool_call_id, tool.name, tool.content) == ("tool", call.call_id, "get_weather", '{"temp": 3}')

    create(sdk, input=follow, tools=TOOLS, text=CONTACT_FORMAT)  # calls, or a final answer valid against the schema
    assert served[1].last_request.answer_schema == CONTACT

    cut = create(sdk, input="[length] Weather?", tools=TOOLS)
    assert cut.status == "incomplete" and cut.output == [] and cut.incomplete_details.reason == "max_output_tokens"


def test_streamed_text_and_calls(sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    events = list(create(sdk, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 2 and "".join(deltas) == REPLY
    assert events[-1].response.output_text == REPLY

    with sdk.responses.stream(model=MODEL, input="Weather in Oslo?", tools=TOOLS, tool_choice="required") as stream:
        seen = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in seen and "response.function_call_arguments.done" in seen
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"]

    with sdk.responses.stream(model=MODEL, input="Say hi", tools=TOOLS, tool_choice="none") as stream:
        assert "".join(e.delta for e in stream if e.type == "response.output_text.delta") == "I can answer without tools."

    cut = list(create(sdk, stream=True, max_output_tokens=1))
    assert cut[-1].type == "response.incomplete" and cut[-1].response.incomplete_details.reason == "max_output_tokens"
    assert cut[-1].response.output[0].status == "incomplete" and cut[-1].response.output_text == REPLY[:8]
    cut_call = list(create(sdk, input="[length] Weather?", tools=TOOLS, stream=True))
    assert [e.type for e in cut_call] == ["response.created", "response.in_progress", "response.incomplete"]

    with httpx.stream("POST", base_url(served[0]) + "/v1/responses", timeout=20,
                      json={"model": MODEL, "input": "hi", "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[0] == "event: response.created" and lines[1].startswith("data: {")


def test_text_before_the_calls_is_a_message_item_before_them(
        sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    out = create(sdk, input="[preamble] Weather in Oslo?", tools=TOOLS)
    assert [item.type for item in out.output] == ["message", "function_call"]
    assert out.output_text == PREAMBLE and out.output[0].status == "completed"
    assert out.output[1].name == "get_weather" and out.status == "completed"
    sent_back = [{"role": "user", "content": "Weather in Oslo?"},
                 *(item.model_dump(exclude_none=True) for item in out.output),
                 {"type": "function_call_output", "call_id": out.output[1].call_id, "output": '{"temp": 3}'}]
    create(sdk, input=sent_back, tools=TOOLS)
    turn = served[1].last_request.messages[1]  # the text and its call: one assistant turn, as the model wrote it
    assert (turn.role, turn.content, [c.name for c in turn.tool_calls]) == ("assistant", PREAMBLE, ["get_weather"])

    with sdk.responses.stream(model=MODEL, input="[preamble] Weather in Oslo?", tools=TOOLS,
                              parallel_tool_calls=True) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    assert final.output_text == PREAMBLE
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    done = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.done"]
    assert added == done == [(0, "message"), (1, "function_call"), (2, "function_call")]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == PREAMBLE
    assert {e.output_index for e in events if e.type.startswith("response.function_call_arguments.")} == {1, 2}


def test_no_tools_as_an_empty_list(sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    assert create(sdk, tools=[]).output_text == REPLY
    assert isinstance(served[1].last_request, TextRequest)
    out = create(sdk, input=CARD, tools=[], text=CONTACT_FORMAT)
    jsonschema.validate(json.loads(out.output_text), CONTACT)
    assert isinstance(served[1].last_request, ExtractionRequest)
    for choice in ("required", "auto", {"type": "function", "name": "get_weather"}):
        with pytest.raises(openai.BadRequestError) as exc:
            create(sdk, tools=[], tool_choice=choice)
        assert error_of(exc)["param"] == "tool_choice"


@pytest.mark.parametrize("mode", ["none", "auto", "required"])
def test_a_tool_named_like_a_mode_is_not_chosen_by_name(sdk: OpenAI, mode: str) -> None:
    tools = [*TOOLS, {"type": "function", "name": mode, "parameters": {"type": "object"}}]
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, tools=tools, tool_choice={"type": "function", "name": mode})
    assert error_of(exc)["param"] == "tool_choice.name" and "mode" in error_of(exc)["message"]


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"max_output_tokens": 10**7}, "max_output_tokens"),
])
def test_refusals_name_the_field(sdk: OpenAI, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, **kwargs)
    assert error_of(exc)["param"] == param


def test_engine_errors_name_the_responses_fields(sdk: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, input="[too-long] Say hello")
    assert error_of(exc)["param"] == "input" and error_of(exc)["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        create(sdk, tools=[*TOOLS, TOOLS[0]])
    assert error_of(exc)["param"] == "tools[2].name"


# -- on the demo models ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_sdk(real: ServerThread) -> OpenAI:  # noqa: F811
    return OpenAI(base_url=base_url(real) + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_demo_schema_and_call_and_stream(demo_sdk: OpenAI) -> None:
    out = demo_sdk.responses.create(model="demo", input=CARD, text=CONTACT_FORMAT, max_output_tokens=200)
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), CONTACT)
    with demo_sdk.responses.stream(model="demo", input=CARD, text_format=Contact, max_output_tokens=200) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 2 and isinstance(final.output_parsed, Contact)
    call = demo_sdk.responses.create(model="demo", input="Where is my order ORD-538485?", tools=TOOLS,
                                     tool_choice="required", max_output_tokens=120)
    (item,) = call.output
    assert item.type == "function_call" and item.name in PARAMETERS
    jsonschema.validate(json.loads(item.arguments), PARAMETERS[item.name])
