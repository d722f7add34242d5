"""Prompt-prefix reuse: requests that share a prompt prefix copy its KV cache instead of recomputing it.

Structured-output prompts share long prefixes: the instruction, the schema and the
few-shot examples are the same for every request of a schema; only the document
differs. A new sequence looks for the longest common token prefix among

  - the prompts of running sequences (their prompt tokens stay cached while they
    decode: decoding only writes past the prompt), and
  - retained sequences: when a request finishes, its executor sequence is cut back
    to what it committed and cached (its prompt and its output but the last sampled
    token, never fed) and kept here, least recently used first out, within a token cap.
    A conversation's next turn repeats the last turn's prompt and answer before its new
    message, so it reuses both (multi-turn reuse; ``tests/engine/test_multi_turn.py``).
    A retained sequence that a newer one of its tenant extends is dropped: the newer one
    serves every match it would.

Retained sequences hold KV memory, so the scheduler evicts them before it ever
makes a request wait for memory: they are a cache, never a reservation.

Tenants. A cached prompt belongs to a *tenant* (``PromptOwner.tenant``: a digest of the caller's
bearer token; "" when the server has no tokens, one tenant). Reuse is visible to the caller (the
cached-token count in its usage, and its latency), so a match that ran on into another tenant's
document would let a caller test guesses of it token by token. A request therefore reuses another
tenant's prompt only as far as that prompt's *public* part (``PromptOwner.public``: its leading
tokens that are no caller's data, a registered schema's template and the server's worked examples),
and its own tenant's prompts in full. A retained output is the caller's data: never public.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    # Compare in blocks first: prompts share hundreds of tokens, so a per-token loop would dominate.
    i, block = 0, 64
    while i + block <= n and list(a[i:i + block]) == list(b[i:i + block]):
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class PromptOwner:
    """Whose cached prompt it is, and how much of it any tenant may reuse."""

    tenant: str = ""  # "" : the one tenant of a server without tokens
    public: int = 0  # leading prompt tokens that are no caller's data

    def reusable(self, tenant: str, matched: int) -> int:
        """Of ``matched`` leading tokens shared with a request of ``tenant``, how many it may reuse."""
        return matched if tenant == self.tenant else min(matched, self.public)


@dataclass(frozen=True)
class PrefixHit:
    source_id: int  # executor sequence holding the prefix
    tokens: int  # how many leading prompt tokens it can give
    ready: int  # how many of those are already in its cache (a running source may still be prefilling)


class PrefixCache:
    """Retained caches (executor sequence id -> its cached tokens and owner), LRU within ``max_tokens``."""

    def __init__(self, max_tokens: int, max_entries: int = 16, min_tokens: int = 16):
        self.max_tokens = max_tokens
        self.max_entries = max_entries
        self.min_tokens = min_tokens  # shorter matches are not worth a copy
        self._entries: OrderedDict[int, tuple[tuple[int, ...], PromptOwner]] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self) -> int:
        """Tokens of the longest retained sequence (0 when none)."""
        return max((len(tokens) for tokens, _ in self._entries.values()), default=0)

    def lookup(self, prompt: Sequence[int], running: Iterable[tuple[int, Sequence[int], int, PromptOwner]],
               tenant: str = "") -> PrefixHit | None:
        """Best source for ``prompt`` of ``tenant``: running ``(seq_id, prompt, cached, owner)`` or retained entries,
        each matched only as far as its owner lets ``tenant`` reuse it (``PromptOwner.reusable``).

        Only ``len(prompt) - 1`` tokens can be reused: the last prompt position must be
        computed to score the first output token.
        """
        limit = len(prompt) - 1
        best: PrefixHit | None = None
        for sid, (tokens, owner) in self._entries.items():
            n = min(limit, owner.reusable(tenant, common_prefix(prompt, tokens)))
            if best is None or n > best.tokens:
                best = PrefixHit(sid, n, n)
        for sid, ids, cached, owner in running:
            n = min(limit, owner.reusable(tenant, common_prefix(prompt, ids)))
            if best is None or n > best.tokens:
                best = PrefixHit(sid, n, min(n, cached))
        if best is None or best.tokens < self.min_tokens:
            return None
        if best.source_id in self._entries:
            self._entries.move_to_end(best.source_id)
        return best

    def retain(self, seq_id: int, tokens: Sequence[int], owner: PromptOwner = PromptOwner()) -> list[int]:
        """Keep ``seq_id`` (already cut back to its cached ``tokens``) for ``owner``; returns the sequences evicted
        to make room (``seq_id`` itself when it is too short to be worth a slot or longer than the cap)."""
        if len(tokens) < self.min_tokens or len(tokens) > self.max_tokens:
            return [seq_id]
        # An entry of the same tenant that the new one starts with (the same prompt again, a conversation's last
        # turn) is redundant: dropped, unless it shares more with other tenants. Only a tenant's own: another
        # tenant's copy replacing it would tell the first that its tokens were sent again.
        kept = tuple(tokens)
        evicted = [sid for sid, (toks, o) in self._entries.items()
                   if o.tenant == owner.tenant and o.public <= owner.public and kept[:len(toks)] == toks]
        for sid in evicted:
            self.tokens -= len(self._entries.pop(sid)[0])
        self._entries[seq_id] = (kept, owner)
        self.tokens += len(kept)
        while self.tokens > self.max_tokens or len(self._entries) > self.max_entries:
            evicted.append(self.evict())
        return evicted

    def evict(self) -> int:
        """Drop the least recently used entry; returns its sequence id (the caller frees it)."""
        sid, (toks, _) = self._entries.popitem(last=False)
        self.tokens -= len(toks)
        return sid
