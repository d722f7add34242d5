"""Schema history: propose what earlier outputs of the same schema wrote after the same text.

Outputs of one schema repeat their structure (key order, enum values, booleans,
null, formats) and often their values. We keep the last ``per_schema`` outputs
of each schema (and at most ``max_schemas`` schemas, least recently used
dropped), find the longest tail of the current output that occurs in them, and
extend it character by character with the continuation a majority of the
matches agree on: the continuation seen most often.

Cost: the router asks at almost every step, so the lookup searches one text per schema (its outputs joined by a
separator no output holds in practice, rebuilt when one is added), and finds the longest tail by bisection:
a tail that occurs means every shorter tail occurs too. About log2(``max_chars``) searches a step, not one
per tail length and output.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from structspec.engine.sequence import EngineSequence
from structspec.speculation.base import Draft, DraftContext
from structspec.speculation.text_tokens import TextTokens


def history_key(seq: EngineSequence) -> str:
    """The schema history ``seq`` reads and adds to. Outputs are shared as drafts only within a scope (e.g. one
    auth token): another caller's acceptance, and so latency, must not reveal whether my outputs matched theirs."""
    return f"{seq.history_scope}|{seq.schema_key}" if seq.history_scope else seq.schema_key


SEPARATOR = "\x00"  # between a schema's outputs in the text its lookups search (JSON output never holds one raw)


@dataclass(frozen=True)
class HistoryConfig:
    per_schema: int = 64
    max_schemas: int = 512
    min_chars: int = 4
    max_chars: int = 32
    continuation_chars: int = 48
    max_matches: int = 64


class SchemaHistory:
    """Bounded memory of recent outputs per schema (LRU across schemas).

    ``journal`` is told every output added (the store persists them, so a restarted server does not
    start cold); ``load`` puts persisted outputs back, oldest first, without telling the journal.
    """

    def __init__(self, config: HistoryConfig = HistoryConfig(), journal: Callable[[str, str], None] | None = None):
        self.config = config
        self.journal = journal
        self._by_schema: OrderedDict[str, deque[str]] = OrderedDict()
        self._joined: dict[str, str] = {}  # schema -> its outputs joined by SEPARATOR (built at its next lookup)

    def load(self, entries: Iterable[tuple[str, str]]) -> None:
        for schema_key, text in entries:
            self._add(schema_key, text)

    def add(self, schema_key: str, text: str) -> None:
        self._add(schema_key, text)
        if self.journal is not None:
            self.journal(schema_key, text)

    def _add(self, schema_key: str, text: str) -> None:
        outputs = self._by_schema.pop(schema_key, None) or deque(maxlen=self.config.per_schema)
        outputs.append(text)
        self._by_schema[schema_key] = outputs
        self._joined.pop(schema_key, None)
        while len(self._by_schema) > self.config.max_schemas:
            dropped, _ = self._by_schema.popitem(last=False)
            self._joined.pop(dropped, None)

    def outputs(self, schema_key: str) -> list[str]:
        if schema_key not in self._by_schema:
            return []
        self._by_schema.move_to_end(schema_key)
        return list(self._by_schema[schema_key])

    def continuation(self, schema_key: str, output: str) -> str | None:
        """What the schema's outputs that hold the longest tail of ``output`` (``min_chars`` .. ``max_chars``
        characters) wrote after it, as far as a majority of them agree (``majority_prefix``); None where no tail
        of ``min_chars`` occurs, or where they agree on nothing."""
        if schema_key not in self._by_schema:
            return None
        self._by_schema.move_to_end(schema_key)
        cfg = self.config
        joined = self._joined.get(schema_key)
        if joined is None:
            joined = self._joined[schema_key] = SEPARATOR.join(self._by_schema[schema_key])
        if len(output) < cfg.min_chars:
            return None
        if SEPARATOR in output[-cfg.max_chars:]:  # a tail could match across two outputs: look in each alone
            return self._continuation_each(list(self._by_schema[schema_key]), output)
        def occurs(n: int) -> bool:
            return joined.find(output[len(output) - n:]) >= 0

        lo, hi = cfg.min_chars, min(cfg.max_chars, len(output))
        if not occurs(lo):
            return None
        while lo < hi:  # the longest tail that occurs: occurs(lo) holds, occurs(hi + 1) does not
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if occurs(mid) else (lo, mid - 1)
        tail, conts = output[len(output) - lo:], list[str]()
        at = joined.find(tail)
        while at >= 0 and len(conts) < cfg.max_matches:
            start = at + lo
            end = joined.find(SEPARATOR, start, start + cfg.continuation_chars)
            conts.append(joined[start: end if end >= 0 else start + cfg.continuation_chars])
            at = joined.find(tail, at + 1)
        return majority_prefix(conts) or None

    def _continuation_each(self, texts: list[str], output: str) -> str | None:
        """``continuation`` searching each output apart, every tail length from the longest."""
        cfg = self.config
        for n in range(min(cfg.max_chars, len(output)), cfg.min_chars - 1, -1):
            tail = output[len(output) - n:]
            conts: list[str] = []
            for text in texts:
                at = text.find(tail)
                while at >= 0 and len(conts) < cfg.max_matches:
                    conts.append(text[at + n: at + n + cfg.continuation_chars])
                    at = text.find(tail, at + 1)
            if conts:
                return majority_prefix(conts) or None
        return None


def majority_prefix(conts: list[str]) -> str:
    """Extend while more than half of the continuations agree on the next character."""
    out = []
    alive = conts
    for i in range(max(len(c) for c in conts)):
        counts = Counter(c[i] for c in alive if len(c) > i)
        if not counts:
            break
        ch, n = counts.most_common(1)[0]
        if 2 * n <= len(alive):
            break
        out.append(ch)
        alive = [c for c in alive if len(c) > i and c[i] == ch]
    return "".join(out)


class HistoryProposer:
    name = "history"

    def __init__(self, tokenizer: Any, history: SchemaHistory):
        self.tokenizer = tokenizer
        self.tokens = TextTokens(tokenizer)
        self.history = history

    def propose(self, ctx: DraftContext, k: int) -> Draft | None:
        cont = self.history.continuation(ctx.history_key, ctx.output_text)
        if not cont:
            return None
        tokens = self.tokens(cont, k)
        return Draft(tokens, None, self.name) if tokens else None
