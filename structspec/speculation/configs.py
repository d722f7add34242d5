"""The named speculation configurations: the one registry the settings, the engine and the benchmark read.

Import-light (no torch): the settings validate ``speculation`` against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProposerSet:
    """Which proposers are on."""

    ngram: bool = True
    history: bool = True
    draft: bool = True


@dataclass(frozen=True)
class SpeculationConfig:
    name: str
    fast_forward: bool  # tokens the grammar forces skip the model (never changes the output)
    proposers: ProposerSet | None  # None: no drafting
    adaptive: bool = False  # the drafting policy decides per schema and batch size (else: always draft)


SPECULATION_CONFIGS: dict[str, SpeculationConfig] = {c.name: c for c in (
    SpeculationConfig("off", False, None),  # one model decision per token
    SpeculationConfig("ff", True, None),
    SpeculationConfig("ff+ngram", True, ProposerSet(ngram=True, history=False, draft=False)),
    SpeculationConfig("ff+ngram+history", True, ProposerSet(ngram=True, history=True, draft=False)),
    SpeculationConfig("all", True, ProposerSet(ngram=True, history=True, draft=True)),
    SpeculationConfig("policy", True, ProposerSet(ngram=True, history=True, draft=True), adaptive=True),
)}


def speculation_config(name: str) -> SpeculationConfig:
    """Raises: ValueError naming the known configurations."""
    try:
        return SPECULATION_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown speculation configuration {name!r}; one of {', '.join(SPECULATION_CONFIGS)}") from None
