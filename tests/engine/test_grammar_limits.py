"""A grammar engine's resource limit is the schema's: refused at compile time where the first step
shows it, else the request ends with ERROR naming the limit (RESOURCE_EXHAUSTED at the API), never
blamed on the model."""

from __future__ import annotations

import asyncio

import pytest

from structspec.engine.api import ExtractionRequest
from structspec.engine.types import FinishReason, SamplingParams
from structspec.front.errors import Code, FrontError
from structspec.front.failures import check_result
from structspec.grammar import GrammarCompiler, SchemaError
from structspec.grammar.llguidance_backend import LLGuidanceBackend
from structspec.schemas import load_builtin_schemas

INVOICE = load_builtin_schemas()["invoice"]


def tight(view, **limits) -> GrammarCompiler:
    return GrammarCompiler(view, backend=LLGuidanceBackend(view, limits=limits))


def test_limit_at_the_first_step_is_refused_at_compile_time(demo_compiler):
    with pytest.raises(SchemaError) as err:
        tight(demo_compiler.view, step_max_items=2).compile_schema(INVOICE)
    assert err.value.kind == "grammar_limit" and "step_max_items" in str(err.value)
    assert "<non-verbose/>" not in str(err.value)
    assert demo_compiler.compile_schema(INVOICE).info.extra["limits"]["step_max_items"] == 50_000


def test_limit_mid_decode_ends_the_request_naming_the_limit(make_engine, demo_compiler, demo_models):
    from structspec.assembly import AssemblyConfig, assemble_engine

    compiler = tight(demo_compiler.view, step_lexer_fuel=1000)  # compiles, then runs out a few tokens in
    engine = assemble_engine(demo_models, AssemblyConfig(compiler=compiler))
    try:
        engine.start()
        request = ExtractionRequest(schema=INVOICE, text="INVOICE INV-7 from Acme, total 12.50 EUR",
                                    sampling=SamplingParams(max_tokens=64))
        result = asyncio.run(engine.extract(request))
    finally:
        engine.stop()
    assert result.finish_reason is FinishReason.ERROR and result.grammar_limit == "step_lexer_fuel"
    assert "model" not in result.error and "step_lexer_fuel" in result.error
    with pytest.raises(FrontError) as err:
        check_result(result, deadline=None, schema_field="schema_id")
    assert err.value.code is Code.RESOURCE_EXHAUSTED and err.value.reason == "GRAMMAR_LIMIT"
    assert err.value.violations[0].field == "schema_id" and err.value.violations[0].keyword == "step_lexer_fuel"
