"""Multi-turn prefix reuse: a conversation's next turn reuses the KV of the last one, its answer included.

A finished request retains what it committed and cached (``EngineSequence.cached_committed``: the prompt and the
output but the last sampled token); the next turn's prompt, rendered by the chat template, repeats the last prompt
and answer before its new messages, so it is served from cache up to them. The *cached share* of a turn is its
usage's cached prompt tokens over its prompt tokens. Run on a tiny random ChatML model (``tests/test_chat_template``)
over the tool-call path, on both executors."""

from __future__ import annotations

import json

import pytest
import torch

from structspec.assembly import AssemblyConfig, assemble_engine
from structspec.engine.api import ChatMessage, ToolCallRequest
from structspec.engine.config import SchedulerLimits
from structspec.engine.core import run_until_idle
from structspec.engine.prefix_cache import common_prefix
from structspec.engine.sequence import EngineSequence
from structspec.engine.types import FinishReason, SamplingParams
from structspec.models.loading import LoadedModels
from structspec.speculation.configs import ProposerSet
from tests.conftest import need_llamacpp
from tests.test_chat_template import CHATML, TOOLS, family_tokenizer, loaded, tiny_model

TURNS = 6
# An agent's system prompt of a realistic length (about 500 tokens of the demo tokenizer): a turn's new messages
# (the call, the tool's answer, the next question: 40-60 tokens) are then under a tenth of its prompt
SYSTEM = ("You are the weather desk of a travel agency that books trips to Oslo and Rome. Travellers write to you "
          "before and during their trips, in short messages, and you answer every question about the weather with a "
          "call of the weather tool for the city the question is about, and with nothing else: no greeting, no "
          "explanation and no apology. The tool answers with the forecast and the temperature in degrees Celsius; "
          "the agency's booking desk reads your calls and the tool's answers, and writes to the traveller itself. "
          "Cities are named in English, as the tool lists them, even when the traveller writes them in Norwegian "
          "or in Italian. When a question names no city, it is about the city of the question before it. When it "
          "names both, call the tool for the first one named; the booking desk asks again for the second. Questions "
          "about the weather on a later day, at night or at a given hour are answered the same way: the tool knows "
          "the days and the hours itself. Never guess a forecast, never repeat an earlier answer of the tool, and "
          "never answer a question that is not about the weather: call the tool for the city of the trip instead, "
          "and the booking desk will answer the rest.")
ASKED = ["Rain in Oslo?", "And in Rome tomorrow?", "Is Oslo windy?", "Will Rome be hot?", "Snow in Oslo tonight?",
         "Sun in Rome?"]
SAMPLING = SamplingParams(temperature=0.0, max_tokens=48)


@pytest.fixture(scope="module")
def chatml_models(tmp_path_factory):
    """transformers and llama.cpp (its F32 GGUF export) of one tiny random ChatML model."""
    tok = family_tokenizer(tmp_path_factory.mktemp("multi_turn"), "chatml")
    model = tiny_model(tok, "llama")
    return tok, model, loaded(tok, model, CHATML)


@pytest.fixture(params=["transformers", "llamacpp"])
def models(request, chatml_models, tmp_path_factory) -> LoadedModels:
    tok, model, hf = chatml_models
    if request.param == "transformers":
        return hf
    need_llamacpp()
    from structspec.models.gguf_export import export_gguf
    from structspec.models.llamacpp_model import LlamaCppModel

    path = export_gguf(model, tmp_path_factory.mktemp("gguf") / "chatml.gguf", bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id).path
    return LoadedModels("tiny", LlamaCppModel(path), tok, None, torch.device("cpu"), torch.float32,
                        executor="llamacpp", chat_template=CHATML)


# the city as free text: a random model writes any characters, in ids of its own choosing
FREE_TEXT_TOOLS = ({"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                                     "parameters": {"type": "object", "properties": {"city": {
                                                         "type": "string", "maxLength": 16}},
                                                         "required": ["city"], "additionalProperties": False}}},)


# two arguments: a draft of the last call (the schema history's) carries the city's choice, the forced run to the
# day and the day's shared first letters; a call of the other city rejects it (a draft ends where the target decides,
# so a call with one enum argument leaves no draft to carry)
DAY_TOOLS = ({"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"enum": ["Oslo", "Rome"]},
                                                   "day": {"enum": ["today", "tomorrow", "tonight"]}},
                                                   "required": ["city", "day"], "additionalProperties": False}}},)


def converse(engine, tenant: str = "", tools: tuple = TOOLS) -> list[EngineSequence]:
    """Six turns: the user asks, the assistant's call comes back as its message, the tool answers, every other
    turn the user asks again; each turn's request carries the whole conversation so far."""
    messages = [ChatMessage("system", SYSTEM), ChatMessage("user", ASKED[0])]
    turns = []
    for turn in range(TURNS):
        seq = engine.prepare_toolcall(ToolCallRequest(messages=tuple(messages), tools=tools, tool_choice="required",
                                                      sampling=SAMPLING, tenant=tenant, request_id=f"{tenant}{turn}"))
        run_until_idle(engine.core, [seq])
        assert seq.finish is FinishReason.STOP, seq.error
        turns.append(seq)
        city = json.loads(seq.output_text())["arguments"]["city"]
        messages.append(ChatMessage("assistant", seq.output_text()))
        messages.append(ChatMessage("tool", json.dumps({"city": city, "forecast": "rain", "celsius": 7})))
        if turn % 2:
            messages.append(ChatMessage("user", ASKED[turn + 1 if turn + 1 < TURNS else 0]))
    return turns


def cached_share(seq: EngineSequence) -> float:
    return seq.usage.cached_prompt_tokens / seq.usage.prompt_tokens


def engine_of(models: LoadedModels, prefix_cache_tokens: int, proposers: ProposerSet | None = None):
    return assemble_engine(models, AssemblyConfig(limits=SchedulerLimits(prefix_cache_tokens=prefix_cache_tokens),
                                                  proposers=proposers))


@pytest.mark.parametrize("drafting", [False, True], ids=["plain", "drafting"])
def test_each_turn_after_the_first_is_served_from_cache_and_outputs_are_unchanged(models, drafting):
    """Drafting (n-gram and history proposers): rejected draft tokens are rolled back before the sequence is
    retained, so the cache holds exactly the committed tokens and the next turn's outputs are unchanged."""
    tools = DAY_TOOLS if drafting else TOOLS
    cached = engine_of(models, 8192, ProposerSet(draft=False) if drafting else None)
    turns = converse(cached, tools=tools)
    shares = [round(cached_share(s), 3) for s in turns]
    print(f"\n{models.executor}, drafting {drafting}: prompt tokens {[s.usage.prompt_tokens for s in turns]}, "
          f"cached {[s.usage.cached_prompt_tokens for s in turns]}, shares {shares}")
    if drafting:
        drafted, accepted = (sum(sum(getattr(s.usage, k).values()) for s in turns) for k in ("drafted", "accepted"))
        assert drafted > accepted > 0  # some drafts were rolled back, some kept
    assert shares[0] == 0 and all(share >= 0.9 for share in shares[1:]), shares
    for last, turn in zip(turns, turns[1:]):
        # all the last turn cached is reused: its prompt and its answer but the tail never fed (the last token
        # sampled and the forced ones after it: here the closing '"}}', and the rest of an enum's value before it)
        kept = last.cached_committed()
        assert len(last.prompt) + len(last.output) - len(kept) == len(last.uncached) <= 3
        assert turn.usage.cached_prompt_tokens == common_prefix(turn.prompt, kept) == len(kept)
    # each turn's retained copy replaced the last turn's, which it extends: one entry, the last turn's
    prefix = cached.core.scheduler.prefix
    assert len(prefix) == 1 and prefix.tokens == len(turns[-1].cached_committed())
    plain = converse(engine_of(models, 0), tools=tools)
    assert [s.output for s in plain] == [s.output for s in turns]  # the cache never changes an output
    assert all(s.usage.cached_prompt_tokens == 0 for s in plain)


def test_another_tenants_same_conversation_reuses_only_its_own_turns(models):
    """A tool call's prompt is the caller's (nothing public): bob's copy of alice's conversation starts cold and
    then reuses his own turns only, as much as she reused of hers."""
    engine = engine_of(models, 8192)
    alice = converse(engine, "t:alice")
    bob = converse(engine, "t:bob")
    assert all(b.public_prefix == 0 for b in bob)
    assert bob[0].usage.cached_prompt_tokens == 0  # alice's identical first prompt is hers
    assert [b.usage.cached_prompt_tokens for b in bob] == [a.usage.cached_prompt_tokens for a in alice]
    assert [b.output for b in bob] == [a.output for a in alice]
    assert len(engine.core.scheduler.prefix) == 2  # one retained conversation per tenant


def test_the_retained_answer_is_the_tokens_the_next_turn_renders(models):
    """The grammar's forced ids (the call's keys and punctuation, an enum's value) are those the tokenizer gives
    the same text when the next turn re-renders it: nothing of the retained answer is lost."""
    turns = converse(engine_of(models, 8192))
    for last, turn in zip(turns, turns[1:]):
        assert turn.prompt[len(last.prompt):len(last.prompt) + len(last.output)] == last.output


def test_an_answer_in_ids_of_its_own_is_reused_up_to_where_the_rendering_differs(models):
    """A model writing free text may choose ids the tokenizer would not give that text (here turn 1's city,
    '298' '518' '457' where the tokenizer gives '29' '85' '18' '457'): the next turn's rendering differs from the
    retained tokens there, and reuse stops at the first id that differs (5 of its 540 tokens recomputed), never
    reusing a token the prompt does not hold; outputs stay those of an engine without the cache."""
    turns = converse(engine_of(models, 8192), tools=FREE_TEXT_TOOLS)
    lost = []
    for last, turn in zip(turns, turns[1:]):
        kept = last.cached_committed()
        assert turn.usage.cached_prompt_tokens == common_prefix(turn.prompt, kept)
        lost.append(len(kept) - turn.usage.cached_prompt_tokens)
    print(f"\n{models.executor}: retained tokens the next turn's rendering does not repeat: {lost}, shares "
          f"{[round(cached_share(s), 3) for s in turns]}")
    assert lost[0] > 0 and sum(lost) <= 10
    assert [s.output for s in converse(engine_of(models, 0), tools=FREE_TEXT_TOOLS)] == [s.output for s in turns]
