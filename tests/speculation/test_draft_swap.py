"""A draft model swapped into a running engine under load: every request is served by one draft version to its end
(the one it was admitted with, named in its result), greedy outputs stay those of plain decoding, statistics land
per version, the replaced draft's executor is freed, and the policy judges the new version on its own evidence."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import shutil
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from structspec.assembly import AssemblyConfig, assemble_engine, engine_model_key
from structspec.bench.workloads import build_workload
from structspec.engine.api import ExtractionRequest
from structspec.engine.config import PolicyConfig, SchedulerLimits
from structspec.engine.sequence import Serving
from structspec.engine.types import (DraftLoadError, DraftsUnsupported, FinishReason, SamplingParams,
                                     SchemaSpeculation, SpeculationMode)
from structspec.models.loading import weights_version
from structspec.models.profiles import DEMO_DIR
from structspec.speculation.configs import ProposerSet, speculation_config
from structspec.speculation.router import Router
from structspec.stats.book import StatsBook
from structspec.stats.counters import HOUR, Reason, Series

FIRST_WAVE, SECOND_WAVE, MAX_TOKENS = 10, 6, 64


def perturbed_draft(folder: Path, seed: int = 0, scale: float = 0.05) -> Path:
    """The demo draft with noise on its weights: another version of the same draft, still a fair drafter."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(DEMO_DIR / "draft", folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * (p.std() if p.numel() > 1 else 1.0))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def second_draft(tmp_path_factory) -> Path:
    return perturbed_draft(tmp_path_factory.mktemp("drafts") / "draft-b")


def _request(item, i: int, off: bool = False) -> ExtractionRequest:
    return ExtractionRequest(schema=item.schema, text=item.source, sampling=SamplingParams(max_tokens=MAX_TOKENS),
                             request_id=f"r{i}{'-off' if off else ''}",
                             speculation=SpeculationMode.OFF if off else SpeculationMode.AUTO)


@dataclass
class SwapRun:
    results: dict[str, object]  # request id -> GenerationResult
    first: list[str]  # request ids running when the swap started (admitted before it)
    second: list[str]  # request ids sent after it returned
    drafted_by: dict[tuple[int, ...], set[str]]  # prompt ids -> the draft versions that actually drafted for it
    prompts: dict[str, tuple[int, ...]]  # request id -> prompt ids
    swap: object


def run_swap(engine, path: Path, items) -> SwapRun:
    """FIRST_WAVE requests admitted, the swap, SECOND_WAVE requests after it; every draft proposal spied on."""
    router = engine.core.speculator
    drafted_by: dict[tuple[int, ...], set[str]] = {}

    def spy(proposer, version):
        inner = proposer.propose

        def propose(ctx, k):
            drafted_by.setdefault(tuple(ctx.prompt_ids), set()).add(version)
            return inner(ctx, k)

        proposer.propose = propose

    spy(router.draft, router.draft_version)
    install = router.install_draft

    def spying_install(proposer, version, stats):
        spy(proposer, version)
        install(proposer, version, stats)

    router.install_draft = spying_install
    requests = [_request(item, i) for i, item in enumerate(items)]
    prompts = {r.request_id: tuple(engine.prepare_extraction(r).prompt) for r in requests}

    async def main() -> SwapRun:
        first = [asyncio.create_task(engine.extract(r)) for r in requests[:FIRST_WAVE]]
        wanted, admitted = {r.request_id for r in requests[:FIRST_WAVE]}, set()
        deadline = time.monotonic() + 120
        while admitted != wanted:  # every first-wave request admitted (and so bound to the old draft)
            admitted |= {s.request_id for s in list(engine.core.scheduler.running)}
            assert time.monotonic() < deadline and not any(t.done() and t.exception() for t in first), admitted
            await asyncio.sleep(0.002)
        swap = await engine.load_draft(str(path))
        assert engine.running() > 0, "the first wave finished before the swap: nothing was swapped under load"
        second = [asyncio.create_task(engine.extract(r)) for r in requests[FIRST_WAVE:]]
        done = await asyncio.gather(*first, *second)
        return SwapRun({r.request_id: res for r, res in zip(requests, done)},
                       [r.request_id for r in requests[:FIRST_WAVE]], [r.request_id for r in requests[FIRST_WAVE:]],
                       drafted_by, prompts, swap)

    return asyncio.run(main())


def test_a_draft_swapped_under_load_serves_only_later_requests(demo_models, demo_compiler, second_draft):
    old_key, new_version = engine_model_key(demo_models), weights_version(second_draft)
    old_version, new_key = demo_models.draft_version, engine_model_key(replace(demo_models, draft_version=new_version))
    assert new_version != old_version
    book = StatsBook()
    engine = assemble_engine(demo_models, AssemblyConfig(limits=SchedulerLimits(max_batch=32, max_queue=64),
                             proposers=speculation_config("all").proposers, compiler=demo_compiler,
                             stats=book.recorder(old_key)))
    old_executor = weakref.ref(engine.core.speculator.draft.executor)
    items = build_workload("freetext", FIRST_WAVE + SECOND_WAVE)
    engine.start()
    try:
        run = run_swap(engine, second_draft, items)
        baseline = asyncio.run(_all(engine, [_request(item, i, off=True) for i, item in enumerate(items)]))
    finally:
        engine.stop()

    assert run.swap.loaded and (run.swap.draft_version, run.swap.model_key) == (new_version, new_key)
    assert (run.swap.previous_draft_version, run.swap.previous_model_key) == (old_version, old_key)
    assert engine.model_key == new_key and engine.draft_version == new_version
    for rid, res in run.results.items():  # no request failed; each names one version, the one it was admitted with
        assert res.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), (rid, res.error)
        want = (old_version, old_key) if rid in run.first else (new_version, new_key)
        assert (res.draft_version, res.model_key) == want, rid
        assert run.drafted_by.get(run.prompts[rid], set()) <= {res.draft_version}, rid  # never drafted by the other
    assert sum(bool(run.drafted_by.get(run.prompts[r])) for r in run.first) >= FIRST_WAVE // 2
    assert any(run.drafted_by.get(run.prompts[r]) for r in run.second)
    # greedy: the text of plain decoding, whichever draft drafted
    for off in baseline:
        assert run.results[off.request_id.removesuffix("-off")].text == off.text, off.request_id

    rows = book.rows()

    def total(model: str, series: str, proposer: str = "") -> float:
        return sum(v for k, v in rows.items() if k.model == model and k.series == series
                   and (not proposer or k.proposer == proposer))

    assert total(old_key, Series.REQUESTS) == FIRST_WAVE
    assert total(new_key, Series.REQUESTS) == SECOND_WAVE + len(baseline)  # the baselines ran after the swap
    assert total(old_key, Series.VERIFICATIONS, "draft") > 0 and total(new_key, Series.VERIFICATIONS, "draft") > 0

    router = engine.core.speculator
    assert router.live_drafts() == {new_version: 0}
    gc.collect()
    assert old_executor() is None, "the replaced draft's executor is still referenced"


async def _all(engine, requests):
    return await asyncio.gather(*(engine.extract(r) for r in requests))


def test_bad_drafts_and_engines_without_drafts_are_refused(demo_models, demo_compiler, tmp_path, second_draft):
    engine = assemble_engine(demo_models, AssemblyConfig(proposers=speculation_config("all").proposers,
                                                         compiler=demo_compiler))
    engine.start()
    try:
        for path, words in ((tmp_path / "missing", "not a folder"), (tmp_path, "no config.json")):
            with pytest.raises(DraftLoadError, match=words) as err:
                asyncio.run(engine.load_draft(str(path)))
            assert err.value.field == "path"
        other = shutil.copytree(second_draft, tmp_path / "other-tokenizer")
        tok = json.loads((other / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        vocab["Ġw"], vocab["ĠS"] = vocab["ĠS"], vocab["Ġw"]  # two ids swapped: another tokenizer
        (other / "tokenizer.json").write_text(json.dumps(tok))
        with pytest.raises(DraftLoadError, match="does not share the tokenizer"):
            asyncio.run(engine.load_draft(str(other)))
        same = asyncio.run(engine.load_draft(str(DEMO_DIR / "draft")))  # the version serving: nothing changes
        assert not same.loaded and same.draft_version == demo_models.draft_version == engine.draft_version
        assert engine.core.speculator.live_drafts() == {demo_models.draft_version: 0}
    finally:
        engine.stop()
    for proposers in (None, ProposerSet(ngram=True, history=True, draft=False)):
        plain = assemble_engine(demo_models, AssemblyConfig(proposers=proposers, compiler=demo_compiler))
        with pytest.raises(DraftsUnsupported):
            asyncio.run(plain.load_draft(str(second_draft)))


@dataclass
class Seq:
    schema_key: str = "invoice@1"
    schema: dict | None = None
    speculate: bool = True
    schema_speculation: SchemaSpeculation = SchemaSpeculation.AUTO
    decision: object = None
    speculation: object = None
    serving: object = None
    finish: object = None
    output: tuple = ()


class DraftStub:
    name = "draft"

    def __init__(self):
        self.closed = False

    def release(self, state):
        pass

    def close(self):
        self.closed = True


LONG = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(8)}}


def test_the_policy_judges_a_new_draft_version_on_its_own_evidence():
    """The old version's draft acceptance is poor (switched off); a new version starts cold, measured afresh,
    while sequences admitted before the swap keep the old version's evidence and draft."""
    now = [1000 * HOUR]
    book = StatsBook(clock=lambda: now[0])
    old, new = book.recorder("demo+draft:old"), book.recorder("demo+draft:new")
    for _ in range(200):
        old.record_verification("invoice@1", "draft", 1, 8, 0, False)
    first, second = DraftStub(), DraftStub()
    router = Router(None, ProposerSet(ngram=False, history=False, draft=True), 16, draft=first, stats=old,
                    policy=PolicyConfig(probe_rate=0.0), rng=random.Random(0), draft_version="old")
    before = Seq(schema=LONG, serving=Serving(old))
    assert router.decide(before, 1).reasons["draft"] == Reason.LOW_ACCEPTANCE
    router.install_draft(second, "new", new)
    after = Seq(schema=LONG, serving=Serving(new))
    assert router.decide(after, 1).reasons["draft"] == Reason.COLD  # no evidence of its own yet
    assert router.decide(before, 2).reasons["draft"] == Reason.LOW_ACCEPTANCE  # the old one's own, still
    assert before.speculation.draft.proposer is first and after.speculation.draft.proposer is second
    assert router.live_drafts() == {"old": 1, "new": 1} and not first.closed
    router.on_finish(before)
    assert first.closed and router.live_drafts() == {"new": 1}
    states = book.policy.latest()  # the policy's state per version: off on the old one, cold on the new one
    assert states[("demo+draft:old", "invoice@1", "draft")].reason == Reason.LOW_ACCEPTANCE
    assert states[("demo+draft:new", "invoice@1", "draft")].reason == Reason.COLD


class HistoryStore:
    """The two calls ``persisted_history`` makes of a store."""

    def __init__(self, stored: dict[str, list[tuple[str, str]]]):
        self.stored, self.appended = stored, []

    async def load_history(self, model, per_key, max_keys):
        return list(self.stored.get(model, []))

    def append_history(self, model, key, text, now):
        self.appended.append((model, key, text))


def test_the_schema_history_is_kept_under_the_model_whatever_draft_serves(demo_models):
    from structspec.assembly import history_model_key, persisted_history

    model = history_model_key(demo_models)
    assert model == history_model_key(replace(demo_models, draft_version="0123456789ab")) == engine_model_key(
        replace(demo_models, draft=None))  # the statistics key without the draft's version
    store = HistoryStore({model: [("contact@1", '{"a": 1}')], "demo": [("contact@1", '{"b": 1}')]})
    history = persisted_history(store, model)
    assert history.outputs("contact@1") == ['{"a": 1}']  # its own key's, not the bare name's
    history.add("contact@1", '{"a": 2}')
    assert store.appended == [(model, "contact@1", '{"a": 2}')]
