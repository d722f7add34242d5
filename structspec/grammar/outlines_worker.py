"""outlines-core builds in a child process that can be killed.

An outlines-core index build cannot be interrupted, and a pathological schema can
take minutes and gigabytes (its regex -> DFA step blows up): a thread that timed
out would keep both. So regex and index are built by a long-lived worker process
(``outlines_worker_main``, vocabulary sent once) and pickled back; past the
deadline the worker is killed, and a fresh one starts with the next build.
"""

from __future__ import annotations

import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from structspec.grammar import outlines_worker_main as wire
from structspec.grammar.base import SchemaError, SchemaIssue

_PROGRAM = Path(wire.__file__)
_STARTUP_S = 60.0


class IndexBuilder:
    """One worker per vocabulary; builds are serialized (outlines is the alternative backend)."""

    def __init__(self, vocabulary: dict[bytes, list[int]], eos_token_id: int):
        self._vocabulary = vocabulary
        self._eos = eos_token_id
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def build(self, schema_json: str | None, whitespace: str | None, text: str | None, timeout_s: float) -> tuple[Any, int]:
        """(index, regex length) for a JSON instance of ``schema_json`` or free text matching ``text``
        (or either); SchemaError "unsupported" when outlines-core cannot, "timeout" past ``timeout_s``."""
        with self._lock:
            process = self._worker()
            wire.write(_pipe(process.stdin), (schema_json, whitespace, text))
            reply = self._reply(process, timeout_s)
        if reply is None:
            raise SchemaError([SchemaIssue("", "", f"outlines index build took longer than {timeout_s:g} s "
                                                   "(or its worker died)")], kind="timeout")
        if reply[0] == "error":
            raise SchemaError([SchemaIssue("", "", f"outlines: {reply[1]}")], kind="unsupported")
        return reply[1], reply[2]

    @property
    def running(self) -> bool:
        """A worker process is up (none before the first build, nor right after a kill)."""
        return self._process is not None and self._process.poll() is None

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _worker(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen([sys.executable, str(_PROGRAM)], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE)
            wire.write(_pipe(self._process.stdin), (self._vocabulary, self._eos))
            if self._reply(self._process, _STARTUP_S) != ("ready",):
                raise RuntimeError("the outlines index worker did not start")
        return self._process

    def _reply(self, process: subprocess.Popen[bytes], timeout_s: float) -> Any:
        """The next message, or None (worker killed) when none comes in time or the worker died."""
        stdout = _pipe(process.stdout)
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        message = wire.read(stdout) if ready else None
        if message is None:
            self._kill()
        return message

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            _pipe(self._process.stdin).close()
            _pipe(self._process.stdout).close()
        self._process = None


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """One of the worker's pipes (it is started with stdin and stdout=PIPE: both are there)."""
    if stream is None:
        raise RuntimeError("the outlines index worker was started without its pipes")
    return stream
