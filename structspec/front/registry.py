"""The schema registry: validated, content-addressed, immutable schema versions over a ``Store``,
each with its owner's override of the drafting policy (the one mutable part of a version); and
``ResolvedSchema``, a request's schema as the engine takes it.

A schema's *canonical text* (``canonical_json``) is its one spelling: sorted keys except inside
``properties``, whose order is part of the output. Its SHA-256 (``content_hash``) is the schema's
*digest*, computed once per request (once per version for a registered schema) and carried to the
engine, which keys its grammar cache and its worked examples by it; an inline schema's statistics
key is made from it too (``front.keys`` spells the statistics keys).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import jsonschema

from structspec.engine.types import SchemaSpeculation
from structspec.front.errors import Code, FieldViolation, FrontError, invalid, not_found, schema_too_deep
from structspec.front.keys import SCHEMA_ID_RE, inline_key, registered_stats_key
from structspec.grammar import json_text
from structspec.grammar.cache import canonical_json
from structspec.grammar.intake import metaschema_errors
from structspec.store.base import SchemaRecord, Store, StoreUnavailable

MAX_METASCHEMA_ISSUES = 10


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def inline_stats_key(canonical: str) -> str:
    """The statistics key of a schema sent inline (by content)."""
    return inline_key(content_hash(canonical))


def check_schema_id(schema_id: str, field: str = "schema_id") -> None:
    if not SCHEMA_ID_RE.match(schema_id):
        raise invalid(field, f"{schema_id!r} is not a valid schema id (1-128 of letters, digits, '_', '-', '.'; first a letter or digit)")


def parse_schema_json(text: str, field: str) -> dict[str, Any]:
    """JSON text -> a schema object, with a readable INVALID_ARGUMENT on failure."""
    if not text.strip():
        raise invalid(field, "empty schema", "INVALID_SCHEMA")
    try:
        value = json_text.loads(text)
    except json_text.TooDeep as exc:
        raise schema_too_deep(field, exc) from None
    except json.JSONDecodeError as exc:
        raise invalid(field, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "INVALID_SCHEMA") from None
    if value is True:  # the schema that admits any JSON value: the same as {}
        return {}
    if not isinstance(value, dict):
        raise invalid(field, f"a JSON Schema must be a JSON object or true here, got {json.dumps(value)[:40]}",
                      "INVALID_SCHEMA")
    return value


def metaschema_violations(schema: Mapping[str, Any], field: str) -> list[FieldViolation]:
    """Problems with ``schema`` against its metaschema ($schema, default draft 2020-12), each
    with the JSON pointer of the offending subschema and the keyword at fault."""
    if "$schema" in schema and not isinstance(schema["$schema"], str):
        return [FieldViolation(field, "must be a string (a metaschema URI)", "", "$schema")]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    out = []
    for err in sorted(metaschema_errors(cls, schema), key=lambda e: list(map(str, e.path))):
        path = [str(p) for p in err.path]
        keyword = path[-1] if path else str(err.validator)
        pointer = "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path[:-1])
        out.append(FieldViolation(field, err.message, pointer, keyword))
        if len(out) >= MAX_METASCHEMA_ISSUES:
            break
    return out


def check_schema(schema: Mapping[str, Any], field: str) -> None:
    try:  # before the metaschema check, which recurses
        json_text.check_schema_depth(schema)
    except json_text.TooDeep as exc:
        raise schema_too_deep(field, exc) from None
    violations = metaschema_violations(schema, field)
    if violations:
        where = "; ".join(f"at {v.json_pointer or '/'} ({v.keyword}): {v.description}" for v in violations[:5])
        raise FrontError(Code.INVALID_ARGUMENT, f"{field}: invalid schema: {where}", "INVALID_SCHEMA", violations)


@dataclass(frozen=True)
class ResolvedSchema:
    """A schema ready for the engine."""

    schema: dict[str, Any]
    key: str  # statistics key
    record: SchemaRecord | None = None  # None for inline schemas
    digest: str = ""  # SHA-256 of the canonical text ("": the engine computes it)

    @property
    def speculation(self) -> SchemaSpeculation:
        """The owner's drafting override (inline schemas have no owner: AUTO)."""
        return SchemaSpeculation(self.record.speculation) if self.record is not None else SchemaSpeculation.AUTO


class SchemaRegistry:
    """Registers and resolves schemas. Versions are immutable, so parsed schemas are cached by
    (id, version); "latest" lookups always ask the store (another replica may have registered).

    Every record read or written is remembered (at most ``known_size``, the least recently used
    forgotten first; ``warm`` reads them all): while the store cannot be reached
    (``StoreUnavailable``), ``get``, ``resolve`` and ``list`` answer from what is remembered (the
    latest version this process knew, its drafting override as last read), so extraction by a
    registered schema keeps working; what is not remembered, and every write, raises
    ``StoreUnavailable`` (the servicer answers UNAVAILABLE ``STORE_UNAVAILABLE``)."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time, cache_size: int = 256,
                 known_size: int = 4096):
        self.store = store
        self._clock = clock
        self._parsed: OrderedDict[tuple[str, int], tuple[dict[str, Any], str]] = OrderedDict()  # (schema, digest)
        self._cache_size = cache_size
        self._known: OrderedDict[tuple[str, int], SchemaRecord] = OrderedDict()
        self._known_size = known_size

    # -- what this process knows, for an unreachable store ---------------------------------------

    def _remember(self, *records: SchemaRecord) -> None:
        for r in records:
            self._known[(r.schema_id, r.version)] = r
            self._known.move_to_end((r.schema_id, r.version))
        while len(self._known) > self._known_size:
            self._known.popitem(last=False)

    def _forget(self, schema_id: str, versions: list[int] | None = None) -> None:
        for key in [k for k in self._known if k[0] == schema_id and (versions is None or k[1] in versions)]:
            del self._known[key]

    def _remembered(self, schema_id: str | None, all_versions: bool) -> list[SchemaRecord]:
        rows = sorted((r for r in self._known.values() if schema_id is None or r.schema_id == schema_id),
                      key=lambda r: (r.schema_id, r.version))
        if all_versions:
            return rows
        latest: dict[str, SchemaRecord] = {}
        for r in rows:
            latest[r.schema_id] = r  # sorted: the highest version last
        return list(latest.values())

    async def warm(self) -> int:
        """Remember every live version the store holds (at start and on each statistics refresh); how many."""
        records = await self.store.list_schemas(None, all_versions=True)
        self._known.clear()
        self._remember(*records[-self._known_size:])
        return len(records)

    # -- the registry ----------------------------------------------------------------------------

    async def register(
        self, schema_id: str, schema: Mapping[str, Any] | str, description: str = "", source: str = "api"
    ) -> tuple[SchemaRecord, bool]:
        check_schema_id(schema_id)
        value = parse_schema_json(schema, "schema_json") if isinstance(schema, str) else dict(schema)
        check_schema(value, "schema_json")
        text = canonical_json(value)
        record, created = await self.store.put_schema(schema_id, text, content_hash(text), description, source,
                                                      self._clock())
        self._remember(record)
        return record, created

    async def get(self, schema_id: str, version: int | None = None) -> SchemaRecord:
        check_schema_id(schema_id)
        if version is not None and version < 1:
            raise invalid("version", "versions start at 1")
        try:
            record = await self.store.get_schema(schema_id, version)
        except StoreUnavailable:
            known = self._remembered(schema_id, all_versions=version is not None)
            record = next((r for r in known if version is None or r.version == version), None)
            if record is None:
                raise
            return record
        if record is None:
            self._forget(schema_id, None if version is None else [version])
            what = f"schema {schema_id!r}" + (f" version {version}" if version is not None else "")
            raise not_found(f"{what} is not registered", field="schema_id" if version is None else "version")
        self._remember(record)
        return record

    async def list(self, schema_id: str | None = None, all_versions: bool = False) -> list[SchemaRecord]:
        if schema_id:
            check_schema_id(schema_id)
        try:
            records = await self.store.list_schemas(schema_id or None, all_versions)
        except StoreUnavailable:
            return self._remembered(schema_id or None, all_versions)
        self._remember(*records)
        return records

    async def delete(self, schema_id: str, version: int | None = None) -> builtins.list[int]:  # (list: the method)
        check_schema_id(schema_id)
        deleted = await self.store.delete_schema(schema_id, version)
        self._forget(schema_id, None if version is None else deleted)
        if not deleted:
            what = f"schema {schema_id!r}" + (f" version {version}" if version is not None else "")
            raise not_found(f"{what} is not registered")
        for v in deleted:
            self._parsed.pop((schema_id, v), None)
        return deleted

    async def set_speculation(self, schema_id: str, version: int | None, mode: SchemaSpeculation) -> SchemaRecord:
        """Set the drafting override of one version (the latest when ``version`` is None); the updated record."""
        record = await self.get(schema_id, version)
        updated = await self.store.set_schema_speculation(record.schema_id, record.version, mode.value)
        if updated is None:  # deleted between the two calls
            raise not_found(f"schema {schema_id!r} version {record.version} is not registered", field="version")
        self._remember(updated)
        return updated

    async def resolve(self, schema_id: str, version: int | None = None) -> ResolvedSchema:
        record = await self.get(schema_id, version)
        cache_key = (record.schema_id, record.version)
        parsed = self._parsed.get(cache_key)
        if parsed is None:  # once per version: parsed, and its digest taken from its canonical text
            schema = json.loads(record.schema_json)
            parsed = self._parsed[cache_key] = (schema, content_hash(canonical_json(schema)))
            while len(self._parsed) > self._cache_size:
                self._parsed.popitem(last=False)
        else:
            self._parsed.move_to_end(cache_key)
        schema, digest = parsed
        return ResolvedSchema(schema, registered_stats_key(record.schema_id, record.version), record, digest)


def inline_schema(schema: dict[str, Any]) -> ResolvedSchema:
    """A schema sent inline, keyed for statistics by its content: canonicalised and hashed here, once per request
    (validated by the engine's compile, which reports pointers)."""
    digest = content_hash(canonical_json(schema))
    return ResolvedSchema(schema, inline_key(digest), digest=digest)


async def register_builtins(registry: SchemaRegistry, schemas: Mapping[str, Mapping[str, Any]]) -> list[tuple[SchemaRecord, bool]]:
    """Register each built-in schema under its name; unchanged content keeps its version."""
    out = []
    for name, schema in sorted(schemas.items()):
        description = str(schema.get("description") or schema.get("title") or "")
        out.append(await registry.register(name, schema, description=description, source="builtin"))
    return out
