"""Matrix products for the few rows a decode step feeds, in the form that is fast on CPU.

Why: a decode or verification step multiplies 1-16 rows by each weight matrix,
and on CPU the BLAS behind ``F.linear`` (x @ W^T) is far from its best at those
row counts. Measured on the 2-vCPU EPYC this project runs on, fp32, Gemma 3's
262k x 640 output layer: 1 row 43 ms (a single-threaded GEMV), 3 rows 130 ms,
4 rows 73 ms; the same product as W @ x^T: 15-17 ms for 1-4 rows (one row padded
to a GEMM), then ~4 ms per row. In bf16 ``F.linear`` is the fast one.

Two tools:
- ``OutputHead``: the output layer. It is most of a step, so the first call with
  a given row count times each form on the real input and keeps the fastest
  (per weight and row count): no BLAS quirk is hard-coded. The forms sum in
  different orders, so the choice can flip a greedy near-tie; ``FormChoices``
  with a file (the executor's default) keeps it for the machine, so every later
  process on it computes the same logits.
- ``small_row_linears(model)``: the body's linear layers, each far too cheap to
  time reliably, take W @ x^T (an even number of rows) when fed at most
  ``SMALL_ROWS`` rows in fp32 on CPU (a Gemma 3 270M verification step of 4
  tokens: 77 -> 55 ms; the demo target's 8.2 -> 4.6 ms). Layers under
  ``SMALL_ROW_MIN_PARAMS`` (the demo draft's) keep ``F.linear``: there the call
  overhead, not the product, is the cost. Only inside ``fast_linears_enabled()``, so the same
  model object still runs stock transformers code elsewhere (the HF baselines).

Every form computes the same product; only the float summation order differs.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

TUNE_MIN_PARAMS = 16_000_000  # smaller output layers cost too little for the choice to matter
TUNE_RUNS = 3  # timed runs per form; the fastest counts
TUNE_MAX_ROWS = 64  # beyond this every form is compute-bound alike: plain F.linear
SMALL_ROWS = 32  # body linears fed more rows than this keep F.linear
SMALL_ROW_MIN_PARAMS = 100_000  # in tinier layers (the demo draft's) the call overhead dominates: F.linear


def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = (-x.shape[0]) % multiple
    return torch.cat([x, x.new_zeros((extra, x.shape[1]))]) if extra else x


def project_linear(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)  # [N, V]


def project_transposed(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(W @ x^T)^T over an even number of rows (one row would take the GEMV path)."""
    n = x.shape[0]
    return torch.mm(weight, _pad_rows(x, 2).t()).t()[:n].contiguous()  # [V, N'] -> [N, V]


def project_chunked(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The transposed form four rows at a time (the per-row cost is lowest at four)."""
    return torch.cat([project_transposed(weight, x[i: i + 4]) for i in range(0, x.shape[0], 4)])


FORMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "linear": project_linear,
    "transposed": project_transposed,
    "chunked": project_chunked,
}

_CHOICES: dict[tuple, str] = {}  # (weight identity, rows) -> form, shared by every executor of a model


def machine_fingerprint() -> str:
    """What the timing depends on: the CPU model, the CPUs and threads torch uses, the torch build."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}|cpus {os.cpu_count()}|threads {torch.get_num_threads()}|torch {torch.__version__}"


class FormChoices:
    """Chosen forms kept in a JSON file per machine (``machine_fingerprint``), so processes agree.

    Raises: never on a missing, unreadable or corrupt file (the choice is then timed and rewritten).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def _key(self, weight: torch.Tensor, rows: int) -> str:
        return f"{machine_fingerprint()}|{tuple(weight.shape)}|{weight.dtype}|{rows}"

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, weight: torch.Tensor, rows: int) -> str | None:
        form = self._read().get(self._key(weight, rows))
        return form if form in FORMS else None

    def put(self, weight: torch.Tensor, rows: int, form: str) -> None:
        with self._lock, contextlib.suppress(OSError):
            data = {**self._read(), self._key(weight, rows): form}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)  # atomic: a concurrent reader sees the old file or the new one


class OutputHead:
    """Applies an output layer (weight [V, H], optional bias [V]) to hidden states [N, H]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, tune: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter, choices: FormChoices | None = None):
        self.weight, self.bias = weight, bias
        if tune is None:
            tune = weight.device.type == "cpu" and weight.numel() >= TUNE_MIN_PARAMS
        self.tune = tune
        self.clock = clock
        self.choices = choices  # None: choices last for the process only
        self._key = (weight.data_ptr(), tuple(weight.shape), weight.dtype)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._project(hidden)  # [N, V]
        return logits if self.bias is None else logits + self.bias

    def form_for(self, rows: int) -> str | None:
        """The form chosen for this row count (None: not tuned yet, here or on this machine)."""
        form = _CHOICES.get((*self._key, rows))
        if form is None and self.choices is not None:
            form = self.choices.get(self.weight, rows)
            if form is not None:
                _CHOICES[(*self._key, rows)] = form
        return form

    def _project(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[0]
        if not self.tune or rows == 0 or rows > TUNE_MAX_ROWS:
            return project_linear(self.weight, hidden)
        form = self.form_for(rows)
        if form is not None:
            return FORMS[form](self.weight, hidden)
        return self._tune(rows, hidden)

    def _tune(self, rows: int, hidden: torch.Tensor) -> torch.Tensor:
        # Each form runs once untimed (one-off allocations), then the fastest of TUNE_RUNS timed runs
        # counts: a minimum is robust to a run slowed by another process, so a busy moment does
        # not fix a slow form for the life of the process.
        best, out = None, None
        for name, form in FORMS.items():
            form(self.weight, hidden)
            elapsed = float("inf")
            for _ in range(TUNE_RUNS):
                start = self.clock()
                result = form(self.weight, hidden)
                elapsed = min(elapsed, self.clock() - start)
            if best is None or elapsed < best[1]:
                best, out = (name, elapsed), result
        if best is None or out is None:
            raise RuntimeError("no matmul form to tune")
        _CHOICES[(*self._key, rows)] = best[0]
        if self.choices is not None:
            self.choices.put(self.weight, rows, best[0])
        return out


# -- the body's linear layers ---------------------------------------------------------------------
_ENABLED = threading.local()


@contextlib.contextmanager
def fast_linears_enabled() -> Iterator[None]:
    """Within this block (on this thread), installed linears take the small-row form."""
    previous = getattr(_ENABLED, "on", False)
    _ENABLED.on = True
    try:
        yield
    finally:
        _ENABLED.on = previous


def _small_row_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if not getattr(_ENABLED, "on", False) or rows > SMALL_ROWS:
        return F.linear(x, self.weight, self.bias)
    y = project_transposed(self.weight, x.reshape(rows, x.shape[-1]))  # [rows, out]
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], y.shape[-1])


def small_row_linears(model: torch.nn.Module) -> int:
    """Give the fp32 CPU linear layers of ``model`` the small-row form; returns how many."""
    count = 0
    for module in model.modules():
        if (isinstance(module, torch.nn.Linear) and module.weight.device.type == "cpu"
                and module.weight.dtype == torch.float32 and module.weight.numel() >= SMALL_ROW_MIN_PARAMS):
            if not isinstance(module.forward, types.MethodType) or module.forward.__func__ is not _small_row_forward:
                module.forward = types.MethodType(_small_row_forward, module)  # type: ignore[method-assign]  # the patch
            count += 1
    return count
