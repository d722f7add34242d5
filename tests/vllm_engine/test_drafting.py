"""structspec's proposer as vLLM's worker drives it, without vLLM: a model runner's rows (request ids, the drafts
they verified, their outputs) played by a fake, and vLLM's verification played by a target output that keeps the
longest prefix of each draft it repeats and samples one token after it (what the rejection sampler does to a
one-hot draft under greedy decoding).

The invariant behind the attribution: every step commits its accepted tokens plus one, so the output's length is
the steps plus the tokens accepted, forced and per proposer; a journal that miscounts breaks it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from structspec.engine.config import PolicyConfig
from structspec.engine.sequence import EngineSequence
from structspec.engine.types import FinishReason, SamplingParams, Usage
from structspec.grammar import GrammarCompiler, TokenizerView
from structspec.speculation.history import SchemaHistory
from structspec.stats.book import StatsBook
from structspec.stats.counters import Reason, Series
from structspec.vllm_engine.drafting import DraftingPlan, Journal, RequestDrafter, Verification
from structspec.vllm_engine.grammar import vllm_lark
from structspec.vllm_engine.planning import DraftingFront
from structspec.vllm_engine.proposer import StructspecProposer

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "structspec" / "models" / "demo" / "target"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "city": {"type": "string", "maxLength": 30}},
          "required": ["name", "city"], "additionalProperties": False}
PROMPT = "Tyrell Corporation moved its offices to Los Angeles last year. Name and city, as JSON:"
ANSWER = '{"name":"Tyrell Corporation","city":"Los Angeles"}'


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(DEMO)


@pytest.fixture(scope="module")
def lark(tok):
    return vllm_lark(GrammarCompiler(TokenizerView(tok)).compile_schema(SCHEMA))


@pytest.fixture(scope="module")
def target(tok, lark):
    """The answer as the tokens a greedy target emits (each forced run as the grammar forces it), then EOS."""
    proposer = proposer_for(tok)
    matcher = proposer._matcher(lark)
    out: list[int] = []
    text = ANSWER
    while not matcher.is_stopped():
        forced = matcher.forced_tokens()
        step = forced[:1] or tok.encode(text[len(tok.decode(out)):], add_special_tokens=False)[:1]
        assert step and matcher.consume(step), (tok.decode(out), step)
        out += step
    assert tok.decode(out) == ANSWER
    return out + [tok.eos_token_id]


def proposer_for(tok, k: int = 8) -> StructspecProposer:
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                             model_config=SimpleNamespace(tokenizer=str(DEMO), trust_remote_code=False,
                                                          get_vocab_size=lambda: len(tok)))
    proposer = StructspecProposer(config)
    proposer._load_tokenizer([tok.eos_token_id])
    return proposer


def plan_for(tok, key: str = "r1", caps=None, **kw) -> DraftingPlan:
    return DraftingPlan(key, "company", "company", {"ngram": 8, "history": 8} if caps is None else caps,
                        schema=SCHEMA, end_of_turn=(tok.eos_token_id,), **kw)


class FakeRunner:
    """The rows vLLM's model runner holds: ``input_batch.req_ids``/``spec_token_ids`` and ``requests``."""

    def __init__(self):
        self.input_batch = SimpleNamespace(req_ids=[], spec_token_ids=[])
        self.requests = {}

    def add(self, rid, plan, prompt, lark):
        params = SimpleNamespace(extra_args={"structspec": plan.to_args()} if plan else None,
                                 structured_outputs=SimpleNamespace(grammar=lark))
        self.requests[rid] = SimpleNamespace(sampling_params=params, prompt_token_ids=prompt, output_token_ids=[])
        self.input_batch.req_ids.append(rid)
        self.input_batch.spec_token_ids.append([])


def play(proposer, runner, targets: dict[str, list[int]]) -> dict[str, int]:
    """Run the rows to the end of their targets, vLLM's way: prefill commits one token, then each step verifies
    the last drafts; the steps each request took."""
    proposer.attach(runner)
    steps = {rid: 1 for rid in targets}
    sampled = [[targets[rid][0]] for rid in runner.input_batch.req_ids]
    for rid, s in zip(runner.input_batch.req_ids, sampled):
        runner.requests[rid].output_token_ids = list(s)
    while True:
        drafts = proposer.propose(sampled, None, None)
        assert len(drafts) == len(runner.input_batch.req_ids)
        sampled = []
        for i, rid in enumerate(runner.input_batch.req_ids):
            out, want = runner.requests[rid].output_token_ids, targets[rid]
            if len(out) >= len(want):
                runner.input_batch.spec_token_ids[i] = []
                sampled.append([])
                continue
            draft = drafts[i]
            accepted = 0
            while accepted < len(draft) and len(out) + accepted < len(want) and draft[accepted] == want[len(out) + accepted]:
                accepted += 1
            committed = want[len(out): len(out) + accepted + 1]
            runner.input_batch.spec_token_ids[i] = list(draft)
            out.extend(committed)
            sampled.append(committed)
            steps[rid] += 1
        if not any(sampled):
            return steps


def journal_of(proposer, key) -> Journal:
    return Journal.from_dict(proposer.drain([key])[key])


def test_forced_tokens_then_copies_from_the_prompt_save_steps_and_every_token_is_attributed(tok, lark, target):
    proposer, runner = proposer_for(tok), FakeRunner()
    runner.add("a", plan_for(tok, "a"), tok.encode(PROMPT), lark)
    steps = play(proposer, runner, {"a": target})
    journal = journal_of(proposer, "a")
    accepted = journal.forced_accepted + sum(v.accepted for v in journal.verifications)
    assert steps["a"] + accepted == len(target)  # each step commits its accepted tokens and one more
    assert journal.forced_accepted >= 1 and journal.forced_drafted == journal.forced_accepted
    copied = [v for v in journal.verifications if v.proposer == "ngram"]
    assert copied and sum(v.accepted for v in copied) >= 3, journal
    assert all(0 <= v.accepted <= v.drafted <= 8 and v.batch_size == 1 for v in journal.verifications)
    assert journal.mismatches == 0 and journal.failures == 0
    assert steps["a"] < len(target) / 2
    assert proposer.drain(["a"]) == {}  # drained once


def test_a_plan_without_proposers_drafts_forced_tokens_only_and_one_turned_off_drafts_nothing(tok, lark, target):
    proposer, runner = proposer_for(tok), FakeRunner()
    runner.add("forced", plan_for(tok, "forced", caps={}), tok.encode(PROMPT), lark)
    runner.add("off", plan_for(tok, "off", caps={}, forced=False), tok.encode(PROMPT), lark)
    runner.add("none", None, tok.encode(PROMPT), lark)  # no plan: not structspec's request
    steps = play(proposer, runner, {"forced": target, "off": target, "none": target})
    forced, off = journal_of(proposer, "forced"), journal_of(proposer, "off")
    assert not forced.verifications and forced.forced_accepted > 0
    assert steps["forced"] + forced.forced_accepted == len(target)
    assert off == Journal() and steps["off"] == steps["none"] == len(target)


def test_drafts_are_grammatical_and_capped_per_proposer(tok, lark, target):
    proposer, runner = proposer_for(tok), FakeRunner()
    runner.add("a", plan_for(tok, "a", caps={"ngram": 2}), tok.encode(PROMPT), lark)
    play(proposer, runner, {"a": target})
    assert all(v.drafted <= 2 for v in journal_of(proposer, "a").verifications)
    # a proposer whose text leaves the grammar is cut where the grammar refuses: a copy across the closing quote
    plan = plan_for(tok, caps={"ngram": 8})
    drafter = RequestDrafter(plan, proposer._matcher(lark), tok.encode('x "name":"Ty"}}}} y'), proposer._decode,
                             {"ngram": _Copy(tok, '"}}}}')}, len(tok))
    drafter.advance(target[:9])  # inside the name's string
    draft = drafter.draft(8, 1)
    check = proposer._matcher(lark)
    assert check.consume(target[:9] + draft)
    assert tok.decode(draft).count("}") <= 1


class _Copy:
    name = "ngram"

    def __init__(self, tok, text):
        self.tok, self.text = tok, text

    def propose(self, ctx, k):
        from structspec.speculation.base import Draft

        return Draft(self.tok.encode(self.text, add_special_tokens=False)[:k], None, self.name)


def test_a_probe_drafts_within_its_budget(tok, lark, target):
    proposer, runner = proposer_for(tok), FakeRunner()
    runner.add("p", plan_for(tok, "p", probe_budget=3), tok.encode(PROMPT), lark)
    play(proposer, runner, {"p": target})
    assert sum(v.drafted for v in journal_of(proposer, "p").verifications) <= 3


def test_the_history_drafts_what_earlier_outputs_of_the_schema_wrote(tok, lark, target):
    proposer, runner = proposer_for(tok), FakeRunner()
    plan = plan_for(tok, "h", caps={"history": 8}, history=(ANSWER, ANSWER))
    runner.add("h", plan, tok.encode("Name and city, as JSON:"), lark)  # nothing to copy from the prompt
    steps = play(proposer, runner, {"h": target})
    journal = journal_of(proposer, "h")
    assert {v.proposer for v in journal.verifications} == {"history"}
    assert steps["h"] <= 6


def test_a_verified_draft_that_is_not_ours_is_counted_as_a_mismatch_not_attributed(tok, lark, target):
    proposer = proposer_for(tok)
    drafter = RequestDrafter(plan_for(tok), proposer._matcher(lark), tok.encode(PROMPT), proposer._decode, {}, len(tok))
    drafter.advance(target[:1])
    assert drafter.draft(8, 1)
    drafter.settle([target[5]], [target[5]], 1)
    assert drafter.journal.mismatches == 1 and not drafter.journal.verifications


def test_a_committed_token_the_grammar_refuses_ends_drafting_not_the_request(tok, lark, target):
    proposer = proposer_for(tok)
    drafter = RequestDrafter(plan_for(tok), proposer._matcher(lark), [], proposer._decode, {}, len(tok))
    drafter.advance(tok.encode("hello"))
    assert drafter.broken and drafter.draft(8, 1) == []


def test_rows_without_sampled_tokens_and_unknown_requests_draft_nothing(tok, lark):
    proposer, runner = proposer_for(tok), FakeRunner()
    runner.add("a", plan_for(tok, "a"), tok.encode(PROMPT), lark)
    proposer.attach(runner)
    assert proposer.propose([[]], None, None) == [[]]  # a prefill's chunk: nothing committed yet
    with pytest.raises(RuntimeError, match="worker_extension_cls"):
        proposer_for(tok).propose([[1]], None, None)


def test_plans_and_journals_cross_processes_as_plain_data(tok):
    plan = plan_for(tok, probe_budget=24, history=("a",), prose=True)
    assert DraftingPlan.from_args(json.loads(json.dumps(plan.to_args()))) == plan
    journal = Journal([Verification("ngram", 4, 2, 3, (1, 2, 3, 4))], 5, 5, 0, 0)
    assert Journal.from_dict(json.loads(json.dumps(journal.to_dict()))) == journal


LONG = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(12)},
        "required": [f"field_{i}" for i in range(12)]}


def seq_for(schema_key="company", speculate=True, scope="", fast_forward=True, schema=SCHEMA):
    return EngineSequence(request_id="x", prompt=[1, 2], params=SamplingParams(max_tokens=64), grammar=None,
                          matcher=None, seed=0, deadline=None, fast_forward=fast_forward, speculate=speculate,
                          schema_key=schema_key, schema=schema, on_event=lambda *a: None, history_scope=scope)


def test_the_front_plans_with_the_policy_and_records_the_journal_per_proposer_and_position():
    book = StatsBook()
    stats = book.recorder("m")
    history = SchemaHistory()
    history.add("tenant|company", ANSWER)
    front = DraftingFront(("ngram", "history"), 8, None, stats, history, (0,))
    seq = seq_for(scope="tenant")
    plan = front.plan(seq, 3)
    assert plan.caps == {"ngram": 8, "history": 8} and plan.forced and plan.history == (ANSWER,)
    assert plan.history_key == "tenant|company" and seq.decision is not None
    off = front.plan(seq_for(speculate=False), 3)
    assert off.caps == {} and off.forced  # the caller's off: no proposer drafts; forced tokens stay (own engine's rule)
    assert not front.plan(seq_for(fast_forward=False), 3).forced
    usage = Usage()
    accepted = front.record(seq, Journal([Verification("ngram", 4, 2, 3), Verification("history", 3, 3, 5)], 6, 6),
                            usage)
    assert accepted == 11 and usage.forced_tokens == 6 and usage.accepted == {"ngram": 2, "history": 3}
    rows = book.rows()
    at = {(k.proposer, k.batch_bucket, k.label) for k in rows if k.series == Series.ACCEPTED_AT and k.model == "m"}
    assert ("ngram", 4, "2") in at and ("ngram", 4, "3") not in at and ("history", 8, "3") in at  # buckets 3-4, 5-8
    front.finished(seq, [], '{"name":"x","city":"y"}', FinishReason.STOP)
    front.finished(seq, [], '{"name": "cut', FinishReason.LENGTH)
    assert history.outputs("tenant|company")[-1] == '{"name":"x","city":"y"}'


def test_a_cold_schema_priced_out_by_the_policy_gets_a_plan_without_proposers():
    """A policy whose step costs make every draft a loss (each extra row costs a whole step): the plan drafts
    forced tokens only, and says why."""
    book = StatsBook()
    stats = book.recorder("m")
    for k in range(9):
        for _ in range(20):
            stats.record_step(1, k, 0.01 * (k + 1))
    front = DraftingFront(("ngram", "history"), 8, PolicyConfig(probe_rate=0.0), stats, SchemaHistory(), (0,),
                          rng=random.Random(5))
    seqs = [seq_for(schema=LONG) for _ in range(20)]
    plans = [front.plan(s, 1) for s in seqs]
    assert all(p.caps == {} and p.forced for p in plans)
    assert {s.decision.reasons["ngram"] for s in seqs} == {Reason.PRICED_OUT}


def test_the_front_replays_a_priced_out_proposer_on_the_finished_output_and_then_plans_it_in(tok):
    """Copy lookup priced out at the prior (each drafted row costs 0.45 of a step): the finished output, a copy of
    the prompt's, replays its drafts (``speculation.replay``) and the next plan drafts with it."""
    book = StatsBook()
    stats = book.recorder("m")
    for k in range(9):
        for _ in range(20):
            stats.record_step(1, k, 0.01 * (1 + 0.45 * k))
    policy = PolicyConfig(probe_rate=0.0, min_evidence_tokens=8, prior_tokens=4)  # one output's replays outweigh it
    front = DraftingFront(("ngram",), 8, policy, stats, SchemaHistory(),
                          (tok.eos_token_id,), tokenizer=tok, vocab_size=len(tok))
    grammar = GrammarCompiler(TokenizerView(tok)).compile_schema(SCHEMA)

    def seq() -> EngineSequence:
        return EngineSequence(request_id="r", prompt=tok.encode(f"Copy it: {ANSWER} Now as JSON:"),
                              params=SamplingParams(max_tokens=64),
                              grammar=grammar, matcher=None, seed=0, deadline=None, fast_forward=True, speculate=True,
                              schema_key="company", schema=LONG, on_event=lambda *a: None)

    first = seq()
    assert front.plan(first, 1).caps == {} and first.decision.reasons["ngram"] == Reason.PRICED_OUT
    front.finished(first, tok.encode(ANSWER, add_special_tokens=False), ANSWER, FinishReason.STOP)
    replayed = {k.series: v for k, v in book.rows().items() if k.series == Series.REPLAYED_DRAFTED}
    assert sum(replayed.values()) >= 8
    assert not any(k.series == Series.DRAFTED for k in book.rows())  # replays are not drafting
    later = seq()
    assert front.plan(later, 1).caps.get("ngram", 0) >= 1 and later.decision.reasons["ngram"] == Reason.COLD
