"""The two tools every agent test gives its framework, the prompt that needs them, and the structured outputs.

*Two-tool agent*: a model given ``get_weather`` and ``get_time`` and a question that needs at least one of them;
the loop ends when the model answers in text. Each test forces a call on the first request (``tool_choice``
"required", through the framework's own per-step setting) and leaves ``auto`` after it, so the loop always runs a
tool and the model then chooses between another call and an answer: SmolLM2-135M under ``auto`` alone answers at
once without a tool, which would leave the loop unexercised. *Tool runs* are counted in ``RUNS``.
"""

from __future__ import annotations

from pydantic import BaseModel

QUESTION = "What is the weather in Paris right now? Use the tools, then answer in one short sentence."
CARD = "Name: Hiro Gupta\nCompany: Northwind Studios\nLocation: Boston, United States\nContact: hiro.gupta@northwind.de"
MAX_TOKENS = 48  # small: an answer or a call fits, and a runaway text stops quickly


RUNS: list[str] = []  # the name of every tool a framework ran, in order


def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    RUNS.append("get_weather")
    return f"It is sunny and 21 C in {city}."


def get_time(city: str) -> str:
    """Get the local time in a city."""
    RUNS.append("get_time")
    return f"It is 14:05 in {city}."


TOOL_RESULTS = {"get_weather": get_weather, "get_time": get_time}


class Weather(BaseModel):
    """A weather report for one city."""

    city: str
    summary: str


class Contact(BaseModel):
    """A contact card's fields."""

    name: str
    email: str
    company: str
    city: str
