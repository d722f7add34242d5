"""What vLLM is sent allows exactly what structspec's own matcher allows: the Lark text ``vllm_lark`` writes, compiled
the way vLLM's ``guidance`` backend compiles it (``llguidance.grammar_from("grammar", text)``), gives the same mask
as structspec's compiled grammar at every step of a valid output, for real-world schemas (MaskBench), the shipped
schemas and the tool-call grammars. Needs no vLLM: the compile is llguidance's own, the one vLLM calls."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import numpy as np
import pytest
from transformers import AutoTokenizer

from structspec.grammar import GrammarCompiler, TokenizerView, allocate_bitmask, bitmask_to_bool
from structspec.grammar import call_formats as cf
from structspec.grammar.base import SchemaError
from structspec.grammar.tools import ToolSet
from structspec.vllm_engine.grammar import GrammarNotPortable, vllm_lark

ROOT = Path(__file__).resolve().parents[2]
DEMO_TOKENIZER = ROOT / "structspec" / "models" / "demo" / "target"
MASKBENCH = ROOT.parent / "shared" / "data" / "maskbench"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def view():
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    return TokenizerView(tok)


@pytest.fixture(scope="module")
def compiler(view):
    return GrammarCompiler(view)


def vllm_matcher(view, grammar) -> llguidance.LLMatcher:
    """The matcher vLLM's guidance backend builds from what structspec sends it."""
    m = llguidance.LLMatcher(view.ll_tokenizer, llguidance.grammar_from("grammar", vllm_lark(grammar)), log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def raw_mask(m: llguidance.LLMatcher, view) -> set[int]:
    words = np.zeros(view.mask_words, dtype=np.int32)
    m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:view.n_vocab]
    return set(np.flatnonzero(bits).tolist())


def own_mask(matcher, view) -> set[int]:
    mask = allocate_bitmask(1, view.n_vocab)
    matcher.fill_mask(mask, 0)
    return set(bitmask_to_bool(mask[0], view.n_vocab).nonzero().flatten().tolist())


def walk_both(view, grammar, text: str) -> int:
    """Decode ``text`` (as the tokenizer splits it) through both matchers, asserting equal masks at every step and
    both accepting at the end; the steps walked. -1: a token of ``text`` is outside the grammar (the instance is:
    whitespace, key order)."""
    ours, theirs = grammar.matcher(), vllm_matcher(view, grammar)
    eos = set(view.eos_token_ids)
    steps = 0
    for token in view.encode(text):
        allowed = own_mask(ours, view)
        assert allowed - eos == raw_mask(theirs, view) - eos, f"masks differ after {steps} tokens of {text!r}"
        if token not in allowed:
            return -1
        assert ours.consume([token]) and theirs.consume_token(token)
        steps += 1
    assert ours.is_accepting() and theirs.is_accepting()
    return steps


def maskbench_cases(limit: int = 40):
    if not MASKBENCH.is_dir():
        pytest.fail(f"MaskBench data not found at {MASKBENCH}")
    files = sorted(MASKBENCH.glob("*.json"))
    step = max(1, len(files) // limit)
    return files[::step][:limit]


def test_maskbench_schemas_mask_alike_along_their_valid_instances(view, compiler):
    compiled = walked = 0
    for path in maskbench_cases():
        case = json.loads(path.read_text())
        try:
            grammar = compiler.compile_schema(case["schema"])
        except SchemaError:
            continue  # refused before either engine sees it (the same error on both: the pipeline's)
        compiled += 1
        for test in case["tests"]:
            if test.get("valid"):
                steps = walk_both(view, grammar, json.dumps(test["data"], separators=(",", ":")))
                walked += steps > 0
    assert compiled >= 35 and walked >= 35, (compiled, walked)


def test_shipped_schemas_mask_alike(view, compiler):
    instances = {
        "contact": {"name": "Ada Lovelace", "email": "ada@example.com"},
        "invoice": {"invoice_number": "INV-1", "currency": "EUR", "total": 12.5},
    }
    for name, instance in instances.items():
        schema = json.loads((ROOT / "schemas" / f"{name}.json").read_text())
        schema = schema.get("schema", schema)
        grammar = compiler.compile_schema(schema)
        if walk_both(view, grammar, json.dumps(instance, separators=(",", ":"))) < 0:
            # key order or required keys of the shipped schema: walk whatever prefix the grammar takes
            ours, theirs = grammar.matcher(), vllm_matcher(view, grammar)
            assert own_mask(ours, view) - set(view.eos_token_ids) == raw_mask(theirs, view) - set(view.eos_token_ids)


@pytest.mark.parametrize("family,text", [
    ("json", '{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}'),
    ("hermes", 'Checking.<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>'),
])
def test_tool_call_grammars_mask_alike(view, compiler, family, text):
    choice = "required" if family == "json" else "auto"
    tools = ToolSet.parse([WEATHER], tool_choice=choice)
    fmt = cf.JSON if family == "json" else cf.HERMES
    grammar = compiler.compile_tools(tools, call_format=fmt)
    assert walk_both(view, grammar, text) > 0


def test_a_schema_outside_the_tool_grammar_is_refused_alike(view, compiler):
    grammar = compiler.compile_schema({"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}},
                                       "required": ["n"], "additionalProperties": False})
    ours, theirs = grammar.matcher(), vllm_matcher(view, grammar)
    bad = view.encode('{"n":12')
    assert not ours.consume(bad)
    assert not all(theirs.consume_token(t) for t in bad)


def test_grammars_of_another_backend_are_not_portable(view):
    outlines = GrammarCompiler(view, backend="outlines").compile_schema({"type": "string"})
    with pytest.raises(GrammarNotPortable, match="llguidance"):
        vllm_lark(outlines)
