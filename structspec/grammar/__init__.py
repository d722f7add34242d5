"""The grammar layer: JSON schemas and tool lists -> token masks, forced tokens, rollback.

    view = TokenizerView(hf_tokenizer, n_vocab=model_vocab_size)
    compiler = GrammarCompiler(view, backend="llguidance")        # or "outlines"
    grammar = compiler.compile_schema(schema)                        # SchemaError if refused
    matcher = grammar.matcher()                                      # one per sequence
"""

from structspec.grammar.base import (
    CompiledGrammar,
    CompileInfo,
    GrammarBackend,
    GrammarOptions,
    Matcher,
    SchemaError,
    SchemaIssue,
    allocate_bitmask,
    apply_token_bitmask,
    bitmask_to_bool,
)
from structspec.grammar.compiler import BACKENDS, GrammarCompiler, make_backend
from structspec.grammar.postcheck import is_post_check_error
from structspec.grammar.tokenizer_view import TokenizerView
from structspec.grammar.tools import (
    ToolCall,
    ToolOutput,
    parse_tool_output,
    tool_call_errors,
)

__all__ = [
    "BACKENDS",
    "CompileInfo",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarCompiler",
    "GrammarOptions",
    "Matcher",
    "SchemaError",
    "SchemaIssue",
    "TokenizerView",
    "ToolCall",
    "ToolOutput",
    "allocate_bitmask",
    "apply_token_bitmask",
    "bitmask_to_bool",
    "is_post_check_error",
    "make_backend",
    "parse_tool_output",
    "tool_call_errors",
]
