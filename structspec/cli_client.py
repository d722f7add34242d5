"""Client sub-commands of the main ``structspec`` CLI: ``health``, ``extract``, ``call-tool``, ``chat``,
``schemas list|show|register|delete|set-speculation|stats``, ``load-draft`` and ``loadtest``.

The connection options (``--target``, the TLS options, the token files, ``--timeout``) are declared
once, as the fields of ``Connection``; ``@connection_options(...)`` gives a command the ones it
takes in place of its ``conn: Connection`` parameter and calls it with them built into one
``Connection``.

The main CLI mounts them with ``register(app)``. ``python -m structspec.cli_client ...`` runs
them standalone. The server command (``serve``) is in ``structspec.cli_serve``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import sys
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping, Optional, Sequence, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from structspec.schemas import load_builtin_tools

# The client (structspec.client, the health check, the load test) imports grpc and the protobuf messages, ~0.4 s
# measured on top of the CLI's own imports: the commands that call a server import it, so `structspec --help` and
# the commands that do not (serve, models, bench) start without it.

DEFAULT_TARGET = "localhost:50051"

# -- connection options, shared by the client commands ----------------------------------------------


def _token(path: Optional[Path], env: str) -> str | None:
    if path is not None:
        return path.read_text().strip() or None
    return os.environ.get(env) or None


@dataclass(frozen=True)
class Connection:
    """How a client command reaches the server. Each field is one command-line option (declared
    here only); a command without an option gets the field's default (a token then comes from the
    environment)."""

    target: Annotated[str, typer.Option("--target", "-t", envvar="STRUCTSPEC_TARGET", help="server host:port, or dns:///name:port for every replica behind a name (calls balanced round-robin)")] = DEFAULT_TARGET
    token_file: Annotated[Optional[Path], typer.Option("--token-file", help="file holding the bearer token (else env STRUCTSPEC_TOKEN)")] = None
    admin_token_file: Annotated[Optional[Path], typer.Option("--admin-token-file", help="file holding the admin token (else env STRUCTSPEC_ADMIN_TOKEN)")] = None
    tls: Annotated[bool, typer.Option("--tls/--no-tls", help="connect with TLS")] = False
    ca_file: Annotated[Optional[Path], typer.Option("--ca-file", help="PEM CA to trust (implies --tls)")] = None
    cert_file: Annotated[Optional[Path], typer.Option("--cert-file", help="client certificate for mutual TLS (implies --tls)")] = None
    key_file: Annotated[Optional[Path], typer.Option("--key-file", help="client key for mutual TLS")] = None
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="seconds, retries included")] = None
    wait: Annotated[float, typer.Option("--wait", help="first wait up to this many seconds for the server to be "
                                                       "SERVING (it loads its model after it starts listening)")] = 0.0

    @property
    def use_tls(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None

    def token(self) -> str | None:
        return _token(self.token_file, "STRUCTSPEC_TOKEN")

    def admin_token(self) -> str | None:
        return _token(self.admin_token_file, "STRUCTSPEC_ADMIN_TOKEN")

    def client(self) -> Any:
        from structspec.client import Client, TLSConfig  # grpc: see the note at the imports

        client = Client(
            self.target,
            token=self.token(),
            admin_token=self.admin_token(),
            tls=TLSConfig(self.ca_file, self.cert_file, self.key_file) if self.use_tls else None,
            timeout=self.timeout,
        )
        if self.wait > 0:
            try:
                client.wait_until_serving(self.wait)
            except Exception as exc:
                client.close()
                _fail(exc)
        return client


_FIELDS = [f.name for f in dataclasses.fields(Connection)]
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Connection)}
_OPTION_TYPES = typing.get_type_hints(Connection, include_extras=True)  # field -> Annotated[type, typer.Option]

# the option sets of the commands that call the API (as a user, or as the admin)
CALL = ("target", "token_file", "tls", "ca_file", "cert_file", "key_file", "timeout", "wait")
ADMIN_CALL = ("target", "admin_token_file", "tls", "ca_file", "cert_file", "key_file", "timeout", "wait")

F = TypeVar("F", bound=Callable[..., None])


def connection_options(names: Sequence[str], *, leading: Sequence[str] = (), defaults: Mapping[str, Any] | None = None) -> Callable[[F], F]:
    """Give a command the ``Connection`` options ``names`` where its ``conn: Connection``
    parameter is (in ``Connection``'s field order), and call it with ``conn=Connection(...)``.
    ``leading``: those of ``names`` listed before the command's own options instead;
    ``defaults``: this command's defaults where they differ from ``Connection``'s."""
    unknown = (set(names) | set(leading) | set(defaults or {})) - set(_FIELDS)
    if unknown or not set(leading) <= set(names):
        raise ValueError(f"not connection options of this command: {sorted(unknown or set(leading) - set(names))}")
    wanted = [n for n in _FIELDS if n in names]

    def option(name: str) -> inspect.Parameter:
        default = (defaults or {}).get(name, _DEFAULTS[name])
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_OPTION_TYPES[name])

    def decorate(fn: F) -> F:
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(fn).parameters.values()]
        names_own = [p.name for p in own]
        if "conn" not in names_own or set(names_own) & set(wanted):
            raise TypeError(f"{fn.__name__}: needs a `conn` parameter and no parameter named like a connection option")
        at = names_own.index("conn")
        params = ([option(n) for n in wanted if n in leading] + own[:at]
                  + [option(n) for n in wanted if n not in leading] + own[at + 1:])

        @functools.wraps(fn)
        def command(**kwargs: Any) -> None:
            conn = Connection(**{n: kwargs.pop(n) for n in wanted})
            return fn(conn=conn, **kwargs)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate


# -- helpers -----------------------------------------------------------------------------------------


def _fail(exc: Exception) -> None:
    from structspec.client import OutputError, StructSpecError, TruncatedOutputError  # grpc: see the imports

    if isinstance(exc, StructSpecError):
        typer.echo(f"error: {exc}", err=True)
        for v in exc.field_violations:
            where = f" at {v.json_pointer or '/'}" if v.json_pointer or v.keyword else ""
            typer.echo(f"  {v.field}{where}{f' ({v.keyword})' if v.keyword else ''}: {v.description}", err=True)
        raise typer.Exit(1)
    if isinstance(exc, TruncatedOutputError):
        typer.echo(f"error: {exc}\npartial output: {exc.partial_text}", err=True)
        raise typer.Exit(3)
    if isinstance(exc, OutputError):
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(3)
    raise exc


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _strict_json(value: Any) -> Any:
    """``value`` with infinite floats (the last histogram bucket's bound) as "inf": JSON has no infinity."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    return value


def _read_text(text: Optional[str], text_file: Optional[Path]) -> str:
    if text is not None:
        return text
    if text_file is None or str(text_file) == "-":
        return sys.stdin.read()
    return text_file.read_text()


def speculation_line(model: str, report: Any) -> str:
    """One line saying whether a request drafted and why, e.g.
    ``model gemma-3-270m: drafted (drafted); draft_model: batch_size, ngram: drafted (up to 8)``."""
    where = f"model {model or '?'}"
    if report is None:
        return f"{where}: no drafting decision reported"
    head = f"{where}: {'drafted' if report.drafted else 'no drafting'} ({report.reason}{', probe' if report.probe else ''})"
    parts = [f"{p}: {r}" + (f" (up to {report.max_draft[p]})" if p in report.max_draft else "")
             for p, r in sorted(report.reasons.items())]
    return head + ("; " + ", ".join(parts) if parts else "")


def _read_examples(path: Optional[Path]) -> list[tuple[str, Any]]:
    """``[{"text": ..., "output": ...}, ...]`` from a JSON file; the server checks each output against the schema."""
    if path is None:
        return []
    try:
        loaded = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        typer.echo(f"error: --examples-file {path}: {exc}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(loaded, list) or not all(
            isinstance(e, dict) and isinstance(e.get("text"), str) and "output" in e for e in loaded):
        typer.echo(f'error: --examples-file {path}: expected a JSON list of {{"text": str, "output": ...}}', err=True)
        raise typer.Exit(2)
    return [(e["text"], e["output"]) for e in loaded]


# -- commands ----------------------------------------------------------------------------------------


@connection_options(("target", "tls", "ca_file", "cert_file", "key_file"), leading=("target",))
def health(
    service: Annotated[str, typer.Option(help="service name ('' = whole server)")] = "",
    *,
    conn: Connection,
    timeout: Annotated[float, typer.Option(help="seconds")] = 3.0,
) -> None:
    """Print the server's health status; exit 0 when SERVING (no token needed)."""
    from structspec.service.healthcheck import check  # grpc: see the note at the imports

    path = lambda p: str(p) if p else None  # noqa: E731
    status = check(conn.target, service, timeout, conn.use_tls, path(conn.ca_file), path(conn.cert_file), path(conn.key_file))
    typer.echo(status)
    raise typer.Exit(0 if status == "SERVING" else 1)


@connection_options(CALL)
def extract(
    text: Annotated[Optional[str], typer.Option("--text", help="input text (else --text-file, else stdin)")] = None,
    text_file: Annotated[Optional[Path], typer.Option("--text-file", help="file with the input text ('-' = stdin)")] = None,
    schema_id: Annotated[Optional[str], typer.Option("--schema-id", "-s", help="registered schema id")] = None,
    version: Annotated[Optional[int], typer.Option("--version", help="schema version (default: latest)")] = None,
    schema_file: Annotated[Optional[Path], typer.Option("--schema-file", help="inline JSON Schema file")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="most output tokens")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 = greedy")] = None,
    seed: Annotated[Optional[int], typer.Option(help="sampling seed")] = None,
    speculation: Annotated[str, typer.Option(help="auto | off")] = "auto",
    stream: Annotated[bool, typer.Option("--stream", help="print text as it is generated")] = False,
    full: Annotated[bool, typer.Option("--full", help="print the whole result (usage, timings, ...)")] = False,
    examples_file: Annotated[Optional[Path], typer.Option("--examples-file", help='JSON list of worked examples [{"text": ..., "output": ...}] (a base model such as Gemma needs one)')] = None,
    *,
    conn: Connection,
) -> None:
    """Extract a JSON instance of a schema from text. The value goes to stdout; whether the request drafted,
    and why, to stderr."""
    # grpc: see the note at the imports
    from structspec.client import ExtractionResult, TextDelta
    from structspec.client.convert import check_output

    if (schema_id is None) == (schema_file is None):
        typer.echo("error: give exactly one of --schema-id and --schema-file", err=True)
        raise typer.Exit(2)
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "speculation": speculation,
                              "examples": _read_examples(examples_file)}
    if schema_id is not None:
        kwargs.update(schema_id=schema_id, version=version)
    else:
        kwargs["schema"] = json.loads(schema_file.read_text())  # type: ignore[union-attr]
    body = _read_text(text, text_file)
    with conn.client() as client:
        try:
            result = None
            if stream:
                for item in client.extract_stream(body, **kwargs):
                    if isinstance(item, TextDelta):
                        typer.echo(item.text, nl=False)
                    elif isinstance(item, ExtractionResult):
                        result = item
                typer.echo("")
                if full and result is not None:
                    _print_json(asdict(result))
            else:
                result = client.extract_result(body, **kwargs)
                if full:
                    _print_json(asdict(result))
                else:
                    check_output(result)  # as Client.extract: a truncated or violating output is an error
                    _print_json(result.value)
        except Exception as exc:
            _fail(exc)
    if result is not None:
        typer.echo(speculation_line(result.model, result.speculation), err=True)


@connection_options(CALL)
def call_tool(
    message: Annotated[list[str], typer.Option("--message", "-m", help="'role: content' (repeatable), e.g. 'user: weather in Oslo?'")] = [],  # noqa: B006
    messages_file: Annotated[Optional[Path], typer.Option("--messages-file", help="JSON list of {role, content}")] = None,
    tools_file: Annotated[Optional[Path], typer.Option("--tools-file", help="JSON list of OpenAI-style tools (default: the built-in agent tools)")] = None,
    tool_choice: Annotated[str, typer.Option(help="auto | required | none | <tool name>")] = "auto",
    parallel: Annotated[bool, typer.Option("--parallel", help="allow several calls")] = False,
    max_tokens: Annotated[Optional[int], typer.Option(help="most output tokens")] = None,
    examples_file: Annotated[Optional[Path], typer.Option("--examples-file", help='JSON list of worked examples [{"text": ..., "output": ...}] (a base model such as Gemma needs one)')] = None,
    *,
    conn: Connection,
) -> None:
    """Answer messages with tool calls (each with its id), or a text answer where --tool-choice allows one."""
    msgs = _read_messages(message, messages_file)
    if tools_file is not None:
        loaded = json.loads(tools_file.read_text())
        tools = loaded["tools"] if isinstance(loaded, dict) else loaded
    else:
        tools = load_builtin_tools()
    with conn.client() as client:
        try:
            result = client.call_tool(msgs, tools, tool_choice=tool_choice, parallel=parallel, max_tokens=max_tokens,
                                      examples=_read_examples(examples_file))
        except Exception as exc:
            _fail(exc)
        _print_json({"calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in result.calls],
                     "text": result.text, "finish_reason": result.finish_reason, "usage": asdict(result.usage), "model": result.model, "draft_version": result.draft_version,
                     "speculation": asdict(result.speculation) if result.speculation is not None else None})
        typer.echo(speculation_line(result.model, result.speculation), err=True)


def _read_messages(message: Sequence[str], messages_file: Optional[Path]) -> list[dict[str, Any]]:
    """--messages-file's list, then each --message 'role: content' (a bare text is a user turn). Exit 2: none."""
    msgs: list[dict[str, Any]] = json.loads(messages_file.read_text()) if messages_file else []
    for m in message:
        role, sep, content = m.partition(":")
        if not sep:
            role, content = "user", m
        msgs.append({"role": role.strip(), "content": content.strip()})
    if not msgs:
        typer.echo("error: give --message or --messages-file", err=True)
        raise typer.Exit(2)
    return msgs


@connection_options(CALL)
def chat(
    message: Annotated[list[str], typer.Option("--message", "-m", help="'role: content' (repeatable), e.g. 'user: say hello'")] = [],  # noqa: B006
    messages_file: Annotated[Optional[Path], typer.Option("--messages-file", help="JSON list of {role, content}")] = None,
    stop: Annotated[list[str], typer.Option("--stop", help="a stop string (repeatable, at most 4)")] = [],  # noqa: B006
    max_tokens: Annotated[Optional[int], typer.Option(help="most output tokens")] = None,
    stream: Annotated[bool, typer.Option("--stream", help="print the text as it is decoded")] = False,
    *,
    conn: Connection,
) -> None:
    """Answer messages with free text (no schema, no tools); the finish reason and usage go to stderr."""
    msgs = _read_messages(message, messages_file)
    with conn.client() as client:
        try:
            if stream:
                result = None
                for item in client.chat_stream(msgs, stop=stop, max_tokens=max_tokens):
                    if hasattr(item, "finish_reason"):  # the result, after the deltas (no client import here)
                        result = item
                    else:
                        typer.echo(item.text, nl=False)
                typer.echo("")
            else:
                result = client.chat(msgs, stop=stop, max_tokens=max_tokens)
                typer.echo(result.text)
        except Exception as exc:
            _fail(exc)
    assert result is not None
    typer.echo(f"finish_reason={result.finish_reason} prompt_tokens={result.usage.prompt_tokens} "
               f"output_tokens={result.usage.output_tokens} passes={result.usage.target_forward_passes}", err=True)
    typer.echo(speculation_line(result.model, result.speculation), err=True)


schemas_app = typer.Typer(help="The schema registry: list, show, register, delete, set-speculation, stats.",
                          no_args_is_help=True)


@schemas_app.command("list")
@connection_options(CALL)
def schemas_list(
    schema_id: Annotated[Optional[str], typer.Argument(help="only this id")] = None,
    all_versions: Annotated[bool, typer.Option("--all-versions", help="every version, not only the latest")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
    *,
    conn: Connection,
) -> None:
    """List registered schemas."""
    with conn.client() as client:
        try:
            items = client.list_schemas(schema_id, all_versions=all_versions, omit_content=True)
        except Exception as exc:
            _fail(exc)
    if as_json:
        _print_json([{"schema_id": s.schema_id, "version": s.version, "sha256": s.sha256, "source": s.source,
                      "created_at": s.created_at.isoformat(), "description": s.description,
                      "speculation": s.speculation} for s in items])
        return
    table = Table("id", "version", "source", "created", "sha256", "speculation", "description")
    for s in items:
        table.add_row(s.schema_id, str(s.version), s.source, s.created_at.strftime("%Y-%m-%d %H:%M"), s.sha256[:12],
                      s.speculation, s.description[:60])
    Console().print(table)


@schemas_app.command("show")
@connection_options(CALL)
def schemas_show(
    schema_id: Annotated[str, typer.Argument(help="schema id")],
    version: Annotated[Optional[int], typer.Option("--version", help="default: latest")] = None,
    *,
    conn: Connection,
) -> None:
    """Print one schema version (JSON)."""
    with conn.client() as client:
        try:
            s = client.get_schema(schema_id, version)
        except Exception as exc:
            _fail(exc)
    _print_json({"schema_id": s.schema_id, "version": s.version, "sha256": s.sha256, "source": s.source,
                 "created_at": s.created_at.isoformat(), "description": s.description, "speculation": s.speculation,
                 "schema": s.schema})


@schemas_app.command("register")
@connection_options(ADMIN_CALL)
def schemas_register(
    schema_id: Annotated[str, typer.Argument(help="schema id")],
    schema_file: Annotated[Path, typer.Argument(help="JSON Schema file ('-' = stdin)")],
    description: Annotated[str, typer.Option(help="free text")] = "",
    *,
    conn: Connection,
) -> None:
    """Register a schema version (same content: the existing version). Needs the admin token."""
    text = sys.stdin.read() if str(schema_file) == "-" else schema_file.read_text()
    with conn.client() as client:
        try:
            s = client.register_schema(schema_id, text, description=description)
        except Exception as exc:
            _fail(exc)
    typer.echo(f"{s.schema_id}@{s.version} {'registered' if s.created else 'unchanged (already registered)'}")


@schemas_app.command("delete")
@connection_options(ADMIN_CALL)
def schemas_delete(
    schema_id: Annotated[str, typer.Argument(help="schema id")],
    version: Annotated[Optional[int], typer.Option("--version", help="default: every version")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    *,
    conn: Connection,
) -> None:
    """Delete a version (or every version) of a schema. Needs the admin token."""
    what = f"{schema_id} version {version}" if version is not None else f"every version of {schema_id}"
    if not yes and not typer.confirm(f"delete {what}?"):
        raise typer.Exit(1)
    with conn.client() as client:
        try:
            deleted = client.delete_schema(schema_id, version)
        except Exception as exc:
            _fail(exc)
    typer.echo(f"deleted {schema_id} versions {', '.join(map(str, deleted))}")


SCHEMA_SPECULATION_MODES = ("auto", "off", "on")


@schemas_app.command("set-speculation")
@connection_options(ADMIN_CALL)
def schemas_set_speculation(
    schema_id: Annotated[str, typer.Argument(help="schema id")],
    mode: Annotated[str, typer.Argument(help="auto (the drafting policy decides), off (never draft) or on (always "
                                             "draft, the policy bypassed)", show_default=False)],
    version: Annotated[Optional[int], typer.Option("--version", help="default: latest")] = None,
    *,
    conn: Connection,
) -> None:
    """Set a schema version's drafting override (auto, off or on). Needs the admin token."""
    if mode not in SCHEMA_SPECULATION_MODES:
        typer.echo(f"error: MODE must be one of {', '.join(SCHEMA_SPECULATION_MODES)}, got {mode!r}", err=True)
        raise typer.Exit(2)
    with conn.client() as client:
        try:
            s = client.set_schema_speculation(schema_id, mode, version)
        except Exception as exc:
            _fail(exc)
    typer.echo(f"{s.schema_id}@{s.version} speculation {s.speculation}")


def window_label(seconds: int) -> str:
    """300 -> 5m, 3600 -> 1h, 86400 -> 1d; other lengths in seconds."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def stats_tables(entry: Any) -> list[Any]:
    """The rich tables of one (model, schema) entry: requests, drafting per proposer, decisions; one row per window."""
    names = sorted({n for w in entry.windows.values() for n in w.names})  # an inline schema's readable names
    title = f"{entry.schema_key}{' (' + ', '.join(names) + ')' if names else ''} on {entry.model or '?'}"
    requests = Table("window", "requests", "output tokens p50 / p95", "passes / token", "latency ms p50 / p99",
                     "finish", title=f"{title}: requests")
    drafting = Table("window", "proposer", "batch", "drafted", "accepted", "acceptance", "verifications (probes)",
                     "acceptance by draft position", title=f"{title}: drafting")
    decisions = Table("window", "proposer", "reason", "requests", title=f"{title}: decisions")
    for seconds, w in entry.windows.items():
        label = window_label(seconds)
        finish = ", ".join(f"{k} {v}" for k, v in sorted(w.finish_reasons.items())) or "-"
        requests.add_row(label, str(w.requests), f"{w.output_tokens_p50:.0f} / {w.output_tokens_p95:.0f}",
                         f"{w.passes_per_token:.2f}", f"{w.latency_ms_p50:.0f} / {w.latency_ms_p99:.0f}", finish)
        for p in w.proposers:
            drafting.add_row(label, p.proposer, str(p.batch_bucket), str(p.drafted), str(p.accepted),
                             f"{p.acceptance_rate:.2f}", f"{p.events} ({p.probe_verifications})",
                             " ".join(f"{a:.2f}" for a in p.acceptance_by_position))
        for d in w.decisions:
            decisions.add_row(label, d.proposer or "(request)", d.reason, str(d.requests))
    return [t for t in (requests, drafting, decisions) if t.row_count]


@schemas_app.command("stats")
@connection_options((*CALL, "admin_token_file"))
def schemas_stats(
    schema_id: Annotated[Optional[str], typer.Argument(help="schema id (default: every schema with statistics)")] = None,
    version: Annotated[Optional[int], typer.Option("--version", help="default: latest")] = None,
    key: Annotated[Optional[str], typer.Option("--key", help="a schema key such as invoice@2 or inline:...")] = None,
    window: Annotated[list[int], typer.Option("--window", help="window in seconds (repeatable; default 3600, 86400, 604800: 1 h, 24 h, 7 d)")] = [],  # noqa: B006
    model: Annotated[Optional[str], typer.Option("--model", help="statistics of this model (default: one schema: the "
                                                                 "server's model; every schema: every model)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
    *,
    conn: Connection,
) -> None:
    """Statistics per model and schema: requests, output lengths, passes per token, finish reasons, drafting
    per proposer and batch bucket (with acceptance by draft position) and the drafting decisions' reasons.
    Where the server has tokens, only the admin token reads inline schemas' and tool lists' statistics."""
    with conn.client() as client:
        try:
            if schema_id is None and key is None:
                stats = client.list_schema_stats(window, model=model)
            else:
                stats = [client.get_schema_stats(schema_id, version, schema_key=key, windows=window, model=model)]
        except Exception as exc:
            _fail(exc)
    if as_json:
        _print_json(_strict_json([asdict(s) for s in stats]))
        return
    console = Console()
    if not stats:
        console.print("no statistics recorded")
    for entry in stats:
        for table in stats_tables(entry):
            console.print(table)


@connection_options(("target", "token_file"), leading=("target",), defaults={"target": "127.0.0.1:50051"})
def loadtest(
    concurrency: Annotated[str, typer.Option(help="comma-separated concurrency levels")] = "1,8,32",
    requests: Annotated[int, typer.Option(help="requests per level")] = 64,
    schema_id: Annotated[str, typer.Option("--schema-id", "-s", help="registered schema to extract")] = "contact",
    max_tokens: Annotated[Optional[int], typer.Option(help="most output tokens per request")] = None,
    *,
    conn: Connection,
) -> None:
    """Loopback load test: requests/s and p99 latency per concurrency level."""
    from structspec.bench.loadtest import run_load  # grpc: see the note at the imports

    levels = tuple(int(x) for x in concurrency.split(",") if x.strip())
    report = run_load(conn.target, levels, requests, schema_id=schema_id, max_tokens=max_tokens, token=conn.token())
    typer.echo(report.table())


@connection_options(ADMIN_CALL)
def load_draft(
    path: Annotated[str, typer.Argument(help="the draft model's folder on the server (config.json, weights, tokenizer "
                                             "files or draft_vocab.json)", show_default=False)],
    *,
    conn: Connection,
) -> None:
    """Make a running server draft with another draft model, without a restart: requests admitted from then on use
    it (their statistics under its version), requests in flight finish on theirs. Needs the admin token."""
    with conn.client() as client:
        try:
            swap = client.load_draft(path)
        except Exception as exc:
            _fail(exc)
    if swap.loaded:
        typer.echo(f"draft {swap.draft_version} loaded: model {swap.model} (was {swap.previous_model})")
    else:
        typer.echo(f"draft {swap.draft_version} is serving already: model {swap.model} (nothing changed)")


COMMANDS: dict[str, Callable[..., None]] = {
    "health": health,
    "extract": extract,
    "call-tool": call_tool,
    "chat": chat,
    "load-draft": load_draft,
    "loadtest": loadtest,
}


def register(app: typer.Typer) -> None:
    """Add the client commands (and the ``schemas`` group) to the main CLI."""
    for name, fn in COMMANDS.items():
        app.command(name, help=inspect.getdoc(fn))(fn)
    app.add_typer(schemas_app, name="schemas")


def standalone_app() -> typer.Typer:
    app = typer.Typer(help="structspec client commands", no_args_is_help=True, add_completion=False)
    register(app)
    return app


if __name__ == "__main__":
    standalone_app()()
