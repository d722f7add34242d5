"""Pure conversion and error-mapping helpers."""

from __future__ import annotations

import pytest

from structspec.engine.types import ToolCall, ToolCallResult
from structspec.engine.types import (
    FinishReason,
    GenerationResult,
    InvalidRequest,
    Outcome,
    Timings,
    Usage,
)
from structspec.proto_gen.v1 import structspec_pb2 as pb
from structspec.front.errors import Code, FrontError
from structspec.front.failures import from_exception
from structspec.front.limits import Limits
from structspec.front.requests import MAX_EXAMPLES, extraction_request, sampling, tool_request
from structspec.service import convert
from structspec.front.registry import canonical_json, content_hash, metaschema_violations


def result(text: str, finish: FinishReason = FinishReason.STOP, outcome: Outcome = Outcome.VALID, value: object = None) -> GenerationResult:
    return GenerationResult("r1", text, [], finish, outcome, Usage(3, 4, 2, 1, {"d": 4}, {"d": 3}), Timings(1, 2, 3, 6), value=value)


def test_sampling_defaults_and_the_request_types_validate() -> None:
    from structspec.engine.api import ExtractionRequest

    limits = Limits(max_tokens_cap=100)
    s = sampling(convert.sampling(pb.SamplingParams()), limits)
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_tokens) == (0.0, 1.0, 0, None, 100)
    assert sampling(convert.sampling(pb.SamplingParams(seed=0, temperature=0.0)), limits).seed == 0  # explicit zero kept
    # convert converts; the engine's request types are the one owner of validation
    bad = ExtractionRequest(schema={}, text="x", sampling=sampling(convert.sampling(pb.SamplingParams(top_p=0.0)), limits))
    with pytest.raises(InvalidRequest) as err:
        bad.validate(limits.max_tokens_cap)
    assert err.value.field == "top_p"
    over = ExtractionRequest(schema={}, text="x", sampling=sampling(convert.sampling(pb.SamplingParams(max_tokens=101)), limits))
    with pytest.raises(InvalidRequest, match="<= 100") as err:
        over.validate(limits.max_tokens_cap)
    mapped = from_exception(err.value)
    assert mapped.reason == "INVALID_SAMPLING" and mapped.violations[0].field == "sampling.max_tokens"


def test_extract_result_parsed_forms() -> None:
    obj = convert.extract_result(result('{"a": 1, "b": [true, null]}'), "k")
    assert obj.WhichOneof("parsed") == "object" and obj.object["b"][0] is True and obj.schema_key == "k"
    assert dict(obj.usage.drafted_tokens) == {"d": 4} and obj.timings.total_ms == 6
    assert convert.extract_result(result('"hi"'), "k").value.string_value == "hi"
    assert convert.extract_result(result("null"), "k").WhichOneof("parsed") == "value"
    cut = convert.extract_result(result('{"a": ', FinishReason.LENGTH, Outcome.TRUNCATED), "k")
    assert cut.truncated and cut.WhichOneof("parsed") is None and cut.finish_reason == pb.FINISH_REASON_LENGTH


def test_tool_result() -> None:
    res = ToolCallResult(result('[{"name":"f","arguments":{"x":1}}]'), [ToolCall("f", {"x": 1})], None)
    out = convert.tool_result(res)
    assert out.tool_calls[0].name == "f" and out.tool_calls[0].arguments["x"] == 1 and not out.HasField("text")
    text = convert.tool_result(ToolCallResult(result("hello", outcome=Outcome.TEXT), [], "hello"))
    assert text.text == "hello" and text.outcome == pb.OUTCOME_TEXT


def test_registry_helpers() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == '{"a":[1,{"c":3,"d":2}],"b":1}'
    assert content_hash(canonical_json({"a": 1})) == content_hash(canonical_json({"a": 1}))
    v = metaschema_violations({"type": "object", "properties": {"a/b": {"type": "strng"}}}, "schema_json")
    assert v and v[0].json_pointer == "/properties/a~1b" and v[0].keyword == "type"
    assert metaschema_violations({"type": "object"}, "f") == []


def test_worked_examples_are_checked_and_compacted() -> None:
    from types import SimpleNamespace

    from structspec.front.registry import ResolvedSchema

    schema = ResolvedSchema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, "k")
    limits = Limits(max_tokens_cap=100)
    caller = SimpleNamespace(request_id="r1", deadline=None, history_scope="", tenant="")

    def extract(*examples: tuple[str, str]):
        req = pb.ExtractRequest(text="doc", examples=[pb.Example(text=t, output_json=o) for t, o in examples])
        return extraction_request(convert.extraction_input(req), schema, caller, limits)

    got = extract(("one apple", '{ "n" : 1 }'), ("two", '{"n": 2}'))
    assert [(e.text, e.output) for e in got.examples] == [("one apple", '{"n":1}'), ("two", '{"n":2}')]
    assert extract().examples == ()
    cases = [((("x", "{n: 1}"),), "examples[0].output_json", "not JSON"),
             ((("x", '{"n": 1}'), ("y", '{"n": "two"}')), "examples[1].output_json", "does not match the schema"),
             ((("  ", '{"n": 1}'),), "examples[0].text", "input text"),
             (tuple(("x", '{"n": 1}') for _ in range(MAX_EXAMPLES + 1)), "examples", "at most")]
    for examples, field, reason in cases:
        with pytest.raises(FrontError) as err:
            extract(*examples)
        assert err.value.code is Code.INVALID_ARGUMENT
        assert err.value.violations[0].field == field and reason in err.value.violations[0].description

    # a schema jsonschema cannot use (found by review: these were INTERNAL) -> INVALID_ARGUMENT on the schema field
    broken = [({"properties": {"id": {"type": "string", "pattern": "("}}}, '{"id": "x"}'),
              ({"type": "foo"}, '{"id": "x"}'),
              ({"$ref": "#/$defs/missing"}, '{"id": "x"}')]
    for bad, output in broken:
        for resolved, field in ((ResolvedSchema(bad, "k"), "json_schema"),
                                (ResolvedSchema(bad, "k", record=object()), "schema_id")):
            req = pb.ExtractRequest(text="doc", examples=[pb.Example(text="x", output_json=output)])
            with pytest.raises(FrontError) as err:
                extraction_request(convert.extraction_input(req), resolved, caller, limits)
            assert err.value.code is Code.INVALID_ARGUMENT, bad
            assert err.value.violations[0].field == field and "worked examples" in err.value.message

    tool = pb.Tool(name="get_weather", parameters_json='{"type": "object", "properties": {"city": {"type": "string"}}}')

    def call(output: str):
        req = pb.CallToolRequest(messages=[pb.ChatMessage(role=pb.ROLE_USER, content="hi")], tools=[tool],
                                 examples=[pb.Example(text="weather in Oslo?", output_json=output)])
        return tool_request(convert.tool_call_input(req), caller, limits)

    assert call('{"name": "get_weather", "arguments": {"city": "Oslo"}}').examples[0].output == \
        '{"name":"get_weather","arguments":{"city":"Oslo"}}'
    for output, reason in (('{"name": "book_flight", "arguments": {}}', "not one of the request's tools"),
                           ('{"name": "get_weather"}', "a call must be")):
        with pytest.raises(FrontError, match=reason):
            call(output)


def test_speculation_report_model_and_schema_override() -> None:
    from dataclasses import replace

    from structspec.engine.types import SchemaSpeculation, SpeculationReport
    from structspec.store.base import SchemaRecord

    plain = convert.extract_result(result('{"a":1}'), "k@1", "demo")
    assert plain.model == "demo" and not plain.HasField("speculation")  # an engine without a policy reports none
    report = SpeculationReport(False, "low_acceptance", False, {"ngram": 4}, {"ngram": "drafted", "draft_model": "low_acceptance"})
    out = convert.extract_result(replace(result('{"a":1}'), speculation=report), "k@1", "demo").speculation
    assert (out.drafted, out.reason, out.probe) == (False, "low_acceptance", False)
    assert dict(out.max_draft) == {"ngram": 4} and dict(out.proposer_reasons) == report.reasons
    tool = convert.tool_result(ToolCallResult(replace(result("[]"), speculation=report), [], None), "demo")
    assert tool.model == "demo" and tool.speculation.reason == "low_acceptance"

    assert convert.schema_speculation(pb.SCHEMA_SPECULATION_ON) is SchemaSpeculation.ON
    for bad in (pb.SCHEMA_SPECULATION_UNSPECIFIED, 99):
        with pytest.raises(FrontError) as err:
            convert.schema_speculation(bad)
        assert err.value.code is Code.INVALID_ARGUMENT and [v.field for v in err.value.violations] == ["speculation"]
    rec = SchemaRecord("inv", 1, "{}", "h", "", 1.0, "api", "off")
    assert convert.schema_version(rec).speculation == pb.SCHEMA_SPECULATION_OFF
    assert convert.schema_version(replace(rec, speculation="auto")).speculation == pb.SCHEMA_SPECULATION_AUTO


@pytest.mark.parametrize("mode", ["auto", "none", "required"])
def test_a_tool_named_like_a_mode_chosen_by_name_is_refused(mode: str) -> None:
    # The engine's tool_choice is one string, a mode or a tool's name: ToolChoice.tool_name "auto" must not run
    # as the mode auto (the HTTP paths refuse it alike, front.requests.tool_by_name).
    with pytest.raises(FrontError) as err:
        convert.tool_choice(pb.ToolChoice(tool_name=mode))
    assert err.value.code is Code.INVALID_ARGUMENT
    assert err.value.violations[0].field == "tool_choice.tool_name"
    assert convert.tool_choice(pb.ToolChoice(tool_name=f"{mode}_x")) == f"{mode}_x"
