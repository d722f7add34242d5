"""The OpenAI Agents SDK (``openai-agents``), unchanged, against a real server on SmolLM2-135M-Instruct: a two-tool
agent on the chat-completions model to a final text answer, an agent whose ``output_type`` is a Pydantic model, and
the SDK's default model (the Responses API, through the default client it is given), each within 4 model requests.
The first request forces a call (``tool_choice`` "required"); the SDK's ``reset_tool_choice`` (on by default) sets
``auto`` after a tool ran. An agent with an ``output_type`` and no tools on the default model is one request, which
the SDK sends with ``tools: []`` (no tools, as on OpenAI's API).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from tests.frameworks.conftest import MAX_TURNS, Served
from tests.frameworks.tools import CARD, MAX_TOKENS, QUESTION, Contact, Weather, get_time, get_weather

TOOLS = [function_tool(get_weather), function_tool(get_time)]
SETTINGS = ModelSettings(max_tokens=MAX_TOKENS, temperature=0.0, tool_choice="required")


@pytest.fixture(scope="module")
def served(smollm2_server: Served) -> Iterator[Served]:
    set_tracing_disabled(True)  # traces go to OpenAI's servers, unreachable here
    yield smollm2_server


def client(served: Served) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=120)


def test_two_tool_agent_on_chat_completions_answers_in_text(served: Served) -> None:
    agent = Agent(name="weather", instructions="Answer with the tools' results.", tools=TOOLS, model_settings=SETTINGS,
                  model=OpenAIChatCompletionsModel(model=served.model, openai_client=client(served)))
    turns = served.turns()
    result = Runner.run_sync(agent, QUESTION, max_turns=MAX_TURNS)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    turns.assert_loop()


def test_output_type_is_a_pydantic_model(served: Served) -> None:
    agent = Agent(name="weather", instructions="Report the weather.", tools=TOOLS, output_type=Weather,
                  model_settings=ModelSettings(max_tokens=120, temperature=0.0, tool_choice="required"),
                  model=OpenAIChatCompletionsModel(model=served.model, openai_client=client(served)))
    turns = served.turns()
    result = Runner.run_sync(agent, QUESTION, max_turns=MAX_TURNS)
    assert isinstance(result.final_output, Weather)
    turns.assert_loop()  # the final answer is a text message (the schema's JSON), not a call


def test_default_responses_model_answers_in_text(served: Served) -> None:
    set_default_openai_client(client(served), use_for_tracing=False)  # a model named by string: the Responses API
    agent = Agent(name="weather", instructions="Answer with the tools' results.", tools=TOOLS,
                  model_settings=SETTINGS, model=served.model)
    turns = served.turns()
    result = Runner.run_sync(agent, QUESTION, max_turns=MAX_TURNS)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert {route for route, _, _ in turns.since()} == {"POST /v1/responses"}
    turns.assert_loop()


def test_default_responses_model_with_an_output_type_and_no_tools(served: Served) -> None:
    set_default_openai_client(client(served), use_for_tracing=False)
    agent = Agent(name="extractor", instructions="Extract the contact card's fields.", output_type=Contact,
                  model_settings=ModelSettings(max_tokens=120, temperature=0.0), model=served.model)
    turns = served.turns()
    result = Runner.run_sync(agent, CARD, max_turns=MAX_TURNS)
    assert isinstance(result.final_output, Contact)
    assert dict(turns.since()) == {("POST /v1/responses", "OK", "stop"): 1}
