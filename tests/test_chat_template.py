"""Prompts through a model's chat template: the engine's prompt ids equal ``apply_chat_template``'s for the same
messages, on tiny random models the tests build (the demo tokenizer with each family's special tokens and a short,
faithful copy of its template: ChatML as SmolLM2 and Qwen write it, Llama 3's, Mistral's and Gemma's, those two
refusing a system message), and on SmolLM2's real GGUF tokenizer and template."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from structspec.assembly import assemble_engine, engine_model_key
from structspec.chat_template import (CALL_FORM, ChatPrompts, ChatTemplateError, PlainPrompts, extraction_system,
                                      fold_system)
from structspec.engine.api import ChatMessage, ExtractionRequest, ToolCallRequest
from structspec.engine.types import EngineError, InvalidRequest, Outcome, SamplingParams
from structspec.models.loading import LoadedModels, gguf_tokenizer, load_profile
from tests.conftest import need_llamacpp, smollm2_gguf
from structspec.prompts import FewShotExample, ToolSpec, describe_tool, encode_prompt, extraction_prompt

DEMO_TOKENIZER = Path(__file__).resolve().parents[1] / "structspec" / "models" / "demo" / "target"

# SmolLM2-135M-Instruct's template as its tokenizer_config.json holds it
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
          "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Qwen2.5's ChatML, shortened: the tools go into the system turn
QWEN = ("{%- if tools %}{{- '<|im_start|>system\n' }}{%- if messages[0]['role'] == 'system' %}"
        "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud.' }}"
        "{%- endif %}"
        "{{- '\n\n# Tools\n\n<tools>' }}{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}"
        "{{- '\n</tools><|im_end|>\n' }}{%- else %}{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- else %}"
        "{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\n' }}{%- endif %}{%- endif %}"
        "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
        "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
# Llama 3.1's, shortened: BOS written by the template, the system turn with its dates, tools as JSON in it
LLAMA3 = ("{{- bos_token }}{%- if messages[0]['role'] == 'system' %}"
          "{%- set system_message = messages[0]['content']|trim %}"
          "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
          "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}{%- if tools is not none %}"
          "{{- 'Environment: ipython\n' }}{%- endif %}"
          "{{- 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' }}{%- if tools is not none %}"
          "{{- 'You have access to the following functions.\n\n' }}{%- for t in tools %}{{- t | tojson(indent=4) }}"
          "{{- '\n\n' }}{%- endfor %}{%- endif %}{{- system_message }}{{- '<|eot_id|>' }}"
          "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' "
          "+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")
# Mistral-7B-Instruct-v0.1's: strictly alternating user/assistant, no system role
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
# Gemma 2's: no system role, the assistant is the "model"
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

# family -> (template, bos, eos, other special tokens, architecture)
FAMILIES = {
    "chatml": (CHATML, "<|im_start|>", "<|im_end|>", [], "llama"),
    "qwen": (QWEN, None, "<|im_end|>", ["<|im_start|>"], "llama"),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", ["<|start_header_id|>", "<|end_header_id|>"], "llama"),
    "mistral": (MISTRAL, "<s>", "</s>", [], "llama"),
    "gemma": (GEMMA, "<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"], "gemma3"),
}
FOLDS_SYSTEM = {"mistral", "gemma"}  # their templates refuse a system message: it goes into the first user turn

SCHEMA = {"title": "Contact", "description": "A person's contact details.", "type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0,
                                                                            "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}
DOCUMENT = "Ada Lovelace, 36, ada@example.com"
TOOLS = ({"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}},)
CONVERSATION = (ChatMessage("user", "Rain in Oslo?"),)
SAMPLING = SamplingParams(temperature=0.0, max_tokens=48)


def family_tokenizer(tmp_path: Path, family: str):
    """The demo tokenizer with the family's special tokens added and its template set as the model's own."""
    template, bos, eos, others, _ = FAMILIES[family]
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    tok.add_special_tokens({"bos_token": bos, "eos_token": eos, "additional_special_tokens": others} if bos else
                           {"eos_token": eos, "additional_special_tokens": others})
    if not bos:
        tok.bos_token = None
    tok.chat_template = template
    tok.save_pretrained(tmp_path / family)
    return AutoTokenizer.from_pretrained(tmp_path / family)


def tiny_model(tok, architecture: str):
    """A random model of two layers, hidden 32, over ``tok``'s vocabulary."""
    torch.manual_seed(0)
    size = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, max_position_embeddings=2048, eos_token_id=tok.eos_token_id,
                bos_token_id=tok.bos_token_id, pad_token_id=tok.eos_token_id)
    if architecture == "gemma3":
        model = Gemma3ForCausalLM(Gemma3TextConfig(**size, sliding_window=64))
    else:
        model = LlamaForCausalLM(LlamaConfig(**size))
    return model.eval()


def loaded(tok, model, template: str | None, profile: str = "tiny") -> LoadedModels:
    return LoadedModels(profile, model, tok, None, torch.device("cpu"), torch.float32, chat_template=template)


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("families")
    made = {}
    for family, (template, *_, architecture) in FAMILIES.items():
        tok = family_tokenizer(tmp, family)
        made[family] = loaded(tok, tiny_model(tok, architecture), template)
    return made


def expected_extraction(family: str) -> list[dict[str, str]]:
    system = extraction_system(SCHEMA, None)
    if family in FOLDS_SYSTEM:
        return [{"role": "user", "content": f"{system}\n\n{DOCUMENT}"}]
    return [{"role": "system", "content": system}, {"role": "user", "content": DOCUMENT}]


def expected_toolcall(family: str, renders_tools: bool) -> list[dict[str, str]]:
    listed = "" if renders_tools else "Tools:\n" + describe_tool(ToolSpec.from_openai(TOOLS[0])) + "\n"
    if family in FOLDS_SYSTEM:
        return [{"role": "user", "content": f"{listed}{CALL_FORM}\n\nRain in Oslo?"}]
    return [{"role": "system", "content": listed + CALL_FORM}, {"role": "user", "content": "Rain in Oslo?"}]


def template_ids(tok, messages, tools=None) -> list[int]:
    return list(tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)["input_ids"])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_extractions_prompt_ids_are_the_templates_for_the_same_messages(family_models, family):
    models = family_models[family]
    tok, engine = models.tokenizer, assemble_engine(models)
    assert isinstance(engine.prompts, ChatPrompts)
    seq = engine.prepare_extraction(ExtractionRequest(schema=SCHEMA, text=DOCUMENT, sampling=SAMPLING))
    assert seq.prompt == template_ids(tok, expected_extraction(family))
    if FAMILIES[family][1] not in (None, "<|im_start|>"):  # a BOS of its own: the template's one, no second
        assert seq.prompt[0] == tok.bos_token_id and seq.prompt.count(tok.bos_token_id) == 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_tool_calls_prompt_ids_are_the_templates_for_the_same_messages_and_tools(family_models, family):
    models = family_models[family]
    tok, engine = models.tokenizer, assemble_engine(models)
    seq = engine.prepare_toolcall(ToolCallRequest(messages=CONVERSATION, tools=TOOLS, tool_choice="required",
                                                  sampling=SAMPLING))
    renders_tools = family in ("qwen", "llama3")  # the others' templates never read them: listed in words
    assert seq.prompt == template_ids(tok, expected_toolcall(family, renders_tools), list(TOOLS))
    assert ('"name": "get_weather"' in tok.decode(seq.prompt)) is renders_tools


def test_no_bos_is_added_where_the_template_begins_with_it(family_models):
    """SmolLM2's BOS is ``<|im_start|>``: the plain format's BOS in front would double it."""
    models = family_models["chatml"]
    ids = assemble_engine(models).prepare_extraction(ExtractionRequest(schema=SCHEMA, text=DOCUMENT)).prompt
    text = models.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nExtract Contact from the user's document as JSON.")
    assert ids[0] == models.tokenizer.bos_token_id != ids[1]
    llama = family_models["llama3"]
    ids = assemble_engine(llama).prepare_extraction(ExtractionRequest(schema=SCHEMA, text=DOCUMENT)).prompt
    assert ids[0] == llama.tokenizer.bos_token_id and ids.count(llama.tokenizer.bos_token_id) == 1


def test_worked_examples_are_earlier_turns(family_models):
    models = family_models["chatml"]
    example = FewShotExample("Bo Ek, 41", '{"name":"Bo Ek","age":41}')
    seq = assemble_engine(models).prepare_extraction(ExtractionRequest(schema=SCHEMA, text=DOCUMENT,
                                                                       examples=(example,)))
    messages = [{"role": "system", "content": extraction_system(SCHEMA, None)},
                {"role": "user", "content": example.text}, {"role": "assistant", "content": example.output},
                {"role": "user", "content": DOCUMENT}]
    assert seq.prompt == template_ids(models.tokenizer, messages)


@pytest.mark.parametrize("family", ["chatml", "gemma"])
def test_a_chat_prompt_generates_valid_json(family_models, family):
    engine = assemble_engine(family_models[family])
    engine.start()
    try:
        result = asyncio.run(engine.extract(ExtractionRequest(schema=SCHEMA, text=DOCUMENT, sampling=SAMPLING)))
        call = asyncio.run(engine.call_tool(ToolCallRequest(messages=CONVERSATION, tools=TOOLS, tool_choice="required",
                                                            sampling=SAMPLING)))
    finally:
        engine.stop()
    assert result.outcome is Outcome.VALID, result
    assert set(json.loads(result.text)) == {"name", "age"}
    assert call.result.outcome is Outcome.VALID and call.calls[0].name == "get_weather"


def test_the_template_hash_is_in_the_statistics_key(family_models):
    models = family_models["llama3"]
    digest = hashlib.sha256(LLAMA3.encode()).hexdigest()[:8]
    assert assemble_engine(models).model_key == engine_model_key(models) == f"tiny+chat-v2:{digest}"
    plain = loaded(models.tokenizer, models.target, None)
    assert engine_model_key(plain) == "tiny+plain-v5"  # the plain format's wording version, as a template's digest
    assert assemble_engine(plain).model_key == "tiny+plain-v5"


def test_the_plain_path_is_todays_prompt_byte_for_byte(family_models):
    models = family_models["mistral"]
    plain = loaded(models.tokenizer, models.target, None)
    engine = assemble_engine(plain)
    assert isinstance(engine.prompts, PlainPrompts)
    example = FewShotExample("Bo Ek, 41", '{"name":"Bo Ek","age":41}')
    request = ExtractionRequest(schema=SCHEMA, text=DOCUMENT, instruction="Names only.", examples=(example,))
    text = extraction_prompt(SCHEMA, DOCUMENT, "Names only.", (example,))
    prompt = engine.prompts.extraction(SCHEMA, DOCUMENT, "Names only.", (example,))
    assert prompt.text == text and prompt.ids == encode_prompt(plain.tokenizer, text)
    assert engine.prepare_extraction(request).prompt == encode_prompt(plain.tokenizer, text)


def test_the_public_start_of_a_chat_prompt_ends_before_the_document(family_models):
    models = family_models["chatml"]
    tok, engine = models.tokenizer, assemble_engine(models)
    seq = engine.prepare_extraction(ExtractionRequest(schema=SCHEMA, text=DOCUMENT, public_template=True))
    public = tok.decode(seq.prompt[:seq.public_prefix])
    assert public.endswith("<|im_start|>user\n") and DOCUMENT not in public
    said = engine.prepare_extraction(ExtractionRequest(schema=SCHEMA, text=DOCUMENT, public_template=True,
                                                       instruction="Mine."))
    assert said.public_prefix == 0  # a caller's instruction is in the system turn: nothing is public


def test_a_template_that_fails_is_one_clear_error(family_models):
    models = family_models["chatml"]
    broken = "{{ raise_exception('no chat here') }}"
    prompts = ChatPrompts(models.tokenizer, broken)
    with pytest.raises(ChatTemplateError, match="no chat here.*folded into the first user turn"):
        prompts.extraction(SCHEMA, DOCUMENT)
    engine = assemble_engine(loaded(models.tokenizer, models.target, "{{ messages[0]['content'] | nofilter }}"))
    with pytest.raises(EngineError, match="the model's chat template failed"):
        engine.prepare_extraction(ExtractionRequest(schema=SCHEMA, text=DOCUMENT))


def test_a_template_that_fails_a_conversation_names_the_messages(family_models):
    models = family_models["chatml"]
    engine = assemble_engine(loaded(models.tokenizer, models.target, "{{ messages[0]['content'] | nofilter }}"))
    with pytest.raises(InvalidRequest, match="chat template") as failed:
        engine.prepare_toolcall(ToolCallRequest(messages=CONVERSATION, tools=TOOLS))
    assert failed.value.field == "messages"


def test_folding_the_system_message():
    turns = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
             {"role": "assistant", "content": "A"}]
    assert fold_system(turns) == [{"role": "user", "content": "S\n\nU"}, {"role": "assistant", "content": "A"}]
    assert fold_system(turns[1:]) is None and fold_system(turns[:1]) is None


def test_the_tool_use_variant_serves_requests_with_tools(family_models):
    models = family_models["chatml"]
    prompts = ChatPrompts(models.tokenizer, {"default": CHATML, "tool_use": QWEN})
    assert "# Tools" in prompts.toolcall([ToolSpec.from_openai(t) for t in TOOLS], [("user", "Rain in Oslo?")]).text
    assert "# Tools" not in prompts.extraction(SCHEMA, DOCUMENT).text


def test_a_schema_without_a_title_is_named_by_its_id_or_described():
    untitled = {"type": "object", "properties": {"name": {"type": "string"}}}
    assert extraction_system(untitled, None).startswith("Extract the data of the user's document as JSON.\n")
    assert extraction_system(untitled, None, "person").startswith("Extract person from the user's document as JSON.")
    described = extraction_system({**untitled, "description": "A person."}, "Names only.")
    assert described.split("\n")[1:3] == ["A person.", "Names only."]
    assert '"description"' not in described  # said in words, not again in the schema shown


# -- SmolLM2's real tokenizer and template, read from its GGUF ------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_tokenizer():
    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf_tokenizer(gguf))  # read from the GGUF once (~26 s), then cached


def test_smollm2_renders_through_its_own_template(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert "<|im_start|>" in tok.chat_template and tok.bos_token == "<|im_start|>"
    prompts = ChatPrompts(tok, tok.chat_template)
    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "contact.json").read_text())
    prompt = prompts.extraction(schema, DOCUMENT)
    messages = [{"role": "system", "content": extraction_system(schema, None)}, {"role": "user", "content": DOCUMENT}]
    assert prompt.ids == template_ids(tok, messages)
    assert prompt.text.startswith("<|im_start|>system\nExtract Contact from the user's document as JSON.\n")
    assert prompt.text.endswith(f"<|im_start|>user\n{DOCUMENT}<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.ids[0] == tok.bos_token_id != prompt.ids[1]  # its BOS is <|im_start|>: written once, not doubled
    assert prompt.ids.count(tok.bos_token_id) == 3  # one per turn: system, user, the generation prompt


def test_a_final_answers_schema_is_said_beside_the_tools(smollm2_tokenizer):
    """With ``answer_schema`` (response_format beside tools) the model is told the answer's form, not only the call's;
    the rest of the prompt is the same conversation rendered by the template."""
    prompts = ChatPrompts(smollm2_tokenizer, smollm2_tokenizer.chat_template)
    answer = {"type": "object", "properties": {"city": {"type": "string"}, "summary": {"type": "string"}},
              "required": ["city", "summary"]}
    turns = [("user", "Weather in Oslo?")]
    shown = [ToolSpec.from_openai(t) for t in TOOLS]
    plain = prompts.toolcall(shown, turns)
    said = prompts.toolcall(shown, turns, answer_schema=answer)
    assert '"required":["city","summary"]' in said.text and "JSON Schema" in said.text
    assert "JSON Schema" not in plain.text
    assert said.text.endswith(plain.text[plain.text.index("<|im_start|>user"):])


@pytest.fixture(scope="module")
def smollm2_engine():
    """SmolLM2 served as ``--model <its GGUF>`` serves it: on llama.cpp, its template read from the GGUF."""
    need_llamacpp()
    gguf = smollm2_gguf()
    engine = assemble_engine(load_profile(str(gguf), executor="llamacpp"))
    engine.start()
    yield engine
    engine.stop()


def test_smollm2_served_from_its_gguf_extracts_a_contact_through_its_template(smollm2_engine):
    engine, tok = smollm2_engine, smollm2_engine.tokenizer
    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "contact.json").read_text())
    seq = engine.prepare_extraction(ExtractionRequest(schema=schema, text=DOCUMENT))
    messages = [{"role": "system", "content": extraction_system(schema, None)}, {"role": "user", "content": DOCUMENT}]
    assert seq.prompt == template_ids(tok, messages)
    assert engine.model_key.endswith("+" + engine.prompts.format_id) and engine.prompts.format_id.startswith("chat-v2:")
    result = asyncio.run(engine.extract(ExtractionRequest(schema=schema, text=DOCUMENT, sampling=SamplingParams(
        temperature=0.0, max_tokens=160))))
    assert result.outcome is Outcome.VALID and json.loads(result.text)["name"] == "Ada Lovelace"
