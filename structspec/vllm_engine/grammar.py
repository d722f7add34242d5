"""A grammar structspec compiled, as vLLM's structured outputs: the Lark text its ``guidance`` backend compiles.

structspec's llguidance backend keeps the serialized llguidance grammar each compiled grammar was built from
(``LLGuidanceGrammar.source``: ``{"grammars": [{"json_schema": ...}]}``, ``{"grammars": [{"lark_grammar":
...}]}``, or the Lark text itself for the call formats' grammars). vLLM's ``StructuredOutputsParams(grammar=...)`` takes Lark (its guidance backend calls
``llguidance.grammar_from("grammar", text)``), so a JSON schema is sent as ``start: %json <schema>``, with the
``x-guidance`` options (whitespace, lenience) the schema carries, and a Lark grammar (tool-call formats, text or
a call) as it is: llguidance on either side compiles the same grammar, so a schema structspec accepts is accepted
by vLLM and every token vLLM samples is one structspec's own matcher allows.
"""

from __future__ import annotations

import json
from typing import Any


class GrammarNotPortable(ValueError):
    """A compiled grammar vLLM cannot be sent (not from the llguidance backend, or of a shape not known here)."""


def vllm_lark(grammar: Any) -> str:
    """The Lark text for ``StructuredOutputsParams(grammar=...)`` equal to ``grammar`` (an ``LLGuidanceGrammar``).
    Raises: GrammarNotPortable."""
    source = getattr(grammar, "source", "")
    if not source:
        raise GrammarNotPortable("the vLLM engine needs grammars of the llguidance backend (--grammar-backend "
                                 "llguidance)")
    try:
        top = json.loads(source)
    except json.JSONDecodeError:
        return str(source)  # the backend's own Lark (``compile_lark``: the call formats' grammars)
    if not isinstance(top, dict):
        raise GrammarNotPortable("a grammar that is neither llguidance's JSON nor Lark is not sent to vLLM")
    parts = top.get("grammars") or []
    if len(parts) != 1 or top.get("max_tokens") is not None:
        raise GrammarNotPortable(f"a grammar of {len(parts)} parts (or a token limit) is not sent to vLLM")
    part = parts[0]
    if part.get("lark_grammar"):
        return str(part["lark_grammar"])
    if part.get("json_schema") is not None:
        return "start: %json " + json.dumps(part["json_schema"], ensure_ascii=False, separators=(",", ":"))
    raise GrammarNotPortable(f"a grammar part with {sorted(k for k, v in part.items() if v)} is not sent to vLLM")
