"""The packages' dependencies run one way: read every import (function-level ones too) and check them."""

from __future__ import annotations

import ast
import json
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
    "chat_template": {"prompts"},  # a model's chat template (or the plain format) turned into prompt ids
    "schemas": set(),
    "stats": set(),  # counters, the book and their summaries: recorded by the engine, kept by the store
    "store": {"stats"},
    "client": {"front", "json_limits", "proto_gen"},  # the front's error and statistics values, not its machinery
    # the Speculator protocol is the engine's own
    "engine": {"chat_template", "grammar", "models", "prompts", "schemas", "stats"},
    "speculation": {"engine", "grammar", "models", "stats", "store"},
    "assembly": {"chat_template", "engine", "grammar", "models", "speculation", "stats"},
    # the protocol-neutral front: requests, errors, the call guard and statistics views, knowing neither protocol
    "front": {"engine", "grammar", "json_limits", "prompts", "schemas", "speculation", "stats", "store"},
    "service": {"engine", "front", "grammar", "prompts", "proto_gen", "schemas", "speculation", "stats", "store"},
    "demo": {"prompts", "schemas"},
    "bench": {"assembly", "chat_template", "client", "demo", "engine", "grammar", "models", "prompts", "schemas",
              "speculation", "stats", "store", "vllm_engine"},  # bench decode --data-dir records its traffic in a store
    # drafts made from their target: the workloads' items and step timing reused, the engine answers for the target
    "draft": {"assembly", "bench", "engine", "models", "speculation", "stats"},
    "cli": {"bench", "demo", "models", "cli_client", "cli_draft", "cli_serve", "cli_stats"},
    "cli_draft": {"assembly", "draft", "front", "models", "service", "stats", "store"},
    "cli_serve": {"assembly", "front", "service", "vllm_engine"},  # the composition root: the server gets the assembly's engine factory
    "cli_client": {"bench", "client", "front", "schemas", "service"},
    "cli_stats": {"cli_client", "client", "front", "report", "service", "store"},  # a store read here, or a server asked
    "report": {"front"},
    # vLLM as the engine: the request pipeline, the assembly's prompt format and end of turn, the batch-size rule
    "vllm_engine": {"assembly", "chat_template", "engine", "grammar", "models", "speculation", "stats"},  # the HTML report renders the front's statistics views
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


# -- the front's boundaries -------------------------------------------------------------------------------------------

# What the protocol-neutral front never imports, directly or through another module: the protocols' packages.
PROTOCOL = ("grpc", "fastapi", "starlette", "uvicorn", "google.protobuf", "structspec.proto_gen", "structspec.service")
# What the HTTP front never imports: the gRPC servicer, its converters, the generated messages and grpc itself.
GRPC_FRONT = ("structspec.service.servicer", "structspec.service.convert", "structspec.proto_gen", "grpc")
PROTOBUF = ("google.protobuf", "structspec.proto_gen")


def module_imports(path: Path, source: str | None = None) -> set[str]:
    """The absolute names a file imports (``source``: its text, else read), function-level imports too:
    ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (c may be a module); relative imports are resolved against
    the file's package."""
    package = ("structspec",) + path.relative_to(ROOT).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ((node.module,) if node.module else ())) \
                if node.level else node.module
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def matching(names: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


def imports_against(files: list[Path], prefixes: tuple[str, ...]) -> dict[str, list[str]]:
    found = {str(f.relative_to(ROOT)): matching(module_imports(f), prefixes) for f in files}
    return {f: names for f, names in found.items() if names}


def test_the_scanner_resolves_relative_and_function_level_imports():
    source = "from . import errors\nfrom ..service import convert\ndef f():\n    import grpc.aio\n"
    names = module_imports(ROOT / "front" / "probe.py", source)  # a file of the front, never written
    assert {"structspec.front.errors", "structspec.service.convert", "grpc.aio"} <= names
    assert matching(names, PROTOCOL) == ["grpc.aio", "structspec.service", "structspec.service.convert"]


def test_the_front_imports_no_protocol_package():
    files = sorted((ROOT / "front").rglob("*.py"))
    assert files, "structspec/front/ is missing"
    assert not imports_against(files, PROTOCOL)


def test_the_http_front_imports_nothing_of_the_grpc_one():
    files = sorted((ROOT / "service" / "http").rglob("*.py"))
    assert files
    assert not imports_against(files, GRPC_FRONT)


def test_the_statistics_views_are_built_without_protobuf():
    files = [ROOT / "front" / "views.py", ROOT / "front" / "stats.py"]
    assert all(f.is_file() for f in files), files
    assert not imports_against(files, PROTOBUF + ("structspec.service",))


_LOADED = """
import importlib, json, pkgutil, sys
import structspec.front
seen = {}
for name in ("structspec.front.views", "structspec.front.stats"):
    importlib.import_module(name)
    seen[name] = sorted(sys.modules)
for info in pkgutil.iter_modules(structspec.front.__path__, "structspec.front."):
    importlib.import_module(info.name)
seen["structspec.front"] = sorted(sys.modules)
print(json.dumps(seen))
"""


def loaded_modules() -> dict[str, list[str]]:
    """What a fresh interpreter has loaded after importing the views, then the views' reader, then every module of
    the front (each entry: everything loaded so far, in that order)."""
    out = subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_the_front_loads_no_protocol_package_through_another_module():
    loaded = loaded_modules()
    assert "structspec.front.errors" in loaded["structspec.front"]  # every module of the front was imported
    assert not matching(set(loaded["structspec.front.views"]), PROTOBUF + ("torch",))
    assert not matching(set(loaded["structspec.front.stats"]), PROTOBUF)
    assert not matching(set(loaded["structspec.front"]), PROTOCOL)


def test_importing_the_client_loads_no_server_no_engine_and_no_torch():
    code = "import sys, structspec.client; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert "structspec.client" in loaded
    assert not matching(loaded, ("torch", "transformers", "llguidance", "structspec.engine", "structspec.service"))


# -- imports made inside functions ------------------------------------------------------------------------------------

# file (under structspec/) -> (how many imports its functions make, why they are not module imports). Every other file
# imports at module level only: a dependency is read at the top of the file. Start-up figures are import times
# measured on this project's 2-core machine on top of what the importing module already loads.
FUNCTION_LEVEL_IMPORTS: dict[str, tuple[int, str]] = {
    # the CLI: `structspec --help`, serve and the client commands start without torch (~6 s), transformers (~3 s
    # more), grpc and protobuf (~0.4 s) or rich.progress (7-25 ms); the commands that need them import them
    "cli.py": (12, "torch: model loading, the benchmarks (decode, step, device, heldout) and the demo trainer; "
                   "rich.progress for bench decode"),
    "bench/workloads.py": (1, "the held-out workloads' module imports WorkItem from here"),
    "cli_client.py": (6, "grpc and protobuf: the client, the health check and the load test"),
    "cli_draft.py": (6, "torch: aligning and distilling drafts (the models, the assembly)"),
    "cli_serve.py": (5, "torch: the assembly, or the vLLM engine, on the engine-loading thread; grpc: the server, for serve alone and "
                        "for the error of a build without the engine"),
    "cli_stats.py": (3, "the statistics reader (front.stats, ~60 ms CPU on every command), plotly for the HTML report"),
    # optional or heavy dependencies that few paths use
    "bench/decode_bench.py": (2, "outlines (0.6-1.0 s): only the hf_outlines baseline"),
    "bench/device_bench.py": (2, "the engine's grammar packages (llguidance, jsonschema-rs, outlines-core, re2): only the "
                                 "perfect-draft ceiling needs them, so the step timings run on a GPU machine without them"),
    "bench/llamacpp_baselines.py": (4, "llama-cpp-python, optional (the llamacpp extra): where a baseline opens"),
    "bench/vllm_rows.py": (1, "vLLM, optional (its own environment): only the vllm rows build its engine"),
    "vllm_engine/build.py": (5, "vLLM (seconds to import) and the modules importing it: only when the engine is built"),
    "vllm_engine/extension.py": (1, "the proposer, mixed into vLLM's worker class: imported when a worker attaches it"),
    "vllm_engine/proposer.py": (4, "transformers, llguidance and the grammar backend: built in vLLM's worker, once"),
    "models/gemma.py": (3, "torch and transformers: profiles imports this module for `models list`"),
    "models/llamacpp_model.py": (1, "llama-cpp-python, optional: lib() imports and initialises it once"),
    "models/profiles.py": (1, "a cycle: gemma imports profiles' cache_dir"),
    "service/codegen.py": (1, "grpc_tools, a dev dependency: only to regenerate the stubs"),
    "service/server.py": (1, "not converted in service/'s refactor: structspec.schemas is light (~1 ms), it fits"),
    "store/__init__.py": (1, "psycopg (~50 ms): only for a PostgreSQL url"),
}


def function_level_imports(tree: ast.AST) -> int:
    """How many import statements sit inside a function (methods and nested functions too)."""
    count = 0

    def visit(node: ast.AST, inside: bool) -> None:
        nonlocal count
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                count += 1
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return count


def test_the_counter_sees_imports_in_functions_methods_and_nested_functions():
    source = ("import os\ntry:\n    import json\nexcept ImportError:\n    json = None\n"
              "def f():\n    import re\n    def g():\n        from x import y\n"
              "class C:\n    import math\n    async def m(self):\n        import z\n")
    assert function_level_imports(ast.parse(source)) == 3


def test_imports_inside_functions_are_the_listed_ones():
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] == "proto_gen":  # generated
            continue
        n = function_level_imports(ast.parse(path.read_text(), str(path)))
        if n:
            found[str(path.relative_to(ROOT))] = n
    listed = {f: n for f, (n, _) in FUNCTION_LEVEL_IMPORTS.items()}
    assert all(reason for _, reason in FUNCTION_LEVEL_IMPORTS.values())
    unlisted = {f: n for f, n in found.items() if listed.get(f) != n}
    gone = {f: n for f, n in listed.items() if f not in found}
    assert not unlisted, (f"imports inside functions not in FUNCTION_LEVEL_IMPORTS (make them module imports, or list "
                          f"the file with its count and why): {unlisted}")
    assert not gone, f"listed in FUNCTION_LEVEL_IMPORTS but gone (remove them from the list): {gone}"


def test_only_the_vllm_engine_imports_vllm():
    """vLLM is an optional engine in an environment of its own: no other module may import it."""
    importers = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            if any(n == "vllm" or n.startswith("vllm.") for n in names):
                importers.add(str(path.relative_to(ROOT)))
    assert importers and all(p.startswith("vllm_engine/") for p in importers), importers
