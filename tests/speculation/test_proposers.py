"""Proposers in isolation: text-level lookup, schema history, JSON position."""

from __future__ import annotations

import random

from structspec.schemas import load_builtin_schemas
from structspec.engine.types import SamplingParams
from structspec.speculation.base import DraftContext, SequenceSpeculation
from structspec.speculation.history import SEPARATOR, HistoryConfig, SchemaHistory, majority_prefix
from structspec.speculation.json_position import is_free_text, scan, subschema
from structspec.speculation.ngram import NgramConfig, NgramProposer, find_continuation, find_match

INVOICE = load_builtin_schemas()["invoice"]


def test_lookup_copies_across_token_boundaries():
    doc = "Bill to: Tyrell Corporation\nDate: 2024-01-05"
    out = '{"customer":"Tyr'
    assert find_continuation(doc, out, NgramConfig()).startswith("ell Corporation\n")


def test_lookup_prefers_longest_match():
    doc = "vendor Acme Labs; customer Acme Foods"
    assert find_continuation(doc, '"customer":"Acme F', NgramConfig()).startswith("oods")
    assert find_continuation(doc, "xyz", NgramConfig()) is None


def test_a_match_reports_its_length_and_a_long_one_drafts_under_its_own_key():
    doc = "Ship to: 1200 Harbour Industrial Estate, Unit 7, Portsmouth\nItems: 4"
    short = find_match(doc, '{"city":"Por', NgramConfig())
    assert short is not None and short[0].startswith("tsmouth") and short[1] == 3  # "Por": a word's start
    long = find_match(doc, '{"address":"1200 Harbour Industrial Est', NgramConfig())
    assert long is not None and long[0].startswith("ate, Unit 7") and long[1] == 27
    proposer = NgramProposer(_Chars())
    for output, key in (('{"city":"Por', "ngram"), ('{"address":"1200 Harbour Industrial Est', "ngram/long")):
        draft = proposer.propose(_context(doc, output), 4)
        assert draft is not None and draft.proposer == key and len(draft.tokens) == 4
    # a repeat of the output's own text is a long match too (a loop's drafts)
    loop = '[{"sku":"A-1","qty":1},{"sku":"A-1","qty":1},{"sku":"'
    assert find_match("unrelated prompt", loop, NgramConfig())[1] >= NgramConfig().long_chars


class _Chars:
    """A tokenizer of one id per character."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def _context(prompt: str, output: str) -> DraftContext:
    ids = _Chars()
    return DraftContext("k", None, prompt, output, ids(prompt)["input_ids"], ids(output)["input_ids"],
                        None, 0, SamplingParams(), SequenceSpeculation())  # type: ignore[arg-type]


def test_lookup_inside_output_repeats():
    out = '[{"sku":"A-1","qty":1},{"sku":"'
    cont = find_continuation("unrelated prompt", out, NgramConfig())
    assert cont is not None and cont.startswith("A-1")


def _every_length(source: str, output: str, cfg: NgramConfig) -> str | None:
    """Copy lookup tried at every tail length from the longest: what the bisection must find."""
    for n in range(min(cfg.max_chars, len(output)), cfg.min_chars - 1, -1):
        tail = output[len(output) - n:]
        at = source.rfind(tail)
        if at >= 0:
            return source[at + n: at + n + cfg.continuation_chars] or None
        at = output.rfind(tail, 0, len(output) - 1)
        if at >= 0:
            return output[at + n: at + n + cfg.continuation_chars] or None
    return None


def _texts(rng: random.Random, count: int, length: int) -> list[str]:
    """JSON-like texts over a small alphabet: tails of every length recur, and some occur nowhere."""
    parts = ['{"', '":', ',"', 'name', 'ab', 'a', 'b', '"}', '1', ' ']
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, length))) for _ in range(count)]


def test_lookup_finds_the_longest_tail_by_bisection_as_every_length_would():
    rng = random.Random(5)
    configs = [NgramConfig(), NgramConfig(min_chars=1, max_chars=12, continuation_chars=5)]
    checked = found = 0
    for _ in range(3000):
        source, output = _texts(rng, 2, 40)
        cfg = rng.choice(configs)
        expected = _every_length(source, output, cfg)
        assert find_continuation(source, output, cfg) == expected, (source, output, cfg)
        checked, found = checked + 1, found + (expected is not None)
    assert 0.2 * checked < found < 0.95 * checked  # both outcomes exercised


def test_history_finds_the_longest_tail_by_bisection_as_each_output_searched_alone_would():
    rng = random.Random(11)
    for cfg in (HistoryConfig(), HistoryConfig(min_chars=2, max_chars=9, continuation_chars=6, max_matches=5)):
        history = SchemaHistory(cfg)
        agreed = 0
        for round_ in range(400):
            if round_ % 10 == 0:
                for text in _texts(rng, 3, 30):
                    history.add("s", text)
            output = _texts(rng, 1, 30)[0]
            expected = history._continuation_each(history.outputs("s"), output)
            assert history.continuation("s", output) == expected, output
            agreed += expected is not None
        assert agreed > 50


def test_history_never_continues_across_two_outputs():
    history = SchemaHistory()
    history.add("s", '{"id": "abcd')
    history.add("s", 'efgh"}')
    assert history.continuation("s", "x abcd") is None  # the first output ends there: nothing after it
    assert history.continuation("s", 'x "id": "abcd' + SEPARATOR + "ef") is None  # no output holds that tail


def test_history_majority_continuation_and_bounds():
    h = SchemaHistory()
    for cur in ("EUR", "EUR", "USD"):
        h.add("invoice", f'{{"total":12,"currency":"{cur}","notes":"ok"}}')
    assert h.continuation("invoice", '{"total":99,"currency":"').startswith("EUR")
    assert h.continuation("other", '{"currency":"') is None
    small = SchemaHistory(type(h.config)(per_schema=2, max_schemas=2))
    for i in range(3):
        small.add(f"s{i}", "x")
    assert small.outputs("s0") == [] and small.outputs("s2") == ["x"]
    for i in range(5):
        small.add("s2", str(i))
    assert small.outputs("s2") == ["3", "4"]


def test_majority_prefix_stops_where_outputs_disagree():
    assert majority_prefix(["abcX", "abcY", "abcZ"]) == "abc"
    assert majority_prefix(["a", "b"]) == ""


def test_json_position_and_free_text():
    pos = scan('{"invoice_number":"INV-1","line_items":[{"description":"des')
    assert pos.path == ("line_items", 0, "description") and pos.in_string and not pos.in_key
    assert is_free_text(INVOICE, pos)
    assert not is_free_text(INVOICE, scan('{"currency":"E'))  # enum
    assert not is_free_text(INVOICE, scan('{"issue_date":"2024'))  # format
    assert not is_free_text(INVOICE, scan('{"invoice_number":"A","curr'))  # a key
    assert not is_free_text(INVOICE, scan('{"total":1'))  # a number
    pos = scan('{"notes":"say \\"hi\\", then')
    assert pos.in_string and pos.path == ("notes",)
    assert subschema({"$defs": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a"}}},
                     ("x",)) == {"type": "string"}


class _FixedLM:
    """A ``ForwardStep`` whose next-token logits are always ``logits`` (a 4-token vocabulary)."""

    def __init__(self, logits):
        self.logits, self.vocab_size, self._len = logits, logits.shape[-1], {}

    def new_sequence(self):
        sid = len(self._len)
        self._len[sid] = 0
        return sid

    def seq_len(self, sid):
        return self._len[sid]

    def rollback(self, sid, n):
        self._len[sid] -= n

    def free(self, sid):
        self._len[sid] = -1

    def step(self, inputs):
        for x in inputs:
            self._len[x.seq_id] += len(x.tokens)
        return [self.logits[None].clone() for _ in inputs]


class _AnyToken:
    """A grammar state that allows every token (EOS included) and never stops."""

    def __init__(self):
        self.consumed = 0

    limit_exceeded = None

    def fill_mask(self, bitmask, row=0):
        bitmask[row] = -1

    def consume(self, tokens):
        self.consumed += len(tokens)
        return True

    def rollback(self, n):
        self.consumed -= n

    def is_stopped(self):
        return False


def test_a_sampled_draft_keeps_the_probability_of_eos():
    """Where the grammar allows EOS beside other tokens, draft + verification must emit EOS with the target's
    probability (with p = (EOS .5, a .5) and q = (EOS .9, a .1) a draft that ended on a drawn EOS once gave
    EOS 0.45 of the time). The draft draws with the verifier's keyed noise, so draft + verification emit
    exactly plain keyed sampling's token, seed by seed; and EOS comes out half of the time over 4k seeds."""
    import math

    import torch
    from scipy.stats import binomtest

    from structspec.engine.sampling import choose
    from structspec.engine.types import SamplingParams
    from structspec.engine.verify import verify
    from structspec.speculation.base import DraftContext, SequenceSpeculation
    from structspec.speculation.draft_model import DraftModelProposer

    eos = 0
    p_logits = torch.tensor([math.log(0.5), math.log(0.5), -math.inf, -math.inf])  # target: EOS or token 1
    q_logits = torch.tensor([math.log(0.9), math.log(0.1), -math.inf, -math.inf])  # draft: mostly EOS
    proposer = DraftModelProposer(_FixedLM(q_logits), end_of_turn=eos, confidence=0.0)
    params = SamplingParams(temperature=1.0, max_tokens=8)
    n, eos_count = 4_000, 0
    for seed in range(n):
        state = SequenceSpeculation("")
        ctx = DraftContext("k", None, "", "", [5, 6], [], _AnyToken(), seed, params, state)
        draft = proposer.propose(ctx, 1)
        if draft is None:
            token = choose(p_logits, params, seed, 0)
        else:
            rows = torch.stack([p_logits, p_logits])  # [k+1, V]
            verdict = verify(rows, draft.tokens, draft.q, params, seed, 0)
            token = draft.tokens[0] if verdict.accepted else verdict.token
        proposer.release(state)
        assert token == choose(p_logits, params, seed, 0)  # the very token speculation off emits
        eos_count += token == eos
    assert binomtest(eos_count, n, 0.5).pvalue > 1e-3, eos_count / n


def test_a_draft_stops_before_any_end_of_turn_id():
    """A model with two end-of-turn ids (Gemma 3 it's <eos> and <end_of_turn>): the draft model drafts up to
    either, never one of them (the target's verification writes the end of turn itself)."""
    import torch

    from structspec.engine.types import SamplingParams
    from structspec.speculation.base import DraftContext, SequenceSpeculation
    from structspec.speculation.draft_model import DraftModelProposer

    writes_end = torch.tensor([0.0, 1.0, 0.0, 5.0])  # greedy: token 3, the second end of turn
    proposer = DraftModelProposer(_FixedLM(writes_end), end_of_turn=(0, 3), confidence=0.0)
    ctx = DraftContext("k", None, "", "", [5, 6], [], _AnyToken(), 0, SamplingParams(), SequenceSpeculation(""))
    assert proposer.propose(ctx, 4) is None
    writes_text = torch.tensor([0.0, 5.0, 0.0, 1.0])
    proposer = DraftModelProposer(_FixedLM(writes_text), end_of_turn=(0, 3), confidence=0.0)
    ctx = DraftContext("k", None, "", "", [5, 6], [], _AnyToken(), 0, SamplingParams(), SequenceSpeculation(""))
    assert proposer.propose(ctx, 4).tokens == [1, 1, 1, 1]


def test_the_schema_history_is_shared_only_within_a_scope():
    from structspec.engine.detok import OutputText
    from structspec.engine.types import FinishReason
    from structspec.speculation.configs import ProposerSet
    from structspec.speculation.history import history_key
    from structspec.speculation.router import Router
    from tests.engine.fakes import ToyTokenizer, free_slots, make_seq

    router = Router(ToyTokenizer(), ProposerSet(ngram=False, history=True, draft=False), vocab_size=16)
    alice, bob, anyone = (make_seq([1], free_slots(2)) for _ in range(3))
    alice.history_scope, bob.history_scope = "t:a", "t:b"
    for seq in (alice, bob, anyone):
        seq.output, seq.finish, seq.text = [3, 4], FinishReason.STOP, OutputText(router.tokenizer)  # as admitted
        router.on_finish(seq)
    assert history_key(alice) != history_key(bob) != history_key(anyone) == "toy"
    assert router.history.outputs(history_key(alice)) == ["cd"] and router.history.outputs("toy") == ["cd"]
    assert len(router.history.outputs(history_key(bob))) == 1  # bob's own output, not alice's as well
