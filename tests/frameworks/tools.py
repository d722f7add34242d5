"""The two tools every agent test gives its framework, the prompt that needs them, and the structured outputs.

*Two-tool agent*: a model given ``get_weather`` and ``get_time`` and a question that needs at least one of them;
the loop ends when the model answers in text (a request whose finish reason is ``stop``).
"""

from __future__ import annotations

from pydantic import BaseModel

QUESTION = "What is the weather in Paris right now? Use the tools, then answer in one short sentence."
CARD = "Name: Hiro Gupta\nCompany: Northwind Studios\nLocation: Boston, United States\nContact: hiro.gupta@northwind.de"
MAX_TOKENS = 48  # small: an answer or a call fits, and a runaway text stops quickly


def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is sunny and 21 C in {city}."


def get_time(city: str) -> str:
    """Get the local time in a city."""
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
