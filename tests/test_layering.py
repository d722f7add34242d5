"""The packages' dependencies run one way: read every import (function-level ones too) and check them."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "structspec"

# What each package (or top-level module) may import from the project. Everything else is a layering bug.
ALLOWED: dict[str, set[str]] = {
    "proto_gen": set(),
    "json_limits": set(),  # how deep a caller's JSON may nest: the server's limits, which the client checks too
    "grammar": {"json_limits"},
    "models": set(),
    "prompts": set(),
    "schemas": set(),
    "stats": set(),  # counters, the book and their summaries: recorded by the engine, kept by the store
    "store": {"stats"},
    "client": {"json_limits", "proto_gen"},
    "engine": {"grammar", "models", "prompts", "schemas", "stats"},  # the Speculator protocol is the engine's own
    "speculation": {"engine", "grammar", "models", "stats", "store"},
    "assembly": {"engine", "grammar", "models", "speculation", "stats"},
    "service": {"engine", "grammar", "prompts", "proto_gen", "schemas", "speculation", "stats", "store"},
    "demo": {"prompts", "schemas"},
    "bench": {"assembly", "client", "demo", "engine", "grammar", "models", "prompts", "schemas", "speculation", "stats",
              "store"},  # bench decode --data-dir records its traffic in a store
    # drafts made from their target: the workloads' items and step timing reused, the engine answers for the target
    "draft": {"assembly", "bench", "engine", "models", "speculation", "stats"},
    "cli": {"bench", "demo", "models", "cli_client", "cli_draft", "cli_serve", "cli_stats"},
    "cli_draft": {"assembly", "draft", "models", "service", "stats", "store"},
    "cli_serve": {"service"},
    "cli_client": {"bench", "client", "schemas", "service"},
    "cli_stats": {"cli_client", "client", "report", "service", "store"},  # a store read here, or a server asked
    "report": {"client"},  # the HTML report renders the client's statistics values
}


def project_imports() -> dict[str, set[str]]:
    """package -> the other project packages its modules import (module-level and inside functions)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("").parts
        package = rel[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "structspec"]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "structspec" and len(parts) > 1 and parts[1] != package:
                    edges[package].add(parts[1])
    return edges


def test_every_import_follows_the_layering():
    edges = project_imports()
    assert "grammar" in edges["engine"] and "engine" in edges["speculation"]  # the scanner sees real edges
    unknown = set(edges) - set(ALLOWED)
    assert not unknown, f"packages missing from the layering table: {unknown}"
    wrong = {pkg: sorted(deps - ALLOWED[pkg]) for pkg, deps in edges.items() if deps - ALLOWED[pkg]}
    assert not wrong, f"imports against the layering: {wrong}"


def test_the_named_boundaries():
    edges = project_imports()
    assert not edges["engine"] & {"speculation", "demo", "store", "service", "client", "bench", "assembly"}
    assert not edges["client"] & {"service", "engine", "models", "grammar"}
    assert not edges["service"] & {"client", "bench", "demo", "assembly"}


def test_the_dependency_graph_has_no_cycle():
    edges = project_imports()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join(path + [nxt])}"
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for pkg in sorted(edges):
        if pkg not in state:
            visit(pkg, [pkg])


def test_importing_the_client_loads_no_server_and_no_torch():
    code = ("import sys, structspec.client; "
            "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('structspec.')}), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "'service'" not in " ".join(out) and "'engine'" not in " ".join(out), out
    assert out[-1] == "False", out
