"""instructor, unchanged, over the openai SDK against a real server on the demo models: a Pydantic
``response_model`` in Mode.TOOLS (a forced tool call), Mode.JSON_SCHEMA (``response_format`` json_schema, sent
without ``strict`` or ``additionalProperties: false``) and Mode.MD_JSON (free text: the schema in the prompt, the
JSON read from the model's fenced block), each validated.
"""

from __future__ import annotations

import instructor
import pytest
from openai import OpenAI

from tests.frameworks.conftest import Served
from tests.frameworks.tools import CARD, Contact


@pytest.fixture(scope="module")
def served(demo_server: Served) -> Served:
    return demo_server


# MD_JSON is free text: the schema in the prompt, the JSON read from a fenced block the model writes unconstrained.
# Neither model here writes one (the demo pair knows no such prompt; SmolLM2-135M echoes the schema back), so it
# is expected to fail until the suite has a stronger instruct model; strict: a pass would be reported.
MD_JSON_NEEDS_A_STRONGER_MODEL = pytest.mark.xfail(strict=True, reason="free text: the demo model writes no JSON "
                                                   "block, and SmolLM2-135M copies the schema instead of filling it")


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA,
                                  pytest.param(instructor.Mode.MD_JSON, marks=MD_JSON_NEEDS_A_STRONGER_MODEL)])
def test_response_model_validates(served: Served, mode: instructor.Mode) -> None:
    client = instructor.from_openai(OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=120),
                                    mode=mode)
    turns = served.turns()
    out = client.chat.completions.create(model=served.model, response_model=Contact, max_tokens=200, max_retries=1,
                                         temperature=0.0,
                                         messages=[{"role": "system", "content": "Extract the contact."},
                                                   {"role": "user", "content": CARD}])
    assert isinstance(out, Contact) and out.email
    assert 1 <= turns.count <= 2  # a retry is instructor's (max_retries=1): a constrained mode needs none
    if mode is not instructor.Mode.MD_JSON:
        assert turns.count == 1
