"""Statistics stored under keys that named a model by its served name alone, and where they move.

A *legacy key* is ``<name>``, ``<name>+chat-v<N>:<digest>`` and either with ``+draft:<version>``: the model
keys before ``model_key`` carried the weights' identity and the plain format's version. The first engine that
starts under ``<name>`` with its identity *claims* them (``claims``): its store moves every row of a legacy key
to the key it names now, so nothing stored is lost and nothing is mixed:

- statistics (counters, samples, policy changes) of ``<name>[+draft:v]`` were measured under the plain format's
  ``plain-v3`` wording: they move to ``<name>@<identity>+plain-v3[+draft:v]`` (kept and shown, not the current
  wording's, so the policy does not read them); those of a chat template keep its format part;
- history outputs (what the history proposer drafts from) move to the claimer's history model: an extraction's
  output is the schema's JSON whatever the prompt format; a tool list's is written in the call format of its
  time, which only a chat-template key says, so a bare name's go to ``<name>@<identity>+format-unknown``.

A legacy key is claimed once (its rows are gone after), by the first identity that starts under its name; two
models served under one name from then on keep apart. Dummy weights claim nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from structspec.stats.counters import model_key

LEGACY_PLAIN = "plain-v3"  # the plain format's wording when its keys carried no format
UNKNOWN_FORMAT = "format-unknown"  # where outputs of an unknown call format are kept (no format drafts from them)
_LEGACY_TAIL = re.compile(r"(?:\+(?P<format>chat-v\d+:[0-9a-f]{8}))?(?:\+draft:(?P<draft>[0-9a-f-]+))?")


@dataclass(frozen=True)
class Claim:
    """Move ``old``'s rows: statistics to ``statistics``, history outputs to ``history`` (a tool list's to
    ``tool_history``)."""

    old: str
    statistics: str
    history: str
    tool_history: str


def is_tool_key(history_key: str) -> bool:
    """Whether a history key (``speculation.history.history_key``: a scope, ``|``, the schema key) is a tool
    list's (``grammar.tools.ToolSet.statistics_key``)."""
    return history_key.rpartition("|")[2].startswith("tools:")


def claims(stored: Iterable[str], name: str, identity: str, prompt_format: str) -> list[Claim]:
    """What the engine serving ``name`` with weights ``identity`` under ``prompt_format`` claims among the
    ``stored`` model keys: one ``Claim`` per legacy key of ``name`` (none without an identity)."""
    if not identity:
        return []
    history = model_key(name, "", prompt_format, identity)
    out = []
    for old in sorted(set(stored)):
        if old != name and not old.startswith(name + "+"):
            continue
        tail = _LEGACY_TAIL.fullmatch(old[len(name):])
        if tail is None:  # another name that starts with this one's, or a key that carries an identity
            continue
        fmt, draft = tail["format"] or "", tail["draft"] or ""
        out.append(Claim(old, model_key(name, draft, fmt or LEGACY_PLAIN, identity), history,
                         model_key(name, "", fmt, identity) if fmt else model_key(name, "", UNKNOWN_FORMAT, identity)))
    return out
