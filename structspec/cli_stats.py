"""``structspec stats``: what a schema's owner looks at. Tables per schema, rejected drafts and an HTML report.

    structspec stats [SCHEMA] [--window 7d] [--json]          tables (``show``, the default command)
    structspec stats rejections [SCHEMA] [--limit 20]          sampled rejected drafts
    structspec stats report [SCHEMA] --out report.html         the self-contained HTML report

The statistics come from the store a server writes (``--data-dir`` / ``--store-url``, as for
``structspec serve``; read in this process) or from a running server (``--server HOST:PORT``,
through GetSchemaStats / ListSchemaStats / ListRejectedDrafts). Both give the same values, the statistics
views (``structspec.front.views``): read from the store by ``structspec.front.stats`` here, by the server's
same code there, so they print the same for the same store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import json
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from structspec.cli_client import CALL, Connection, _fail, connection_options, window_label
from structspec.front.keys import MAX_WINDOW_SECONDS, registered_stats_key
from structspec.service.settings import ServiceSettings, load_settings
from structspec.store import DEFAULT_DB_NAME, Store, open_store, redact_url

if TYPE_CHECKING:  # annotations only: the views cost every command ~18 ms to import
    from structspec.front.views import DraftPricing, ProposerPolicyState, RejectedDraft, SchemaStats

SCHEMA_HELP = ("a registered schema id (its latest version), id@version, or a statistics key such as inline:3f2a... "
               "or tools:...; default: every schema")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class _DefaultShow(TyperGroup):
    """``structspec stats ARGS`` runs ``show ARGS`` unless ARGS start with another subcommand (or ask for help)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: typer's own (vendored) click Context
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["show", *args]
        return super().parse_args(ctx, args)


stats_app = typer.Typer(cls=_DefaultShow, no_args_is_help=False, add_completion=False,
                        help="Per-schema speculation statistics: tables (the default: `structspec stats [SCHEMA]` is "
                             "`structspec stats show [SCHEMA]`), rejected drafts, an HTML report.")


class StatsInputError(Exception):
    """Bad input or a missing source: the message is printed as ``error: ...``, the exit status is 2."""


def parse_window(text: str) -> int:
    """``7d``, ``24h``, ``90m``, ``3600s`` or plain seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw]?)\s*", text.lower())
    if not m or int(m.group(1)) <= 0:
        raise StatsInputError(f"--window {text!r}: give a duration such as 7d, 24h, 90m or 3600 (seconds)")
    seconds = int(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds > MAX_WINDOW_SECONDS:
        raise StatsInputError(f"--window {text!r}: at most 90d")
    return seconds


# -- sources ---------------------------------------------------------------------------------------


def _split_schema(schema: str | None) -> tuple[str | None, int | None, str | None]:
    """SCHEMA -> (registered id, version, statistics key); at most one of id and key."""
    if schema is None:
        return None, None, None
    if ":" in schema:
        return None, None, schema
    sid, sep, version = schema.partition("@")
    if sep:
        if not version.isdigit():
            raise StatsInputError(f"SCHEMA {schema!r}: a version after @ is a number (id@3)")
        return sid, int(version), None
    return sid, None, None


@dataclasses.dataclass
class StoreSource:
    """The store a server writes, read here."""

    data_dir: Optional[Path]
    store_url: Optional[str]

    def describe(self) -> str:
        return redact_url(self.store_url) if self.store_url else str(self._path())

    def _settings(self) -> ServiceSettings:
        """The settings a server on this data directory reads (its env and TOML, no flags): the drafting policy's
        configuration the draft pricing uses comes from them."""
        return load_settings(None, overrides={"data_dir": self.data_dir, "store_url": self.store_url}, validate=False)

    def _path(self) -> Path:
        return Path(self._settings().data_dir) / DEFAULT_DB_NAME

    async def _with_store(self, fn: Any) -> Any:
        settings = self._settings()
        if not settings.store_url and not self._path().is_file():
            raise StatsInputError(f"no store at {self._path()} (a server or `structspec bench decode --data-dir` "
                                  "writes one there); give --data-dir, --store-url or --server")
        store = open_store(settings.store_url, settings.data_dir)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    async def _key(self, store: Store, schema: str | None) -> str | None:
        sid, version, key = _split_schema(schema)
        if sid is None:
            return key
        record = await store.get_schema(sid, version)
        if record is None:
            what = f"{sid}@{version}" if version is not None else sid
            raise StatsInputError(f"no registered schema {what} in {self.describe()}")
        return registered_stats_key(record.schema_id, record.version)

    def stats(self, windows: Sequence[int], schema: str | None, model: str | None,
              timeline: bool) -> list[SchemaStats]:
        from structspec.front import stats  # the statistics' classes: ~60 ms CPU (+15%) on every command's start-up

        policy = self._settings().engine_config().policy

        async def read(store: Store) -> list[SchemaStats]:
            key = await self._key(store, schema)
            return await stats.read_stats(store, windows, model=model, schema_key=key, include_timeline=timeline,
                                          policy=policy)

        return asyncio.run(self._with_store(read))

    def rejected(self, schema: str | None, model: str | None, proposer: str | None, limit: int,
                 schema_key: str | None = None) -> list[RejectedDraft]:
        """``schema_key``: a statistics key as it is (a schema deleted since still has its samples)."""
        from structspec.front import stats  # as in ``stats``

        async def read(store: Store) -> list[RejectedDraft]:
            key = schema_key or await self._key(store, schema)
            return await stats.read_rejected_drafts(store, model=model, schema_key=key, proposer=proposer, limit=limit)

        return asyncio.run(self._with_store(read))


@dataclasses.dataclass
class ServerSource:
    """A running server, through its RPCs."""

    conn: Connection

    def describe(self) -> str:
        return f"server {self.conn.target}"

    def stats(self, windows: Sequence[int], schema: str | None, model: str | None,
              timeline: bool) -> list[SchemaStats]:
        sid, version, key = _split_schema(schema)
        with self.conn.client() as client:
            try:
                if sid is None and key is None:
                    return client.list_schema_stats(windows, model=model, include_timeline=timeline)
                return [client.get_schema_stats(sid, version, schema_key=key, windows=windows, model=model,
                                                include_timeline=timeline)]
            except Exception as exc:
                _fail(exc)
        raise AssertionError("unreachable")

    def rejected(self, schema: str | None, model: str | None, proposer: str | None, limit: int,
                 schema_key: str | None = None) -> list[RejectedDraft]:
        sid, version, key = (None, None, schema_key) if schema_key else _split_schema(schema)
        with self.conn.client() as client:
            try:
                return client.list_rejected_drafts(sid, version, schema_key=key, model=model, proposer=proposer,
                                                   limit=limit)
            except Exception as exc:
                _fail(exc)
        raise AssertionError("unreachable")


def _source(conn: Connection, server: Optional[str], data_dir: Optional[Path], store_url: Optional[str]) -> Any:
    if server is not None and (data_dir is not None or store_url is not None):
        raise StatsInputError("give --server or a store (--data-dir / --store-url), not both")
    if server is not None:
        return ServerSource(dataclasses.replace(conn, target=server))
    return StoreSource(data_dir, store_url)


# the options every stats command takes: where the statistics come from
SOURCE_CALL = tuple(n for n in CALL if n != "target") + ("admin_token_file",)
ServerOpt = Annotated[Optional[str], typer.Option("--server", help="ask a running server (HOST:PORT) through its RPCs")]
DataDirOpt = Annotated[Optional[Path], typer.Option("--data-dir", help="read the store in this data directory (as "
                                                                       "`structspec serve --data-dir`; default: the "
                                                                       "server's default, or env STRUCTSPEC_DATA_DIR)")]
StoreUrlOpt = Annotated[Optional[str], typer.Option("--store-url", help="read this store (sqlite:///path.db)")]
WindowOpt = Annotated[str, typer.Option("--window", help="how far back: 7d, 24h, 90m, 3600 (seconds); the counters "
                                                         "are hourly, so a window covers every hour it reaches into")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="only this model's statistics (default: every model's; "
                                                                 "with --server and a SCHEMA, the server's model)")]


# -- tables ----------------------------------------------------------------------------------------


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def schema_tables(entry: SchemaStats, window_seconds: int) -> list[Table]:
    """One schema's tables: requests, drafting per proposer and batch bucket, the policy's state per proposer."""
    w = entry.windows.get(window_seconds)
    names = sorted(w.names) if w is not None else []
    title = f"{entry.schema_key}{' (' + ', '.join(names) + ')' if names else ''} on {entry.model or '?'}, " \
            f"last {window_label(window_seconds)}"
    tables = []
    requests = Table("requests", "output tokens mean / p50 / p95", "tokens / target pass", "est. speedup",
                     "truncated", "cancelled", "failed", "latency ms p50 / p99", title=f"{title}: requests")
    if w is not None and w.requests:
        speedup = f"{w.estimated_speedup:.2f}x" if w.estimated_speedup else "-"
        if w.estimated_speedup and not w.speedup_costs_measured:
            speedup += " (pass ratio)"
        requests.add_row(str(w.requests), f"{w.output_tokens_mean:.1f} / {w.output_tokens_p50:.0f} / "
                                          f"{w.output_tokens_p95:.0f}", f"{w.tokens_per_pass:.2f}", speedup,
                         _pct(w.finish_share("length")), _pct(w.finish_share("cancelled")),
                         _pct(w.finish_share("error")), f"{w.latency_ms_p50:.0f} / {w.latency_ms_p99:.0f}")
    tables.append(requests)
    drafting = Table("proposer", "batch", "drafted", "accepted", "acceptance", "per examined token",
                     "verifications (probes)", "acceptance by draft position", title=f"{title}: drafting")
    for p in (w.proposers if w is not None else []):
        examined = f"{sum(p.accepted_at) / sum(p.reached):.2f}" if sum(p.reached) else "-"
        drafting.add_row(p.proposer, f"\u2264{p.batch_bucket}", str(p.drafted), str(p.accepted),
                         f"{p.acceptance_rate:.2f}", examined, f"{p.events} ({p.probe_verifications})",
                         " ".join(f"{a:.2f}" for a in p.acceptance_by_position))
    if drafting.row_count:
        tables.append(drafting)
    policy = Table("proposer", "state", "why", "since", "last switched off", "last switched on",
                   "acceptance read (threshold)", title=f"{title}: drafting policy")
    for st in entry.policy:
        read = f"{st.acceptance:.2f}" if st.acceptance is not None else "no evidence"
        if st.threshold is not None:
            read += f" ({st.threshold:.2f})"
        policy.add_row(st.proposer, f"[green]{st.state}[/green]" if st.state == "on" else f"[red]{st.state}[/red]",
                       st.reason, _when(st.since), _when(st.last_switch_off), _when(st.last_switch_on),
                       f"{read} at batch \u2264{st.batch_bucket}")
    if policy.row_count:
        tables.append(policy)
    return tables


_ON_REASONS = ("drafted", "cold", "schema_on", "probe", "explore")  # a proposer drafting (a probe: a little)


def _ms(seconds: float | None) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds is not None else "-"


def pricing_line(p: DraftPricing, state: ProposerPolicyState | None) -> str:
    """One proposer's draft pricing in a sentence: the policy's decision, the evidence and the acceptance it is
    priced at, the plain step and the chosen (or the cheapest) draft length's price."""
    if state is not None:
        decision = f"{state.state} ({state.reason})"
    elif p.reason:
        decision = f"{'on' if p.reason in _ON_REASONS else 'off'} ({p.reason})"
    else:
        decision = "no policy decision recorded"
    first = p.priced_acceptance
    if p.cold:
        prior = "prior" if p.evidence_tokens <= 0 else f"prior + {p.evidence_tokens:.0f} tokens of evidence"
        if p.replayed_tokens > 0 and p.replayed_acceptance is not None:
            prior += f" + {p.replayed_tokens:.0f} replayed at {p.replayed_acceptance:.2f}"
        evidence = f"cold, {p.evidence_tokens:.0f} of {p.min_evidence_tokens} drafted tokens"
    else:
        prior = "measured"
        measured = f", acceptance {p.acceptance:.2f} per examined token" if p.acceptance is not None else ""
        evidence = f"{p.evidence_tokens:.0f} drafted tokens read{measured}"
    priced = f"priced at acceptance {first:.2f} ({prior})" if first is not None else "not priced"
    plain = p.plain
    if plain is None or plain.step_seconds is None:
        return (f"{p.proposer} at batch {p.batch_bucket}: {decision}: {evidence}, {priced}; no step cost known "
                f"(the cost model drafts k={p.chosen} to measure)")
    text = f"{p.proposer} at batch {p.batch_bucket}: {decision}: {evidence}, {priced}; plain step {_ms(plain.step_seconds)}; "
    best = p.best
    if best is None:
        return text + "no draft length priced"
    drafting = f" + {_ms(best.propose_seconds)} drafting" if best.propose_seconds > 0 else ""
    head = f"chose k={best.k}" if p.chosen else f"none pays by {100 * p.gain_margin:.0f}%, best k={best.k}"
    small = (f"; where every scored position allows few tokens (no output layer), k={p.restricted_chosen}"
             if p.restricted_chosen else "")
    return (text + f"{head}: {_ms(best.step_seconds)}/step{drafting}, {best.expected_accepted:.2f} accepted -> "
            f"{_ms(best.seconds_per_token)}/token vs {_ms(plain.step_seconds)} plain{small}")


def pricing_table(p: DraftPricing) -> Table:
    """Each draft length's price: the step, its ratio to the plain step, the drafting time, the expected accepted
    tokens and the time per committed token (the chosen length marked)."""
    table = Table("k", "step ms", "step / plain", "drafting ms", escape("E[accepted]"), "ms / token", "step from")
    plain = p.plain.step_seconds if p.plain is not None else None
    for d in p.prices:
        ratio = f"{d.step_seconds / plain:.2f}" if d.step_seconds is not None and plain else "-"
        table.add_row(f"{d.k}{' (chosen)' if d.k == p.chosen and d.k else ''}",
                      f"{1000 * d.step_seconds:.1f}" if d.step_seconds is not None else "-", ratio,
                      f"{1000 * d.propose_seconds:.2f}", f"{d.expected_accepted:.2f}",
                      f"{1000 * d.seconds_per_token:.1f}" if d.seconds_per_token is not None else "-",
                      d.step_source or "-")
    return table


def print_pricing(console: Console, entry: SchemaStats) -> None:
    """Per proposer: the decision and its numbers (``pricing_line``), then the prices by draft length."""
    states = {st.proposer: st for st in entry.policy}
    for p in entry.pricing:
        console.print(pricing_line(p, states.get(p.proposer)), markup=False, highlight=False, soft_wrap=True)
        console.print(pricing_table(p))


def _strict(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _json(value: Any) -> None:
    typer.echo(json.dumps(_strict(value), indent=2, ensure_ascii=False))


# -- commands --------------------------------------------------------------------------------------


def _input_errors(fn: Any) -> Any:
    """``StatsInputError`` -> ``error: <message>`` on stderr, exit 2."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> None:
        try:
            return fn(*args, **kwargs)
        except StatsInputError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return command


@stats_app.command("show")
@connection_options(SOURCE_CALL)
@_input_errors
def show(
    schema: Annotated[Optional[str], typer.Argument(help=SCHEMA_HELP, show_default=False)] = None,
    window: WindowOpt = "7d",
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output (for scripts)")] = False,
    server: ServerOpt = None,
    data_dir: DataDirOpt = None,
    store_url: StoreUrlOpt = None,
    *,
    conn: Connection,
) -> None:
    """A table per schema: requests, output tokens (mean, p50, p95), tokens per target pass, the estimated speedup
    over no drafting, the share truncated / cancelled / failed; acceptance per proposer, batch bucket and draft
    position; the drafting policy's state per proposer, why, and when it last switched it off and on; per proposer
    the draft pricing: the decision, the acceptance it is priced at and each draft length's measured cost."""
    seconds = parse_window(window)
    stats = _source(conn, server, data_dir, store_url).stats((seconds,), schema, model, False)
    if as_json:
        _json([dataclasses.asdict(s) for s in stats])
        return
    console = Console()
    if not stats:
        console.print("no statistics recorded in the window")
    for entry in stats:
        for table in schema_tables(entry, seconds):
            console.print(table)
        print_pricing(console, entry)


@stats_app.command("rejections")
@connection_options(SOURCE_CALL)
@_input_errors
def rejections(
    schema: Annotated[Optional[str], typer.Argument(help=SCHEMA_HELP, show_default=False)] = None,
    proposer: Annotated[Optional[str], typer.Option("--proposer", help="only this proposer's")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="at most this many, newest first")] = 20,
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output (token ids included)")] = False,
    server: ServerOpt = None,
    data_dir: DataDirOpt = None,
    store_url: StoreUrlOpt = None,
    *,
    conn: Connection,
) -> None:
    """Sampled rejected drafts: the context's last tokens, the drafted continuation, the position and token the
    target refused and what it chose (with --server: needs the admin token, the samples hold callers' input)."""
    drafts = _source(conn, server, data_dir, store_url).rejected(schema, model, proposer, limit)
    if as_json:
        _json([dataclasses.asdict(d) for d in drafts])
        return
    table = Table("when", "schema", "proposer", "pos", "context (end)", "drafted", "refused", "target chose",
                  title="rejected drafts, newest first")
    for d in drafts:
        table.add_row(_when(d.created_at), d.schema_key, d.proposer, str(d.position), escape(repr(d.context_text[-40:])),
                      escape(repr(d.draft_text)), escape(repr(d.rejected_text)) + ("" if d.grammatical else " (grammar)"),
                      escape(repr(d.target_text)))
    Console().print(table if drafts else "no rejected drafts sampled")


@stats_app.command("report")
@connection_options(SOURCE_CALL)
@_input_errors
def report(
    schema: Annotated[Optional[str], typer.Argument(help=SCHEMA_HELP, show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", help="the HTML file to write")] = Path("report.html"),
    window: WindowOpt = "7d",
    model: ModelOpt = None,
    samples: Annotated[int, typer.Option("--samples", min=0, max=1000, help="rejected drafts per schema (with "
                                                                            "--server they need the admin token)")] = 10,
    threshold: Annotated[Optional[float], typer.Option("--acceptance-threshold", help="the threshold line where no "
                                                                                      "policy change recorded one")] = None,
    server: ServerOpt = None,
    data_dir: DataDirOpt = None,
    store_url: StoreUrlOpt = None,
    *,
    conn: Connection,
) -> None:
    """One self-contained HTML file (it fetches nothing when viewed): an overview table, then per schema acceptance
    over time with the threshold and the policy's switches, acceptance by batch bucket and by draft position, the
    output-length distribution, latency p50/p99 and passes per token over time, the policy's state and the
    rejected drafts."""
    from structspec.report.page import ReportInput, render  # plotly: not at start-up

    seconds = parse_window(window)
    source = _source(conn, server, data_dir, store_url)
    stats = source.stats((seconds,), schema, model, True)
    rejected: dict[tuple[str, str], list[RejectedDraft]] = {}
    note = ""
    if samples:
        try:
            for entry in stats:  # by the statistics key itself: a schema deleted since still has its samples
                rejected[(entry.model, entry.schema_key)] = source.rejected(None, entry.model, None, samples,
                                                                            schema_key=entry.schema_key)
        except typer.Exit:
            note = "Rejected drafts not read: the server refused (they need the admin token: --admin-token-file)."
            rejected = {}
    else:
        note = "Rejected drafts left out (--samples 0)."
    page = render(ReportInput(stats, seconds, rejected, note, threshold, source.describe(), time.time()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    typer.echo(f"report written to {out} ({len(stats)} schema{'s' if len(stats) != 1 else ''}, "
               f"{len(page) / 1e6:.1f} MB)")


def register(app: typer.Typer) -> None:
    """Add the ``stats`` group to the main CLI."""
    app.add_typer(stats_app, name="stats")


def standalone_app() -> typer.Typer:
    app = typer.Typer(help="structspec statistics commands", no_args_is_help=True, add_completion=False)
    register(app)
    return app


if __name__ == "__main__":
    standalone_app()()
