"""Where a tensor's bytes are in a GGUF file: its type, shape and a read-only memory map of its data.

The llama.cpp executor reads the output layer's rows from the file (the same pages llama.cpp
maps) to score a few token ids alone. ``gguf.GGUFReader`` builds an array for every metadata
value (~9 s for Gemma's 262k-token vocabulary); this walks the header and skips values.

Raises ``ValueError`` for a file that is not GGUF v2/v3 or lacks the tensor. Cost: one pass
over the header (a string array of 262k tokens: ~0.2 s), no data read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> bytes
_STRING, _ARRAY, _UINT32 = 8, 9, 4


@dataclass(frozen=True)
class TensorBytes:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    data: np.ndarray  # uint8 [rows, bytes per row], memory-mapped, read-only


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.at = buf, 0

    def take(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<Q")
        text = bytes(self.buf[self.at:self.at + n]).decode("utf-8", "replace")
        self.at += n
        return text

    def skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            n = self.take("<Q")
            self.at += n
        elif vtype == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item == _STRING:
                for _ in range(count):
                    self.at += struct.unpack_from("<Q", self.buf, self.at)[0] + 8
            elif item in _SCALAR:
                self.at += _SCALAR[item] * count
            else:
                for _ in range(count):
                    self.skip_value(item)
        elif vtype in _SCALAR:
            self.at += _SCALAR[vtype]
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")


def tensor_bytes(path: str | Path, name: str) -> TensorBytes:
    """The bytes of tensor ``name`` in the GGUF at ``path``, one row of ``shape[0]`` elements per line."""
    file = Path(path)
    mapped = np.memmap(file, dtype=np.uint8, mode="r")
    cur = _Cursor(mapped.data)  # (the memoryview of its bytes)
    if bytes(mapped[:4]) != b"GGUF" or cur.take("<4sI")[1] not in (2, 3):
        raise ValueError(f"{file} is not a GGUF v2/v3 file")
    n_tensors, n_kv = cur.take("<QQ")
    alignment = 32
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.take("<I")
        if key == "general.alignment" and vtype == _UINT32:
            alignment = cur.take("<I")
        else:
            cur.skip_value(vtype)
    found = None
    for _ in range(n_tensors):
        tname = cur.string()
        dims = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
        gtype, offset = cur.take("<IQ")
        if tname == name:
            found = (dims, gtype, offset)
    if found is None:
        raise ValueError(f"{file} has no tensor {name!r}")
    dims, gtype, offset = found
    start = -(-cur.at // alignment) * alignment + offset
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(gtype)]
    if dims[0] % block:
        raise ValueError(f"tensor {name!r}: rows of {dims[0]} are not whole blocks of {block}")
    row_bytes = dims[0] // block * block_bytes
    rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
    # a plain ndarray over the mapping: indexing an np.memmap builds memmap objects (~40 us a gather)
    data = mapped[start:start + rows * row_bytes].reshape(rows, row_bytes).view(np.ndarray)
    return TensorBytes(name, gtype, dims, data)
