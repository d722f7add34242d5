"""No Kubernetes cluster runs here: the manifests in deploy/k8s are linted (kubernetes-validate, strict, against the
API schemas it ships for the oldest and the newest version targeted: a misspelt field fails; yamllint), and what
they configure is checked against what `structspec serve` exposes: the ports, the gRPC health probes, the
environment (every STRUCTSPEC_* variable a setting, every value valid, the token files in a mounted Secret, the store
URL from a Secret), the memory request against the documented bound, the autoscaler's metric against the exported
series."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from structspec.models.profiles import profiles
from structspec.front.metrics import ServiceMetrics
from structspec.service.settings import env_var, load_settings, settings_fields

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
MANIFESTS = sorted(K8S.rglob("*.yaml"))
MANIFESTS = [p for p in MANIFESTS if not p.name.startswith(".")]
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # the oldest targeted (gRPC probes, autoscaling/v2, policy/v1) and newest
NOT_SETTINGS = {"STRUCTSPEC_CACHE_DIR"}  # read by structspec.models.profiles.cache_dir, not a server setting

# The documented memory bound (docs/decode-loop.md, "Memory is bounded by configuration"): weights +
# kv_budget_tokens x bytes per token; the weights are the converted float32 folder (structspec/models/gemma.py:
# ~1.1 GB); the runtime (interpreter, torch, tokenizer, grammar engine) is what that page's measurement shows beside them after the
# first request (1.53 GB resident in all).
WEIGHTS_BYTES = 1.1e9
RUNTIME_BYTES = 0.45e9


def docs() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def quantity(text: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"([0-9.]+)([KMG]i?)?", text)
    assert m, text
    return float(m.group(1)) * units.get(m.group(2) or "", 1)


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict[str, Any]]:
    return docs()


def server_container(k8s) -> dict[str, Any]:
    (c,) = k8s[("Deployment", "structspec")]["spec"]["template"]["spec"]["containers"]
    return c


def environment(k8s) -> dict[str, str]:
    """The STRUCTSPEC_* environment of the server container: the ConfigMap, then the container's own (values from
    Secrets as placeholders)."""
    c = server_container(k8s)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(k8s[("ConfigMap", source["configMapRef"]["name"])]["data"])
    for item in c.get("env", []):
        env[item["name"]] = item["value"] if "value" in item else f"<{item['valueFrom']}>"
    return {k: v for k, v in env.items() if k.startswith("STRUCTSPEC_")}


def test_the_manifests_are_found() -> None:
    names = {p.relative_to(K8S).as_posix() for p in MANIFESTS}
    assert {"configmap.yaml", "deployment.yaml", "service.yaml", "pdb.yaml", "hpa.yaml", "model-cache.yaml",
            "dev/postgres.yaml", "dev/secrets.yaml", "prometheus-adapter/rules.yaml"} <= names


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_manifests_validate_strictly(version: str) -> None:
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", version,
                          *map(str, MANIFESTS)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_misspelt_field_fails_validation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((K8S / "service.yaml").read_text().replace("clusterIP:", "clusterIp:"))
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "clusterIp" in out.stdout + out.stderr


def test_yamllint() -> None:
    out = subprocess.run([sys.executable, "-m", "yamllint", "-s", "-c", str(K8S / ".yamllint.yaml"), str(K8S)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_environment_is_settings_and_validates(k8s, tmp_path: Path) -> None:
    env = environment(k8s)
    valid = {env_var(f.name) for f in settings_fields()}
    assert set(env) - NOT_SETTINGS <= valid, set(env) - NOT_SETTINGS - valid
    c = server_container(k8s)
    from_secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert set(from_secret) == {"STRUCTSPEC_STORE_URL"}  # the URL (a password in it) is a Secret's
    assert ("Secret", from_secret["STRUCTSPEC_STORE_URL"]["name"]) in k8s  # the dev example has its shape
    # each token file lies in a volume of a Secret that has the file's key
    volumes = {v["name"]: v for v in k8s[("Deployment", "structspec")]["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    files: dict[str, Path] = {}
    for name in ("STRUCTSPEC_AUTH_TOKEN_FILE", "STRUCTSPEC_ADMIN_TOKEN_FILE"):
        path = Path(env[name])
        volume = mounts[str(path.parent)]
        assert path.name in {item["path"] for item in volume["secret"]["items"]}, (name, volume)
        files[name] = tmp_path / path.name
        files[name].write_text("token\n")
    # every value valid as the server reads it (the token files replaced by local ones, the URL by a real-looking one)
    local = {**env, **{k: str(v) for k, v in files.items()}, "STRUCTSPEC_STORE_URL": "postgresql://u@db/structspec"}
    settings = load_settings(env=local)
    assert settings.host == "0.0.0.0" and settings.store_url.startswith("postgresql://")
    assert settings.profile in profiles()  # a real profile


def test_ports_probes_and_the_service_match_the_server(k8s) -> None:
    settings = load_settings(env={k: v for k, v in environment(k8s).items() if not k.endswith("_FILE")
                                  and k != "STRUCTSPEC_STORE_URL"})
    c = server_container(k8s)
    assert c["args"][0] == "serve"  # after the image's ENTRYPOINT ["structspec"] (docker/Dockerfile.cpu)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": settings.port, "http": settings.http_port, "metrics": settings.metrics_port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc_probe = c[probe]["grpc"]
        assert grpc_probe["port"] == settings.port and grpc_probe.get("service", "") == ""  # the server's health
    pod = k8s[("Deployment", "structspec")]["spec"]["template"]
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    live = c["livenessProbe"]
    assert settings.drain_grace_seconds < grace < live["periodSeconds"] * live["failureThreshold"]
    start = c["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 300  # a first model conversion fits
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(settings.metrics_port)

    service = k8s[("Service", "structspec")]["spec"]
    assert service["clusterIP"] == "None"  # headless: clients balance over the pods (dns:///)
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["ports"]} == {
        name: (port, name) for name, port in ports.items()}
    pdb = k8s[("PodDisruptionBudget", "structspec")]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert k8s[("Deployment", "structspec")]["spec"]["replicas"] >= 2


def test_the_model_cache_and_its_preparation(k8s) -> None:
    spec = k8s[("Deployment", "structspec")]["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    profile = environment(k8s)["STRUCTSPEC_PROFILE"]
    assert init["command"] == ["structspec", "models", "prepare", profile]
    cache = {e["name"]: e["value"] for e in server_container(k8s)["env"] if "value" in e}["STRUCTSPEC_CACHE_DIR"]
    for container in (init, server_container(k8s)):
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts[cache] == "model-cache"
    assert {e["name"]: e["value"] for e in init["env"]}["STRUCTSPEC_CACHE_DIR"] == cache
    volume = next(v for v in spec["volumes"] if v["name"] == "model-cache")
    assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in k8s


def test_the_memory_request_covers_the_documented_bound(k8s) -> None:
    readme = (ROOT / "docs" / "decode-loop.md").read_text()
    per_token = int(re.search(r"gemma-3-270m in float32: (\d+) KB per token", readme).group(1)) * 1024  # type: ignore[union-attr]
    budget = int(environment(k8s)["STRUCTSPEC_KV_BUDGET_TOKENS"])
    resources = server_container(k8s)["resources"]
    request, limit = quantity(resources["requests"]["memory"]), quantity(resources["limits"]["memory"])
    assert request >= WEIGHTS_BYTES + budget * per_token + RUNTIME_BYTES, (request, budget, per_token)
    assert limit >= request


def test_the_autoscaler_reads_an_exported_series_through_the_adapter(k8s) -> None:
    hpa = k8s[("HorizontalPodAutoscaler", "structspec")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "structspec"}
    (metric,) = hpa["metrics"]
    name = metric["pods"]["metric"]["name"]
    exported = {f.name for f in ServiceMetrics().registry.collect()}
    assert name in exported and hpa["minReplicas"] >= 2
    rules = yaml.safe_load(k8s[("ConfigMap", "adapter-config")]["data"]["config.yaml"])["rules"]
    assert any(r["name"]["as"] == name and name in r["seriesQuery"] for r in rules)
    assert all(re.sub(r"\{.*", "", r["seriesQuery"]).strip("'") in exported for r in rules)


def test_the_vllm_pod_spans_the_gpus_it_requests(k8s) -> None:
    """deploy/k8s/vllm: `serve --engine vllm` with flags the server has, tensor parallelism over exactly the GPUs
    the pod requests, shared memory for its workers, the fleet's store, and the server's probes and ports."""
    from structspec.service.settings import SECRET_FIELDS

    pod = k8s[("Deployment", "structspec-vllm")]["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    assert args[:3] == ["serve", "--engine", "vllm"]
    flags = {a for a in args if a.startswith("--")}
    known = {"--" + f.name.replace("_", "-") for f in settings_fields() if f.name not in SECRET_FIELDS}
    assert flags <= known, flags - known
    tp = int(args[args.index("--tensor-parallel-size") + 1])
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert tp == gpus == c["resources"]["requests"]["nvidia.com/gpu"] and tp > 1
    json_args = args[args.index("--speculative-config") + 1]
    assert __import__("json").loads(json_args)["method"] == "ngram"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts["shm"] == "/dev/shm" and volumes["shm"]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e for e in c["env"]}
    assert env["STRUCTSPEC_STORE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "structspec-store"
    assert {p["containerPort"] for p in c["ports"]} == {50051, 8000, 9464}
    assert all(c[p]["grpc"]["port"] == 50051 for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    service = k8s[("Service", "structspec-vllm")]["spec"]
    assert service["selector"] == pod["metadata"]["labels"]
