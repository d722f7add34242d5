"""pydantic-ai, unchanged, against a real server on SmolLM2-135M-Instruct (its OpenAI chat model through an
OpenAI provider at the server's base URL): tools with a ``str`` output to a final text answer, and a tool output
(``ToolOutput``: the answer is a call to the output tool, validated into the Pydantic model), within 4 requests.
The first request forces a function tool's call, through pydantic-ai's per-step settings (a capability's
``get_model_settings``); ``auto`` after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic_ai import Agent, ToolOutput, UsageLimits
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.frameworks.conftest import MAX_TURNS, Served
from tests.frameworks.tools import MAX_TOKENS, QUESTION, Weather, get_time, get_weather

LIMITS = UsageLimits(request_limit=MAX_TURNS)


@dataclass
class CallFirst(AbstractCapability):
    """``tool_choice`` "required" on the run's first model request, the agent's own settings after it."""

    def get_model_settings(self):
        return lambda ctx: {"tool_choice": "required"} if ctx.run_step <= 1 else {}


@pytest.fixture(scope="module")
def served(smollm2_server: Served) -> Served:
    return smollm2_server


def model(served: Served) -> OpenAIChatModel:
    return OpenAIChatModel(served.model, provider=OpenAIProvider(base_url=served.base_url, api_key="unused"))


def test_tools_and_str_output_answer_in_text(served: Served) -> None:
    agent = Agent(model(served), output_type=str, tools=[get_weather, get_time],
                  instructions="Answer with the tools' results.", capabilities=[CallFirst()],
                  model_settings={"max_tokens": MAX_TOKENS, "temperature": 0.0})
    turns = served.turns()
    result = agent.run_sync(QUESTION, usage_limits=LIMITS)
    assert isinstance(result.output, str) and result.output.strip()
    turns.assert_loop()


def test_tool_output_validates(served: Served) -> None:
    agent = Agent(model(served), output_type=ToolOutput(Weather), tools=[get_weather],
                  instructions="Report the weather.", capabilities=[CallFirst()], model_settings={"max_tokens": 120, "temperature": 0.0})
    turns = served.turns()
    result = agent.run_sync(QUESTION, usage_limits=LIMITS)
    assert isinstance(result.output, Weather) and result.output.city.strip()
    assert 1 <= turns.count <= MAX_TURNS  # ends with the output tool's call (a function tool may run first or not)
