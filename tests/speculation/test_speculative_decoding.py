"""Correctness gates of speculation on the demo models: greedy identity, trimmed bad drafts, same distribution."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from structspec.bench.workloads import build_workload
from structspec.engine.api import ChatMessage, ExtractionRequest, ToolCallRequest
from structspec.engine.core import run_until_idle
from structspec.engine.types import FinishReason, SamplingParams
from structspec.grammar.base import allocate_bitmask, apply_token_bitmask
from structspec.models.executor import StepInput
from structspec.speculation.base import Draft
from structspec.speculation.configs import ProposerSet, speculation_config
from tests.engine.fakes import AlwaysDrafts

ITEMS = build_workload("extraction", 4) + build_workload("freetext", 3) + build_workload("toolcall", 3)


def sequences(engine, items, max_tokens=200):
    seqs = []
    for item in items:
        params = SamplingParams(max_tokens=max_tokens)
        if item.kind == "toolcall":
            req = ToolCallRequest(messages=(ChatMessage("user", item.source),), tools=item.tools,
                                  tool_choice="required", sampling=params)
            seqs.append(engine.prepare_toolcall(req))
        else:
            seqs.append(engine.prepare_extraction(ExtractionRequest(schema=item.schema, text=item.source,
                                                                    schema_key=item.schema_name, sampling=params)))
    return seqs


def assert_same_or_near_tie(engine, ref, got):
    """Identical tokens, or a first divergence at a floating-point near-tie of the masked target logits (the
    executor's own evaluation of the whole prefix, in a sequence of its own)."""
    if ref.output == got.output:
        return
    d = next(i for i, (a, b) in enumerate(zip(ref.output, got.output)) if a != b)
    executor = engine.core.executor
    matcher = ref.grammar.matcher()
    assert matcher.consume(ref.output[:d])
    sid = executor.new_sequence()
    try:
        (logits,) = executor.step([StepInput(sid, ref.prompt + ref.output[:d], logits_at=(-1,))])
    finally:
        executor.free(sid)
    logits = logits[0]
    bitmask = allocate_bitmask(1, logits.shape[-1])
    matcher.fill_mask(bitmask, 0)
    top2 = torch.topk(apply_token_bitmask(logits[None], bitmask)[0], 2).values
    assert float(top2[0] - top2[1]) < 1e-4, f"divergence at {d} is not a near-tie"


@pytest.mark.parametrize("config", ["ff+ngram", "ff+ngram+history", "all"])
def test_greedy_identical_with_speculation(make_engine, config):
    plain = make_engine()
    spec = make_engine(proposers=speculation_config(config).proposers, max_spec_batch=64)
    ref = sequences(plain, ITEMS)
    run_until_idle(plain.core, ref)
    # twice, so the schema history has something to propose the second time
    for _ in range(2):
        got = sequences(spec, ITEMS)
        run_until_idle(spec.core, got)
        for r, g in zip(ref, got):
            assert g.finish is r.finish is FinishReason.STOP
            assert_same_or_near_tie(plain, r, g)
    drafted = sum(sum(s.usage.drafted.values()) for s in got)
    accepted = sum(sum(s.usage.accepted.values()) for s in got)
    assert drafted > 0 and 0 < accepted <= drafted
    assert sum(s.usage.target_forward_passes for s in got) < sum(s.usage.target_forward_passes for s in ref)


class GarbageProposer(AlwaysDrafts):
    """Drafts random tokens: mostly ungrammatical. They must be trimmed and never reach the output."""

    def __init__(self, vocab):
        self.rng, self.vocab = random.Random(0), vocab

    def propose(self, seq, k, narrow=True):
        return Draft([self.rng.randrange(self.vocab) for _ in range(k)], None, "garbage")

    def on_verified(self, seq, verdict):
        pass

    def on_finish(self, seq):
        pass


def test_ungrammatical_drafts_are_trimmed(make_engine):
    plain = make_engine()
    bad = make_engine()
    bad.core.speculator = GarbageProposer(bad.core.executor.vocab_size)
    ref, got = sequences(plain, ITEMS[:4]), sequences(bad, ITEMS[:4])
    run_until_idle(plain.core, ref)
    run_until_idle(bad.core, got)
    for r, g in zip(ref, got):
        assert g.output == r.output
        assert g.usage.drafted["garbage"] > g.usage.accepted.get("garbage", 0)


def test_seeded_sampling_is_the_same_text_whatever_the_server_state(make_engine):
    """The draft model drafts with the verifier's keyed noise, so every draft is a point mass and a seeded
    request's text is plain keyed sampling's: alone, beside 8 others, after the schema history has filled,
    and with speculation off. Exact per seed (no statistics needed)."""
    schema = {"type": "object", "properties": {"priority": {"enum": ["low", "medium", "high", "urgent"]},
                                               "summary": {"type": "string"}},
              "required": ["priority", "summary"], "additionalProperties": False}
    texts = [item.source for item in build_workload("freetext", 9)]
    params = lambda seed: SamplingParams(temperature=1.0, top_p=0.95, seed=seed, max_tokens=60)  # noqa: E731

    def seqs(engine, seeds, text=texts[0]):
        return [engine.prepare_extraction(ExtractionRequest(schema=schema, text=text, sampling=params(s),
                                                            schema_key="ticket")) for s in seeds]

    plain = make_engine()
    spec = make_engine(proposers=speculation_config("all").proposers, max_spec_batch=64)
    seeds = range(12)
    ref = seqs(plain, seeds)
    run_until_idle(plain.core, ref)
    alone = []
    for seed in seeds:
        (seq,) = seqs(spec, [seed])
        run_until_idle(spec.core, [seq])
        alone.append(seq)
    crowd = seqs(spec, seeds)  # beside 8 other requests of the same schema
    others = [s for t in texts[1:] for s in seqs(spec, [99], text=t)]
    run_until_idle(spec.core, crowd + others)
    for _ in range(2):  # the history is full now
        run_until_idle(spec.core, seqs(spec, range(100, 108)))
    late = seqs(spec, seeds)
    run_until_idle(spec.core, late)
    for r, a, c, la in zip(ref, alone, crowd, late):
        assert r.output == a.output == c.output == la.output
    assert len({tuple(r.output) for r in ref}) > 3  # different seeds really sample differently
    drafted = sum(s.usage.drafted.get("draft", 0) + s.usage.drafted.get("history", 0) for s in alone + late)
    accepted = sum(s.usage.accepted.get("draft", 0) + s.usage.accepted.get("history", 0) for s in alone + late)
    assert drafted > 50 and 0 < accepted < drafted  # drafts were made, some accepted, some rejected


class OracleProposer(AlwaysDrafts):
    """Drafts the reference continuation: every draft is accepted, and the last one completes the grammar."""

    def __init__(self, reference):
        self.reference = reference  # request order -> reference output tokens

    def propose(self, seq, k, narrow=True):
        ref = self.reference[seq.prompt_key]
        n = len(seq.output)
        return Draft(ref[n:n + k], None, "oracle") if n < len(ref) else None

    def on_verified(self, seq, verdict):
        pass

    def on_finish(self, seq):
        pass


def test_draft_that_completes_the_grammar_ends_without_bonus(make_engine):
    plain, oracle = make_engine(), make_engine()
    ref = sequences(plain, ITEMS[:5])
    run_until_idle(plain.core, ref)
    got = sequences(oracle, ITEMS[:5])
    for r, g in zip(ref, got):
        g.prompt_key = r.prompt_key = tuple(r.prompt)
    oracle.core.speculator = OracleProposer({tuple(r.prompt): r.output for r in ref})
    run_until_idle(oracle.core, got)
    for r, g in zip(ref, got):
        assert g.finish is FinishReason.STOP and g.output == r.output
        assert g.usage.accepted["oracle"] == g.usage.drafted["oracle"] > 0
        assert g.usage.target_forward_passes < r.usage.target_forward_passes


def test_no_drafting_above_the_speculation_batch_limit(make_engine):
    spec = make_engine(proposers=speculation_config("ff+ngram+history").proposers, max_spec_batch=2)
    seen = []
    propose = spec.core.speculator.propose

    def counting(seq, k, narrow=True):
        seen.append(len(spec.core.scheduler.running))
        return propose(seq, k, narrow)

    spec.core.speculator.propose = counting
    run_until_idle(spec.core, sequences(spec, ITEMS[:4]))
    assert seen and max(seen) <= 2  # drafting resumed only once the batch shrank to the limit


def test_draft_model_stops_after_a_doubted_token(make_engine):
    """With a confidence bar no token clears, every draft is one token; with none, drafts run longer."""
    def mean_draft(confidence: float) -> float:
        engine = make_engine(ProposerSet(ngram=False, history=False, draft=True))
        engine.core.speculator.order = lambda ctx: [engine.core.speculator.draft]
        engine.core.speculator.draft.confidence = confidence
        seqs = sequences(engine, build_workload("freetext", 2), max_tokens=60)
        run_until_idle(engine.core, seqs)
        drafted = sum(s.usage.drafted.get("draft", 0) for s in seqs)
        steps = sum(s.usage.draft_steps.get("draft", 0) for s in seqs)
        assert steps > 0
        return drafted / steps

    assert mean_draft(1.01) == 1.0
    assert mean_draft(0.0) > 1.5


class GreedyOracle(OracleProposer):
    """The reference continuation, drafted 8 tokens at a time whatever k the engine asks for."""

    def propose(self, seq, k, narrow=True):
        return super().propose(seq, 8)


@pytest.mark.parametrize("max_tokens", [3, 6, 11])
def test_speculation_never_exceeds_max_tokens(make_engine, max_tokens):
    """A draft longer than asked is cut, so accepted + the new token fit: a length finish holds exactly max_tokens."""
    plain, oracle = make_engine(), make_engine()
    ref = sequences(plain, ITEMS[:4], max_tokens=200)
    run_until_idle(plain.core, ref)
    got = sequences(oracle, ITEMS[:4], max_tokens=max_tokens)
    for r, g in zip(ref, got):
        g.prompt_key = tuple(r.prompt)
    oracle.core.speculator = GreedyOracle({tuple(r.prompt): r.output for r in ref})
    run_until_idle(oracle.core, got)
    for r, g in zip(ref, got):
        assert len(g.output) <= max_tokens and g.output == r.output[:len(g.output)]
        if g.finish is FinishReason.LENGTH:
            assert len(g.output) == max_tokens
    assert any(g.finish is FinishReason.LENGTH for g in got)


def test_router_draft_length_respects_the_cap():
    from structspec.speculation.base import SequenceSpeculation
    from structspec.speculation.proposing import draft_length

    state = SequenceSpeculation("", accepted={"ngram": 3.0})  # a proposer that has been doing well
    assert draft_length(state, "ngram", 8) == 5
    assert draft_length(state, "ngram", 1) == 1  # one token left before max_tokens: never two
    assert draft_length(state, "history", 6) == 6  # not drafted yet: the maximum


def matcher_state(matcher, vocab: int):
    """What the step reads from a matcher: the mask, the forced tokens, accepting / stopped, the error."""
    mask = allocate_bitmask(1, vocab)
    matcher.fill_mask(mask, 0)
    return mask.tolist(), tuple(matcher.forced_tokens()), matcher.is_accepting(), matcher.is_stopped(), matcher.error


def test_proposers_leave_the_matcher_as_found(make_engine):
    """Every proposer may walk the sequence's matcher while drafting; the step must find it unchanged."""
    engine = make_engine(proposers=speculation_config("all").proposers, max_spec_batch=64)
    router, vocab = engine.core.speculator, engine.core.executor.vocab_size
    checked: Counter = Counter()
    for proposer in (router.ngram, router.history_proposer, router.draft):
        def checking(ctx, k, inner=proposer.propose, name=proposer.name):
            before = matcher_state(ctx.matcher, vocab)
            draft = inner(ctx, k)
            assert matcher_state(ctx.matcher, vocab) == before, f"{name} moved the matcher"
            checked[name] += 1
            return draft
        proposer.propose = checking
    for _ in range(2):  # the second round has a schema history to draft from
        run_until_idle(engine.core, sequences(engine, ITEMS[:2] + ITEMS[4:6], max_tokens=80))
    assert checked["ngram"] and checked["history"] and checked["draft"], checked
    # the check has teeth: a proposer that consumes a token and does not roll back is caught
    seq = sequences(engine, ITEMS[:1])[0]
    before = matcher_state(seq.matcher, vocab)
    mask = allocate_bitmask(1, vocab)
    seq.matcher.fill_mask(mask, 0)
    seq.matcher.consume([int(apply_token_bitmask(torch.zeros(1, vocab), mask)[0].argmax())])
    assert matcher_state(seq.matcher, vocab) != before
