"""The grammar layer's seams: a backend compiles, a compiled grammar makes matchers.

    tokenizer view -> backend.compile(schema) -> CompiledGrammar (immutable, cached)
                                              -> .matcher()  -> Matcher (per sequence, mutable)

Masks use one format across backends: an int32 bitmask of shape [B, ceil(V / 32)]
(bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed), the format of
``llguidance.torch``; ``apply_token_bitmask`` applies a row to logits.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class SchemaIssue:
    """One problem with a schema: where (JSON pointer), which keyword, why."""

    pointer: str
    keyword: str
    message: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.keyword}: {self.message}"


class SchemaError(ValueError):
    """A schema (or tool list) that cannot be compiled; ``issues`` are plain data for the API layer."""

    def __init__(self, issues: Sequence[SchemaIssue], kind: str = "invalid_schema"):
        self.issues = tuple(issues)
        self.kind = kind  # invalid_schema | metaschema | unsupported | external_ref | too_deep | too_large | timeout
        super().__init__("; ".join(str(i) for i in self.issues) or kind)


@dataclass(frozen=True)
class GrammarOptions:
    """What changes the compiled grammar besides the schema and tokenizer (part of the cache key)."""

    whitespace: Literal["compact", "flexible"] = "compact"
    compile_timeout_s: float = 10.0
    max_schema_bytes: int = 512_000
    # A keyword the grammar ignores is listed (``CompileInfo.warnings``, and
    # ``post_check_keywords`` when jsonschema can check it after decoding); False refuses
    # such schemas instead (kind "unsupported"). Loosely enforced formats compile either way.
    allow_post_check: bool = True


@dataclass(frozen=True)
class CompileInfo:
    """What a compile reports besides the grammar: keywords only enforced after decoding, timing."""

    warnings: tuple[SchemaIssue, ...] = ()
    compile_ms: float = 0.0
    post_check_keywords: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


class Matcher(Protocol):
    """Grammar state of one sequence. Never raises mid-decode: errors are sticky (``error``)."""

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the allowed-token bits of the current state into ``bitmask[row]`` ([B, ceil(V/32)] int32)."""

    def consume(self, tokens: Sequence[int]) -> bool:
        """Advance over ``tokens``; False (and a sticky error) if one is not allowed."""

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens."""

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next, each the only allowed token at its position, canonical split."""

    def is_accepting(self) -> bool:
        """The output so far is a complete instance (EOS would be allowed)."""

    def is_stopped(self) -> bool:
        """Nothing more can be generated (the grammar is complete and allows no continuation, or EOS was consumed)."""

    @property
    def error(self) -> str | None: ...

    @property
    def limit_exceeded(self) -> str | None:
        """When ``error`` is the grammar engine running out of one of its resource limits (a
        property of the schema, not of the output), that limit's name; else None."""


class CompiledGrammar(Protocol):
    """Immutable, shareable across threads and requests."""

    info: CompileInfo

    def matcher(self) -> Matcher: ...


class GrammarBackend(Protocol):
    name: str

    def compile_json_schema(self, schema: dict[str, Any], options: GrammarOptions) -> CompiledGrammar: ...

    def compile_text_or_json(
        self, schema: dict[str, Any] | None, allow_text: bool, options: GrammarOptions
    ) -> CompiledGrammar:
        """Output is free text (not starting with ``{`` or ``[`` when ``schema`` is given) if
        ``allow_text``, or an instance of ``schema`` if given: tool calls and their ``tool_choice``."""


def allocate_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """[B, ceil(V/32)] int32, all tokens disallowed."""
    return torch.zeros((batch, (vocab_size + 31) // 32), dtype=torch.int32)


def bitmask_row(bitmask: torch.Tensor, row: int, words: int) -> torch.Tensor:
    """The first ``words`` words of ``bitmask[row]``, checked for what the engines write into."""
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2:
        raise ValueError("bitmask must be a 2-D int32 CPU tensor")
    if bitmask.shape[1] < words:
        raise ValueError(f"bitmask rows have {bitmask.shape[1]} words, the vocabulary needs {words}")
    target = bitmask[row, :words]
    if not target.is_contiguous():
        raise ValueError("bitmask rows must be contiguous")
    return target


@dataclass(frozen=True)
class MaskLayout:
    """Where the rows of one bitmask tensor lie in memory (checked as ``bitmask_row`` checks them)."""

    address: int  # of row 0's first word
    rows: int
    width: int  # words per row
    row_bytes: int

    def row_address(self, row: int) -> int:
        """Raises IndexError for a row outside the batch (negative rows count from the end, as in torch)."""
        if not -self.rows <= row < self.rows:
            raise IndexError(f"row {row} is outside a batch of {self.rows}")
        return self.address + (row % self.rows) * self.row_bytes


# The layout last read, kept for its tensor (weakly) while that tensor keeps its memory: an engine
# step fills every row of one bitmask, and each torch attribute read costs 0.2-2 us, as much as a
# cheap llguidance mask, where a tensor view (``bitmask_row``) costs 5-15 us.
_last_layout: tuple[weakref.ref[torch.Tensor], int, MaskLayout] | None = None


def mask_layout(bitmask: torch.Tensor, words: int) -> MaskLayout:
    """The memory layout of ``bitmask``, whose rows must hold at least ``words`` words.

    Raises ValueError as ``bitmask_row`` does. Read once per tensor object and data pointer.
    """
    global _last_layout
    last = _last_layout
    if last is not None and last[0]() is bitmask and last[1] == bitmask.data_ptr():
        layout = last[2]
    else:
        if bitmask.dtype != torch.int32 or not bitmask.is_cpu or bitmask.dim() != 2:
            raise ValueError("bitmask must be a 2-D int32 CPU tensor")
        rows, width = bitmask.shape
        if bitmask.stride(1) != 1 and width > 1:
            raise ValueError("bitmask rows must be contiguous")
        layout = MaskLayout(bitmask.data_ptr(), rows, width, bitmask.stride(0) * 4)
        _last_layout = (weakref.ref(bitmask), layout.address, layout)
    if layout.width < words:
        raise ValueError(f"bitmask rows have {layout.width} words, the vocabulary needs {words}")
    return layout


def token_allowed(row: torch.Tensor | np.ndarray, token: int) -> bool:
    """Whether one bitmask row (int32 words, a tensor or an array) allows ``token``; ids past the row are not."""
    word = token >> 5
    return word < row.shape[0] and bool((int(row[word]) >> (token & 31)) & 1)


def set_bits(row: torch.Tensor, tokens: Iterable[int]) -> None:
    """Allow ``tokens`` in one bitmask row (in place)."""
    words = row.numpy().view("uint32")  # shares memory; unsigned, so bit 31 needs no sign games
    for t in tokens:
        words[t >> 5] |= 1 << (t & 31)


def _words(bitmask: torch.Tensor) -> np.ndarray:
    """The int32 mask words as a little-endian numpy array on the CPU (byte order = token order)."""
    return bitmask.detach().cpu().contiguous().numpy().astype("<i4", copy=False)


def _unpack(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """[N, W] int32 words -> [N, width] bool (token t is bit t % 32 of word t // 32), on the CPU.

    numpy's ``unpackbits`` does this in one C loop over the bytes (~10 us for Gemma's 262k ids),
    where shifting every word by 0..31 in torch materialises four [N, 32W] temporaries (~1 ms a row).
    """
    words = _words(bitmask)
    bits = np.unpackbits(words.view(np.uint8), axis=-1, count=width, bitorder="little")  # [N, width] uint8
    return torch.from_numpy(bits).bool()


def bitmask_to_bool(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """One [ceil(V/32)] int32 row -> [V] bool."""
    return _unpack(bitmask_row[None], vocab_size)[0]


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, inplace: bool = False,
                        allowed: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
    """Set disallowed logits to -inf. logits [N, V'] (V' may exceed the tokenizer's V), bitmask [N, W].

    Ids past the mask (model-only padding rows of the output layer) are disallowed. ``inplace`` writes
    into ``logits`` (the engine owns its step's logits) instead of returning a masked copy. ``allowed``:
    per row, the ids its bitmask allows when already listed (``small_allowed_set``), or None; a listed row
    is masked from its list (a fill and a scatter) rather than from the unpacked bitmask.
    """
    out = logits if inplace else logits.clone()
    if allowed is not None and any(ids is not None for ids in allowed):
        wide = [i for i, ids in enumerate(allowed) if ids is None]
        for i, ids in enumerate(allowed):
            if ids is not None:
                kept = out[i, ids]
                out[i].fill_(float("-inf"))
                out[i, ids] = kept
        if wide:
            out[wide] = apply_token_bitmask(out[wide], bitmask[wide], inplace=True)
        return out
    vocab = logits.shape[-1]
    width = min(vocab, 32 * bitmask.shape[-1])
    if out.device.type == "cpu" and out.dtype == torch.float32 and not out.requires_grad:
        # one C pass over numpy views (~90 us for Gemma's 262k ids, ~130 us through torch's bool temporaries)
        bits = np.unpackbits(_words(bitmask).view(np.uint8), axis=-1, count=width, bitorder="little")  # [N, width]
        out.detach().numpy()[:, :width][bits == 0] = -np.inf
    else:
        allowed_bits = _unpack(bitmask, width).to(out.device, non_blocking=True)  # [N, width]
        out[:, :width].masked_fill_(~allowed_bits, float("-inf"))
    if width < vocab:
        out[:, width:] = float("-inf")
    return out


def forces_one_token(bitmask_row: torch.Tensor) -> bool:
    """Whether one [W] int32 row allows exactly one token (a forced position; a dead end allows none)."""
    ids = small_allowed_set(bitmask_row, 1)
    return ids is not None and len(ids) == 1


def decision_end(bitmask: torch.Tensor, kept: int) -> int:
    """How many of a draft's first ``kept`` tokens stay so that the row after the last one (``bitmask`` [>kept, W]:
    row i the mask after i drafted tokens) is not forced: trailing tokens at forced positions, and the decision
    before them, are dropped (``Drafter._decision_end``). Looks at rows from ``kept`` down, only while forced."""
    while kept > 0 and forces_one_token(bitmask[kept]):
        kept -= 1
    return kept


def small_allowed_set(bitmask_row: torch.Tensor, limit: int) -> torch.Tensor | None:
    """The allowed token ids of one [W] int32 row as a LongTensor, or None when there may be more than ``limit``.

    Cheap when the answer is None for a wide set: only the non-zero words are looked at.
    """
    words = _words(bitmask_row)
    nonzero = np.flatnonzero(words)  # [Z] word indices
    if len(nonzero) > limit:
        return None  # every non-zero word holds at least one allowed id
    bits = np.unpackbits(words[nonzero].view(np.uint8).reshape(-1, 4), axis=-1, bitorder="little")  # [Z, 32]
    ids = (nonzero[:, None] * 32 + np.arange(32))[bits.astype(bool)]  # ascending
    return torch.from_numpy(ids.astype(np.int64)) if len(ids) <= limit else None

