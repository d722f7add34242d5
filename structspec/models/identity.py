"""What a loaded model is, by content: the identity its statistics, policy state and history are kept under.

A name says nothing of the weights behind it (two fine-tunes written to ``./output``, two files called
``model-Q4_K_M.gguf``), so the statistics key names a model by what it loaded (``stats.counters.model_key``):

- a model folder: ``folder_digest``, a hash of its weights and config (``loading.weights_version``);
- a GGUF file: a hash of ``loading.gguf_identity`` (its size, its first and last MiB);
- dummy weights (``--load-format dummy``): ``dummy-`` and a hash of the config alone, never a real model's.

Cost: a folder's digest reads every weight file once (about a second per GB); it is remembered in the cache
(``profiles.cache_dir``) by the files' paths, sizes and modification times, so a restart reads none.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from structspec.models.draft_vocab import VOCAB_FILE
from structspec.models.profiles import cache_dir

DUMMY_PREFIX = "dummy-"  # the identity of seeded random weights: no real model's key starts so


def _hashed_files(folder: Path) -> list[Path]:
    """The files a folder's digest reads, in the order it reads them."""
    return [f for f in (sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
                        + [folder / "config.json", folder / VOCAB_FILE]) if f.is_file()]


def _digest_files(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def folder_digest(path: str | Path) -> str:
    """A short content hash of a model folder's weights, config and draft vocabulary: other weights, another
    digest. Remembered by the files' stat (a file rewritten in place changes its size or modification time).
    Raises: OSError (an unreadable file)."""
    folder = Path(path).resolve()
    files = _hashed_files(folder)
    signature = [[f.name, st.st_size, st.st_mtime_ns] for f in files for st in (f.stat(),)]
    memo = cache_dir() / "identities.json"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    entry = known.get(str(folder)) if isinstance(known, dict) else None
    if isinstance(entry, dict) and entry.get("files") == signature and isinstance(entry.get("digest"), str):
        return entry["digest"]
    digest = _digest_files(files)
    known = known if isinstance(known, dict) else {}
    known[str(folder)] = {"files": signature, "digest": digest}
    _write_memo(memo, known)
    return digest


def _write_memo(memo: Path, known: dict[str, object]) -> None:
    """Replace the memo atomically (a concurrent reader sees the old or the new one); a cache that cannot be
    written costs a re-read at the next start, nothing else."""
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="identities-", dir=memo.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(known, fh)
        os.replace(tmp, memo)
    except OSError:
        pass


def gguf_digest(identity: str) -> str:
    """The statistics identity of a GGUF file from its ``loading.gguf_identity``: 12 hex digits as a folder's."""
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def dummy_identity(folder: str | Path) -> str:
    """The identity of seeded random weights built from ``folder``'s config: ``dummy-`` and the config's hash
    (other shapes, other timings), apart from every real model's."""
    config = Path(folder) / "config.json"
    text = config.read_bytes() if config.is_file() else b""
    return DUMMY_PREFIX + hashlib.sha256(text).hexdigest()[:8]
