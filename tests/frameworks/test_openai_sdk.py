"""The official openai SDK, unchanged, against a real server on SmolLM2-135M-Instruct: chat completions and the
Responses API, streamed and not, free text, structured outputs (``parse`` with a Pydantic model), and an agent loop
written the way the SDK's own examples write it (call, run the tools, send their results back, until a text answer;
the first request forces a call, ``auto`` after it).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import OpenAI

from tests.frameworks.conftest import MAX_TURNS, Served
from tests.frameworks.tools import CARD, MAX_TOKENS, QUESTION, TOOL_RESULTS, Contact

CHAT_TOOLS = [{"type": "function", "function": {
    "name": name, "description": fn.__doc__,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
    for name, fn in TOOL_RESULTS.items()]
RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"]} for t in CHAT_TOOLS]


@pytest.fixture(scope="module")
def served(smollm2_server: Served) -> Served:
    return smollm2_server


@pytest.fixture(scope="module")
def sdk(served: Served) -> OpenAI:
    return OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=120)


# -- chat completions ---------------------------------------------------------------------------------------------


def test_chat_free_text(sdk: OpenAI, served: Served) -> None:
    out = sdk.chat.completions.create(model=served.model, max_tokens=MAX_TOKENS,
                                      messages=[{"role": "user", "content": "Say hello in one sentence."}])
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert choice.message.content and choice.message.content.strip()
    assert "<|im_start|>" not in choice.message.content and "### " not in choice.message.content


def test_chat_free_text_streamed(sdk: OpenAI, served: Served) -> None:
    chunks = list(sdk.chat.completions.create(model=served.model, max_tokens=MAX_TOKENS, stream=True,
                                              messages=[{"role": "user", "content": "Name three colours."}]))
    deltas = [c.choices[0] for c in chunks if c.choices]
    text = "".join(d.delta.content or "" for d in deltas)
    assert text.strip() and len([d for d in deltas if d.delta.content]) > 1  # streamed, not one blob
    assert deltas[-1].finish_reason in ("stop", "length")


def test_chat_parse_pydantic(sdk: OpenAI, served: Served) -> None:
    out = sdk.chat.completions.parse(model=served.model, max_tokens=200, response_format=Contact,
                                     messages=[{"role": "system", "content": "Extract the contact."},
                                               {"role": "user", "content": CARD}])
    assert isinstance(out.choices[0].message.parsed, Contact)


def test_chat_agent_loop_ends_with_text(sdk: OpenAI, served: Served) -> None:
    turns = served.turns()
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for turn in range(MAX_TURNS):
        msg = sdk.chat.completions.create(model=served.model, max_tokens=MAX_TOKENS, messages=messages,  # type: ignore[arg-type]
                                          tools=CHAT_TOOLS, tool_choice="required" if turn == 0 else "auto",  # type: ignore[arg-type]
                                          temperature=0.0).choices[0].message
        if not msg.tool_calls:
            break
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            assert call.function.name in TOOL_RESULTS
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": TOOL_RESULTS[call.function.name](**args)})
    assert msg.content and not msg.tool_calls
    turns.assert_loop()


# -- the Responses API ----------------------------------------------------------------------------------------------


def test_responses_text(sdk: OpenAI, served: Served) -> None:
    resp = sdk.responses.create(model=served.model, input="Say hello in one sentence.", max_output_tokens=MAX_TOKENS,
                                instructions="You are brief.")
    assert resp.status in ("completed", "incomplete") and resp.output_text.strip()


def test_responses_streamed(sdk: OpenAI, served: Served) -> None:
    events = list(sdk.responses.create(model=served.model, input="Name three colours.",
                                       max_output_tokens=MAX_TOKENS, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() and kinds.count("response.output_text.delta") > 1
    assert events[-1].response.output_text == text


def test_responses_parse_pydantic(sdk: OpenAI, served: Served) -> None:
    resp = sdk.responses.parse(model=served.model, input=CARD, instructions="Extract the contact.",
                               text_format=Contact, max_output_tokens=200)
    assert isinstance(resp.output_parsed, Contact)


def test_responses_agent_loop_ends_with_text(sdk: OpenAI, served: Served) -> None:
    turns = served.turns()
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    for turn in range(MAX_TURNS):
        resp = sdk.responses.create(model=served.model, input=items, tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
                                    tool_choice="required" if turn == 0 else "auto", max_output_tokens=MAX_TOKENS,
                                    temperature=0.0)
        calls = [item for item in resp.output if item.type == "function_call"]
        if not calls:
            break
        for call in calls:
            assert call.name in TOOL_RESULTS
            items.append({"type": "function_call", "call_id": call.call_id, "name": call.name,
                          "arguments": call.arguments})
            items.append({"type": "function_call_output", "call_id": call.call_id,
                          "output": TOOL_RESULTS[call.name](**json.loads(call.arguments))})
    assert resp.output_text.strip() and not calls
    turns.assert_loop()
