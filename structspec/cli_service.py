"""Service sub-commands for the main ``structspec`` CLI: ``serve``, ``health``, ``extract``,
``call-tool``, ``schemas list|show|register|delete|stats`` and ``loadtest``.

The main CLI mounts them with ``register(app)``. ``python -m structspec.cli_service ...`` runs
them standalone.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from structspec.service.settings import SECRET_FIELDS, SettingsError, env_var, field_type, settings_fields

# -- serve: one option per settings field, generated so --help documents every setting --------------


def _default_text(name: str) -> str:
    if name == "data_dir":
        return "$XDG_DATA_HOME/structspec or ~/.local/share/structspec"
    default = {f.name: f.default for f in settings_fields()}[name]
    return "none" if default is None or default == "" else str(default)


def _serve_parameters() -> list[inspect.Parameter]:
    params = [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--config", help=f"TOML settings file (keys = the option names; env {ENV_CONFIG})", show_default=False),
            annotation=Optional[Path],
        )
    ]
    for f in settings_fields():
        if f.name in SECRET_FIELDS:
            continue
        flag = f.name.replace("_", "-")
        choices = f.metadata.get("choices")
        text = f.metadata["help"] + (f" (one of: {', '.join(choices)})" if choices else "")
        text += f" (default: {_default_text(f.name)}; env {env_var(f.name)})"
        tp = field_type(f.name)
        decls = [f"--{flag}/--no-{flag}"] if tp is bool else [f"--{flag}"]
        opt = typer.Option(None, *decls, help=text, show_default=False)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=Optional[tp]))
    return params


ENV_CONFIG = "STRUCTSPEC_CONFIG"


def serve(**options: Any) -> None:
    """Run the gRPC server: loads the model (health NOT_SERVING meanwhile), serves until SIGTERM,
    then drains. Precedence: flags > STRUCTSPEC_* environment > --config file > defaults.
    Token values come from STRUCTSPEC_AUTH_TOKEN / STRUCTSPEC_ADMIN_TOKEN or the *-token-file options."""
    from structspec.service.server import default_engine_factory, run_server
    from structspec.service.settings import load_settings

    config = options.pop("config", None)
    try:
        settings = load_settings(config, overrides=options)
    except SettingsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run_server(settings, default_engine_factory))


serve.__signature__ = inspect.Signature(_serve_parameters())  # type: ignore[attr-defined]
serve.__annotations__ = {p.name: p.annotation for p in serve.__signature__.parameters.values()}  # type: ignore[attr-defined]


# -- client options shared by the client commands ---------------------------------------------------

Target = Annotated[str, typer.Option("--target", "-t", envvar="STRUCTSPEC_TARGET", help="server host:port")]
TokenFile = Annotated[Optional[Path], typer.Option("--token-file", help="file holding the bearer token (else env STRUCTSPEC_TOKEN)")]
AdminTokenFile = Annotated[Optional[Path], typer.Option("--admin-token-file", help="file holding the admin token (else env STRUCTSPEC_ADMIN_TOKEN)")]
Tls = Annotated[bool, typer.Option("--tls/--no-tls", help="connect with TLS")]
CaFile = Annotated[Optional[Path], typer.Option("--ca-file", help="PEM CA to trust (implies --tls)")]
CertFile = Annotated[Optional[Path], typer.Option("--cert-file", help="client certificate for mutual TLS (implies --tls)")]
KeyFile = Annotated[Optional[Path], typer.Option("--key-file", help="client key for mutual TLS")]
Timeout = Annotated[Optional[float], typer.Option("--timeout", help="seconds, retries included")]
DEFAULT_TARGET = "localhost:50051"


def _token(path: Optional[Path], env: str) -> str | None:
    if path is not None:
        return path.read_text().strip() or None
    return os.environ.get(env) or None


def _client(target: str, token_file: Optional[Path], tls: bool, ca_file: Optional[Path], cert_file: Optional[Path], key_file: Optional[Path],
            timeout: Optional[float], admin_token_file: Optional[Path] = None) -> Any:
    from structspec.client import Client, TLSConfig

    use_tls = tls or ca_file is not None or cert_file is not None
    return Client(
        target,
        token=_token(token_file, "STRUCTSPEC_TOKEN"),
        admin_token=_token(admin_token_file, "STRUCTSPEC_ADMIN_TOKEN"),
        tls=TLSConfig(ca_file, cert_file, key_file) if use_tls else None,
        timeout=timeout,
    )


def _fail(exc: Exception) -> None:
    from structspec.client import OutputError, StructSpecError, TruncatedOutputError

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


def _read_text(text: Optional[str], text_file: Optional[Path]) -> str:
    if text is not None:
        return text
    if text_file is None or str(text_file) == "-":
        return sys.stdin.read()
    return text_file.read_text()


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


def health(
    target: Target = DEFAULT_TARGET,
    service: Annotated[str, typer.Option(help="service name ('' = whole server)")] = "",
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Annotated[float, typer.Option(help="seconds")] = 3.0,
) -> None:
    """Print the server's health status; exit 0 when SERVING (no token needed)."""
    from structspec.service.healthcheck import check

    use_tls = tls or ca_file is not None or cert_file is not None
    status = check(target, service, timeout, use_tls, str(ca_file) if ca_file else None, str(cert_file) if cert_file else None, str(key_file) if key_file else None)
    typer.echo(status)
    raise typer.Exit(0 if status == "SERVING" else 1)


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
    target: Target = DEFAULT_TARGET,
    token_file: TokenFile = None,
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Timeout = None,
) -> None:
    """Extract a JSON instance of a schema from text."""
    from dataclasses import asdict

    from structspec.client import ExtractionResult, TextDelta

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
    with _client(target, token_file, tls, ca_file, cert_file, key_file, timeout) as client:
        try:
            if stream:
                result = None
                for item in client.extract_stream(body, **kwargs):
                    if isinstance(item, TextDelta):
                        typer.echo(item.text, nl=False)
                    elif isinstance(item, ExtractionResult):
                        result = item
                typer.echo("")
                if full and result is not None:
                    _print_json(asdict(result))
            elif full:
                _print_json(asdict(client.extract_result(body, **kwargs)))
            else:
                _print_json(client.extract(body, **kwargs))
        except Exception as exc:
            _fail(exc)


def call_tool(
    message: Annotated[list[str], typer.Option("--message", "-m", help="'role: content' (repeatable), e.g. 'user: weather in Oslo?'")] = [],  # noqa: B006
    messages_file: Annotated[Optional[Path], typer.Option("--messages-file", help="JSON list of {role, content}")] = None,
    tools_file: Annotated[Optional[Path], typer.Option("--tools-file", help="JSON list of OpenAI-style tools (default: the built-in agent tools)")] = None,
    tool_choice: Annotated[str, typer.Option(help="auto | required | none | <tool name>")] = "auto",
    parallel: Annotated[bool, typer.Option("--parallel", help="allow several calls")] = False,
    max_tokens: Annotated[Optional[int], typer.Option(help="most output tokens")] = None,
    examples_file: Annotated[Optional[Path], typer.Option("--examples-file", help='JSON list of worked examples [{"text": ..., "output": ...}] (a base model such as Gemma needs one)')] = None,
    target: Target = DEFAULT_TARGET,
    token_file: TokenFile = None,
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Timeout = None,
) -> None:
    """Answer messages with tool calls."""
    from dataclasses import asdict

    msgs: list[dict[str, str]] = json.loads(messages_file.read_text()) if messages_file else []
    for m in message:
        role, sep, content = m.partition(":")
        if not sep:
            role, content = "user", m
        msgs.append({"role": role.strip(), "content": content.strip()})
    if not msgs:
        typer.echo("error: give --message or --messages-file", err=True)
        raise typer.Exit(2)
    if tools_file is not None:
        loaded = json.loads(tools_file.read_text())
        tools = loaded["tools"] if isinstance(loaded, dict) else loaded
    else:
        from structspec.schemas import load_builtin_tools

        tools = load_builtin_tools()
    with _client(target, token_file, tls, ca_file, cert_file, key_file, timeout) as client:
        try:
            result = client.call_tool(msgs, tools, tool_choice=tool_choice, parallel=parallel, max_tokens=max_tokens,
                                      examples=_read_examples(examples_file))
        except Exception as exc:
            _fail(exc)
        _print_json({"calls": [{"name": c.name, "arguments": c.arguments} for c in result.calls], "text": result.text, "usage": asdict(result.usage)})


schemas_app = typer.Typer(help="The schema registry: list, show, register, delete, stats.", no_args_is_help=True)


@schemas_app.command("list")
def schemas_list(
    schema_id: Annotated[Optional[str], typer.Argument(help="only this id")] = None,
    all_versions: Annotated[bool, typer.Option("--all-versions", help="every version, not only the latest")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
    target: Target = DEFAULT_TARGET,
    token_file: TokenFile = None,
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Timeout = None,
) -> None:
    """List registered schemas."""
    with _client(target, token_file, tls, ca_file, cert_file, key_file, timeout) as client:
        try:
            items = client.list_schemas(schema_id, all_versions=all_versions, omit_content=True)
        except Exception as exc:
            _fail(exc)
    if as_json:
        _print_json([{"schema_id": s.schema_id, "version": s.version, "sha256": s.sha256, "source": s.source,
                      "created_at": s.created_at.isoformat(), "description": s.description} for s in items])
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "version", "source", "created", "sha256", "description")
    for s in items:
        table.add_row(s.schema_id, str(s.version), s.source, s.created_at.strftime("%Y-%m-%d %H:%M"), s.sha256[:12], s.description[:60])
    Console().print(table)


@schemas_app.command("show")
def schemas_show(
    schema_id: Annotated[str, typer.Argument(help="schema id")],
    version: Annotated[Optional[int], typer.Option("--version", help="default: latest")] = None,
    target: Target = DEFAULT_TARGET,
    token_file: TokenFile = None,
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Timeout = None,
) -> None:
    """Print one schema version (JSON)."""
    with _client(target, token_file, tls, ca_file, cert_file, key_file, timeout) as client:
        try:
            s = client.get_schema(schema_id, version)
        except Exception as exc:
            _fail(exc)
    _print_json({"schema_id": s.schema_id, "version": s.version, "sha256": s.sha256, "source": s.source,
                 "created_at": s.created_at.isoformat(), "description": s.description, "schema": s.schema})


@schemas_app.command("register")
def schemas_register(
    schema_id: Annotated[str, typer.Argument(help="schema id")],
    schema_file: Annotated[Path, typer.Argument(help="JSON Schema file ('-' = stdin)")],
    description: Annotated[str, typer.Option(help="free text")] = "",
    target: Target = DEFAULT_TARGET,
    admin_token_file: AdminTokenFile = None,
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Timeout = None,
) -> None:
    """Register a schema version (same content: the existing version). Needs the admin token."""
    text = sys.stdin.read() if str(schema_file) == "-" else schema_file.read_text()
    with _client(target, None, tls, ca_file, cert_file, key_file, timeout, admin_token_file) as client:
        try:
            s = client.register_schema(schema_id, text, description=description)
        except Exception as exc:
            _fail(exc)
    typer.echo(f"{s.schema_id}@{s.version} {'registered' if s.created else 'unchanged (already registered)'}")


@schemas_app.command("delete")
def schemas_delete(
    schema_id: Annotated[str, typer.Argument(help="schema id")],
    version: Annotated[Optional[int], typer.Option("--version", help="default: every version")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    target: Target = DEFAULT_TARGET,
    admin_token_file: AdminTokenFile = None,
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Timeout = None,
) -> None:
    """Delete a version (or every version) of a schema. Needs the admin token."""
    what = f"{schema_id} version {version}" if version is not None else f"every version of {schema_id}"
    if not yes and not typer.confirm(f"delete {what}?"):
        raise typer.Exit(1)
    with _client(target, None, tls, ca_file, cert_file, key_file, timeout, admin_token_file) as client:
        try:
            deleted = client.delete_schema(schema_id, version)
        except Exception as exc:
            _fail(exc)
    typer.echo(f"deleted {schema_id} versions {', '.join(map(str, deleted))}")


@schemas_app.command("stats")
def schemas_stats(
    schema_id: Annotated[Optional[str], typer.Argument(help="schema id (default: every schema with statistics)")] = None,
    version: Annotated[Optional[int], typer.Option("--version", help="default: latest")] = None,
    key: Annotated[Optional[str], typer.Option("--key", help="a schema key such as invoice@2 or inline:...")] = None,
    window: Annotated[list[int], typer.Option("--window", help="window in seconds (repeatable; default 300, 3600, 86400)")] = [],  # noqa: B006
    target: Target = DEFAULT_TARGET,
    token_file: TokenFile = None,
    tls: Tls = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    timeout: Timeout = None,
) -> None:
    """Speculation statistics (drafted/accepted per proposer and batch bucket)."""
    from dataclasses import asdict

    with _client(target, token_file, tls, ca_file, cert_file, key_file, timeout) as client:
        try:
            if schema_id is None and key is None:
                stats = client.list_schema_stats(window)
            else:
                stats = [client.get_schema_stats(schema_id, version, schema_key=key, windows=window)]
        except Exception as exc:
            _fail(exc)
    _print_json([asdict(s) for s in stats])


def loadtest(
    target: Target = "127.0.0.1:50051",
    concurrency: Annotated[str, typer.Option(help="comma-separated concurrency levels")] = "1,8,32",
    requests: Annotated[int, typer.Option(help="requests per level")] = 64,
    schema_id: Annotated[str, typer.Option("--schema-id", "-s", help="registered schema to extract")] = "contact",
    max_tokens: Annotated[Optional[int], typer.Option(help="most output tokens per request")] = None,
    token_file: TokenFile = None,
) -> None:
    """Loopback load test: requests/s and p99 latency per concurrency level."""
    from structspec.service.loadtest import run_load

    levels = tuple(int(x) for x in concurrency.split(",") if x.strip())
    report = run_load(target, levels, requests, schema_id=schema_id, max_tokens=max_tokens, token=_token(token_file, "STRUCTSPEC_TOKEN"))
    typer.echo(report.table())


COMMANDS: dict[str, Callable[..., None]] = {
    "serve": serve,
    "health": health,
    "extract": extract,
    "call-tool": call_tool,
    "loadtest": loadtest,
}


def register(app: typer.Typer) -> None:
    """Add the service commands (and the ``schemas`` group) to the main CLI."""
    for name, fn in COMMANDS.items():
        app.command(name, help=inspect.getdoc(fn))(fn)
    app.add_typer(schemas_app, name="schemas")


def standalone_app() -> typer.Typer:
    app = typer.Typer(help="structspec service commands", no_args_is_help=True, add_completion=False)
    register(app)
    return app




if __name__ == "__main__":
    standalone_app()()
