"""The copy guard: an output never writes a value of a worked example further than the input holds it.

Terms:
- a *shown value*: a string (3+ characters) or number leaf of a worked example's output, or a number its text
  writes, that the server put in the prompt (its own examples, not a caller's);
- *normalized* text: lower-cased, ASCII punctuation and whitespace dropped (``INV_2027-1149`` and
  ``inv-2027 1149`` are both ``inv20271149``); strings are compared normalized;
- a *guarded value*: a shown value the request's input does not hold and the schema neither enumerates nor
  formats (``date``, ``time``, ...: a value the output writes in a form of its own, not as the input does):
  written into an output it can only have come from the example. A shown date (``date``, ``date-time``) whose
  day or year the input does not write is a *guarded date*: the output may not write it whole;
- the *held part* of a value being written: the most of it that the input holds (a number: that one of the
  input's numbers begins with, read as JSON would write it: ``2,845.45`` as ``2845.45``, ``41.00`` as ``41``,
  ``41.0`` or ``41.00``).

A base model shown worked examples writes their values where it cannot find the document's (Gemma 3 270M: a
quarter of the values it writes on held-out invoices, docs/benchmarks.md). ``CopyGuard`` wraps a sequence's
matcher and takes out of the mask every token that would take the value being written along a guarded value
past its held part: ``"INV-2027-`` may go on as the input's ``INV-2027-0456`` goes on, not as the example's
``INV-2027-1149``. The model writes the input's value, or another. A number may not end where it is a guarded
one whole (``11`` where the input writes ``117.65``: the input's goes on). What does not work, measured:
- refusing only the close (the value whole): Gemma 3 270M then writes the example's value with a character more
  (``"INV-2027-1149,"``), and a refused number's end, with no run rule (below), runs on as digits to
  ``max_tokens``;
- comparing raw text: refused ``INV-2027-1``, it writes ``INV_2027-1149``. Normalized, a token is refused by the
  letters and digits it adds, whatever punctuation comes with them.

Turned off an example's value, Gemma 3 270M at times writes one character on and on (``"INV-0000000…``, to
``max_tokens``: 6-10 of 90 held-out invoices), or a short unit (``-y-x-y-x…``). So under the guard a value that
ends with a run of ``MAX_RUN`` or more bytes repeating a unit of up to ``MAX_PERIOD`` that the input does not hold
may only end (a string close, a number stop): no value the input holds has one, and the output goes on.

It yields where it would leave nothing allowed (the grammar forces the value: an enumerated or patterned one),
so it never stops a grammar from completing. It is part of the mask every executor and the verifier apply, so
speculation stays exact under it.

Cost: a fill inside a value compares it with each guarded value (a prefix test); a value it is a prefix of costs
a few substring tests on the input and bisections in the tokens' sorted bytes (``GuardTokens``, built once per
tokenizer: two sorts of the vocabulary, 0.33 s for Gemma's 262k tokens). A consumed token's bytes advance a
small JSON cursor; a rollback pops its states.
"""

from __future__ import annotations

import json
import math
import re
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from structspec.grammar.base import Matcher, bitmask_row
from structspec.grammar.tokenizer_view import TokenizerView, TokenPrefixIndex

MIN_STRING_CHARS = 3  # shorter strings ("EU", "1a") are too often a document's own to guard
MAX_RUN = 8  # a run this long of one letter or digit (or of a short unit) that the input does not hold ends its value
MAX_PERIOD = 3  # the longest unit a run repeats: "yxyxyxyx" runs on as "00000000" does
# a string of one of these formats is the output's rendering ("2027-04-16" of "16 April 2027"), not the input's text
RENDERED_FORMATS = frozenset({"date", "time", "date-time", "duration"})
_DROPPED = bytes(b for b in range(128) if not (48 <= b <= 57 or 97 <= b <= 122))  # after lower(): not [0-9a-z]
_NUMBER_START = frozenset(b"-0123456789")
_NUMBER_BYTES = frozenset(b"0123456789+-.eE")
_NUMBER_ENDS = (b",", b"}", b"]", b" ", b"\n", b"\r", b"\t")  # what may follow a number in JSON
_SOURCE_NUMBER = re.compile(r"\d(?:[\d.,]*\d)?")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_THOUSANDS = re.compile(r"\d{1,3}(?:([.,])\d{3})(?:\1\d{3})*(?:[.,]\d{1,2})?")  # 9,980.75; 1.234.567,8


def normalized(data: bytes) -> bytes:
    """Lower-cased, ASCII punctuation and whitespace dropped (UTF-8 past ASCII kept as it is)."""
    return data.lower().translate(None, _DROPPED)


@dataclass(frozen=True)
class GuardedValues:
    """The values an output may not write past what the input holds, and the input, all normalized. Empty: no
    guard."""

    strings: tuple[bytes, ...] = ()
    source: bytes = b""
    numbers: tuple[bytes, ...] = ()  # guarded numbers' JSON text, sign aside
    number_prefixes: frozenset[bytes] = frozenset()  # every beginning of the input's numbers as JSON texts
    dates: tuple[bytes, ...] = ()  # rendered dates (normalized: 20250918) whose day or year the input lacks

    def __bool__(self) -> bool:
        return bool(self.strings or self.numbers or self.dates)

    def holds(self, text: bytes) -> bool:
        """Whether the input holds ``text`` (normalized)."""
        return text in self.source


class GuardTokens:
    """A tokenizer's tokens as the guard reads them: each token's bytes, and the ids by their normalized bytes.
    ``for_view`` builds it once per tokenizer view."""

    _built: "weakref.WeakKeyDictionary[TokenizerView, GuardTokens]" = weakref.WeakKeyDictionary()

    def __init__(self, token_bytes: Sequence[bytes], n_vocab: int):
        self.token_bytes = token_bytes
        self.index = TokenPrefixIndex([normalized(b) for b in token_bytes], n_vocab)
        self.raw_index = TokenPrefixIndex(token_bytes, n_vocab)
        self.closing_words = self._row(i for i, b in enumerate(token_bytes) if b.startswith(b'"'))
        self.digit_words = self._row(i for i, b in enumerate(token_bytes) if b[:1].isdigit())

    def _row(self, ids: Iterable[int]) -> np.ndarray:
        """A mask row (uint32 words) allowing ``ids``."""
        at = np.asarray(list(ids), dtype=np.int64)
        row = np.zeros(self.index.words, dtype=np.uint32)
        np.bitwise_or.at(row, at >> 5, np.uint32(1) << (at & 31).astype(np.uint32))
        return row

    @classmethod
    def for_view(cls, view: TokenizerView) -> "GuardTokens":
        tokens = cls._built.get(view)
        if tokens is None:
            tokens = cls._built[view] = cls(view.token_bytes, view.n_vocab)
        return tokens

    def bytes_of(self, token: int) -> bytes:
        """A token's bytes; b"" for special tokens and ids past the tokenizer (padding rows)."""
        return self.token_bytes[token] if 0 <= token < len(self.token_bytes) else b""


def guarded_values(example_outputs: Iterable[str], source: str, schema: Mapping[str, Any] | None = None,
                   shown_elsewhere: Iterable[str] = (), example_texts: Iterable[str] = ()) -> GuardedValues:
    """The guarded values of worked examples (``example_outputs``: their JSON texts; ``example_texts``: their
    inputs, whose numbers are shown too) for a request whose input is ``source``, whose output follows ``schema``.
    ``shown_elsewhere``: outputs of examples that are not guarded (a caller's): a value one of them holds is the
    caller's to show, and is not guarded. Raises: Never (an output that is not JSON holds none)."""
    norm = normalized(source.encode())
    kept = {v for out in shown_elsewhere for v, _ in _leaves(out, None)}
    texts = {t for m in _SOURCE_NUMBER.findall(source) for t in _number_texts(m)}
    values = {float(t) for t in texts}
    strings: dict[bytes, None] = {}
    numbers: dict[bytes, None] = {}
    dates: dict[bytes, None] = {}
    for shown in example_texts:  # as the input writes them: "2,845.45" is 2845.45
        for m in _SOURCE_NUMBER.findall(shown):
            v = _written_number(m)
            if v is not None and v not in values and v not in kept:
                numbers[json.dumps(int(v) if v.is_integer() else v).encode()] = None
    for out in example_outputs:
        for v, at in _leaves(out, schema):
            if v in kept or isinstance(v, bool):
                continue
            if isinstance(v, str) and at is not None and at.get("format") in ("date", "date-time"):
                day = _DATE.match(v)  # a rendered date the input cannot hold as written: its day and year can
                if day and not {float(day[1]), float(day[3])} <= values:
                    dates[normalized(day[0].encode())] = None
                continue
            if _fixed(at):
                continue
            if isinstance(v, str) and len(v.strip()) >= MIN_STRING_CHARS:
                data = normalized(json.dumps(v, ensure_ascii=False)[1:-1].encode())
                if data and data not in norm:
                    strings[data] = None
            elif isinstance(v, (int, float)) and abs(v) not in values and math.isfinite(v):
                numbers[json.dumps(abs(v)).encode()] = None
    prefixes = frozenset(t[:n].encode() for t in texts for n in range(len(t) + 1))
    return GuardedValues(tuple(strings), norm, tuple(numbers), prefixes, tuple(dates))


def _written_number(text: str) -> float | None:
    """The number a text writes (``text``: digits, dots and commas), commas read as thousands (``2,845.45``);
    None where it is none (``19.09.2026``)."""
    try:
        v = float(text.replace(",", ""))
    except ValueError:
        return None
    return abs(v) if math.isfinite(v) else None


def _number_texts(text: str) -> set[str]:
    """The JSON texts a number the input writes (``text``: digits, dots and commas) may be written as: its
    separators read as thousands, or its last one as the decimal point, or each group alone where there are two
    separators or more and the groups are no thousands (a date's parts: ``19.09.2026``; ``9,980.75`` holds no 9,
    ``16.20`` no 16), each with no, one or two decimals (``41.00`` -> ``41``, ``41.0``, ``41.00``). Generous: a
    number the input may hold is never guarded."""
    parts = [p for p in re.split(r"[.,]", text) if p][:64]  # (more groups than that are no number a text means)
    readings = {float("".join(parts))}
    if len(parts) > 2 and not _THOUSANDS.fullmatch(text):
        readings |= {float(p) for p in parts}  # "19.09.2026" holds 19, 9 and 2026 too
    if len(parts) > 1:
        readings.add(float("".join(parts[:-1]) + "." + parts[-1]))
    out: set[str] = set()
    for r in readings:
        if math.isfinite(r):
            out |= {json.dumps(r), f"{r:.1f}", f"{r:.2f}"}
            if r.is_integer():
                out.add(str(int(r)))
    return out


class CopyGuard:
    """A ``Matcher`` whose mask never takes a value along a guarded value past its held part, nor a value on past a
    run the input does not hold (see the module docstring); everything else is ``inner``'s. Raises: Never (as
    ``inner``)."""

    def __init__(self, inner: Matcher, guarded: GuardedValues, tokens: GuardTokens):
        self.inner = inner
        self.guarded = guarded
        self._tokens = tokens
        self._cursor = JsonCursor()
        self._number_values = frozenset(float(n) for n in guarded.numbers)
        self.refusals = 0  # fills that took a token out of the mask (diagnostic)

    # -- the mask --------------------------------------------------------------------------------
    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        self.inner.fill_mask(bitmask, row)
        kind, raw = self._cursor.open_value()
        if kind is None:
            return
        words = bitmask_row(bitmask, row, self._tokens.index.words).numpy().view(np.uint32)
        written = normalized(raw) if kind == "string" else raw.lstrip(b"-")
        if self.runs_on(written):  # a string may only close, a number only end
            self._keep(words, self._tokens.closing_words if kind == "string" else ~self._tokens.digit_words)
            return
        refused = self.refused(written) if kind == "string" else self.refused_number(written)
        if refused is None:
            return
        refused = refused[((words[refused >> 5] >> (refused & 31).astype(np.uint32)) & 1).astype(bool)]
        if not len(refused):
            return
        before = words.copy()
        np.bitwise_and.at(words, refused >> 5, ~(np.uint32(1) << (refused & 31).astype(np.uint32)))
        if not words.any():  # the grammar allows only what the guard refuses: the value is forced, the guard yields
            words[:] = before
            return
        self.refusals += 1

    def _keep(self, words: np.ndarray, allowed: np.ndarray) -> None:
        kept = words & allowed
        if kept.any():  # else the grammar does not allow it here: the guard yields
            words[:] = kept
            self.refusals += 1

    def runs_on(self, written: bytes) -> bool:
        """Whether the open value (``written``: a string's normalized, a number's text) ends with a run of
        ``MAX_RUN`` or more bytes repeating a unit of up to ``MAX_PERIOD`` (``0000…``, ``yxyx…``) that the input
        does not hold. Cost: a backward scan of the run, per period."""
        if len(written) < MAX_RUN:
            return False
        for period in range(1, MAX_PERIOD + 1):
            i = len(written) - period - 1
            while i >= 0 and written[i] == written[i + period]:
                i -= 1
            run = len(written) - 1 - i  # the repeating tail, its first unit included
            if run >= max(MAX_RUN, 2 * period) and not self.guarded.holds(written[-run:]):
                return True
        return False

    def refused(self, written: bytes) -> np.ndarray | None:
        """Token ids that would take the open string value (``written``, normalized) along a guarded value past what
        the input holds; None where none is refused."""
        index = self._tokens.index
        found: list[np.ndarray] = []
        for rest, held in _along(written, self.guarded.strings, self.guarded.holds):
            # a token that adds the rest's beginning past the held part, or the whole rest and more
            found.extend(index.exactly(rest[:n]) for n in range(held + 1, len(rest)))
            found.append(index.starting_with(rest))
        for date in self.guarded.dates:  # a rendered date goes on freely, but not to the example's whole
            if date.startswith(written) and date != written:
                found.append(index.starting_with(date[len(written):]))
        return _ids(found)

    def refused_number(self, written: bytes) -> np.ndarray | None:
        """Token ids that would take the open number (``written``, its sign aside) along a guarded number past
        what the input's numbers begin with, or bring the rest of a guarded one and end it, or end it where it is
        one (``1.0`` is ``1``); None where none is."""
        index = self._tokens.raw_index
        found: list[np.ndarray] = []
        for rest, held in _along(written, self.guarded.numbers, self.guarded.number_prefixes.__contains__):
            found.extend(index.exactly(rest[:n]) for n in range(held + 1, len(rest) + 1))
            found.extend(index.starting_with(rest + end) for end in _NUMBER_ENDS)
        if self._is_guarded_number(written):
            found.extend(index.starting_with(end) for end in _NUMBER_ENDS)
        return _ids(found)

    def _is_guarded_number(self, written: bytes) -> bool:
        try:
            return float(written) in self._number_values
        except ValueError:  # not a whole number yet ("1.", "2e")
            return False

    # -- the rest is the grammar's ---------------------------------------------------------------
    def consume(self, tokens: Sequence[int]) -> bool:
        tokens = list(tokens)
        if not self.inner.consume(tokens):
            return False
        for t in tokens:
            self._cursor.feed(self._tokens.bytes_of(t))
        return True

    def rollback(self, n: int) -> None:
        self.inner.rollback(n)
        self._cursor.rollback(n)

    def forced_tokens(self) -> list[int]:
        return self.inner.forced_tokens()  # one token allowed: the guard yields there

    def is_accepting(self) -> bool:
        return self.inner.is_accepting()

    def is_stopped(self) -> bool:
        return self.inner.is_stopped()

    @property
    def error(self) -> str | None:
        return self.inner.error

    @property
    def limit_exceeded(self) -> str | None:
        return self.inner.limit_exceeded


def _along(written: bytes, values: Iterable[bytes], holds: Callable[[bytes], bool]) -> Iterator[tuple[bytes, int]]:
    """(rest, held) of each of ``values`` that ``written`` is a proper beginning of: what is left of it, and the
    most bytes of that rest ``written`` can go on with while ``holds`` says the input holds it. A held text's every
    beginning is held, so the held length is found by bisection."""
    for v in values:
        if not v.startswith(written) or v == written:
            continue
        rest = v[len(written):]
        lo, hi = 0, len(rest)  # written + rest[:lo] is held, or lo == 0; written + rest whole is not
        if holds(v):
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if holds(written + rest[:mid]):
                lo = mid
            else:
                hi = mid
        yield rest, lo


def _ids(found: list[np.ndarray]) -> np.ndarray | None:
    found = [f for f in found if len(f)]
    return np.concatenate(found) if found else None


# cursor modes
_OUT, _KEY, _VALUE, _NUMBER = 0, 1, 2, 3


class JsonCursor:
    """Where a JSON output written token by token stands: inside a string value (not a key), a number or neither,
    and what that value holds so far. One state per fed token, so a rollback pops states. Raises: Never (bytes that are not
    JSON leave it somewhere harmless: in no value)."""

    def __init__(self) -> None:
        self._text = bytearray()
        # after each fed token: (text length, mode, escaped, value start, stack); the stack is a linked tuple of
        # frames (is_object, expecting_key, parent)
        self._states: list[tuple[int, int, bool, int, Any]] = [(0, _OUT, False, 0, None)]

    def feed(self, data: bytes) -> None:
        _, mode, escaped, start, stack = self._states[-1]
        text = self._text
        for b in data:
            pos = len(text)
            text.append(b)
            if mode == _NUMBER:
                if b in _NUMBER_BYTES:
                    continue
                mode = _OUT  # the number ended: this byte is read outside it
            if mode != _OUT:
                if escaped:
                    escaped = False
                elif b == 0x5C:  # backslash
                    escaped = True
                elif b == 0x22:  # the closing quote
                    mode = _OUT
            elif b == 0x22:
                key = stack is not None and stack[0] and stack[1]
                mode, start = (_KEY if key else _VALUE), pos + 1
            elif b == 0x7B:  # {
                stack = (True, True, stack)
            elif b == 0x5B:  # [
                stack = (False, False, stack)
            elif b in (0x7D, 0x5D):  # } ]
                stack = stack[2] if stack is not None else None
            elif b == 0x3A and stack is not None and stack[0]:  # ':' after a key
                stack = (True, False, stack[2])
            elif b == 0x2C and stack is not None and stack[0]:  # ',' in an object: a key next
                stack = (True, True, stack[2])
            elif b in _NUMBER_START:
                mode, start = _NUMBER, pos
        self._states.append((len(text), mode, escaped, start, stack))

    def rollback(self, n: int) -> None:
        n = min(n, len(self._states) - 1)
        if n > 0:
            del self._states[len(self._states) - n:]
            del self._text[self._states[-1][0]:]

    def open_value(self) -> tuple[str | None, bytes]:
        """("string", the bytes written inside the open string value: JSON text, escapes as written), ("number",
        its bytes so far) or (None, b"")."""
        _, mode, _, start, _ = self._states[-1]
        if mode == _VALUE:
            return "string", bytes(self._text[start:])
        if mode == _NUMBER:
            return "number", bytes(self._text[start:])
        return None, b""


def _leaves(output: str, schema: Mapping[str, Any] | None) -> list[tuple[Any, Mapping[str, Any] | None]]:
    """(leaf, the subschema it is an instance of, where ``properties`` and ``items`` lead to one) of a JSON text."""
    try:
        value = json.loads(output)
    except ValueError:
        return []
    out: list[tuple[Any, Mapping[str, Any] | None]] = []
    stack: list[tuple[Any, Any]] = [(value, schema)]
    while stack:  # no recursion: an example's depth is bounded, but a walk need not rely on it
        v, at = stack.pop()
        at = at if isinstance(at, Mapping) else None
        if isinstance(v, dict):
            props = at.get("properties") if at is not None else None
            stack.extend((x, props.get(k) if isinstance(props, Mapping) else None) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, at.get("items") if at is not None else None) for x in v)
        else:
            out.append((v, at))
    return out


def _fixed(at: Mapping[str, Any] | None) -> bool:
    """The schema enumerates the value, or has the output render it in a format of its own."""
    return at is not None and ("enum" in at or "const" in at or at.get("format") in RENDERED_FORMATS)
