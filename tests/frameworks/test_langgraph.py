"""LangGraph's prebuilt ReAct agent (``create_react_agent``) over langchain-openai's ``ChatOpenAI``, unchanged,
against a real server on SmolLM2-135M-Instruct: two tools, to a final text answer within 4 model requests. The
model is LangGraph's dynamic model (a callable of the state): tools bound with ``tool_choice`` "required" while the
conversation has no tool result yet, ``auto`` after it.
"""

from __future__ import annotations

import warnings

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_openai import ChatOpenAI

from tests.frameworks.conftest import MAX_TURNS, Served
from tests.frameworks.tools import MAX_TOKENS, QUESTION, get_time, get_weather


@pytest.fixture(scope="module")
def served(smollm2_server: Served) -> Served:
    return smollm2_server


def test_react_agent_answers_in_text(served: Served) -> None:
    with warnings.catch_warnings():  # langgraph 1.x points to langchain.agents.create_agent; the prebuilt one stays
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

    llm = ChatOpenAI(model=served.model, base_url=served.base_url, api_key="unused", max_tokens=MAX_TOKENS,
                     temperature=0.0, max_retries=0)
    tools = [get_weather, get_time]
    forced, free = llm.bind_tools(tools, tool_choice="required"), llm.bind_tools(tools)

    def model(state, runtime):
        return free if any(isinstance(m, ToolMessage) for m in state["messages"]) else forced

    agent = create_react_agent(model, tools=tools)
    turns = served.turns()
    # a step is a model call or a tool run: 4 model requests and the tool runs between them fit in 2 * 4
    state = agent.invoke({"messages": [("user", QUESTION)]}, config={"recursion_limit": 2 * MAX_TURNS})
    last = state["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls and isinstance(last.content, str) and last.content.strip()
    turns.assert_loop()
