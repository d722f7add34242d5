"""Prompt formats: the zero-shot shapes the demo pair was trained on, and the few-shot blocks base models get."""

from __future__ import annotations

import pytest

from structspec.prompts import FewShotExample, ToolSpec, extraction_prompt, toolcall_prompt

SCHEMA = {"title": "Contact", "type": "object"}
TOOLS = [ToolSpec("get_weather", "Weather for a city.", {"properties": {"city": {}}}),
         ToolSpec("lookup_order", "Order status.", {"properties": {"order_id": {}}})]


def test_zero_shot_shapes_are_the_trained_ones():
    assert extraction_prompt(SCHEMA, " Ada, ada@example.com ") == (
        "### Extract Contact as JSON.\n### Input:\nAda, ada@example.com\n### JSON:\n")
    assert toolcall_prompt(TOOLS, [("user", "Rain in Oslo?")]) == (
        "### Tools:\n- get_weather(city): Weather for a city.\n- lookup_order(order_id): Order status.\n"
        "### User:\nRain in Oslo?\n### Call:\n")


def test_extraction_examples_repeat_the_block_before_the_request():
    ex = FewShotExample("Bo, bo@example.com", '{"name":"Bo"}')
    prompt = extraction_prompt(SCHEMA, "Ada", "Names only.", (ex,))
    head = "### Extract Contact as JSON.\nNames only.\n"
    assert prompt == f"{head}### Input:\nBo, bo@example.com\n### JSON:\n{ex.output}\n\n{head}### Input:\nAda\n### JSON:\n"


def test_tool_examples_follow_one_tool_list():
    shots = (FewShotExample("Rain in Rome?", '{"name":"get_weather","arguments":{"city":"Rome"}}'),
             FewShotExample("Where is ORD-1?", '{"name":"lookup_order","arguments":{"order_id":"ORD-1"}}'))
    prompt = toolcall_prompt(TOOLS, [("user", "Rain in Oslo?")], shots)
    assert prompt.count("### Tools:") == 1 and prompt.count("### Call:") == 3
    assert prompt.endswith("### User:\nWhere is ORD-1?\n### Call:\n"
                           '{"name":"lookup_order","arguments":{"order_id":"ORD-1"}}\n\n'
                           "### User:\nRain in Oslo?\n### Call:\n")


def test_an_example_of_another_schema_is_shown_under_its_own_title():
    other = FewShotExample("Bo, bo@example.com", '{"name":"Bo"}', title="Contact")
    prompt = extraction_prompt({"title": "Order", "type": "object"}, "Order 7", None, (other,))
    assert prompt == ("### Extract Contact as JSON.\n### Input:\nBo, bo@example.com\n### JSON:\n{\"name\":\"Bo\"}\n\n"
                      "### Extract Order as JSON.\n### Input:\nOrder 7\n### JSON:\n")


def test_a_schema_without_a_title_is_named_by_its_id_or_its_description():
    untitled = {"type": "object", "properties": {"name": {"type": "string"}}}
    assert extraction_prompt(untitled, "Ada") == "### Extract JSON.\n### Input:\nAda\n### JSON:\n"
    assert extraction_prompt(untitled, "Ada", schema_id="person").startswith("### Extract person as JSON.\n### Input:")
    described = {**untitled, "description": "A person,\n  named."}
    assert extraction_prompt(described, "Ada", "Names only.") == (
        "### Extract JSON.\nA person, named.\nNames only.\n### Input:\nAda\n### JSON:\n")
    assert extraction_prompt(SCHEMA, "Ada", schema_id="person").startswith("### Extract Contact as JSON.\n")


def test_under_auto_the_plain_format_offers_an_answer_beside_a_call():
    """``answers``: the model's turn is ``### Assistant:`` (a call or a text answer), after an exchange that shows
    both; without it (a forced call, or a model trained on call-only turns) the prompt is the call-only one."""
    tools = [ToolSpec("get_weather", "Weather for a city.", {"properties": {"city": {}}})]
    shot = FewShotExample("Weather in Rome?", '{"name":"get_weather","arguments":{"city":"Rome"}}')
    turns = [("user", "Say hello")]
    answering = toolcall_prompt(tools, turns, (shot,), answers=True)
    calling = toolcall_prompt(tools, turns, (shot,))
    assert answering.endswith("### User:\nSay hello\n### Assistant:\n") and "### Call:" not in answering
    assert "### Assistant:\nHello Sam, nice to meet you!\n" in answering  # a text answer is shown, not only calls
    assert "get_weather" not in answering.split("### Tools:\n- get_weather")[0]  # the episode's tool is another
    assert calling.endswith("### User:\nSay hello\n### Call:\n") and "### Assistant:" not in calling


def test_under_auto_the_turn_after_a_tools_result_is_headed_answer():
    """After a result the model's turn is ``### Answer:`` (the episode shows a result answered under it), and an
    earlier answer after a result is shown under it too; a call-only prompt keeps its ``### Call:`` turns."""
    from structspec.engine.api import ChatMessage
    from structspec.engine.types import ToolCall

    call = ChatMessage("assistant", "", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),))
    turns = [ChatMessage("user", "Rain in Oslo?"), call, ChatMessage("tool", "rain")]
    answering = toolcall_prompt(TOOLS, turns, answers=True)
    assert answering.endswith('### Assistant:\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n'
                              "### Tool:\nrain\n### Answer:\n")
    assert answering.count("### Tool:\n") == 3 and answering.count("### Answer:\n") == 3  # the episode's two
    later = toolcall_prompt(TOOLS, [*turns, ChatMessage("assistant", "Rain."), ChatMessage("user", "And Rome?")],
                            answers=True)
    assert "### Tool:\nrain\n### Answer:\nRain.\n### User:\nAnd Rome?\n### Assistant:\n" in later
    calling = toolcall_prompt(TOOLS, turns)
    assert calling.endswith("### Tool:\nrain\n### Call:\n") and "### Answer:" not in calling


def test_only_models_not_trained_on_call_only_turns_are_offered_answers():
    from structspec.models.profiles import profiles

    assert profiles()["demo"].plain_answers is False  # the demo pair is trained on "### Call:" turns
    assert profiles()["gemma-3-270m"].plain_answers is True


def test_a_model_may_follow_its_extraction_examples_after_a_bare_json_label():
    """``plain_json_line`` "label": every extraction output (the examples' and the model's own) follows ``JSON:``,
    not the ``### JSON:`` heading; the rest of the prompt is the plain format's, and the wording is its own
    statistics key. Gemma 3 270M is served so; the demo pair keeps the heading it was trained on."""
    from structspec.assembly import make_prompts
    from structspec.chat_template import PlainPrompts
    from structspec.models.loading import LoadedModels
    from structspec.models.profiles import profiles

    contact = {"title": "Contact", "type": "object", "properties": {"name": {"type": "string"}}}
    shots = (FewShotExample("Bo, bo@example.com", '{"name":"Bo"}'),)
    heading, label = PlainPrompts(_CharTokenizer()), PlainPrompts(_CharTokenizer(), json_line="label")
    said, plain = (p.extraction(contact, "Ada", examples=shots, public=True) for p in (label, heading))
    assert said.text == plain.text.replace("### JSON:\n", "JSON:\n")
    assert said.text.endswith("### Input:\nAda\nJSON:\n") and "\nJSON:\n{\"name\":\"Bo\"}\n" in said.text
    assert said.ids[:len(said.public_ids)] == said.public_ids and said.public_ids != plain.public_ids
    assert label.stats_format == "plain-v5+json-label" != heading.stats_format == "plain-v5"
    assert label.toolcall(TOOLS, [("user", "Rain?")]).text == heading.toolcall(TOOLS, [("user", "Rain?")]).text
    with pytest.raises(ValueError, match="json_line"):
        PlainPrompts(_CharTokenizer(), json_line="### Output:")
    assert profiles()["gemma-3-270m"].plain_json_line == "label" and profiles()["demo"].plain_json_line == "heading"
    models = LoadedModels("m", None, _CharTokenizer(), None, None, None, plain_json_line="label")
    assert make_prompts(models).stats_format == label.stats_format


def test_under_none_the_plain_format_asks_for_an_answer_in_words():
    """``may_call`` False (``tool_choice`` none): the tools are listed and the conversation shown, the model's turn is
    the answer heading; no worked call is shown (not the episode's either), for either kind of model."""
    from structspec.engine.api import ChatMessage
    from structspec.engine.types import ToolCall

    shot = FewShotExample("Rain in Rome?", '{"name":"get_weather","arguments":{"city":"Rome"}}')
    turns = [("user", "Rain in Oslo?")]
    for answers in (False, True):
        prompt = toolcall_prompt(TOOLS, turns, (shot,), answers=answers, may_call=False)
        assert prompt == ("### Tools:\n- get_weather(city): Weather for a city.\n- lookup_order(order_id): Order "
                          "status.\n### User:\nRain in Oslo?\n### Assistant:\n")
    called = [ChatMessage("user", "Rain in Oslo?"),
              ChatMessage("assistant", "", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),)),
              ChatMessage("tool", "rain")]
    after = toolcall_prompt(TOOLS, called, may_call=False)  # an earlier call keeps the call heading it was made under
    assert after.endswith('### Call:\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n### Tool:\nrain\n'
                          "### Assistant:\n")


def test_a_plain_answer_ends_at_the_formats_own_headings_not_at_a_markdown_heading():
    """A base model's answer may hold Markdown headings; it ends where it runs on into a turn of the format."""
    from structspec.chat_template import PlainPrompts
    from structspec.engine.stop import cut_at_stop

    answer = "Findings:\n### Results\n- dry\n## Notes\nnone"
    stops = PlainPrompts.text_stop
    assert cut_at_stop(answer, stops) == (answer, False)
    for heading in ("### User:", "### Assistant:", "### Call:", "### Tool:", "### Tools:", "### System:"):
        assert cut_at_stop(f"{answer}\n{heading}\nmore", stops) == (answer, True), heading


def test_every_heading_a_plain_conversation_renders_ends_an_answer():
    """The stop strings are the renderer's own headings: each turn heading a tool prompt or a free-text prompt
    writes (every role, a call, the tool list), after a newline."""
    import re

    from structspec.chat_template import PlainPrompts, plain_conversation
    from structspec.engine.api import ChatMessage
    from structspec.engine.types import ToolCall

    turns = [ChatMessage("system", "Be brief."), ChatMessage("user", "Rain in Oslo?"),
             ChatMessage("assistant", "", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),)),
             ChatMessage("tool", "rain"), ChatMessage("assistant", "Rain."), ChatMessage("user", "And Rome?")]
    rendered = [toolcall_prompt(TOOLS, turns), toolcall_prompt(TOOLS, turns, answers=True),
                toolcall_prompt(TOOLS, turns, may_call=False), plain_conversation(turns)]
    headings = {h for text in rendered for h in re.findall(r"^### [^\n]*:$", text, flags=re.MULTILINE)}
    assert {"### System:", "### User:", "### Assistant:", "### Call:", "### Tool:", "### Tools:"} <= headings
    assert set(PlainPrompts.text_stop) == {"\n" + h for h in headings}


# The plain format's wording, version by version: the digest of ``_plain_renders()``. A change of wording changes
# what a model writes after it, so its statistics must not be mixed with the old wording's.
WORDING_DIGESTS = {"structspec-plain-v4": "5b7e251f6299749a", "structspec-plain-v5": "1b9ac190b748259d",
                   "structspec-plain-v5+json-label": "2458dafb31c795fc"}


class _CharTokenizer:
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def _plain_renders(json_line: str = "heading") -> list[str]:
    """Every kind of prompt the plain format renders, on fixed inputs (and the stops and headings it cuts at)."""
    from structspec.chat_template import PlainPrompts
    from structspec.engine.api import ChatMessage
    from structspec.engine.types import ToolCall

    contact = {"title": "Contact", "type": "object", "properties": {"name": {"type": "string"}}}
    shots = (FewShotExample("Bo, bo@example.com", '{"name":"Bo"}'),
             FewShotExample("Invoice 7", '{"id":7}', title="Invoice"))
    call = (FewShotExample("Rain in Rome?", '{"name":"get_weather","arguments":{"city":"Rome"}}'),)
    turns = [ChatMessage("system", "Be brief."), ChatMessage("user", "Rain in Oslo?"),
             ChatMessage("assistant", "", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),)),
             ChatMessage("tool", "rain"), ChatMessage("assistant", "Rain."), ChatMessage("user", "And Rome?")]
    answer = {"type": "object", "properties": {"city": {"type": "string"}}}
    out = []
    for answers in (False, True):
        plain = PlainPrompts(_CharTokenizer(), answers=answers, json_line=json_line)
        out += [plain.extraction(contact, " Ada, ada@example.com ").text,
                plain.extraction(contact, "Ada", "Names only.", shots, schema_id="contact").text,
                plain.extraction({"type": "object", "description": "A person."}, "Ada", schema_id="person").text]
        for may_answer, may_call in ((False, True), (True, True), (False, False)):
            out += [plain.toolcall(TOOLS, [("user", "Rain in Oslo?")], call, may_answer=may_answer,
                                   may_call=may_call).text,
                    plain.toolcall(TOOLS, turns, answer_schema=answer, may_answer=may_answer, may_call=may_call).text]
        out += [plain.text(turns).text, *plain.text_stop, *plain.call_headings]
    return out


def test_a_change_of_the_plain_wording_is_a_new_format_version():
    import hashlib
    import json

    from structspec.prompts import PROMPT_FORMAT

    from structspec.chat_template import PlainPrompts
    from structspec.prompts import JSON_LINES

    for line in JSON_LINES:
        key = PlainPrompts(_CharTokenizer(), json_line=line).format_id
        assert key.startswith(PROMPT_FORMAT)
        digest = hashlib.sha256(json.dumps(_plain_renders(line)).encode()).hexdigest()[:16]
        assert WORDING_DIGESTS.get(key) == digest, (
            f"the plain prompts' wording changed ({key}: {digest}): bump PROMPT_FORMAT (a new statistics key, "
            "structspec/prompts.py) and record the new digest in WORDING_DIGESTS")
