"""Free text: a chat turn without a schema or tools, through the engine (``Engine.chat`` / ``chat_stream``).

Checked on the demo pair (the plain format: the answer ends at EOS or before the format's next turn heading) and on
SmolLM2-135M-Instruct's GGUF (its ChatML template: the answer ends at ``<|im_end|>``, the model's EOS): how a text
ends, stop strings (the text before the first one; a stream never shows a part of one), max_tokens, and drafting
(n-gram, history and the draft model) leaving greedy outputs as they were.
"""

from __future__ import annotations

import asyncio

import pytest

from structspec.assembly import assemble_engine
from structspec.engine.api import ChatMessage, TextRequest, ToolCallRequest
from structspec.engine.types import FinishReason, InvalidRequest, Outcome, SamplingParams, SpeculationMode, TextDelta
from structspec.models.loading import load_profile
from structspec.speculation.configs import ProposerSet
from tests.conftest import need_llamacpp, smollm2_gguf

ASKS = ["Write a short note about the invoice from Redwood Logistics.", "Tell me about Oslo.",
        "Contact: Elena Mendes, elena@redwood.org. Say something about her."]


def ask(text: str, **fields) -> TextRequest:
    fields.setdefault("sampling", SamplingParams(max_tokens=48))
    return TextRequest(messages=(ChatMessage("user", text),), **fields)


async def streamed(engine, request: TextRequest) -> tuple[list[str], object]:
    deltas, result = [], None
    async for item in engine.chat_stream(request):
        if isinstance(item, TextDelta):
            deltas.append(item.text)
        else:
            result = item
    return deltas, result


@pytest.fixture(scope="module")
def engines(demo_models):
    plain = assemble_engine(demo_models)
    from structspec.assembly import AssemblyConfig
    drafting = assemble_engine(demo_models, AssemblyConfig(proposers=ProposerSet()))
    for e in (plain, drafting):
        e.start()
    yield plain, drafting
    for e in (plain, drafting):
        e.stop()


def test_a_plain_format_answer_ends_by_itself_or_at_max_tokens_and_never_prints_a_heading(engines):
    plain, _ = engines
    seq = plain.prepare_text(ask(ASKS[0]))
    assert plain.tokenizer.decode(seq.prompt).endswith("### User:\n" + ASKS[0] + "\n### Assistant:\n")
    for text in ASKS:
        res = asyncio.run(plain.chat(ask(text)))
        assert (res.finish_reason, res.outcome) in ((FinishReason.STOP, Outcome.TEXT),
                                                    (FinishReason.LENGTH, Outcome.TRUNCATED)), res
        assert not any(stop in res.text for stop in plain.prompts.text_stop)


def test_a_stop_string_cuts_the_answer_and_a_stream_never_shows_it(engines):
    plain, _ = engines
    free = asyncio.run(plain.chat(ask(ASKS[2], sampling=SamplingParams(max_tokens=64))))
    assert len(free.text) > 12, free.text
    stop = free.text[8:12]  # a string the model writes, cut from its own greedy answer
    cut = free.text[: free.text.index(stop)]
    res = asyncio.run(plain.chat(ask(ASKS[2], stop=(stop,), sampling=SamplingParams(max_tokens=64))))
    assert (res.text, res.finish_reason, res.outcome) == (cut, FinishReason.STOP, Outcome.TEXT)
    assert len(res.token_ids) < len(free.token_ids) or free.finish_reason is FinishReason.STOP
    deltas, final = asyncio.run(streamed(plain, ask(ASKS[2], stop=(stop,), sampling=SamplingParams(max_tokens=64))))
    assert "".join(deltas) == final.text == cut
    assert all(stop not in "".join(deltas[: i + 1]) for i in range(len(deltas)))


def test_max_tokens_ends_the_answer_as_truncated(engines):
    plain, _ = engines
    res = asyncio.run(plain.chat(ask(ASKS[1], sampling=SamplingParams(max_tokens=3))))
    if res.finish_reason is FinishReason.LENGTH:
        assert res.outcome is Outcome.TRUNCATED and len(res.token_ids) == 3
    else:  # the model ended within 3 tokens: still a whole answer
        assert res.outcome is Outcome.TEXT and len(res.token_ids) <= 3


def test_drafting_leaves_greedy_answers_as_they_were(engines):
    plain, drafting = engines
    drafted: dict[str, int] = {}
    for text in ASKS * 2:  # the second round drafts from the history of the first
        off = asyncio.run(plain.chat(ask(text, speculation=SpeculationMode.OFF)))
        on = asyncio.run(drafting.chat(ask(text)))
        assert (on.text, on.token_ids, on.finish_reason) == (off.text, off.token_ids, off.finish_reason)
        for proposer, n in on.usage.drafted.items():
            drafted[proposer] = drafted.get(proposer, 0) + n
    assert drafted.get("draft", 0) > 0, drafted  # the draft model drafts anywhere in a free-text answer


def test_bad_stop_strings_are_refused_naming_the_field(engines):
    plain, _ = engines
    with pytest.raises(InvalidRequest) as exc:
        asyncio.run(plain.chat(ask("hi", stop=("a", ""))))
    assert exc.value.field == "stop[1]"
    with pytest.raises(InvalidRequest) as exc:
        asyncio.run(plain.chat(ask("hi", stop=tuple("abcde"))))
    assert exc.value.field == "stop"


class ScriptedModel:
    """A base model that writes ``script`` after any prompt and would run on past it (then EOS): the logits prefer the
    script's next token after the longest start of the script the context ends with."""

    def __init__(self, tokenizer, script: str):
        self.script = tokenizer.encode(script, add_special_tokens=False)
        self.eos = tokenizer.eos_token_id

    def __call__(self, context: tuple[int, ...]) -> int:
        for k in range(min(len(self.script), len(context)), 0, -1):
            if list(context[-k:]) == self.script[:k]:
                return self.script[k] if k < len(self.script) else self.eos
        return self.script[0]


@pytest.fixture(scope="module")
def scripted(demo_models):
    """An engine over the demo tokenizer and the plain format whose model answers with a Markdown heading, then runs
    on into the format's next turn."""
    from structspec.chat_template import PlainPrompts
    from structspec.engine.config import SchedulerLimits
    from structspec.engine.core import EngineCore
    from structspec.engine.engine import Engine
    from structspec.grammar import GrammarCompiler, TokenizerView
    from tests.engine.fakes import TableExecutor

    tok = demo_models.tokenizer
    model = ScriptedModel(tok, "Findings:\n### Results\n- dry\n### User:\nAnd Rome?\n### Assistant:\n")
    vocab = len(tok)
    executor = TableExecutor(model, vocab_size=vocab)
    engine = Engine(EngineCore(executor, tok, tok.eos_token_id, SchedulerLimits()), tok,
                    GrammarCompiler(TokenizerView(tok, n_vocab=vocab)), max_context=4096, prompts=PlainPrompts(tok))
    engine.start()
    yield engine
    engine.stop()


def test_a_plain_answer_keeps_its_markdown_headings_and_ends_at_the_formats_next_turn(scripted):
    whole = "Findings:\n### Results\n- dry"
    res = asyncio.run(scripted.chat(ask("Rain in Oslo?")))
    assert (res.text, res.finish_reason, res.outcome) == (whole, FinishReason.STOP, Outcome.TEXT)
    deltas, final = asyncio.run(streamed(scripted, ask("Rain in Oslo?")))
    assert "".join(deltas) == final.text == whole  # the heading split across tokens is never shown in part
    tools = ({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},)
    for choice in ("auto", "none"):  # a tool request's text answer ends the same way
        answer = asyncio.run(scripted.call_tool(ToolCallRequest(messages=(ChatMessage("user", "Rain in Oslo?"),),
                                                                tools=tools, tool_choice=choice)))
        assert (answer.text, answer.calls, answer.result.outcome) == (whole, [], Outcome.TEXT), choice


@pytest.fixture(scope="module")
def smollm2_engine():
    need_llamacpp()
    engine = assemble_engine(load_profile(str(smollm2_gguf()), executor="llamacpp"))
    engine.start()
    yield engine
    engine.stop()


def test_smollm2_answers_in_its_template_and_ends_at_its_end_of_turn(smollm2_engine):
    tok = smollm2_engine.tokenizer
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == "<|im_end|>"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    seq = smollm2_engine.prepare_text(TextRequest(messages=(ChatMessage("user", messages[0]["content"]),)))
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert seq.prompt == list(rendered["input_ids"])
    res = asyncio.run(smollm2_engine.chat(ask("What is 2+2?", sampling=SamplingParams(max_tokens=64))))
    print(repr(res.text), res.finish_reason)
    assert res.finish_reason is FinishReason.STOP and res.outcome is Outcome.TEXT
    assert res.text.strip() and "<|im_" not in res.text
