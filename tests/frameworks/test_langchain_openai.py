"""langchain-openai's ``ChatOpenAI``, unchanged, against a real server on the demo models: a plain ``invoke`` (free
text), ``bind_tools`` (a forced call and a call under ``auto``: only declared tools, arguments that validate), and
``with_structured_output`` with each of its methods (json_schema, function_calling, json_mode), each validated.
"""

from __future__ import annotations

import jsonschema
import pytest
from langchain_core.messages import AIMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI

from tests.frameworks.conftest import Served
from tests.frameworks.tools import CARD, Contact, get_time, get_weather

TOOLS = [get_weather, get_time]
PARAMETERS = {t.__name__: convert_to_openai_tool(t)["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def served(demo_server: Served) -> Served:
    return demo_server


@pytest.fixture(scope="module")
def llm(served: Served) -> ChatOpenAI:
    return ChatOpenAI(model=served.model, base_url=served.base_url, api_key="unused", max_tokens=200,  # type: ignore[arg-type]
                      temperature=0.0, max_retries=0)


def test_plain_invoke_is_free_text(llm: ChatOpenAI) -> None:
    out = llm.invoke("Say hello.", max_tokens=16)
    assert isinstance(out, AIMessage) and isinstance(out.content, str) and out.content.strip() and not out.tool_calls


@pytest.mark.parametrize("tool_choice", ["get_weather", "any", "auto"])
def test_bind_tools_calls_only_declared_tools_with_valid_arguments(llm: ChatOpenAI, tool_choice: str) -> None:
    out = llm.bind_tools(TOOLS, tool_choice=tool_choice).invoke("What is the weather in Paris?")
    assert isinstance(out, AIMessage)
    if tool_choice != "auto":
        assert out.tool_calls and (tool_choice == "any" or out.tool_calls[0]["name"] == "get_weather")
    for call in out.tool_calls:  # under auto: a call or a text answer, never an invalid call
        jsonschema.validate(call["args"], PARAMETERS[call["name"]])
    assert out.tool_calls or (isinstance(out.content, str) and out.content.strip())
    assert not out.invalid_tool_calls


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_with_structured_output_validates(llm: ChatOpenAI, method: str) -> None:
    structured = llm.with_structured_output(Contact, method=method)  # type: ignore[arg-type]
    prompt = [("system", "Extract the contact as JSON with the keys name, email, company and city."), ("user", CARD)]
    out = structured.invoke(prompt)
    assert isinstance(out, Contact)
