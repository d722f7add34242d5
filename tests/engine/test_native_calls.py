"""Tool calls in the model's own format, end to end: a tiny random model whose template is Qwen's (Hermes
``<tool_call>`` blocks, the markers special tokens) writes only calls to declared tools with valid arguments under
auto, a forced call from the first token, an answer schema's JSON in place of text, and a call cut at max_tokens
is neither a call nor text; a Llama-3 template (calls are bare JSON objects) with an answer schema beside its tools
reads each final answer as the answer and each call as a call; SmolLM2 (ChatML, no tools in its template: the generic
JSON call) under auto."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import jsonschema
import pytest
from transformers import AutoTokenizer

from structspec.assembly import assemble_engine
from structspec.chat_template import call_family
from structspec.engine.api import ChatMessage, ToolCallRequest
from structspec.engine.types import Outcome, SamplingParams, ToolCall
from structspec.models.loading import load_profile
from tests.conftest import need_llamacpp, smollm2_gguf
from tests.test_chat_template import DEMO_TOKENIZER, LLAMA3, QWEN, loaded, tiny_model

# Qwen2.5's template, shortened, with the call format its own instructions say
HERMES = QWEN.replace("'\n</tools><|im_end|>\n'", "'\n</tools>\n\nFor each function call, return a json object "
                      "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                      "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n'")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 20}},
                                                "required": ["city"], "additionalProperties": False}}}
ASK = (ChatMessage("user", "What is the weather in Paris?"),)


@pytest.fixture(scope="module")
def hermes_engine(tmp_path_factory):
    assert "<tool_call>" in HERMES
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    tok.add_special_tokens({"eos_token": "<|im_end|>",
                            "additional_special_tokens": ["<|im_start|>", "<tool_call>", "</tool_call>"]})
    tok.bos_token = None
    tok.chat_template = HERMES
    folder = tmp_path_factory.mktemp("hermes")
    tok.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    engine = assemble_engine(loaded(tok, tiny_model(tok, "llama"), HERMES))
    engine.start()
    yield engine
    engine.stop()


def call(engine, **fields):
    return asyncio.run(engine.call_tool(ToolCallRequest(messages=ASK, tools=(WEATHER,), **fields)))


def test_the_engine_writes_its_templates_call_format(hermes_engine):
    assert hermes_engine.call_format.family == "hermes"
    prompt = hermes_engine.prepare_toolcall(ToolCallRequest(messages=ASK, tools=(WEATHER,))).prompt
    text = hermes_engine.tokenizer.decode(prompt)
    assert "<tool_call>" in text and "answer with only a JSON object" not in text  # the template's own instructions


def test_a_forced_call_opens_with_the_trigger_and_is_valid(hermes_engine):
    res = call(hermes_engine, tool_choice="required", sampling=SamplingParams(max_tokens=64))
    assert res.result.outcome is Outcome.VALID, res.result.error
    assert res.result.text.startswith("<tool_call>\n{") and res.result.text.endswith("</tool_call>")
    assert [c.name for c in res.calls] == ["get_weather"]
    jsonschema.validate(res.calls[0].arguments, WEATHER["function"]["parameters"])


def test_under_auto_every_call_is_declared_and_valid(hermes_engine):
    outcomes = []
    for seed in range(6):
        res = call(hermes_engine, sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=48))
        outcomes.append(res.result.outcome)
        assert res.result.outcome in (Outcome.VALID, Outcome.TEXT, Outcome.TRUNCATED), res.result.error
        for c in res.calls:
            assert c.name == "get_weather"
            jsonschema.validate(c.arguments, WEATHER["function"]["parameters"])
        if res.result.outcome is Outcome.TEXT:
            assert "<tool_call>" not in res.text
    assert outcomes  # a random model: which of the three it does is chance; none may be invalid


def test_a_call_cut_at_max_tokens_is_neither_a_call_nor_text(hermes_engine):
    res = call(hermes_engine, tool_choice="required", sampling=SamplingParams(max_tokens=6))
    assert res.result.outcome is Outcome.TRUNCATED
    assert res.calls == [] and res.text is None


def test_an_answer_schema_replaces_the_text_answer(hermes_engine):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10}}, "required": ["answer"],
              "additionalProperties": False}
    res = call(hermes_engine, tool_choice="none", answer_schema=schema, sampling=SamplingParams(max_tokens=64))
    assert res.result.outcome is Outcome.VALID, res.result.error
    assert res.calls == [] and set(res.result.value) == {"answer"}


# -- Llama 3.1's template: a call is a bare JSON object, as an answer schema's answer is ------------------------------

@pytest.fixture(scope="module")
def llama3_engine(tmp_path_factory):
    template = LLAMA3.replace("'You have access to the following functions.", "'<|python_tag|> opens calls. "
                              "You have access to the following functions.")
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "additional_special_tokens": [
        "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>"]})
    tok.chat_template = template
    folder = tmp_path_factory.mktemp("llama3")
    tok.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    engine = assemble_engine(loaded(tok, tiny_model(tok, "llama"), template))
    engine.start()
    yield engine
    engine.stop()


def test_a_llama3_answer_beside_tools_is_the_answer_and_a_call_a_call(llama3_engine):
    assert llama3_engine.call_format.family == "llama3"
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}}, "required": ["answer"],
              "additionalProperties": False}
    answers = calls = 0
    for seed in range(8):
        res = call(llama3_engine, answer_schema=schema, sampling=SamplingParams(temperature=1.0, seed=seed,
                                                                                max_tokens=48))
        assert res.result.outcome in (Outcome.VALID, Outcome.TRUNCATED), res.result.error
        if res.result.outcome is Outcome.VALID and res.calls:
            calls += 1
            assert res.calls[0].name == "get_weather" and res.text is None
            jsonschema.validate(res.calls[0].arguments, WEATHER["function"]["parameters"])
        elif res.result.outcome is Outcome.VALID:
            answers += 1
            jsonschema.validate(res.result.value, schema)
            assert json.loads(res.text) == res.result.value
    assert answers and calls  # a random model: over these seeds it writes both


# -- SmolLM2-135M-Instruct on llama.cpp: ChatML renders no tools, so the generic JSON call --------------------------

@pytest.fixture(scope="module")
def smollm2_engine():
    need_llamacpp()
    engine = assemble_engine(load_profile(str(smollm2_gguf()), executor="llamacpp"))
    engine.start()
    yield engine
    engine.stop()


@pytest.mark.parametrize("question", ["What is the weather in Paris?", "Say hello"])
def test_smollm2_under_auto_calls_only_declared_tools_with_valid_arguments(smollm2_engine, question):
    assert smollm2_engine.call_format.family == "json"
    res = asyncio.run(smollm2_engine.call_tool(ToolCallRequest(
        messages=(ChatMessage("user", question),), tools=(WEATHER,), sampling=SamplingParams(max_tokens=64))))
    assert res.result.outcome in (Outcome.VALID, Outcome.TEXT, Outcome.TRUNCATED), res.result.error
    for c in res.calls:
        assert c.name == "get_weather"
        jsonschema.validate(c.arguments, WEATHER["function"]["parameters"])
    print(question, "->", res.result.outcome, res.calls, repr(res.text))


def test_the_family_is_read_from_the_templates_markers():
    assert call_family("{% for tool in tools %}...{% endfor %}<tool_call>\n{...}\n</tool_call>") == "hermes"
    assert call_family("{%- if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]") == "mistral"
    assert call_family("{%- if tools %}<|python_tag|>{% endif %}") == "llama3"
    assert call_family("{% for m in messages %}{{ m.content }}{% endfor %}") == "json"
    assert call_family("<tool_call> but it never reads the tool list") == "json"
    assert call_family(None) == "json"


def test_an_agents_earlier_call_and_the_tools_result_are_turns_of_the_prompt(hermes_engine):
    turns = (*ASK, ChatMessage("assistant", "", tool_calls=(ToolCall("get_weather", {"city": "Paris"}),),
                               tool_call_ids=("call_1",)),
             ChatMessage("tool", "18 C and sunny", tool_call_id="call_1", name="get_weather"))
    text = hermes_engine.tokenizer.decode(hermes_engine.prepare_toolcall(ToolCallRequest(
        messages=turns, tools=(WEATHER,))).prompt)
    assert "<|im_start|>tool\n18 C and sunny<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_the_plain_formats_text_answer_under_auto_stops_at_its_next_turn(demo_engine_for_calls):
    seq = demo_engine_for_calls.prepare_toolcall(ToolCallRequest(messages=ASK, tools=(WEATHER,)))
    assert seq.stop == demo_engine_for_calls.prompts.text_stop and "\n### User:" in seq.stop
    forced = demo_engine_for_calls.prepare_toolcall(ToolCallRequest(messages=ASK, tools=(WEATHER,),
                                                                    tool_choice="required"))
    assert forced.stop == ()


@pytest.fixture(scope="module")
def demo_engine_for_calls(demo_models):
    return assemble_engine(demo_models)


def test_a_plain_format_model_is_offered_an_answer_under_auto_only(demo_models):
    """A model without a template and not trained on call-only turns (``plain_answers``) is prompted for its own
    turn under auto (a call or a text answer), and for a call where the call is forced; the demo pair, trained on
    call-only turns, keeps ``### Call:``."""
    answering = assemble_engine(dataclasses.replace(demo_models, plain_answers=True))
    trained = assemble_engine(demo_models)
    asked = ToolCallRequest(messages=(ChatMessage("user", "Say hello"),), tools=(WEATHER,))

    def ending(engine, request):
        return engine.tokenizer.decode(engine.prepare_toolcall(request).prompt)[-40:]

    assert ending(answering, asked).endswith("### User:\nSay hello\n### Assistant:\n")
    assert ending(answering, dataclasses.replace(asked, tool_choice="required")).endswith("### Call:\n")
    assert ending(trained, asked).endswith("### Call:\n")


def test_under_none_a_plain_format_model_is_asked_for_an_answer_and_cannot_call(demo_models):
    """The demo pair, trained on ``### Call:`` turns, is the model that would call: under none its prompt ends at the
    answer heading and the grammar refuses the call heading and call JSON, so what it writes is text, not a call."""
    engine = assemble_engine(demo_models)
    none = ToolCallRequest(messages=ASK, tools=(WEATHER,), tool_choice="none", sampling=SamplingParams(max_tokens=48))
    seq = engine.prepare_toolcall(none)
    assert engine.tokenizer.decode(seq.prompt).endswith("### User:\nWhat is the weather in Paris?\n### Assistant:\n")
    assert seq.stop == engine.prompts.text_stop
    refused = seq.matcher
    assert not refused.consume(engine.tokenizer.encode("### Call:", add_special_tokens=False))
    engine.start()
    try:
        for seed in (None, 1, 2):
            sampling = SamplingParams(max_tokens=48, temperature=0.0 if seed is None else 1.0, seed=seed)
            res = asyncio.run(engine.call_tool(dataclasses.replace(none, sampling=sampling)))
            assert res.calls == [] and res.result.outcome in (Outcome.TEXT, Outcome.TRUNCATED), res.result
            assert res.text is not None and res.text[:1] not in ("{", "[") and "### Call:" not in res.result.text
    finally:
        engine.stop()
