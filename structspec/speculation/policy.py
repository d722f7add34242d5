"""The drafting policy: from a schema's measured acceptance and the measured step costs, who may draft and how far.

``decide`` is a pure function of (the schema's evidence, the request with its draw, the
running batch size, the configuration). The router asks it when a request is admitted
and again when the running batch crosses a bucket boundary; the engine counts every
decision with its reason. In order:

1. overrides: the request said OFF; the schema's owner said off (or on: every proposer,
   the switches below bypassed);
2. short outputs: a predicted output (p50 of the schema's recent outputs; with too few, an
   estimate from the schema) under ``min_predicted_length`` tokens has few model decisions (most of
   it is forced), so a draft saves a pass only where it covers the rest of the output: the draft
   model is off (its prefill of the prompt buys few tokens), and each cheap proposer drafts up to
   ``max_draft`` tokens where such a cap pays, priced at the rows and accepted tokens its drafts
   have had, else nothing (``short_draft_length``; fast-forward only where no step cost is known);
3. per proposer: the draft model is off past ``draft_model_max_batch`` running sequences;
   with under ``min_evidence_tokens`` drafted tokens of evidence it is cold: it drafts the length
   the cost model picks at the prior (``prior_acceptance`` at a draft's first position,
   ``prior_continuation`` at each later one, held as ``prior_tokens`` examined tokens, its own thin
   evidence and its drafts replayed on the schema's finished outputs added (``speculation.replay``: a
   priced-out proposer learns what it would have had accepted without drafting): it widens as evidence
   comes in, ``priced_evidence``), or nothing (priced out) where no length
   pays at the measured step costs (the executor's step profile, measured at start, and the steps
   measured while serving); with no step cost known at all it drafts at the cap to measure; unless
   it was switched off before (below); under ``acceptance_threshold`` over the
   schema's most recent ``evidence_window_tokens`` drafted tokens at this batch bucket (whole
   hours, ``structspec.stats.evidence``) it is off (the guard): with ``acceptance_guard``
   ``always`` whatever the costs say, with ``unmeasured`` (the default) unless the step costs
   at this bucket are measured and the cost model finds a draft length that pays (on a CPU
   where a verification costs barely more than a decode step, copy lookup at acceptance
   0.4 still pays, and the benchmark confirms it); otherwise the
   cost model picks the draft length k minimising the time per committed token,
       (T(b, k) + D(k)) / (1 + E[accepted | k]),   E[accepted | k] = sum_{i<=k} prod_{j<=i} c_j
   (T: the measured target step with a k-token draft at batch bucket b; D: the proposer's
   own drafting time per draft made, its lookups that found nothing included; c_j: the schema's acceptance at draft position j given position j was
   examined, for j > 1 pulled toward the proposer's pooled rate after the first position by
   ``depth_prior_tokens`` examinations, so a deep position few drafts reached does not cap
   the length), and switches the proposer off when no k beats plain decoding, T(b, 0), by
   ``gain_margin``. Beside that cap, a copy proposer (not the draft model) gets a *restricted* cap: the same
   choice priced at the steps of forwards whose every scored position allows few tokens, which the executor
   scores without its output layer (``restricted_draft_length``); a draft runs past its cap only there
   (``Drafter.draft``), so a proposer priced out at the full head still drafts keys, punctuation and numbers;
4. the draft model, end to end: a draft model that beats plain decoding may still lose to the
   cheap proposers that would draft in its place (its own forward is not free), and no
   per-step model sees that. So the policy keeps, per schema, the measured decode time per
   output token of requests decoded with it and without it (the two arms): while either
   has under ``min_arm_requests`` complete requests in the evidence read (counted, not
   weighted by age: low traffic does not make a measured arm cold again) it gives the
   request to the arm with fewer (cold), then keeps the faster by the age-weighted means and
   sends a ``probe_rate`` share of requests to the slower (explore: the draft model left
   out, or drafting at its own cap) so that arm stays measured. A re-decision inside a
   request keeps the request's arm;
5. recovery probes: a request whose proposers are switched off for acceptance or cost, or priced
   out cold (step 3), drafts with them anyway, at most ``probe_max_draft`` tokens a draft and
   ``probe_max_tokens`` in the request, when its draw is under ``probe_rate``, or when a proposer
   switched off on evidence has its newest drafting or probe (any replica's, through the store)
   ``probe_interval_hours`` old (a priced-out one only by the draw: it is unproven, not known bad): the floor that keeps a quiet schema's
   evidence fresh, at most one probe per interval whatever the traffic (two replicas can both
   take it within a refresh). A probe's request is no arm's measurement. A re-decision keeps
   the request's probe (or its absence); it never draws again.

The draw: each request's own uniform number, drawn once when it is first decided
(``PolicyRequest.draw``); a probe takes draws under ``probe_rate``, an explore draws at or over
``1 - probe_rate``, so a request is one or the other, and re-decisions agree with the first.

Known bad stays known bad: a proposer the policy switched off for acceptance or cost
(``PolicyRequest.off``: its latest state, kept per process and seeded from the store) is not
cold again when its evidence thins (probes draft little): under ``min_evidence_tokens`` it stays
off with that reason, and only evidence (``min_evidence_tokens`` of it, probes' included) turns
it on. The draft model once both arms are measured is held by the end-to-end comparison instead
(on thin evidence it is cold at step 3, and the arms decide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from structspec.engine.config import PolicyConfig
from structspec.engine.types import SchemaSpeculation, SpeculationReport
from structspec.stats.counters import HOUR, Arm, Reason, batch_bucket, narrow_key
from structspec.stats.evidence import CostEvidence, ProposerEvidence, SchemaEvidence

DRAFT_MODEL = "draft"  # DraftModelProposer.name
SHORT_DRAFTS_READ = 8  # a short output's drafts whose own lengths price its cap (``short_draft_length``)


@dataclass(frozen=True)
class PolicyRequest:
    """What the policy needs to know about one request."""

    schema_key: str
    schema: Mapping[str, Any] | None  # None for tool calls
    drafting_asked: bool  # False: the request said OFF
    schema_override: SchemaSpeculation = SchemaSpeculation.AUTO
    draw: float = 0.5  # the request's own uniform draw in [0, 1), the same at every re-decision
    off: Mapping[str, str] = field(default_factory=dict)  # proposer -> low_acceptance | no_gain: its standing state
    redecision: bool = False  # the request was decided before (at another batch bucket)
    probe: bool = False  # a re-decision: the request was a probe so far (kept)
    arm: str = ""  # a re-decision: the arm the request was decoded in so far (kept)
    arm_reason: str = ""  # and the draft model's reason then (kept with it)


def decide(evidence: SchemaEvidence, costs: CostEvidence, request: PolicyRequest, batch_size: int,
           config: PolicyConfig, proposers: tuple[str, ...]) -> SpeculationReport:
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
    short = predicted < config.min_predicted_length
    priced = costs.step_seconds(batch_size, 0) is not None
    if short and not priced:  # no measured cost to price a short output's drafts with: they rarely pay
        return _none(proposers, Reason.SHORT_OUTPUT)

    caps: dict[str, int] = {}
    reasons: dict[str, str] = {}
    wide: dict[str, int] = {}  # restricted caps: longer drafts where every scored position's allowed set is small
    arms_measured = min(evidence.arm_at(a, batch_size, config.min_arm_requests).count
                        for a in (Arm.DRAFT, Arm.NO_DRAFT)) >= config.min_arm_requests
    for p in proposers:
        if p == DRAFT_MODEL and batch_size > config.draft_model_max_batch:
            reasons[p] = Reason.BATCH_SIZE
            continue
        if short:
            k = 0 if p == DRAFT_MODEL else short_draft_length(evidence.at_bucket(p, batch_size, 1), costs, p,
                                                               batch_size, config, evidence.replayed.get(p))
            if k == 0:
                reasons[p] = Reason.SHORT_OUTPUT
            else:
                caps[p], reasons[p] = k, Reason.DRAFTED
            continue
        ev = evidence.at_bucket(p, batch_size, config.min_evidence_tokens)
        if ev is None or ev.drafted < config.min_evidence_tokens:
            if p in request.off and not (p == DRAFT_MODEL and arms_measured):  # known bad stays off
                reasons[p] = request.off[p]
            else:
                at = priced_evidence(ev, config, evidence.replayed.get(p))
                k = cold_draft_length(at, costs, p, batch_size, config)
                if k == 0:
                    reasons[p] = Reason.PRICED_OUT
                else:
                    caps[p], reasons[p] = k, Reason.COLD
                wide[p] = restricted_draft_length(evidence, costs, p, batch_size, config)
        elif ev.acceptance < config.acceptance_threshold:
            k = guarded_draft_length(ev, costs, p, batch_size, config)
            if k == 0:
                reasons[p] = Reason.LOW_ACCEPTANCE
            else:
                caps[p], reasons[p] = k, Reason.DRAFTED
        else:
            at = priced_evidence(ev, config)
            k = best_draft_length(at, costs, p, batch_size, config)
            if k == 0:
                reasons[p] = Reason.NO_GAIN
            else:
                caps[p], reasons[p] = k, Reason.DRAFTED
            wide[p] = restricted_draft_length(evidence, costs, p, batch_size, config)

    switched_off = [p for p in proposers if reasons.get(p) in (Reason.LOW_ACCEPTANCE, Reason.NO_GAIN, Reason.PRICED_OUT)]
    compared = DRAFT_MODEL in caps
    if compared:
        arm, why = choose_arm(evidence, request, batch_size, config)
        if arm == Arm.NO_DRAFT:
            del caps[DRAFT_MODEL]
        if arm == Arm.NO_DRAFT or why == Reason.EXPLORE or request.arm:  # a re-decision keeps the reason too
            reasons[DRAFT_MODEL] = why
    if switched_off and (request.probe if request.redecision else probe_due(evidence, request, switched_off, config, reasons)):
        for p in switched_off:
            caps[p], reasons[p] = min(config.probe_max_draft, config.max_draft), Reason.PROBE
        return SpeculationReport(True, Reason.PROBE, True, caps, reasons, "")  # no arm's measurement
    arm = _arm(caps, compared)
    wide = {p: k for p, k in wide.items() if k > caps.get(p, 0)}
    if caps:
        cold = all(reasons[p] == Reason.COLD for p in caps)
        return SpeculationReport(True, Reason.COLD if cold else Reason.DRAFTED, False, caps, reasons, arm, wide)
    return SpeculationReport(bool(wide), _dominant(reasons), False, {}, reasons, arm, wide)


def _arm(caps: Mapping[str, int], compared: bool) -> str:
    if not compared:
        return ""
    return Arm.DRAFT if DRAFT_MODEL in caps else Arm.NO_DRAFT


def probe_due(evidence: SchemaEvidence, request: PolicyRequest, switched_off: list[str], config: PolicyConfig,
              reasons: Mapping[str, str] | None = None) -> bool:
    """A first decision's recovery probe: its draw is under ``probe_rate``, or a proposer switched off on evidence
    (``reasons``: not priced out cold) has its newest drafting or probe ``probe_interval_hours`` old (or none in the
    evidence read). A cold proposer priced out is probed by the draw alone: the floor re-measures known bad, and a
    priced-out proposer is not known bad, only unproven where drafting is dear."""
    if request.draw < config.probe_rate:
        return True
    for p in switched_off:
        if reasons is not None and reasons.get(p) == Reason.PRICED_OUT:
            continue
        newest = evidence.last_measured.get(p)
        if newest is None or evidence.hour - newest >= config.probe_interval_hours * HOUR:
            return True
    return False


def choose_arm(evidence: SchemaEvidence, request: PolicyRequest, batch_size: int,
               config: PolicyConfig) -> tuple[str, str]:
    """With or without the draft model (which the guard and the cost model allow), and the draft model's reason."""
    if request.arm:
        default = Reason.DRAFTED if request.arm == Arm.DRAFT else Reason.NO_GAIN
        return request.arm, request.arm_reason or default
    with_draft = evidence.arm_at(Arm.DRAFT, batch_size, config.min_arm_requests)
    without = evidence.arm_at(Arm.NO_DRAFT, batch_size, config.min_arm_requests)
    if min(with_draft.count, without.count) < config.min_arm_requests:  # measuring the one with fewer
        return (Arm.NO_DRAFT if without.count < with_draft.count else Arm.DRAFT), Reason.COLD
    explore = request.draw >= 1.0 - config.probe_rate  # the other end of the draw from a probe's
    if with_draft.ms_per_token < without.ms_per_token:
        return (Arm.NO_DRAFT, Reason.EXPLORE) if explore else (Arm.DRAFT, Reason.DRAFTED)
    return (Arm.DRAFT, Reason.EXPLORE) if explore else (Arm.NO_DRAFT, Reason.NO_GAIN)


def _none(proposers: tuple[str, ...], reason: str) -> SpeculationReport:
    return SpeculationReport(False, reason, False, {}, {p: reason for p in proposers})


_PRIORITY = (Reason.LOW_ACCEPTANCE, Reason.NO_GAIN, Reason.PRICED_OUT, Reason.SHORT_OUTPUT, Reason.BATCH_SIZE,
             Reason.EXPLORE, Reason.COLD)


def _dominant(reasons: Mapping[str, str]) -> str:
    """The request's reason when no proposer drafts: the most frequent one (ties by _PRIORITY, then by name)."""
    values = list(reasons.values())
    rank = {r: i for i, r in enumerate(_PRIORITY)}
    return max(values, key=lambda r: (values.count(r), -rank.get(r, len(rank)), r)) if values else Reason.SERVER_OFF


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
    return best_draft_length(priced_evidence(ev, config), costs, proposer, batch_size, config)


def short_draft_length(ev: ProposerEvidence | None, costs: CostEvidence, proposer: str, batch_size: int,
                       config: PolicyConfig, replayed: ProposerEvidence | None = None) -> int:
    """A short output's draft length: ``max_draft`` where a draft capped there pays, else 0. A short output has
    few model decisions and most of it is forced, so a draft saves a pass only where it covers the rest of the
    output: a 1- or 2-token cap there costs its rows and saves nothing (on the held-out classify workload, Gemma
    on transformers: the policy's short caps left the passes per token at fast-forward's 0.182 while a cap of 8
    made them 0.106). The cap is priced at the rows its drafts fill: with ``SHORT_DRAFTS_READ`` drafts of the
    schema's own or replayed, a draft's mean length and mean accepted tokens are read from them (the few tokens
    left to decide bound a draft far below the cap: an 8-row price would refuse drafts that fill 3); with fewer,
    a full cap at the prior (``priced_evidence``)."""
    k = config.max_draft
    measured = (ev or ProposerEvidence()).plus(replayed)
    drafts = measured.reached[0] if measured.reached else 0.0
    if drafts >= SHORT_DRAFTS_READ:
        rows = min(k, max(1, math.ceil(measured.drafted / drafts)))
        accepted = sum(measured.accepted_at) / drafts
    else:
        rows, accepted = k, priced_evidence(ev, config, replayed).expected_accepted(k)
    step, plain = costs.step_seconds(batch_size, rows), costs.step_seconds(batch_size, 0)
    if step is None or plain is None:
        return 0
    per_token = (step + costs.propose_seconds(proposer, rows)) / (1.0 + accepted)
    return k if per_token < plain * (1.0 - config.gain_margin) else 0


def priced_evidence(ev: ProposerEvidence | None, config: PolicyConfig,
                    replayed: ProposerEvidence | None = None) -> ProposerEvidence:
    """The evidence a proposer is priced with: its own once it holds ``min_evidence_tokens``, each position after a
    draft's first pulled toward the proposer's pooled rate there (``depth_prior_tokens``: the few drafts that reach
    a deep position do not set its rate alone, ``ProposerEvidence.with_pooled_depth``); before, its own and
    its drafts replayed on the schema's finished outputs (``speculation.replay``: what verification would have
    accepted of the drafts it did not make) with the prior added (``prior_acceptance`` at a draft's first
    position, ``prior_continuation`` after it, ``prior_tokens`` strong)."""
    if ev is not None and ev.drafted >= config.min_evidence_tokens:
        return ev.with_pooled_depth(config.depth_prior_tokens)
    return (ev or ProposerEvidence()).plus(replayed).with_prior(config.prior_acceptance, config.prior_tokens,
                                                               config.max_draft, config.prior_continuation)


def cold_draft_length(priced: ProposerEvidence, costs: CostEvidence, proposer: str, batch_size: int,
                      config: PolicyConfig) -> int:
    """A cold proposer's draft length: the cost model's choice at ``priced`` (``priced_evidence``: the prior, its own
    thin evidence and its replayed drafts), so it drafts only what pays at the measured step costs and widens as
    evidence comes in; ``max_draft`` (measuring) where no step cost at this bucket is known at all."""
    if costs.step_seconds(batch_size, 0) is None:
        return config.max_draft
    return best_draft_length(priced, costs, proposer, batch_size, config)


def restricted_draft_length(evidence: SchemaEvidence, costs: CostEvidence, proposer: str, batch_size: int,
                            config: PolicyConfig) -> int:
    """The draft length the cost model picks for drafts whose every scored position has a small allowed set (a
    structural stretch: keys, punctuation, numbers, enums), which the executor scores without its output layer
    (``CostEvidence.restricted``): priced at those forwards' costs against a restricted plain step. On a large
    vocabulary that layer is most of a step (Gemma 3 270M on llama.cpp: ~6 of ~10.5 ms a row), so a k-row step
    there costs about k + 1 plain steps while a restricted one costs barely more than one, and a proposer priced
    out at the full head still pays there. Priced with the acceptance of the proposer's own drafts carried so
    (recorded under ``narrow_key``) and the prior, never with its acceptance elsewhere: what a copy lookup gets
    right inside a value says little of the key or separator that follows one (SmolLM2's nested tool calls on
    llama.cpp: narrow drafts priced at the proposer's replayed 0.75 a token saved 55 passes in 199, and the policy
    ran 0.94x ``ff``). 0 where neither the profile nor serving priced a restricted plain step (no
    such head), for the draft model (a sampled draft cut where its own tokens lead would be biased:
    ``Drafter.draft``), and where none pays."""
    restricted = costs.restricted()
    if proposer == DRAFT_MODEL or restricted is None or restricted.step_seconds(batch_size, 0) is None:
        return 0
    narrow = evidence.at_bucket(narrow_key(proposer), batch_size, config.min_evidence_tokens)
    return best_draft_length(priced_evidence(narrow, config), restricted, proposer, batch_size, config)


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


@dataclass(frozen=True)
class DraftPrice:
    """One draft length as the cost model prices it: (T(b, k) + D(k)) / (1 + E[accepted | k])."""

    k: int
    step_seconds: float | None  # T(b, k): the target step carrying a k-token draft (None: not measured)
    propose_seconds: float  # D(k): the proposer's own drafting time per draft made (empty lookups included)
    expected_accepted: float  # E[accepted | k] at the priced acceptance
    seconds_per_token: float | None  # per committed token (k = 0: the plain step)


@dataclass(frozen=True)
class DraftPricing:
    """Why a proposer drafts as far as it does for a schema at a batch bucket: the evidence, the acceptance it was
    priced at, the plain step and each draft length's price, and the length the cost model chose (0: none pays by
    ``gain_margin``)."""

    proposer: str
    batch_bucket: int
    evidence_tokens: float  # the schema's own drafted tokens read (cold under ``min_evidence_tokens``)
    acceptance: float | None  # measured, per examined token (None: nothing drafted)
    cold: bool  # priced with the prior (``prior_acceptance``) added to the thin evidence
    chosen: int
    prices: tuple[DraftPrice, ...]  # k = 0 .. max_draft
    replayed_tokens: float = 0.0  # drafts replayed on the schema's finished outputs (``speculation.replay``)
    replayed_acceptance: float | None = None  # theirs, per examined token (None: none replayed)
    restricted_chosen: int = 0  # the longer length drafted where every scored set is small (0: none longer)


def price_draft(evidence: SchemaEvidence, costs: CostEvidence, proposer: str, batch_size: int,
                config: PolicyConfig) -> DraftPricing:
    """The cost model's view of ``proposer`` for a schema, as ``decide`` reads it (cold: with the prior), for the
    schema owners' view. The guard, overrides, short outputs and probes are ``decide``'s, not priced here."""
    ev = evidence.at_bucket(proposer, batch_size, config.min_evidence_tokens)
    cold = ev is None or ev.drafted < config.min_evidence_tokens
    replayed = evidence.replayed.get(proposer)
    priced = priced_evidence(ev, config, replayed)
    chosen = (cold_draft_length if cold else best_draft_length)(priced, costs, proposer, batch_size, config)
    prices = []
    for k in range(config.max_draft + 1):
        step = costs.step_seconds(batch_size, k)
        d = costs.propose_seconds(proposer, k) if k else 0.0
        e = priced.expected_accepted(k)
        prices.append(DraftPrice(k, step, d, e, (step + d) / (1.0 + e) if step is not None else None))
    acceptance = ev.acceptance if ev is not None and ev.drafted > 0 else None
    wide = restricted_draft_length(evidence, costs, proposer, batch_size, config)
    return DraftPricing(proposer, batch_bucket(batch_size), ev.drafted if ev is not None else 0.0, acceptance, cold,
                        chosen, tuple(prices), replayed.drafted if replayed is not None else 0.0,
                        replayed.acceptance if replayed is not None and replayed.drafted > 0 else None,
                        wide if wide > chosen else 0)


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
    kind: Any = schema.get("type")
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
            return 2.0 + min(int(schema["maxLength"]), 400) / 8
        return 2.0 + (4.0 if "format" in schema else 10.0)
    return float(_TYPE_TOKENS.get(kind, 4))
