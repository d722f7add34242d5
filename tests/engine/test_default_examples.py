"""Worked examples added for the built-in schemas and tools when a request brings none (base-model profiles)."""

from __future__ import annotations

import json

import jsonschema

from structspec.engine.api import ChatMessage, ExtractionRequest, ToolCallRequest
from structspec.engine.default_examples import FOREIGN_CALLS, ExampleBook, build_example_book, fill_examples
from structspec.grammar.cache import schema_digest
from structspec.models.profiles import get_profile
from structspec.prompts import FewShotExample
from structspec.schemas import load_builtin_schemas, load_builtin_tools


def test_one_valid_example_per_builtin_schema_and_per_tool():
    book = build_example_book(1)
    for _name, schema in load_builtin_schemas().items():
        (example,) = book.for_schema(schema)
        jsonschema.validate(json.loads(example.output), schema)  # a worked example must itself be right
        assert example.text.strip()
    tools = load_builtin_tools()
    calls = [json.loads(e.output) for e in book.for_tools(tools)]
    assert sorted(c["name"] for c in calls) == sorted(t["function"]["name"] for t in tools)
    assert build_example_book(1).for_schema(load_builtin_schemas()["invoice"]) == book.for_schema(
        load_builtin_schemas()["invoice"])  # fixed seed: the same prompts on every start


def test_unknown_schemas_get_a_synthesised_example_and_none_when_none_are_wanted():
    book = build_example_book(1)
    unit = {"type": "object", "properties": {"x": {"enum": ["c", "f"]}}, "required": ["x"]}
    made, real = book.for_schema(unit)
    assert made.output == '{"x":"c"}' and real.title == "Contact"  # made from the schema (test_synthetic_examples)
    (only,) = book.for_schema({"type": "object", "properties": {"x": {"type": "string"}}})  # a free value: none made
    assert only.title == "Contact"
    foreign = book.for_tools(load_builtin_tools()[:1])  # another tool list, its arguments free: other tools' calls
    assert len(foreign) == 2 and set(foreign) <= set(FOREIGN_CALLS)
    assert build_example_book(0).for_schema({"type": "object"}) == ()
    two = ExampleBook(synthesize=2).for_schema(unit)
    assert [e.output for e in two] == ['{"x":"c"}', '{"x":"f"}']  # two variants: values vary
    calls = build_example_book(2).for_tools(load_builtin_tools())  # round by round: every tool once, then again
    names = [json.loads(e.output)["name"] for e in calls]
    assert names[:6] == names[6:] == [t["function"]["name"] for t in load_builtin_tools()]
    assert build_example_book(0).for_schema(load_builtin_schemas()["invoice"]) == ()
    assert get_profile("gemma-3-270m").few_shot == 3 and get_profile("demo").few_shot == 0


def test_engine_adds_book_examples_only_when_the_request_has_none(make_engine):
    engine = make_engine()
    invoice = load_builtin_schemas()["invoice"]
    book = build_example_book(1)
    engine.examples = book
    (shown,) = book.for_schema(invoice)
    tok = engine.tokenizer

    def prompt(req) -> str:
        return tok.decode(engine.prepare_extraction(req).prompt)

    assert shown.text.strip()[:40] in prompt(ExtractionRequest(schema=invoice, text="INVOICE 7 from Foo Ltd"))
    own = FewShotExample("INVOICE 1 from Bar Inc", '{"invoice_number":"1"}')
    mine = prompt(ExtractionRequest(schema=invoice, text="INVOICE 7 from Foo Ltd", examples=(own,)))
    assert "Bar Inc" in mine and shown.text.strip()[:40] not in mine
    # Tool calls: keyed by the exact tool list (a short one here: the demo model's context is 1024 tokens).
    tools = tuple(load_builtin_tools()[:2])
    shot = FewShotExample("please book the usual example call", json.dumps({"name": tools[0]["function"]["name"],
                                                                            "arguments": {}}))
    engine.examples = ExampleBook(by_tools={schema_digest(list(tools)): (shot,)})
    call = tok.decode(engine.prepare_toolcall(ToolCallRequest(messages=(ChatMessage("user", "hi"),), tools=tools,
                                                              tool_choice="required")).prompt)
    assert "please book the usual example call" in call
    engine.examples = ExampleBook()
    assert shown.text.strip()[:40] not in prompt(ExtractionRequest(schema=invoice, text="INVOICE 7 from Foo Ltd"))


def test_a_request_with_fewer_examples_than_the_server_shows_gets_the_server_s_first():
    """The caller's examples come last, after as many of the server's own of that schema as make up its count;
    another schema's example (titled) never fills; with as many as the server's, or an empty book, the caller's
    alone."""
    own = tuple(FewShotExample(f"server {k}", f'{{"k":{k}}}') for k in range(3))
    given = FewShotExample("mine", '{"k":9}')
    assert fill_examples((), own) == own
    assert fill_examples((given,), own) == (own[0], own[1], given)
    assert fill_examples((given, given), own) == (own[0], given, given)
    assert fill_examples((given,) * 4, own) == (given,) * 4
    assert fill_examples((given,), ()) == (given,)
    foreign = FewShotExample("Ada, ada@example.com", '{"name":"Ada"}', title="Contact")
    assert fill_examples((given,), (own[0], foreign)) == (given,)


def test_the_engine_shows_a_caller_s_example_after_the_server_s(make_engine):
    engine = make_engine()
    invoice = load_builtin_schemas()["invoice"]
    engine.examples = build_example_book(2)
    first, second = engine.examples.for_schema(invoice)
    own = FewShotExample("INVOICE 1 from Bar Inc", '{"invoice_number":"1"}')
    prompt = engine.tokenizer.decode(engine.prepare_extraction(
        ExtractionRequest(schema=invoice, text="INVOICE 7 from Foo Ltd", examples=(own,))).prompt)
    at = [prompt.index(s) for s in (first.text.strip()[:40], own.text, "INVOICE 7 from Foo Ltd")]
    assert at == sorted(at) and second.text.strip()[:40] not in prompt


def test_a_tool_list_without_an_example_of_its_own_gets_another_tools_call_it_does_not_hold():
    book = build_example_book(1)
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}} for n in ("find", "look")]
    shown = book.for_tools(tools)  # the digest picks where to start (the same each time)
    assert len(shown) == 2 and set(shown) <= set(FOREIGN_CALLS) and book.for_tools(tools) == shown
    # calls that close a list and a number, beside a string: each pair the digest can pick holds one with a list
    for at in range(len(FOREIGN_CALLS)):
        pair = FOREIGN_CALLS[at], FOREIGN_CALLS[(at + 1) % len(FOREIGN_CALLS)]
        assert any("[" in ex.output for ex in pair)
    held = [{"type": "function", "function": {"name": json.loads(ex.output)["name"], "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}} for ex in FOREIGN_CALLS[:3]]
    assert book.for_tools(held) == FOREIGN_CALLS[3:]  # never a call of a tool the list holds
    assert build_example_book(0).for_tools(tools) == ()  # a profile that needs no examples gets none
    # where the model may answer in words, calls of other tools would make it call where no tool is needed
    assert book.for_tools(tools, forced=False) == () and book.for_tools(tools) == shown


def test_the_engine_shows_other_tools_calls_only_to_a_forced_call(make_engine):
    engine = make_engine()
    engine.examples = build_example_book(1)
    tools = tuple({"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}} for n in ("find", "look"))

    def prompt(choice: str) -> str:
        request = ToolCallRequest(messages=(ChatMessage("user", "Find my keys."),), tools=tools, tool_choice=choice)
        return engine.tokenizer.decode(engine.prepare_toolcall(request).prompt)

    foreign = [ex.title for ex in FOREIGN_CALLS]
    assert any(title in prompt("required") for title in foreign)
    assert any(title in prompt("find") for title in foreign)  # a named tool is forced too
    assert not any(title in prompt("auto") for title in foreign)


def test_a_call_of_another_tool_is_shown_under_its_own_list_before_the_request_s():
    from structspec.prompts import ToolSpec, toolcall_prompt

    tool = ToolSpec("find", "Finds a thing.", {"type": "object", "properties": {"q": {"type": "string"}}})
    prompt = toolcall_prompt([tool], [("user", "Find my keys.")], (FOREIGN_CALLS[0],))
    foreign_at, own_at = prompt.index(FOREIGN_CALLS[0].title), prompt.index("- find(")
    assert prompt.startswith("### Tools:\n" + FOREIGN_CALLS[0].title) and foreign_at < prompt.index(
        FOREIGN_CALLS[0].output) < own_at < prompt.index("Find my keys.")
    assert prompt.endswith("### Call:\n")



def test_the_server_s_examples_are_guarded_and_a_caller_s_are_not(make_engine):
    """An extraction shown the server's examples decodes under a copy guard over their values its input does not
    hold; a caller's own example is not guarded, nor anything with the guard off."""
    from structspec.grammar.copy_guard import CopyGuard, normalized

    engine = make_engine()
    invoice = load_builtin_schemas()["invoice"]
    engine.examples = book = build_example_book(2)
    first, second = book.for_schema(invoice)
    vendor = json.loads(first.output)["vendor"]
    seq = engine.prepare_extraction(ExtractionRequest(schema=invoice, text=f"INVOICE 7 from Foo Ltd, {vendor}"))
    assert isinstance(seq.matcher, CopyGuard)
    guarded = set(seq.matcher.guarded.strings)
    assert normalized(json.loads(second.output)["vendor"].encode()) in guarded
    assert normalized(vendor.encode()) not in guarded  # this input holds it
    own = FewShotExample("INVOICE 1 from Bar Inc", '{"invoice_number":"Bar-1","vendor":"Bar Inc"}')
    seq = engine.prepare_extraction(ExtractionRequest(schema=invoice, text="INVOICE 7", examples=(own,)))
    assert isinstance(seq.matcher, CopyGuard) and b"bar1" not in seq.matcher.guarded.strings
    assert normalized(json.loads(first.output)["vendor"].encode()) in seq.matcher.guarded.strings  # shown before it
    assert not isinstance(engine.prepare_extraction(ExtractionRequest(
        schema=invoice, text="INVOICE 7", examples=(own, own))).matcher, CopyGuard)  # the server's none shown
    engine.copy_guard = False
    assert not isinstance(engine.prepare_extraction(ExtractionRequest(schema=invoice, text="INVOICE 7")).matcher,
                          CopyGuard)


def test_no_sampled_output_goes_along_a_guarded_value_past_its_input(make_engine):
    """Sampled at temperature 1 on inputs that hold none of the examples' values: wherever an output's token ends
    inside a string value, what that value holds so far (normalized) is no guarded value's beginning past what the
    input holds. (The invoice schema forces no free string, so the guard never yields here.)"""
    from structspec.grammar.copy_guard import GuardTokens

    engine = make_engine()
    invoice = load_builtin_schemas()["invoice"]
    engine.examples = build_example_book(2)
    tokens = GuardTokens.for_view(engine.compiler.view)
    engine.start()
    assert _past_input(engine, invoice, tokens) == 0
    engine.copy_guard = False  # the check has power: unguarded, the demo model writes the examples' values
    assert _past_input(engine, invoice, tokens) > 0


def _past_input(engine, invoice, tokens) -> int:
    """Token ends, over 6 sampled outputs, where a string value holds a guarded value's beginning past its input."""
    import asyncio

    from structspec.engine.types import SamplingParams
    from structspec.grammar.copy_guard import JsonCursor, guarded_values, normalized

    past = 0
    for seed in range(6):
        text = f"Bill {seed}. Goods delivered. Please pay."
        guarded = guarded_values([ex.output for ex in engine.examples.for_schema(invoice)], text, invoice)
        res = asyncio.run(engine.extract(ExtractionRequest(
            schema=invoice, text=text, sampling=SamplingParams(max_tokens=160, temperature=1.0, seed=seed))))
        cursor = JsonCursor()
        for t in res.token_ids:
            cursor.feed(tokens.bytes_of(t))
            kind, written = cursor.open_value()
            w = normalized(written) if kind == "string" else b""
            past += sum(bool(w) and g.startswith(w) and not guarded.holds(w) for g in guarded.strings)
    return past
