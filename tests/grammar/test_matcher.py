"""The Matcher protocol, on a toy vocabulary, for both backends."""

from __future__ import annotations

import json

import pytest
import torch

from structspec.grammar import allocate_bitmask, apply_token_bitmask, bitmask_to_bool
from structspec.grammar.tools import ToolSet

from .conftest import accepts, allowed

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "paid": {"type": "boolean"}},
    "required": ["name", "age", "paid"],
    "additionalProperties": False,
}
PERSON_TEXT = '{"name":"Ada Lovelace","age":36,"paid":false}'


def disallowed_after(grammar, view, prefix) -> int:
    """A (non-EOS) token the grammar rejects right after ``prefix``."""
    probe = grammar.matcher()
    assert probe.consume(prefix)
    ok = allowed(probe, view)
    return next(t for t in range(len(view.tokenizer)) if t not in ok and t != view.eos_token_id)


def test_walks_a_valid_instance_and_rejects_invalid_ones(compiler, view):
    grammar = compiler.compile_schema(PERSON)
    assert accepts(grammar, view, PERSON_TEXT)
    assert not accepts(grammar, view, '{"name":"Ada","age":"36","paid":false}')  # wrong type
    assert not accepts(grammar, view, '{"name":"Ada","age":36}')  # missing property
    assert not accepts(grammar, view, '{"name": "Ada","age":36,"paid":false}')  # compact JSON only


def test_rollback_after_a_rejected_draft(compiler, view):
    grammar = compiler.compile_schema(PERSON)
    matcher = grammar.matcher()
    tokens = view.encode(PERSON_TEXT)
    assert matcher.consume(tokens[:4])
    before = allowed(matcher, view)
    draft = tokens[4:7] + [disallowed_after(grammar, view, tokens[:7])]  # wrong at its 4th token
    n = 0  # walked as the step walks a draft: mask check, then consume
    for token in draft:
        if token not in allowed(matcher, view) or not matcher.consume([token]):
            break
        n += 1
    assert n == 3 and matcher.error is None
    matcher.rollback(n)  # the target rejected the draft after all
    assert allowed(matcher, view) == before
    assert matcher.consume(tokens[4:]) and matcher.is_accepting()


TWO_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "lookup_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"],
        "additionalProperties": False}}},
]


@pytest.mark.parametrize("partial", [False, True, "deep"])
def test_rollback_leaves_no_mask_of_the_walked_draft_behind(demo_compiler, partial):
    """A draft walked (a mask after every token, as the step and the draft model walk one) into one tool's string
    value and rolled back must leave the masks of another tool's string value as a fresh matcher has them. With
    llguidance's own rollback, the mask in the order id kept refusing ``"}}`` (closing the call), which only the
    city's followers forbid: decoding went off the target's choice and ended on a token the grammar rejected."""
    view = demo_compiler.view
    grammar = demo_compiler.compile_tools(ToolSet.parse(TWO_TOOLS, "required"))
    prefix, taken = view.encode('{"name":"'), view.encode('lookup_order","arguments":{"order_id":"ORD-538485')
    walked = grammar.matcher()
    assert walked.consume(prefix)
    draft = view.encode('get_weather","arguments":{"city":"')
    for token in draft:
        assert token in allowed(walked, view) and walked.consume([token])
    allowed(walked, view)  # the mask at the start of the city's value
    if partial == "deep":  # undo one token, walk it again (a mask inside the string), then undo the whole draft:
        walked.rollback(1)  # deeper than the tokens consumed since that rollback
        assert walked.consume(draft[-1:])
        allowed(walked, view)
        walked.rollback(len(draft))
    elif partial:  # and undo part of one multi-token consume call
        tail = view.encode('Dublin","unit":"')
        assert walked.consume(tail)
        allowed(walked, view)
        walked.rollback(len(draft) + len(tail))
    else:
        walked.rollback(len(draft))
    fresh = grammar.matcher()
    assert fresh.consume(prefix)
    assert walked.consume(taken) and fresh.consume(taken)  # in one call, as forced tokens are
    assert allowed(walked, view) == allowed(fresh, view)
    assert walked.consume(view.encode('"}}')) and walked.is_accepting()


def test_forced_tokens_are_the_canonical_split_llguidance(compilers, view):
    grammar = compilers["llguidance"].compile_schema({"const": "summary_of_invoice"})
    text = '"summary_of_invoice"'
    forced = grammar.matcher().forced_tokens()
    assert forced == view.encode(text)
    enum_obj = {"type": "object", "properties": {"kind": {"enum": ["summary"]}}, "required": ["kind"],
                "additionalProperties": False}
    assert compilers["llguidance"].compile_schema(enum_obj).matcher().forced_tokens() == view.encode('{"kind":"summary"}')


def test_forced_tokens_only_where_one_token_is_allowed_outlines(compilers, view):
    grammar = compilers["outlines"].compile_schema({"const": "summary_of_invoice"})
    matcher = grammar.matcher()
    forced = matcher.forced_tokens()
    canonical = view.encode('"summary_of_invoice"')
    assert forced == canonical[: len(forced)]  # a prefix: several splits may be allowed later on
    for token in forced:
        assert allowed(matcher, view) == {token}
        assert matcher.consume([token])
    if len(forced) < len(canonical):
        assert len(allowed(matcher, view)) > 1


def test_forced_tokens_then_decode_finish(compiler, view):
    matcher = compiler.compile_schema({"enum": ["only-choice"]}).matcher()
    forced = matcher.forced_tokens()
    assert matcher.consume(forced)
    rest = view.encode_bytes(b'"only-choice"'[len(view.decode_bytes(forced)):])
    assert matcher.consume(rest)
    assert matcher.is_accepting() and matcher.is_stopped()
    assert allowed(matcher, view) == {view.eos_token_id}


def test_sticky_error_instead_of_raising(compiler, view):
    matcher = compiler.compile_schema(PERSON).matcher()
    assert not matcher.consume(view.encode("[1]"))
    assert matcher.error
    assert not matcher.consume(view.encode("{"))
    assert matcher.forced_tokens() == []
    assert matcher.is_stopped()
    assert allowed(matcher, view) == {view.eos_token_id}  # the sequence can only end
    matcher.rollback(1)
    assert matcher.error  # sticky


def test_eos(compiler, view):
    eos = view.eos_token_id
    matcher = compiler.compile_schema(PERSON).matcher()
    tokens = view.encode(PERSON_TEXT)
    assert matcher.consume(tokens[:2]) and eos not in allowed(matcher, view)  # EOS before the instance is complete
    matcher.rollback(2)
    assert matcher.consume(tokens + [eos])
    assert matcher.is_stopped() and matcher.is_accepting()
    matcher.rollback(1)  # undoes the EOS only
    assert matcher.is_accepting() and eos in allowed(matcher, view)
    assert matcher.consume([eos])
    assert not matcher.consume([tokens[0]]) and matcher.error == "token after EOS"

    early = compiler.compile_schema(PERSON).matcher()
    assert not early.consume(tokens[:2] + [eos]) and early.error


def test_top_level_integer_accepting_but_not_stopped(compiler, view):
    matcher = compiler.compile_schema({"type": "integer"}).matcher()
    assert matcher.consume(view.encode("42"))
    assert matcher.is_accepting() and not matcher.is_stopped()  # more digits may follow
    assert view.eos_token_id in allowed(matcher, view)


def test_mask_rows_wider_than_the_vocabulary_and_narrower_ones(compiler, view):
    matcher = compiler.compile_schema(PERSON).matcher()
    wide = torch.full((3, view.mask_words + 5), -1, dtype=torch.int32)
    matcher.fill_mask(wide, 1)
    assert (wide[1, view.mask_words:] == 0).all()
    assert bitmask_to_bool(wide[1], view.n_vocab).sum() >= 1
    assert (wide[0] == -1).all() and (wide[2] == -1).all()  # other rows untouched
    with pytest.raises(ValueError):
        matcher.fill_mask(torch.zeros((1, view.mask_words - 1), dtype=torch.int32), 0)


def test_padding_ids_of_the_model_vocabulary_are_never_allowed(compiler, view, tokenizer):
    grammar = compiler.compile_schema({"type": "string"})
    matcher = grammar.matcher()
    assert matcher.consume(view.encode('"a'))
    assert max(allowed(matcher, view)) < len(tokenizer)


def test_listed_allowed_sets_mask_as_the_bitmask_does():
    """Rows whose allowed ids are listed (the executor's restricted rows) are masked from the list: the same
    result as unpacking their bitmask; unlisted rows still go through the bitmask."""
    from structspec.grammar.base import small_allowed_set

    vocab = 300
    logits = torch.randn(3, vocab + 4)
    bitmask = allocate_bitmask(3, vocab)
    bitmask[0, 0] = 0b1011
    bitmask[1, :] = -1
    bitmask[2, 9] = 1 << 3
    listed = tuple(small_allowed_set(row, 16) for row in bitmask)
    assert listed[1] is None and listed[0].tolist() == [0, 1, 3] and listed[2].tolist() == [9 * 32 + 3]
    want = apply_token_bitmask(logits, bitmask)
    assert torch.equal(apply_token_bitmask(logits, bitmask, allowed=listed), want)
    assert torch.equal(apply_token_bitmask(logits, bitmask, allowed=(None, None, None)), want)


def test_apply_token_bitmask_vectorised():
    vocab, width = 70, 3
    logits = torch.randn(4, vocab + 6)  # logits wider than the mask: the tail is disallowed
    bitmask = allocate_bitmask(4, vocab)
    bitmask[0, 0] = 0b1011
    bitmask[1, 1] = -1  # tokens 32..63, bit 31 included
    bitmask[3, 2] = 1 << 5
    before = logits.clone()
    out = apply_token_bitmask(logits, bitmask)
    assert torch.equal(logits, before)  # a masked copy by default
    inplace = logits.clone()
    assert apply_token_bitmask(inplace, bitmask, inplace=True) is inplace
    assert torch.equal(inplace, out)
    for row in range(4):
        expected = torch.zeros(vocab + 6, dtype=torch.bool)
        expected[:vocab] = bitmask_to_bool(bitmask[row], vocab)
        assert torch.equal(torch.isfinite(out[row]), expected)
        assert torch.equal(out[row][expected], logits[row][expected])
    assert bitmask.shape[1] == width


def test_matchers_are_independent(compiler, view):
    grammar = compiler.compile_schema(PERSON)
    a, b = grammar.matcher(), grammar.matcher()
    assert a.consume(view.encode('{"name":"A'))
    assert allowed(b, view) != allowed(a, view) or b.forced_tokens() != a.forced_tokens()
    assert accepts(grammar, view, json.dumps(json.loads(PERSON_TEXT), separators=(",", ":")))


def test_nothing_is_forced_where_eos_is_an_alternative(compiler, view, backend):
    matcher = compiler.compile_schema({"enum": [1, 12]}).matcher()
    assert matcher.consume(view.encode("1"))
    expected = {view.eos_token_id, view.encode("2")[0]}
    if backend == "outlines":  # outlines-core's index drops some continuations of accepting states
        expected = {view.eos_token_id}
    assert expected <= allowed(matcher, view)
    assert matcher.forced_tokens() == []


def test_masks_through_the_layout_are_llguidances_own_bit_for_bit(compilers, view):
    """``fill_mask`` writes through an address (no tensor view): at every position of a walk, into every
    row of a batch (negative rows counting from the end), the words are llguidance's own."""
    import numpy as np

    grammar = compilers["llguidance"].compile_schema(PERSON)
    matcher, raw = grammar.matcher(), grammar._prototype.deep_copy()
    words = view.mask_words
    bitmask = torch.full((3, words), -1, dtype=torch.int32)
    expected = np.empty(words, dtype=np.int32)
    tokens = view.encode(PERSON_TEXT)
    for i, token in enumerate(tokens + [None]):
        raw.unsafe_compute_mask_ptr(expected.ctypes.data, expected.nbytes)
        row = (i % 3) - (i % 2) * 3  # 0, -2, 2, 0, -2, ...
        matcher.fill_mask(bitmask, row)
        assert (bitmask[row].numpy() == expected).all(), i
        if token is not None:
            assert matcher.consume([token]) and raw.consume_token(token)
    assert view.eos_token_id in allowed(matcher, view)


def test_the_mask_path_checks_what_it_writes_into(compiler, view):
    matcher = compiler.compile_schema(PERSON).matcher()
    words = view.mask_words
    for bad in (torch.zeros((1, words), dtype=torch.int64), torch.zeros((words,), dtype=torch.int32),
                torch.zeros((words, 2), dtype=torch.int32).t(), torch.zeros((1, words - 1), dtype=torch.int32)):
        with pytest.raises(ValueError):
            matcher.fill_mask(bad, 0)
    with pytest.raises(IndexError):
        matcher.fill_mask(torch.zeros((2, words), dtype=torch.int32), 2)


def test_a_layout_is_read_again_for_another_tensor_or_new_memory(view):
    """The layout kept for the last tensor is never used for another one, nor once that tensor's
    memory moved (``set_``): each write lands in the tensor it was meant for."""
    from structspec.grammar.base import mask_layout

    words = view.mask_words
    a, b = torch.zeros((2, words), dtype=torch.int32), torch.zeros((4, words + 3), dtype=torch.int32)
    assert mask_layout(a, words).address == a.data_ptr() and mask_layout(a, words).rows == 2
    assert (mask_layout(b, words).address, mask_layout(b, words).width) == (b.data_ptr(), words + 3)
    assert mask_layout(b, words).row_address(-1) == b[3].data_ptr()
    a.set_(torch.zeros((5, words), dtype=torch.int32))
    layout = mask_layout(a, words)
    assert (layout.address, layout.rows) == (a.data_ptr(), 5)


def test_the_mask_path_makes_no_tensor_view(compilers, view, monkeypatch):
    """A torch view costs 5-15 us a mask, more than llguidance's cheap masks: the hot path goes through
    the layout; only a finished or broken sequence (EOS only) takes the view."""
    from structspec.grammar import llguidance_backend

    matcher = compilers["llguidance"].compile_schema(PERSON).matcher()
    bitmask = allocate_bitmask(1, view.n_vocab)
    views = []
    original = llguidance_backend.bitmask_row
    monkeypatch.setattr(llguidance_backend, "bitmask_row", lambda *a: views.append(a) or original(*a))
    matcher.fill_mask(bitmask, 0)
    assert views == []
    assert matcher.consume(view.encode(PERSON_TEXT)) and matcher.consume([view.eos_token_id])
    matcher.fill_mask(bitmask, 0)
    assert len(views) == 1 and bitmask_to_bool(bitmask[0], view.n_vocab).nonzero().flatten().tolist() == [
        view.eos_token_id]
