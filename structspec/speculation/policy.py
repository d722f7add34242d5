"""The drafting policy: from a schema's measured acceptance and the measured step costs, who may draft and how far.

``decide`` is a pure function of (the schema's evidence, the request, the running batch
size, a random source, the configuration). The router asks it when a request is admitted
and again when the running batch crosses a bucket boundary; the engine counts every
decision with its reason. In order:

1. overrides: the request said OFF; the schema's owner said off (or on: every proposer,
   the switches below bypassed);
2. short outputs: a predicted output (p50 of the schema's recent outputs; with too few, an
   estimate from the schema) under ``min_predicted_length`` tokens leaves no room to win:
   fast-forward only;
3. per proposer: the draft model is off past ``draft_model_max_batch`` running sequences;
   with under ``min_evidence_tokens`` drafted tokens of evidence it drafts (cold: measuring);
   under ``acceptance_threshold`` over the schema's most recent ``evidence_window_tokens``
   drafted tokens at this batch bucket it is off (the guard): with ``acceptance_guard``
   ``always`` whatever the costs say, with ``unmeasured`` (the default) unless the step costs
   at this bucket are measured and the cost model finds a draft length that pays (on a CPU
   where a verification costs barely more than a decode step, copy lookup at acceptance
   0.4 still pays, and the benchmark confirms it); otherwise the
   cost model picks the draft length k minimising the time per committed token,
       (T(b, k) + D(k)) / (1 + E[accepted | k]),   E[accepted | k] = sum_{i<=k} prod_{j<=i} c_j
   (T: the measured target step with a k-token draft at batch bucket b; D: the proposer's
   own drafting time; c_j: the schema's acceptance at draft position j given position j was
   examined), and switches the proposer off when no k beats plain decoding, T(b, 0), by
   ``gain_margin``;
4. the draft model, end to end: a draft model that beats plain decoding may still lose to the
   cheap proposers that would draft in its place (its own forward is not free), and no
   per-step model sees that. So the policy keeps, per schema, the measured decode time per
   output token of requests decoded with it and without it (the two arms): while either
   has under ``min_arm_requests`` it alternates them (cold), then keeps the faster, leaving
   the draft model out of a ``probe_rate`` share of requests when it is on (explore) so the
   other arm stays measured. A re-decision inside a request keeps the request's arm;
5. recovery probes: a request whose proposers are switched off for acceptance or cost still
   drafts with them with probability ``probe_rate``, and always when the schema has had no
   probe this hour, so acceptance is re-measured and speculation comes back when the
   traffic changes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping

from structspec.engine.config import PolicyConfig
from structspec.engine.types import SchemaSpeculation, SpeculationReport
from structspec.stats.counters import Arm, Reason
from structspec.stats.evidence import CostEvidence, ProposerEvidence, SchemaEvidence

DRAFT_MODEL = "draft"  # DraftModelProposer.name


@dataclass(frozen=True)
class PolicyRequest:
    """What the policy needs to know about one request."""

    schema_key: str
    schema: Mapping[str, Any] | None  # None for tool calls
    drafting_asked: bool  # False: the request said OFF
    schema_override: SchemaSpeculation = SchemaSpeculation.AUTO
    probed_this_hour: frozenset[str] = field(default_factory=frozenset)  # proposers probed for the schema this hour
    arm: str = ""  # a re-decision: the arm the request was decoded in so far (kept)
    arm_reason: str = ""  # and the draft model's reason then (kept with it)


def decide(evidence: SchemaEvidence, costs: CostEvidence, request: PolicyRequest, batch_size: int,
           rng: random.Random, config: PolicyConfig, proposers: tuple[str, ...]) -> SpeculationReport:
    """Which of ``proposers`` (the server's) may draft for ``request`` now, their caps and the reasons. Raises: Never."""
    if not proposers:
        return SpeculationReport(False, Reason.SERVER_OFF)
    if not request.drafting_asked:
        return _none(proposers, Reason.REQUEST_OFF)
    if request.schema_override is SchemaSpeculation.OFF:
        return _none(proposers, Reason.SCHEMA_OFF)
    if request.schema_override is SchemaSpeculation.ON:
        return SpeculationReport(True, Reason.SCHEMA_ON, False, {p: config.max_draft for p in proposers},
                                 {p: Reason.SCHEMA_ON for p in proposers})
    predicted = predicted_length(evidence, request.schema, config)
    if predicted < config.min_predicted_length:
        return _none(proposers, Reason.SHORT_OUTPUT)

    caps: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for p in proposers:
        if p == DRAFT_MODEL and batch_size > config.draft_model_max_batch:
            reasons[p] = Reason.BATCH_SIZE
            continue
        ev = evidence.at_bucket(p, batch_size, config.min_evidence_tokens)
        if ev is None or ev.drafted < config.min_evidence_tokens:
            caps[p], reasons[p] = config.max_draft, Reason.COLD
        elif ev.acceptance < config.acceptance_threshold:
            k = guarded_draft_length(ev, costs, p, batch_size, config)
            if k == 0:
                reasons[p] = Reason.LOW_ACCEPTANCE
            else:
                caps[p], reasons[p] = k, Reason.DRAFTED
        else:
            k = best_draft_length(ev, costs, p, batch_size, config)
            if k == 0:
                reasons[p] = Reason.NO_GAIN
            else:
                caps[p], reasons[p] = k, Reason.DRAFTED

    compared = DRAFT_MODEL in caps
    if compared:
        arm, why = choose_arm(evidence, request, batch_size, rng, config)
        if arm == Arm.NO_DRAFT:
            del caps[DRAFT_MODEL]
            reasons[DRAFT_MODEL] = why
        elif request.arm:  # a re-decision keeps the draft model's reason (a probe stays a probe)
            reasons[DRAFT_MODEL] = why
    switched_off = [p for p in proposers if reasons.get(p) in (Reason.LOW_ACCEPTANCE, Reason.NO_GAIN)]
    if switched_off and not request.arm and (rng.random() < config.probe_rate
                                             or any(p not in request.probed_this_hour for p in switched_off)):
        for p in switched_off:
            caps[p], reasons[p] = config.max_draft, Reason.PROBE
        return SpeculationReport(True, Reason.PROBE, True, caps, reasons, _arm(caps, compared or DRAFT_MODEL in caps))
    arm = _arm(caps, compared)
    if caps:
        cold = all(reasons[p] == Reason.COLD for p in caps)
        return SpeculationReport(True, Reason.COLD if cold else Reason.DRAFTED, False, caps, reasons, arm)
    return SpeculationReport(False, _dominant(reasons), False, {}, reasons, arm)


def _arm(caps: Mapping[str, int], compared: bool) -> str:
    if not compared:
        return ""
    return Arm.DRAFT if DRAFT_MODEL in caps else Arm.NO_DRAFT


def choose_arm(evidence: SchemaEvidence, request: PolicyRequest, batch_size: int, rng: random.Random,
               config: PolicyConfig) -> tuple[str, str]:
    """With or without the draft model (which the guard and the cost model allow), and the draft model's reason."""
    if request.arm:
        default = Reason.DRAFTED if request.arm == Arm.DRAFT else Reason.NO_GAIN
        return request.arm, request.arm_reason or default
    with_draft = evidence.arm_at(Arm.DRAFT, batch_size, config.min_arm_requests)
    without = evidence.arm_at(Arm.NO_DRAFT, batch_size, config.min_arm_requests)
    if min(with_draft.requests, without.requests) < config.min_arm_requests:  # measuring both, in turn
        return (Arm.NO_DRAFT if without.requests < with_draft.requests else Arm.DRAFT), Reason.COLD
    if with_draft.ms_per_token < without.ms_per_token:
        if rng.random() < config.probe_rate:
            return Arm.NO_DRAFT, Reason.EXPLORE
        return Arm.DRAFT, Reason.DRAFTED
    return Arm.NO_DRAFT, Reason.NO_GAIN


def _none(proposers: tuple[str, ...], reason: str) -> SpeculationReport:
    return SpeculationReport(False, reason, False, {}, {p: reason for p in proposers})


_PRIORITY = (Reason.LOW_ACCEPTANCE, Reason.NO_GAIN, Reason.BATCH_SIZE, Reason.EXPLORE, Reason.COLD)


def _dominant(reasons: Mapping[str, str]) -> str:
    """The request's reason when no proposer drafts: the most frequent one (ties by _PRIORITY)."""
    values = list(reasons.values())
    return max(_PRIORITY, key=lambda r: (values.count(r), -_PRIORITY.index(r)))


def predicted_length(evidence: SchemaEvidence, schema: Mapping[str, Any] | None, config: PolicyConfig) -> float:
    """The p50 of the schema's recent complete outputs; with too few of them, the schema's own estimate."""
    if evidence.finished >= config.min_length_evidence and evidence.output_p50 is not None:
        return evidence.output_p50
    return estimate_output_tokens(schema)


def guarded_draft_length(ev: ProposerEvidence, costs: CostEvidence, proposer: str, batch_size: int,
                         config: PolicyConfig) -> int:
    """The draft length of a proposer under the acceptance threshold: 0 (off) with the guard ``always``; with
    ``unmeasured``, the cost model's choice where the step costs at this batch bucket are measured (off where not)."""
    if config.acceptance_guard == "always" or costs.step_seconds(batch_size, 0) is None:
        return 0
    return best_draft_length(ev, costs, proposer, batch_size, config)


def best_draft_length(ev: ProposerEvidence, costs: CostEvidence, proposer: str, batch_size: int,
                      config: PolicyConfig) -> int:
    """The k in 1..max_draft minimising the time per committed token; 0 when none beats plain decoding by
    ``gain_margin``. Without measured step costs at this batch bucket: ``max_draft`` (the guard still holds)."""
    plain = costs.step_seconds(batch_size, 0)
    if plain is None:
        return config.max_draft
    best_k, best = 0, plain * (1.0 - config.gain_margin)
    for k in range(1, config.max_draft + 1):
        step = costs.step_seconds(batch_size, k)
        if step is None:
            continue
        per_token = (step + costs.propose_seconds(proposer, k)) / (1.0 + ev.expected_accepted(k))
        if per_token < best:
            best_k, best = k, per_token
    return best_k


_TYPE_TOKENS = {"integer": 2, "number": 3, "boolean": 1, "null": 1}


def estimate_output_tokens(schema: Mapping[str, Any] | None, depth: int = 0) -> float:
    """A rough output length of ``schema`` in tokens (about 4 characters a token), for schemas with no history.

    Tool lists (None) and anything it cannot read are taken as long (64): drafting stays on until measured.
    """
    if not isinstance(schema, Mapping) or depth > 8:
        return 64.0
    if "const" in schema:
        return 1.0 + len(str(schema["const"])) / 4
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return 1.0 + sum(len(str(v)) for v in schema["enum"]) / len(schema["enum"]) / 4
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return max(estimate_output_tokens(s, depth + 1) for s in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((t for t in kind if t != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if not isinstance(props, Mapping):
            return 64.0
        return 2.0 + sum(2.0 + len(str(name)) / 4 + estimate_output_tokens(sub, depth + 1)
                         for name, sub in props.items())
    if kind == "array":
        items = int(schema.get("minItems") or 0) or 2
        if isinstance(schema.get("maxItems"), int):
            items = min(items, schema["maxItems"])
        return 2.0 + items * (1.0 + estimate_output_tokens(schema.get("items"), depth + 1))
    if kind == "string":
        if isinstance(schema.get("maxLength"), int):
            return 2.0 + min(schema["maxLength"], 400) / 8
        return 2.0 + (4.0 if "format" in schema else 10.0)
    return float(_TYPE_TOKENS.get(kind, 4))
