"""What the SQLite and the PostgreSQL stores write differently, and nothing else: one ``Dialect`` each.

The tables, statements (``statements``) and row codecs (``rows``) are written once for both. A statement is
written with ``?`` placeholders (``Dialect.sql`` gives the driver's); a token list is a JSON array in a ``TEXT``
column in SQLite and an ``INTEGER[]`` in PostgreSQL, a flag an ``INTEGER`` and a ``BOOLEAN``, an id column an
``AUTOINCREMENT`` integer and a ``BIGSERIAL``. SQLite creates its tables ``IF NOT EXISTS`` on every open;
PostgreSQL creates them once, under its migration lock (``postgres_schema``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Dialect:
    placeholder: str  # the driver's parameter mark
    id_column: str  # an auto-numbered primary key's type and constraint
    array_type: str  # a token list's column type
    bool_type: str
    create: str  # how a table or index is created
    array_in: Callable[[Sequence[int]], Any]  # a token list as stored
    array_out: Callable[[Any], Sequence[int]]  # a stored token list (made a tuple by the row codecs)
    replace_into: bool  # a sample's slot is overwritten by INSERT OR REPLACE (else an upsert of its columns)
    key_order: bool  # counters and samples are written in key order (writers sharing the tables cannot deadlock)
    lock_rows: str  # what locks the rows a SELECT reads until the transaction ends (SQLite's writer holds the file)

    def sql(self, text: str) -> str:
        """``text`` (``?`` placeholders) with the driver's placeholders."""
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)


SQLITE = Dialect("?", "INTEGER PRIMARY KEY AUTOINCREMENT", "TEXT", "INTEGER", "CREATE {} IF NOT EXISTS", json.dumps,
                 json.loads, replace_into=True, key_order=False, lock_rows="")
POSTGRES = Dialect("%s", "BIGSERIAL PRIMARY KEY", "INTEGER[]", "BOOLEAN", "CREATE {}", list, tuple, replace_into=False,
                   key_order=True, lock_rows=" FOR UPDATE")
