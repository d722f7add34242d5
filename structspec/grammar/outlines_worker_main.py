"""The outlines-core index worker program (run as a script: stdlib + outlines_core only, starts fast).

Reads length-prefixed pickles on stdin: first ``(token bytes -> ids, eos id)``, then
jobs ``(schema JSON or None, whitespace pattern, plain-text regex or None)``; writes
``("ready",)`` once, then ``("ok", index, regex length)`` or ``("error", message)``.
"""

import pickle
import struct
import sys
from typing import IO, Any

import outlines_core

_HEADER = struct.Struct("<Q")


def read(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    return pickle.loads(stream.read(_HEADER.unpack(header)[0]))


def write(stream: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def build(vocabulary: Any, schema_json: str | None, whitespace: str | None, text: str | None) -> tuple[Any, int]:
    regex = None
    if schema_json is not None:
        regex = outlines_core.json_schema.build_regex_from_schema(schema_json, whitespace_pattern=whitespace)
    if text is not None:
        regex = text if regex is None else f"(?:{text})|(?:{regex})"
    if regex is None:
        raise ValueError("a job names a schema, a text pattern or both")
    return outlines_core.Index(regex, vocabulary), len(regex)


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    tokens, eos = read(stdin)
    vocabulary = outlines_core.Vocabulary(eos, tokens)
    write(stdout, ("ready",))
    while (job := read(stdin)) is not None:
        try:
            index, regex_chars = build(vocabulary, *job)
            write(stdout, ("ok", index, regex_chars))
        except Exception as exc:  # outlines-core raises ValueError and others on what it cannot express
            write(stdout, ("error", (str(exc).splitlines() or [type(exc).__name__])[0][:300]))


if __name__ == "__main__":
    main()
