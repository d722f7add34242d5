"""Chat completions beyond a schema, called with the openai SDK: free text (stop, max_tokens, streaming), tool calls
streamed per index, text a model writes before its calls (the message's content), a cut call, ``tools: []`` (no
tools), an answer schema beside tools, a conversation's calls kept structured, and the lenient and refused fields
(a tool named like a ``tool_choice`` mode chosen by name among them).

The engine is the fake one with a free-text turn (``TextFake``): what matters here is the wire, not the words.
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator, Iterator

import openai
import pytest
from openai import OpenAI

from structspec.engine.api import ExtractionRequest, TextRequest, ToolCallRequest
from structspec.engine.types import GenerationResult, TextDelta
from structspec.service.settings import ServiceSettings
from tests.service.fakes import PREAMBLE, FakeEngine
from tests.service.harness import ServerThread, settings_for
from tests.service.test_openai_http import TOOLS, base_url, contact_format, error_of, real  # noqa: F401

MODEL = ServiceSettings().profile
REPLY = "Hello there. The weather is fine today. Anything else?"


class TextFake(FakeEngine):
    """The fake engine with a free-text turn: ``REPLY``, cut at the first stop string."""

    async def chat(self, request: TextRequest) -> GenerationResult:
        result = None
        async for item in self.chat_stream(request):
            if isinstance(item, GenerationResult):
                result = item
        assert result is not None
        return result

    async def chat_stream(self, request: TextRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        self._admit(request)  # type: ignore[arg-type]
        prompt = request.messages[-1].content
        self._check_prompt(prompt)
        text = REPLY
        for stop in request.stop:
            text = text.split(stop, 1)[0]
        async for item in self._decode(request.request_id, prompt, text, request.sampling.max_tokens,
                                       request.deadline, is_json=False):
            yield item


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ServerThread, TextFake]]:
    engine = TextFake()
    with ServerThread(settings_for(tmp_path_factory.mktemp("free-text"), http_port=0), engine) as st:
        yield st, engine


@pytest.fixture(scope="module")
def sdk(served: tuple[ServerThread, TextFake]) -> OpenAI:
    return OpenAI(base_url=base_url(served[0]) + "/v1", api_key="unused", max_retries=0, timeout=20)


def ask(sdk: OpenAI, content: str = "Say hello", **kwargs: Any) -> Any:
    kwargs.setdefault("messages", [{"role": "user", "content": content}])
    return sdk.chat.completions.create(model=MODEL, **kwargs)


def test_free_text_plain_with_stop_and_max_tokens(sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    out = ask(sdk)
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == REPLY and not choice.message.tool_calls
    assert out.usage.model_extra["structspec"]["outcome"] == "text"
    req = served[1].last_request
    assert isinstance(req, TextRequest) and req.stop == () and req.messages[-1].content == "Say hello"

    assert ask(sdk, stop=".").choices[0].message.content == "Hello there"
    assert ask(sdk, stop=["weather", "!"]).choices[0].message.content == "Hello there. The "
    assert served[1].last_request.stop == ("weather", "!")
    as_text = ask(sdk, response_format={"type": "text"}, max_completion_tokens=2)
    assert as_text.choices[0].finish_reason == "length" and as_text.choices[0].message.content == REPLY[:16]
    assert as_text.usage.completion_tokens == 2


def test_free_text_streamed_with_usage(sdk: OpenAI) -> None:
    chunks = list(ask(sdk, stream=True, stream_options={"include_usage": True}, stop=["Anything"]))
    deltas = [c for c in chunks if c.choices]
    assert deltas[0].choices[0].delta.role == "assistant"
    assert len([c for c in deltas if c.choices[0].delta.content]) > 2  # token by token, not one blob
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == REPLY.split("Anything")[0]
    assert [c.choices[0].finish_reason for c in deltas][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    cut = list(ask(sdk, stream=True, max_tokens=1))
    assert cut[-1].choices[0].finish_reason == "length"


def test_stop_is_refused_for_json_outputs_and_bad_stops_are_named(sdk: OpenAI) -> None:
    for kwargs in ({"response_format": contact_format()}, {"response_format": {"type": "json_object"}},
                   {"tools": TOOLS}):
        with pytest.raises(openai.BadRequestError) as exc:
            ask(sdk, stop="\n", **kwargs)
        assert error_of(exc)["param"] == "stop"
    with pytest.raises(openai.BadRequestError) as exc:
        ask(sdk, stop=["a", "b", "c", "d", "e"])
    assert error_of(exc)["param"] == "stop"


def test_tool_calls_streamed_per_index_and_a_cut_call(sdk: OpenAI) -> None:
    plain = ask(sdk, "Weather in Oslo?", tools=TOOLS, parallel_tool_calls=True)
    calls = plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "tool_calls" and len(calls) == 2
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    assert json.loads(calls[0].function.arguments)["city"]

    chunks = list(ask(sdk, "Weather in Oslo?", tools=TOOLS, parallel_tool_calls=True, stream=True))
    parts = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    for index in (0, 1):
        mine = [p for p in parts if p.index == index]
        assert mine[0].id.startswith("call_") and mine[0].function.name == TOOLS[index]["function"]["name"]
        assert all(p.id is None and p.function.name is None for p in mine[1:])  # id and name once, first
        assert json.loads("".join(p.function.arguments or "" for p in mine)) == json.loads(calls[index].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    cut = ask(sdk, "[length] Weather in Oslo?", tools=TOOLS)  # the fake stops halfway through the call
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.content is None and cut.choices[0].message.tool_calls is None
    streamed = list(ask(sdk, "[length] Weather in Oslo?", tools=TOOLS, stream=True))
    assert streamed[-1].choices[0].finish_reason == "length"
    assert not any(c.choices[0].delta.content or c.choices[0].delta.tool_calls for c in streamed)


def test_text_before_the_calls_is_the_messages_content(sdk: OpenAI) -> None:
    out = ask(sdk, "[preamble] Weather in Oslo?", tools=TOOLS)
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and message.content == PREAMBLE
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    chunks = list(ask(sdk, "[preamble] Weather in Oslo?", tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == PREAMBLE
    first_call = next(i for i, d in enumerate(deltas) if d.tool_calls)
    assert all(not d.content for d in deltas[first_call:])  # the text comes before the calls


def test_no_tools_as_an_empty_list(sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    out = ask(sdk, tools=[])
    assert out.choices[0].message.content == REPLY and isinstance(served[1].last_request, TextRequest)
    ask(sdk, tools=[], response_format=contact_format())
    assert isinstance(served[1].last_request, ExtractionRequest)
    for choice in ("required", "none", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError) as exc:
            ask(sdk, tools=[], tool_choice=choice)
        assert error_of(exc)["param"] == "tool_choice"


@pytest.mark.parametrize("mode", ["none", "auto", "required"])
def test_a_tool_named_like_a_mode_is_not_chosen_by_name(sdk: OpenAI, mode: str) -> None:
    tools = [*TOOLS, {"type": "function", "function": {"name": mode, "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as exc:
        ask(sdk, tools=tools, tool_choice={"type": "function", "function": {"name": mode}})
    assert error_of(exc)["param"] == "tool_choice.function.name" and "mode" in error_of(exc)["message"]


def test_a_conversation_keeps_its_calls_and_an_answer_schema_beside_tools(
        sdk: OpenAI, served: tuple[ServerThread, TextFake]) -> None:
    first = ask(sdk, "Weather in Oslo?", tools=TOOLS)
    message = first.choices[0].message
    (call,) = message.tool_calls
    history = [{"role": "user", "content": "Weather in Oslo?"}, message,
               {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'}]
    ask(sdk, messages=history, tools=TOOLS, response_format=contact_format())
    req = served[1].last_request
    assert isinstance(req, ToolCallRequest) and req.answer_schema == contact_format()["json_schema"]["schema"]
    assistant, tool = req.messages[1], req.messages[2]
    assert assistant.role == "assistant" and assistant.content == "" and assistant.tool_call_ids == (call.id,)
    assert assistant.tool_calls[0].name == "get_weather"
    assert dict(assistant.tool_calls[0].arguments) == json.loads(call.function.arguments)
    assert (tool.role, tool.tool_call_id, tool.name, tool.content) == ("tool", call.id, "get_weather", '{"temp": 3}')
    ask(sdk, messages=history, tools=TOOLS, response_format={"type": "json_object"})
    assert served[1].last_request.answer_schema == {"type": "object"}
    # free text after a tool turn: the calls stay structured too
    ask(sdk, messages=[*history[:2], {**history[2], "name": "get_weather"}])
    assert isinstance(served[1].last_request, TextRequest) and served[1].last_request.messages[1].tool_calls


def test_lenient_fields_are_accepted_and_logged_once(sdk: OpenAI, caplog: pytest.LogCaptureFixture) -> None:
    lenient = {"store": True, "metadata": {"team": "a"}, "service_tier": "auto", "prompt_cache_key": "k1",
               "safety_identifier": "u-1"}
    strict_tools = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    with caplog.at_level(logging.INFO, logger="structspec.service.http"):
        for _ in range(2):
            assert ask(sdk, user="u-1", extra_body=lenient).choices[0].finish_reason == "stop"
        out = ask(sdk, "Weather?", tools=strict_tools, parallel_tool_calls=True, extra_body=lenient)
        assert out.choices[0].finish_reason == "tool_calls"
    noted = [r.getMessage() for r in caplog.records if "accepted and ignored" in r.getMessage()]
    for name in lenient:
        assert sum(f"'{name}'" in m for m in noted) <= 1  # once per process (an earlier test may have logged it)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 1}, "top_logprobs"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"presence_penalty": 0.2}, "presence_penalty"),
    ({"frequency_penalty": -0.2}, "frequency_penalty"),
    ({"extra_body": {"reasoning_effort": "high"}}, "reasoning_effort"),  # would change a reasoning model's output
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"response_format": {"type": "text", "json_schema": {"name": "x", "schema": {}}}}, "response_format.json_schema"),
])
def test_refused_fields_name_their_param(sdk: OpenAI, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        ask(sdk, **kwargs)
    assert error_of(exc)["param"] == param


# -- on the demo models ----------------------------------------------------------------------------------


def test_demo_free_text_plain_stop_and_streamed(real: ServerThread) -> None:  # noqa: F811
    if not hasattr(real.engine, "chat"):
        pytest.skip("this engine has no free-text turn yet (Engine.chat)")
    demo = OpenAI(base_url=base_url(real) + "/v1", api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    out = demo.chat.completions.create(model="demo", messages=messages, max_tokens=40)
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content and not choice.message.tool_calls
    assert (choice.finish_reason == "length") == (out.usage.completion_tokens == 40)
    assert "### " not in choice.message.content  # never the prompt format's next heading
    text = choice.message.content
    if len(text) > 3:  # a stop string from the text itself ends it there
        stop = text[2:4]
        cut = demo.chat.completions.create(model="demo", messages=messages, max_tokens=40, stop=[stop])
        assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].message.content
        assert text.startswith(cut.choices[0].message.content)
    chunks = list(demo.chat.completions.create(model="demo", messages=messages, max_tokens=40, stream=True,
                                               stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text and chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    r = demo.responses.create(model="demo", input="Write one sentence about the sea.", max_output_tokens=40)
    assert r.output_text == text and r.status == ("incomplete" if choice.finish_reason == "length" else "completed")
