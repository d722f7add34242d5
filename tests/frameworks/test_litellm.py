"""LiteLLM, unchanged, against a real server on the demo models as an OpenAI-compatible base (``openai/<model>``
with ``api_base``): a plain completion (free text), a streamed one, and ``response_format`` json_schema, validated.
"""

from __future__ import annotations

import json

import jsonschema
import litellm
import pytest

from tests.frameworks.conftest import Served
from tests.frameworks.tools import CARD, Contact


@pytest.fixture(scope="module")
def served(demo_server: Served) -> Served:
    return demo_server


def complete(served: Served, **kwargs):
    return litellm.completion(model=f"openai/{served.model}", api_base=served.base_url, api_key="unused",
                              num_retries=0, **kwargs)


def test_completion_is_free_text(served: Served) -> None:
    out = complete(served, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16)
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content.strip()


def test_completion_streamed(served: Served) -> None:
    chunks = list(complete(served, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and len(chunks) > 2


def test_completion_json_schema_validates(served: Served) -> None:
    schema = Contact.model_json_schema()
    out = complete(served, messages=[{"role": "system", "content": "Extract the contact."},
                                     {"role": "user", "content": CARD}], max_tokens=200,
                   response_format={"type": "json_schema",
                                    "json_schema": {"name": "contact", "schema": schema, "strict": True}})
    value = json.loads(out.choices[0].message.content)
    jsonschema.validate(value, schema)
    Contact.model_validate(value)
