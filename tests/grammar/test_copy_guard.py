"""The copy guard: which values it guards, where a written output stands, and the mask it leaves."""

from __future__ import annotations

import json
import random

import pytest

from structspec.grammar.copy_guard import CopyGuard, GuardedValues, GuardTokens, JsonCursor, guarded_values, normalized
from structspec.grammar.tokenizer_view import TokenPrefixIndex
from tests.grammar.conftest import allowed

SCHEMA = {"type": "object", "properties": {
    "vendor": {"type": "string"}, "currency": {"enum": ["USD", "EUR", "Euro"]}, "date": {"type": "string", "format": "date"},
    "code": {"type": "string", "pattern": "^INV-[0-9]{3}$"}, "total": {"type": "number"},
    "items": {"type": "array", "items": {"type": "object", "properties": {"description": {"type": "string"}}}}},
    "required": ["vendor", "currency", "code", "total", "items"], "additionalProperties": False}
EXAMPLE = {"vendor": "Iris Media S.A.", "currency": "Euro", "date": "2027-04-16", "code": "INV-123", "total": 6049,
           "items": [{"description": "consulting hours"}, {"description": "EU"}]}


def test_guarded_values_are_the_examples_strings_the_input_does_not_hold() -> None:
    g = guarded_values([json.dumps(EXAMPLE)], "Invoice from IRIS  media s.a. for 12 hours, total 6049", SCHEMA)
    # the vendor is in the input (case and spacing aside); "Euro" is enumerated; the date is the output's
    # rendering (format: date); "EU" is too short; numbers are not guarded
    assert set(g.strings) == {b"inv123", b"consultinghours"}
    held = guarded_values([json.dumps(EXAMPLE)], "inv 123 for Consulting-Hours", SCHEMA)  # punctuation aside
    assert held.strings == (b"irismediasa",)
    # a value a caller's own example shows is the caller's: not guarded
    caller = guarded_values([json.dumps(EXAMPLE)], "", SCHEMA, shown_elsewhere=['{"vendor": "Iris Media S.A."}'])
    assert b"irismediasa" not in caller.strings and b"consultinghours" in caller.strings
    assert not guarded_values(["not json"], "", SCHEMA)
    # without a schema nothing is known to be fixed: the date is guarded as a string
    assert b"20270416" in guarded_values([json.dumps(EXAMPLE)], "").strings


def test_a_shown_date_whose_day_or_year_the_input_lacks_may_not_be_written_whole(compilers, view) -> None:
    # EXAMPLE's date is 2027-04-16: the input writes its day and year in words' company, or not
    assert guarded_values([json.dumps(EXAMPLE)], "issued April 16, 2027", SCHEMA).dates == ()
    assert guarded_values([json.dumps(EXAMPLE)], "issued 20.04.2027", SCHEMA).dates == (b"20270416",)
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    guarded = guarded_values([json.dumps(EXAMPLE)], "issued 20.04.2027", SCHEMA)
    for text, refused in (('{"vendor":"x","currency":"USD","date":"2027-04-1', True),
                          ('{"vendor":"x","currency":"USD","date":"2027-04-', False),  # the input's 20 goes on
                          ('{"vendor":"x","currency":"USD","date":"2027-05-1', False)):
        guard = CopyGuard(grammar.matcher(), guarded, GuardTokens.for_view(view))
        _walk(guard, view, text)
        inner = allowed(_walked(grammar, view, text), view)
        gone = inner - allowed(guard, view)
        assert gone == ({t for t in inner if normalized(view.token_bytes[t]).startswith(b"6")} if refused else set())
        assert allowed(guard, view) and (gone or not refused), text


def test_guarded_strings_are_their_json_text_normalized() -> None:
    g = guarded_values([json.dumps({"a": 'Say "HI"\n', "b": "Zoë's Café"})], "")
    assert set(g.strings) == {b"sayhin", "zoëscafé".encode()}  # as the output writes them: escapes, UTF-8 kept
    assert normalized(b"INV_2027-1149 ") == normalized(b"inv 2027 1149") == b"inv20271149"
    assert g.holds(b"") and not g.holds(b"say")


def _reference(text: bytes) -> tuple[str | None, bytes]:
    """The open string value or number of ``text``, read from its start with a stack of the containers' states."""
    s = text.decode("utf-8", "replace")
    in_str, esc, start, stack, key, num = False, False, 0, [], False, None
    for i, ch in enumerate(s):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if num is not None:
            if ch in "0123456789+-.eE":
                continue
            num = None
        if ch == '"':
            in_str, start, key = True, i + 1, bool(stack) and stack[-1] == "key"
        elif ch == "{":
            stack.append("key")
        elif ch == "[":
            stack.append("arr")
        elif ch in "}]":
            stack.pop()
        elif ch == ":":
            stack[-1] = "value"
        elif ch == "," and stack[-1] in ("key", "value"):
            stack[-1] = "key"
        elif ch in "-0123456789":
            num = i
    if in_str and not key:
        return "string", s[start:].encode()
    return ("number", s[num:].encode()) if num is not None else (None, b"")


@pytest.mark.parametrize("seed", range(20))
def test_the_cursor_tracks_the_open_value_through_random_splits_and_rollbacks(seed: int) -> None:
    r = random.Random(seed)
    doc = json.dumps({"a": [1, -2.5e3, {"b\\\"": 'x"y\\'}], "c": "Iris, Media", "d": {"e": 10}, "f": ""},
                     separators=(",", ":") if seed % 2 else (", ", ": ")).encode()
    cuts = sorted(r.sample(range(1, len(doc)), 12))
    pieces = [doc[i:j] for i, j in zip([0, *cuts], [*cuts, len(doc)])]
    cursor, fed = JsonCursor(), b""
    for piece in pieces:
        cursor.feed(piece)
        fed += piece
        assert cursor.open_value() == _reference(fed), fed
        if r.random() < 0.4:  # a draft rolled back, then the same bytes again
            cursor.feed(b'"zz')
            cursor.rollback(1)
            assert cursor.open_value() == _reference(fed), fed
    cursor.rollback(len(pieces) + 5)
    assert cursor.open_value() == (None, b"")


def _walk(matcher, view, text: str) -> None:
    assert matcher.consume(view.encode(text)), (text, matcher.error)


def _walked(grammar, view, text: str):
    m = grammar.matcher()
    _walk(m, view, text)
    return m


def _starting(tokens: set[int], view, prefix: bytes) -> set[int]:
    return {t for t in tokens if view.token_bytes[t].startswith(prefix)}


def _along(rest: bytes, held: int, view) -> set[int]:
    """Token ids whose normalized bytes take a value along ``rest`` past its first ``held`` bytes."""
    return {t for t, b in enumerate(view.token_bytes) if (n := normalized(b)) and (
        (rest.startswith(n) and len(n) > held) or n.startswith(rest))}


def test_the_guard_refuses_to_go_along_a_guarded_value_past_what_the_input_holds(compilers, view) -> None:
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    tokens = GuardTokens.for_view(view)
    guarded = guarded_values([json.dumps(EXAMPLE)], "Bill from IRIS  mountain ltd", SCHEMA)
    assert b"irismediasa" in guarded.strings
    text = '{"vendor":"Iris M'  # the input holds "irism", not "irisme"
    guard, inner = CopyGuard(grammar.matcher(), guarded, tokens), _walked(grammar, view, text)
    _walk(guard, view, text)
    gone = allowed(inner, view) - allowed(guard, view)
    want = _along(b"ediasa", 0, view) & allowed(inner, view)
    assert want and gone == want
    assert _starting(allowed(guard, view), view, b"o")  # the input's "Iris Mountain" goes on
    assert guard.refusals == 2  # the two fills above
    # the held part is free: the input holds "helloexam", so at "Hello " the tokens along "example" go only as far
    # as "exam", whatever punctuation they bring
    guarded = guarded_values([json.dumps({"vendor": "Hello example"})], "HELLO  EXAMINER, Paris", SCHEMA)
    guard = CopyGuard(grammar.matcher(), guarded, tokens)
    _walk(guard, view, '{"vendor":"Hello ')
    inner = _walked(grammar, view, '{"vendor":"Hello ')
    gone = allowed(inner, view) - allowed(guard, view)
    assert gone and gone == _along(b"example", len(b"exam"), view) & allowed(inner, view)
    # another vendor goes on freely
    other = CopyGuard(grammar.matcher(), guarded, tokens)
    _walk(other, view, '{"vendor":"Saltmarsh')
    assert allowed(other, view) == allowed(_walked(grammar, view, '{"vendor":"Saltmarsh'), view)
    assert other.refusals == 0


def test_the_guard_yields_where_the_grammar_forces_the_value(compilers, view) -> None:
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    # guarded as if no schema had said they are fixed
    guarded = GuardedValues(strings=(b"inv123", b"euro"), source=b"nothing")
    guard = CopyGuard(grammar.matcher(), guarded, GuardTokens.for_view(view))
    text = '{"vendor":"x","currency":"Eu'
    _walk(guard, view, text)  # the enum allows one way on ("ro"): the guard lets it be
    inner = _walked(grammar, view, text)
    assert allowed(guard, view) == allowed(inner, view) and allowed(inner, view)
    assert guard.refusals == 0
    text += 'ro","code":"INV-12'
    _walk(guard, view, 'ro","code":"INV-12')  # the pattern allows ten digits: the guard refuses the example's
    inner = _walked(grammar, view, text)
    gone = allowed(inner, view) - allowed(guard, view)
    assert gone == _starting(allowed(inner, view), view, b"3") and gone
    assert guard.refusals == 1


def test_keys_are_never_guarded(compilers, view) -> None:
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    guard = CopyGuard(grammar.matcher(), GuardedValues(strings=(b"vendor", b"currency"), source=b""),
                      GuardTokens.for_view(view))
    text = ""
    for more in ('{"ven', 'dor":"x","curr'):
        _walk(guard, view, more)
        text += more
        assert allowed(guard, view) == allowed(_walked(grammar, view, text), view), text
    assert guard.refusals == 0


def test_guarded_numbers_are_the_examples_numbers_the_input_does_not_write() -> None:
    g = guarded_values([json.dumps({"total": 6049, "code": "x", "items": [{"q": 41}, {"q": 3.5}, {"q": -12}]})],
                       "Total 6.049,00 EUR; 41.00 each; 12 boxes", SCHEMA)
    assert g.numbers == (b"3.5",)  # 6049 (as 6.049,00), 41 (as 41.00) and 12 are the input's
    assert {b"6049", b"6049.0", b"6049.00", b"41", b"41.00", b"4"} <= g.number_prefixes


def test_the_numbers_an_example_s_text_writes_are_guarded_and_a_thousands_group_is_no_number() -> None:
    g = guarded_values([json.dumps({"total": 9})], "Total 9,980.75 due 19.08.2026, fee 16.20", SCHEMA,
                       example_texts=["Paid 2,845.45 on April 16, 2027 for 9 items; 19 left", "INV-2027-1149"])
    assert set(g.numbers) == {b"9", b"2845.45", b"16", b"2027", b"1149"}  # 19 is the input's (the date's day); 16.20 is no 16
    assert b"9980.75" in g.number_prefixes and b"980" not in g.number_prefixes
    assert not guarded_values([], "x", SCHEMA, shown_elsewhere=['{"q": 16}'], example_texts=["16 boxes"])


@pytest.mark.parametrize("seed", range(5))
def test_guarded_values_never_raise_on_what_an_input_writes(seed: int) -> None:
    r = random.Random(seed)
    source = "".join(r.choice("0123456789.,, -e\n") for _ in range(2000)) + " 19.09.2026 1e999 " + "9" * 400
    example = json.dumps({"a": 19, "b": 2026.5, "c": 1e300, "d": "19.09"})
    g = guarded_values([example], source, None)
    assert b"19" not in g.numbers  # the date's day


def test_the_guard_refuses_to_go_along_a_guarded_number_past_the_input_s(compilers, view) -> None:
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    guarded = guarded_values([json.dumps({"total": 6049})], "Total 60 EUR", SCHEMA)
    text = '{"vendor":"x","currency":"USD","code":"INV-001","total":60'
    guard, inner = CopyGuard(grammar.matcher(), guarded, GuardTokens.for_view(view)), _walked(grammar, view, text)
    _walk(guard, view, text)
    gone = allowed(inner, view) - allowed(guard, view)
    ends = (b",", b"}", b"]", b" ", b"\n", b"\r", b"\t")
    want = {t for t in allowed(inner, view) if (b := view.token_bytes[t]) and (
        b"49".startswith(b) or any(b.startswith(b"49" + e) for e in ends))}
    assert want and gone == want
    assert _starting(allowed(guard, view), view, b",")  # 60 itself may end


@pytest.mark.parametrize("text", ["11", "11.0", "11.00"])
def test_a_guarded_number_may_not_end_where_it_is_whole(compilers, view, text: str) -> None:
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    guarded = guarded_values([json.dumps({"total": 11})], "Total 117.65 EUR", SCHEMA)  # 11 begins 117.65 only
    assert guarded.numbers == (b"11",)
    prefix = '{"vendor":"x","currency":"USD","code":"INV-001","total":'
    guard = CopyGuard(grammar.matcher(), guarded, GuardTokens.for_view(view))
    _walk(guard, view, prefix + text)
    inner = allowed(_walked(grammar, view, prefix + text), view)
    ends = (b",", b"}", b"]", b" ", b"\n", b"\r", b"\t")
    gone = inner - allowed(guard, view)
    assert gone and gone == {t for t in inner if view.token_bytes[t].startswith(ends)}
    assert _starting(allowed(guard, view), view, b"7")  # the input's 117.65 goes on
    # the input's own number ends freely
    guard = CopyGuard(grammar.matcher(), guarded, GuardTokens.for_view(view))
    _walk(guard, view, prefix + "117.65")
    assert allowed(guard, view) == allowed(_walked(grammar, view, prefix + "117.65"), view)


@pytest.mark.parametrize("held", [False, True])
def test_a_string_value_repeating_a_short_unit_the_input_does_not_hold_may_only_close(compilers, view,
                                                                                     held: bool) -> None:
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    source = b"ref" + (b"yx" * 8 if held else b"yxyxyx")
    for unit, n, runs in (("y-x-", 3, False), ("y-x-", 4, True), ("abc", 3, True), ("ab", 3, False)):
        text = '{"vendor":"INV-' + unit * n
        guard = CopyGuard(grammar.matcher(), GuardedValues(strings=(b"unrelated",), source=source),
                          GuardTokens.for_view(view))
        _walk(guard, view, text)
        inner = allowed(_walked(grammar, view, text), view)
        if runs and not (held and unit == "y-x-"):
            assert allowed(guard, view) == _starting(inner, view, b'"') and allowed(guard, view), text
        else:
            assert allowed(guard, view) == inner, text


@pytest.mark.parametrize("held", [False, True])
def test_a_string_value_running_on_one_character_the_input_does_not_hold_may_only_close(compilers, view,
                                                                                       held: bool) -> None:
    grammar = compilers["llguidance"].compile_schema(SCHEMA)
    source = b"ref" + b"0" * (16 if held else 7)  # holds every run written below, or one of 7
    guard = CopyGuard(grammar.matcher(), GuardedValues(strings=(b"unrelated",), source=source),
                      GuardTokens.for_view(view))
    for n in (7, 8, 12):
        text = '{"vendor":"INV-' + "0" * n
        guard = CopyGuard(grammar.matcher(), guard.guarded, GuardTokens.for_view(view))
        _walk(guard, view, text)
        inner = allowed(_walked(grammar, view, text), view)
        if n < 8 or held:
            assert allowed(guard, view) == inner, n
        else:
            assert allowed(guard, view) == _starting(inner, view, b'"') and allowed(guard, view), n
    # a number that runs one digit on may only end
    text = '{"vendor":"x","currency":"USD","code":"INV-001","total":1.' + "0" * 12
    guard = CopyGuard(grammar.matcher(), guard.guarded, GuardTokens.for_view(view))
    _walk(guard, view, text)
    inner = allowed(_walked(grammar, view, text), view)
    digits = {t for t in inner if view.token_bytes[t][:1].isdigit()}
    assert digits and allowed(guard, view) == (inner if held else inner - digits)


def test_prefix_index_finds_exactly_the_tokens_that_begin_with_a_prefix(view) -> None:
    index = TokenPrefixIndex(view.token_bytes, view.n_vocab)
    for prefix in (b'"', b'",', b"In", b"\xff", b"e", b'"}', b"example"):
        want = {i for i, b in enumerate(view.token_bytes) if b.startswith(prefix)}
        assert set(index.starting_with(prefix).tolist()) == want, prefix
        assert set(index.exactly(prefix).tolist()) == {i for i in want if view.token_bytes[i] == prefix}, prefix
