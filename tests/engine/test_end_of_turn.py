"""A turn ends at any end-of-turn id the model declares, not only at its tokenizer's EOS.

Tiny models over the demo tokenizer with each family's special tokens: a chain model (``chain_model``) writes two
words and then one end-of-turn token, whatever the prompt. Families: Llama 3 Instruct (tokenizer EOS
``<|eot_id|>``; generation_config ``<|end_of_text|>``, ``<|eom_id|>``, ``<|eot_id|>``), Gemma 3 it (tokenizer EOS
``<eos>``; generation_config ``<eos>``, ``<end_of_turn>``), Phi-3.5 (tokenizer EOS ``<|endoftext|>``;
generation_config ``<|end|>``, ``<|assistant|>``, ``<|endoftext|>``). The ids come from a model folder (its
generation_config and tokenizer, on transformers and on llama.cpp) or from a GGUF's ``tokenizer.ggml.eos_token_id``,
``eot_token_id`` and ``eom_token_id`` beside a tokenizer folder of its own.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from structspec.assembly import assemble_engine
from structspec.engine.api import ChatMessage, TextRequest, ToolCallRequest
from structspec.engine.types import FinishReason, Outcome, SamplingParams
from structspec.models.gguf_export import export_gguf
from structspec.models.loading import load_profile
from tests.conftest import need_llamacpp
from tests.test_chat_template import DEMO_TOKENIZER, GEMMA, LLAMA3

PHI3 = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")
MAX_TOKENS = 24


@dataclass(frozen=True)
class Family:
    """A model family's end-of-turn tokens: the tokenizer's EOS, generation_config's list, the template."""

    template: str
    eos: str  # the tokenizer's eos_token
    declared: tuple[str, ...]  # generation_config.json's eos_token_id, as tokens
    others: tuple[str, ...] = ()  # the template's other special tokens


FAMILIES = {
    "llama3": Family(LLAMA3, "<|eot_id|>", ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
                     ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>")),
    "gemma3-it": Family(GEMMA, "<eos>", ("<eos>", "<end_of_turn>"), ("<bos>", "<start_of_turn>")),
    "phi3.5": Family(PHI3, "<|endoftext|>", ("<|end|>", "<|assistant|>", "<|endoftext|>"), ("<|user|>",)),
}


def family_tokenizer(folder: Path, family: Family):
    """The demo tokenizer with the family's special tokens and template, saved to ``folder`` and loaded back."""
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    specials = [t for t in dict.fromkeys((*family.declared, *family.others)) if t != family.eos]
    tok.add_special_tokens({"eos_token": family.eos, "additional_special_tokens": specials})
    tok.bos_token = None
    tok.chat_template = family.template
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def words(tok) -> tuple[int, int]:
    """Two ordinary tokens the chain model writes before its end of turn ("ok Oslo")."""
    (first,), (second,) = (tok.encode(w, add_special_tokens=False) for w in ("ok", " Oslo"))
    return first, second


def chain_model(tok, chain: list[int]) -> LlamaForCausalLM:
    """A two-layer Llama whose next token depends on the last one alone: after any token outside ``chain`` it
    writes ``chain[0]``, after ``chain[i]`` ``chain[i + 1]``. Its layers add nothing (zero output projections), so
    the last hidden state is that token's embedding: a code in one dimension that the head reads. After
    ``chain[-2]`` the first word is its second choice (what a model writes where its end of turn is masked)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.zero_()
        embed[:, 0] = 1.0  # code 0: any token outside the chain
        head.zero_()
        for i, token in enumerate(chain):
            embed[token].zero_()
            embed[token, i + 1] = 1.0
            head[token, i] = 10.0  # code i -> chain[i]
        head[chain[0], len(chain) - 1] = 1.0  # the second choice where the end of turn comes
    return model


def save_folder(folder: Path, family: Family, writes: str) -> Path:
    """A model folder of ``family`` whose generation_config declares ``family.declared`` (config.json: the
    tokenizer's EOS alone), its chain model ending its turn with the token ``writes``."""
    tok = family_tokenizer(folder, family)
    model = chain_model(tok, [*words(tok), tok.convert_tokens_to_ids(writes)])
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids(t) for t in family.declared]
    model.save_pretrained(folder)
    return folder


def ask(engine, text: str = "Tell me about Oslo."):
    request = TextRequest(messages=(ChatMessage("user", text),), sampling=SamplingParams(max_tokens=MAX_TOKENS))
    return asyncio.run(engine.chat(request))


def expected_text(engine) -> str:
    return engine.tokenizer.decode(list(words(engine.tokenizer)))


def assert_ends_its_turn(engine, writes: str) -> None:
    res = ask(engine)
    assert (res.finish_reason, res.outcome) == (FinishReason.STOP, Outcome.TEXT), \
        f"{res.finish_reason} {res.outcome} after {len(res.token_ids)} tokens: {res.text!r}"
    assert res.text == expected_text(engine) and len(res.token_ids) == 2
    assert writes not in res.text


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of its own for the GGUFs ``gguf_for`` writes."""
    old = os.environ.get("STRUCTSPEC_CACHE_DIR")
    os.environ["STRUCTSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("STRUCTSPEC_CACHE_DIR", None)
    else:
        os.environ["STRUCTSPEC_CACHE_DIR"] = old


def started(models):
    engine = assemble_engine(models)
    engine.start()
    return engine


# (family, the end-of-turn token its model writes): each a declared id that is not the tokenizer's EOS
NOT_EOS = [("llama3", "<|eom_id|>"), ("llama3", "<|end_of_text|>"), ("gemma3-it", "<end_of_turn>"),
           ("phi3.5", "<|end|>"), ("phi3.5", "<|assistant|>")]


@pytest.mark.parametrize("executor", ["transformers", "llamacpp"])
@pytest.mark.parametrize("family,writes", NOT_EOS)
def test_a_folder_model_ends_its_turn_at_any_id_its_generation_config_declares(tmp_path, cache, executor, family,
                                                                                writes):
    if executor == "llamacpp":
        need_llamacpp()
    folder = save_folder(tmp_path / family, FAMILIES[family], writes)
    engine = started(load_profile(str(folder), executor=executor))
    try:
        assert_ends_its_turn(engine, writes)
    finally:
        engine.stop()


def test_a_folder_model_still_ends_at_its_tokenizers_eos_where_generation_config_omits_it(tmp_path):
    family = Family(LLAMA3, "<|eot_id|>", ("<|end_of_text|>",), FAMILIES["llama3"].others)
    engine = started(load_profile(str(save_folder(tmp_path / "llama3", family, "<|eot_id|>"))))
    try:
        assert_ends_its_turn(engine, "<|eot_id|>")
    finally:
        engine.stop()


def test_a_text_answer_under_auto_ends_at_a_declared_end_of_turn(tmp_path):
    engine = started(load_profile(str(save_folder(tmp_path / "gemma", FAMILIES["gemma3-it"], "<end_of_turn>"))))
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}
    try:
        out = asyncio.run(engine.call_tool(ToolCallRequest(messages=(ChatMessage("user", "Hi"),), tools=(tool,),
                                                           sampling=SamplingParams(max_tokens=MAX_TOKENS))))
        res = out.result
        assert (res.finish_reason, res.outcome) == (FinishReason.STOP, Outcome.TEXT), \
            f"{res.finish_reason} {res.outcome} after {len(res.token_ids)} tokens: {res.text!r}"
        assert (out.calls, out.text) == ([], expected_text(engine))
    finally:
        engine.stop()


@dataclass(frozen=True)
class GGUFCase:
    """A GGUF's end-of-turn metadata (tokens; None: not written) beside a tokenizer folder whose EOS is ``eos``."""

    family: str
    eos: str
    gguf_eos: str | None
    eot: str | None = None
    eom: str | None = None


GGUF_CASES = {
    "llama3-eot": (GGUFCase("llama3", "<|end_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"), "<|eot_id|>"),
    "llama3-eom": (GGUFCase("llama3", "<|end_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"), "<|eom_id|>"),
    "gemma3-it-eot": (GGUFCase("gemma3-it", "<eos>", "<eos>", "<end_of_turn>"), "<end_of_turn>"),
    "phi3.5-eos": (GGUFCase("phi3.5", "<|endoftext|>", "<|end|>"), "<|end|>"),
}


def gguf_model(folder: Path, case: GGUFCase, writes: str) -> tuple[Path, Path]:
    """A GGUF of ``case``'s chain model (writing ``writes`` at its end of turn) and its tokenizer folder (the
    tokenizer alone: no generation_config or config.json to read the ids from)."""
    family = FAMILIES[case.family]
    tok = family_tokenizer(folder / "tokenizer", Family(family.template, case.eos, family.declared, family.others))
    model = chain_model(tok, [*words(tok), tok.convert_tokens_to_ids(writes)])
    ids = {name: (tok.convert_tokens_to_ids(t) if t is not None else None)
           for name, t in (("eos", case.gguf_eos), ("eot", case.eot), ("eom", case.eom))}
    path = folder / f"{case.family}.gguf"
    export_gguf(model, path, eos_token_id=ids["eos"], eot_token_id=ids["eot"], eom_token_id=ids["eom"])
    return path, folder / "tokenizer"


@pytest.mark.parametrize("name", GGUF_CASES)
def test_a_gguf_model_ends_its_turn_at_its_eos_eot_or_eom_metadata(tmp_path, name):
    need_llamacpp()
    case, writes = GGUF_CASES[name]
    path, tokenizer = gguf_model(tmp_path, case, writes)
    engine = started(load_profile(str(path), tokenizer=str(tokenizer), executor="llamacpp"))
    try:
        assert_ends_its_turn(engine, writes)
    finally:
        engine.stop()
