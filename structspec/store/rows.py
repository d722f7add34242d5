"""Row codecs, written once for both stores: a record as a statement's arguments (``*_row``) and a selected row as
the record (``statements``' column lists, in their order). Callers' and the model's text goes through
``text.encode``/``decode`` (``text.ENCODED_COLUMNS``); token lists through the dialect's array codec."""

from __future__ import annotations

from typing import Any

from structspec.stats.counters import CounterKey
from structspec.stats.policy_states import PolicyChange
from structspec.stats.samples import RejectedDraft
from structspec.stats.traffic import TrafficSample
from structspec.store.base import HistoryRow, SchemaRecord
from structspec.store.dialect import Dialect
from structspec.store.text import decode, encode

Row = tuple[Any, ...]


def schema_row(r: SchemaRecord) -> Row:
    return (r.schema_id, r.version, encode(r.schema_json), r.sha256, encode(r.description), r.created_at, r.source,
            r.speculation)


def schema(row: Row) -> SchemaRecord:
    return SchemaRecord(row[0], int(row[1]), decode(row[2]), row[3], decode(row[4]), float(row[5]), row[6], row[7])


def counter_row(k: CounterKey, value: float) -> Row:
    return (k.model, k.schema_key, k.hour, k.series, k.proposer, k.batch_bucket, k.label, value)


def counter(r: Row) -> tuple[CounterKey, float]:
    return CounterKey(r[0], r[1], int(r[2]), r[3], r[4], int(r[5]), r[6]), float(r[7])


def history_row(r: HistoryRow) -> Row:
    return (r[0], encode(r[1]), encode(r[2]), r[3])


def sample_row(d: Dialect, r: RejectedDraft) -> Row:
    return (r.model, r.schema_key, r.proposer, r.hour, r.slot, r.created_at, r.batch_bucket,
            d.array_in(r.context_tokens), encode(r.context_text), d.array_in(r.draft_tokens), encode(r.draft_text),
            r.position, r.rejected_token, encode(r.rejected_text), r.target_token, encode(r.target_text),
            bool(r.grammatical), r.writer)


def sample(d: Dialect, row: Row) -> RejectedDraft:
    return RejectedDraft(row[0], row[1], row[2], int(row[3]), int(row[4]), float(row[5]), int(row[6]),
                         tuple(d.array_out(row[7])), decode(row[8]), tuple(d.array_out(row[9])), decode(row[10]),
                         int(row[11]), int(row[12]), decode(row[13]), int(row[14]), decode(row[15]), bool(row[16]),
                         row[17])


def traffic_row(d: Dialect, r: TrafficSample) -> Row:
    return (r.model, r.schema_key, r.hour, r.slot, r.created_at, d.array_in(r.prompt_tokens),
            d.array_in(r.output_tokens), r.finish, r.writer)


def traffic(d: Dialect, row: Row) -> TrafficSample:
    return TrafficSample(row[0], row[1], int(row[2]), int(row[3]), float(row[4]), tuple(d.array_out(row[5])),
                         tuple(d.array_out(row[6])), row[7], row[8])


def change_row(r: PolicyChange) -> Row:
    return (r.model, r.schema_key, r.proposer, r.at, r.state, r.reason, r.previous, r.batch_bucket, r.acceptance,
            r.threshold)


def change(row: Row) -> PolicyChange:
    return PolicyChange(row[0], row[1], row[2], float(row[3]), row[4], row[5], row[6], int(row[7]),
                        None if row[8] is None else float(row[8]), None if row[9] is None else float(row[9]))
