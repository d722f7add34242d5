"""Text every store column can hold: ``encode`` on write, ``decode`` on read, applied by both stores alike.

PostgreSQL's ``text`` cannot hold NUL (U+0000), and neither PostgreSQL nor SQLite can hold a lone surrogate, yet
a Python ``str`` can hold both (a caller's input, a token decoded from bytes, JSON's ``"\\ud800"``). ``encode`` maps
every string to one both stores hold, reversibly, and leaves every storable string as it is (rows, filters and
indexes read as before): an unstorable string, or one that starts with ``MARK`` (a Unicode noncharacter, reserved
for a program's internal use), is stored as ``MARK`` followed by its ASCII JSON text. A stored value that starts
with ``MARK`` was written by ``encode``.

``ENCODED_COLUMNS``: the (table, column) pairs the stores encode: those holding text a caller or the model wrote.
"""

from __future__ import annotations

import json
import re

MARK = "\ufdd0"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

ENCODED_COLUMNS = (
    ("schema_versions", "schema_json"), ("schema_versions", "description"),
    ("history", "history_key"), ("history", "text"),
    ("rejected_drafts", "context_text"), ("rejected_drafts", "draft_text"),
    ("rejected_drafts", "rejected_text"), ("rejected_drafts", "target_text"),
)


def encode(text: str) -> str:
    """``text`` as stored: itself when both stores can hold it and it does not start with ``MARK``."""
    if text.startswith(MARK) or _UNSTORABLE.search(text):
        return MARK + json.dumps(text)  # ASCII: NUL and surrogates escaped
    return text


def decode(stored: str) -> str:
    """What ``encode`` was given."""
    return json.loads(stored[len(MARK):]) if stored.startswith(MARK) else stored
