"""Statistics as additive counters: one number per (model, schema, hour, series, proposer, batch bucket, label).

Every statistic structspec keeps is a sum, so one table of counters holds them all and a
store writes them with plain add-upserts (no read-modify-write, any number of replicas).
The series (below) say what a counter counts; ``label`` carries the one extra dimension a
series has (a draft position, a histogram bucket, a finish or decision reason, a step's
draft length). Windows (1 h, 24 h, 7 d, ...) are sums of hourly counters.

``model`` keys statistics by the model that produced them (served name, weights, prompt format and draft
version, ``model_key``): a demo server and a Gemma server sharing a data directory never mix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOUR = 3600


def hour_of(ts: float) -> int:
    """Start (unix seconds) of the hour holding ``ts``."""
    return int(ts // HOUR) * HOUR


def batch_bucket(batch_size: int) -> int:
    """A running batch size rounded up to a power of two (1, 2, 4, 8, ...)."""
    size = max(1, int(batch_size))
    return 1 << (size - 1).bit_length()


def model_key(name: str, draft_version: str = "", prompt_format: str = "", identity: str = "", engine: str = "") -> str:
    """The model statistics are kept under: ``<name>@<identity>+<prompt format>[+draft:<version>][+<engine>]``, e.g.
    ``gemma-3-270m@1a2b3c4d5e6f+plain-v5+json-label``, ``smollm2@9f8e7d6c5b4a+chat-v2:5e6f7a8b+draft:1a2b3c4d`` and
    ``demo@4bff5f0f0a20+plain-v5+vllm:ngram``.

    ``name``: the served name (what people read); ``identity``: the weights' content (``models.identity``: two
    fine-tunes served under one name keep apart); ``prompt_format``: how prompts are rendered
    (``PromptFormat.stats_format``: a new wording, a new key); ``draft_version``: the draft model's weights;
    ``engine``: another engine than structspec's own, with its speculative method (``vllm``, ``vllm:ngram``).
    Acceptance measured for one of these is not mixed with another's. An empty part is left out."""
    key = f"{name}@{identity}" if identity else name
    key = f"{key}+{prompt_format}" if prompt_format else key
    key = f"{key}+draft:{draft_version}" if draft_version else key
    return f"{key}+{engine}" if engine else key


def acceptance_of(accepted_examined: int, examined: int, accepted: int, drafted: int) -> float | None:
    """Accepted per examined drafted token (the measure the policy's threshold applies to), or accepted per
    drafted token where nothing was examined; None when nothing was drafted."""
    if examined:
        return accepted_examined / examined
    return accepted / drafted if drafted else None

@dataclass(frozen=True, order=True)
class CounterKey:
    model: str
    schema_key: str  # "" for the model's own series (step costs)
    hour: int  # unix seconds, a multiple of HOUR
    series: str  # one of Series
    proposer: str = ""
    batch_bucket: int = 0
    label: str = ""


class Series:
    """What a counter counts. Per schema and hour unless noted."""

    # per request, recorded when it ends
    REQUESTS = "requests"
    OUTPUT_TOKENS = "output_tokens"
    TARGET_PASSES = "target_passes"
    FORCED_TOKENS = "forced_tokens"
    FINISH = "finish"  # label: stop | length | cancelled | error
    OUTPUT_LENGTH = "output_length"  # label: histogram upper bound (LENGTH_BOUNDS)
    LATENCY_MS = "latency_ms"  # label: histogram upper bound (LATENCY_BOUNDS_MS)
    LATENCY_MS_SUM = "latency_ms_sum"
    DECISION = "decision"  # label: a Reason; proposer "" for the request, else that proposer's own reason
    NAME = "name"  # label: the readable name a caller gave an inline schema (the OpenAI API's json_schema.name)
    # per batch bucket (at the decision), label: the arm (with or without the draft model), complete requests only
    ARM_REQUESTS = "arm_requests"
    ARM_DECODE_MS = "arm_decode_ms"
    ARM_TOKENS = "arm_tokens"
    # per (proposer, batch bucket), recorded after each verification that carried a draft
    VERIFICATIONS = "verifications"
    DRAFTED = "drafted"
    ACCEPTED = "accepted"
    PROBE_VERIFICATIONS = "probe_verifications"  # of VERIFICATIONS, those made by a recovery probe
    REACHED = "reached"  # label: draft position 1..k; the verifier examined it
    ACCEPTED_AT = "accepted_at"  # label: draft position; examined and accepted
    # per (proposer, batch bucket): drafts replayed on a finished output by a proposer that did not draft in it
    # (``speculation.replay``): what verification would have made of them; read only to price a cold proposer
    REPLAYED = "replayed"  # replayed drafts
    REPLAYED_DRAFTED = "replayed_drafted"
    REPLAYED_REACHED = "replayed_reached"  # label: draft position
    REPLAYED_ACCEPTED_AT = "replayed_accepted_at"  # label: draft position
    # per proposer: its own drafting time (label: tokens asked for)
    PROPOSALS = "proposals"
    PROPOSE_SECONDS = "propose_seconds"
    PROPOSALS_EMPTY = "proposals_empty"  # of PROPOSALS, those that made no draft (a lookup that found nothing)
    # the model's (schema_key ""), per batch bucket: target step times by the longest draft in the step (label),
    # proposer "" (a forward running the output layer) or RESTRICTED_HEAD (every scored row's allowed set was small)
    STEPS = "steps"
    STEP_SECONDS = "step_seconds"
    # the model's: the executor's step profile measured at start (``models.step_profile``), per batch bucket, label
    # the draft length k, proposer "full" | "restricted" (the output head) | "draft" (the draft model, per token)
    PROFILE_STEPS = "profile_steps"
    PROFILE_SECONDS = "profile_seconds"


RESTRICTED_HEAD = "restricted"  # the head of a forward scoring small allowed sets alone (steps and profile rows)


def narrow_key(proposer: str) -> str:
    """The name a proposer's drafts carried on its restricted cap are recorded under: drafts made where every scored
    position allows few tokens (a key, a separator), whose acceptance is theirs, not the proposer's elsewhere."""
    return f"{proposer}/narrow"


LONG_MATCH_PROPOSERS = ("ngram",)  # the proposers whose long matches are drafts of their own (``long_match_key``)


def long_match_key(proposer: str) -> str:
    """The name a copy lookup's drafts from a long match are drafted, capped and recorded under
    (``speculation.ngram``): a copy under way or a repeat, accepted far more often than a short match's draft."""
    return f"{proposer}/long"


def draft_keys(proposer: str) -> tuple[str, ...]:
    """The names ``proposer``'s drafts are capped and priced under: its own, and its long matches' where it has
    them. The policy decides each apart; the proposer is asked where any of them may draft."""
    return (proposer, long_match_key(proposer)) if proposer in LONG_MATCH_PROPOSERS else (proposer,)


def proposer_of(key: str) -> str:
    """The proposer a draft key (``draft_keys``, ``narrow_key``) belongs to: what drafts, and whose lookups cost."""
    return key.split("/", 1)[0]


class Arm:
    """The end-to-end comparison the policy keeps per schema: requests decoded with the draft model or without."""

    DRAFT = "draft"
    NO_DRAFT = "no_draft"


class Reason:
    """Why a request (or one proposer) drafted or not: the labels of ``Series.DECISION``."""

    DRAFTED = "drafted"  # at least one proposer may draft
    COLD = "cold"  # not enough evidence yet: drafting, measuring
    REQUEST_OFF = "request_off"  # the request asked for no drafting
    SCHEMA_OFF = "schema_off"  # the schema's owner turned drafting off
    SCHEMA_ON = "schema_on"  # the schema's owner turned drafting on (the policy's switches bypassed)
    SERVER_OFF = "server_off"  # the server's speculation configuration drafts nothing
    SHORT_OUTPUT = "short_output"  # predicted output under min_predicted_length: fast-forward only
    LOW_ACCEPTANCE = "low_acceptance"  # under acceptance_threshold at this batch bucket
    NO_GAIN = "no_gain"  # the cost model finds no draft length beating plain decoding
    PRICED_OUT = "priced_out"  # cold, and at the prior acceptance no draft length pays at the measured step costs
    BATCH_SIZE = "batch_size"  # the running batch is past the proposer's limit
    PROBE = "probe"  # a recovery probe: drafting with proposers the policy had switched off
    EXPLORE = "explore"  # the draft model left out of a request to keep measuring the schema without it
    POLICY_ERROR = "policy_error"  # the policy raised (a bug, logged): no drafting for the request
    SAMPLED_ON_VLLM = "sampled_on_vllm"  # a sampled request on vLLM: its proposers' drafts were measured biased


LENGTH_BOUNDS: tuple[float, ...] = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, math.inf)
LATENCY_BOUNDS_MS: tuple[float, ...] = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 20000, 30000, 60000, 120000,
                                        300000, math.inf)


def histogram_label(value: float, bounds: tuple[float, ...]) -> str:
    """The label of the first bucket whose upper bound is >= ``value`` ("inf" for the last)."""
    for bound in bounds:
        if value <= bound:
            return "inf" if math.isinf(bound) else str(int(bound))
    return "inf"


def label_bound(label: str) -> float:
    return math.inf if label == "inf" else float(label)


def histogram_quantile(counts: dict[str, float], q: float, bounds: tuple[float, ...]) -> float | None:
    """The ``q`` quantile of a histogram (label -> count) over ``bounds``, linear within its bucket (between the
    bucket's own lower and upper bound); the last, unbounded bucket gives its lower bound. None when empty."""
    items = sorted(((label_bound(k), v) for k, v in counts.items() if v > 0))
    total = sum(v for _, v in items)
    if total <= 0:
        return None
    target, seen = q * total, 0.0
    for upper, n in items:
        lower = max((b for b in bounds if b < upper), default=0.0)
        if seen + n >= target:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * ((target - seen) / n)
        seen += n
    return items[-1][0]
