"""The forward-step API on llama.cpp against llama.cpp's own evaluation of the whole sequence.

Reference: a fresh llama.cpp context (written here with the low-level API, not the
executor's code) that evaluates the whole token sequence in one ``llama_decode`` with
logits at every position. The executor feeds the same sequence in pieces: prefill,
decodes, k-token scoring, after rollbacks and prefix copies, beside other sequences.

Both test architectures are tiny random transformers models written to F32 GGUF
(Llama, and Gemma 3 with a sliding window of 8, so rollbacks and copies cross the
window). On F32 weights llama.cpp's kernels for a one-token and a many-token forward
differ only in rounding: measured <= 1.1e-3 over these tests (logits of magnitude ~0.3),
so TOL = 2e-3; a wrong position, cell or rollback moves logits by 1e-1 or more.

Gemma 3 270M Q4_K_M (the profile's GGUF): llama.cpp's own logits depend on the shape of
the forward (how many tokens, how many and which cache cells: ~1 logit, see
llamacpp_executor), so there the executor must give exactly what llama.cpp gives when
fed the same forwards.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.conftest import need_llamacpp

need_llamacpp()

from structspec.models.executor import ContextOverflow, InputError, StepInput  # noqa: E402
from structspec.models.gguf_export import export_gguf  # noqa: E402
from structspec.models.llamacpp_executor import LlamaCppExecutor  # noqa: E402
from structspec.models.llamacpp_model import LlamaCppError, LlamaCppModel, lib  # noqa: E402
from structspec.models.threads import cpu_budget  # noqa: E402
from tests.models.test_hf_executor import MODELS, VOCAB  # noqa: E402

TOL = 2e-3


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """name -> (transformers model, the LlamaCppModel of its F32 GGUF)."""
    out = {}
    for name, make in MODELS.items():
        hf = make()
        exported = export_gguf(hf, tmp_path_factory.mktemp("gguf") / f"{name}.gguf")
        out[name] = (hf, LlamaCppModel(exported.path))
    return out


@pytest.fixture(params=sorted(MODELS))
def model(request, ggufs):
    return ggufs[request.param][1]


def llama_reference(model: LlamaCppModel, pieces: list[list[int]], outputs: list[list[int]] | None = None,
                    kv_type: int = 1, drop: dict[int, int] | None = None) -> torch.Tensor:
    """llama.cpp's own evaluation: one sequence in a fresh context, ``pieces`` fed one ``llama_decode`` each with
    logits at ``outputs`` (default: every position), and after piece i its last ``drop[i]`` tokens removed;
    returns the logits rows in order."""
    llama_cpp = lib()
    p = llama_cpp.llama_context_default_params()
    total = sum(map(len, pieces))
    p.n_ctx = max(256, total)
    p.n_batch = p.n_ubatch = max(map(len, pieces))
    p.n_seq_max = 1
    p.n_outputs_max = max(map(len, pieces))
    p.n_threads = p.n_threads_batch = cpu_budget()  # the executor's default: llama.cpp's sums split by thread
    p.swa_full, p.kv_unified = True, True
    p.type_k = p.type_v = kv_type
    ctx = llama_cpp.llama_init_from_model(model.handle, p)
    batch = llama_cpp.llama_batch_init(p.n_batch, 0, 1)
    rows, at = [], 0
    try:
        for i, piece in enumerate(pieces):
            flags = set(range(len(piece))) if outputs is None else set(outputs[i])
            batch.n_tokens = len(piece)
            for j, tok in enumerate(piece):
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, at + j, 1
                batch.seq_id[j][0], batch.logits[j] = 0, int(j in flags)
            assert llama_cpp.llama_decode(ctx, batch) == 0
            for j in sorted(flags):
                ptr = llama_cpp.llama_get_logits_ith(ctx, j)
                rows.append(np.ctypeslib.as_array(ptr, shape=(model.info.n_vocab,)).copy())
            at += len(piece)
            if drop and i in drop:
                at -= drop[i]
                llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, at, -1)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return torch.from_numpy(np.stack(rows))


def whole(model: LlamaCppModel, tokens: list[int]) -> torch.Tensor:
    """[T, V]: the whole sequence in one forward, logits everywhere."""
    return llama_reference(model, [list(tokens)])


def test_exported_gguf_computes_what_transformers_computes(ggufs):
    """The GGUF writer (q/k permutation for Llama, +1 norms and the window for Gemma 3) is the same model."""
    rng = random.Random(0)
    tokens = [rng.randrange(VOCAB) for _ in range(24)]  # past Gemma's window of 8
    for hf, gguf in ggufs.values():
        with torch.no_grad():
            want = hf(torch.tensor([tokens])).logits[0]
        assert (whole(gguf, tokens) - want).abs().max() <= 3e-3


def test_prefill_then_decode_matches_whole_sequence(model):
    ex = LlamaCppExecutor(model)
    seq = ex.new_sequence()
    rng = random.Random(1)
    tokens = [rng.randrange(VOCAB) for _ in range(20)]
    got = [ex.step([StepInput(seq, tokens, logits_at=(-1,))])[0]]
    for _ in range(10):
        tok = rng.randrange(VOCAB)
        tokens.append(tok)
        got.append(ex.step([StepInput(seq, [tok], logits_at=(0,))])[0])
    assert (torch.cat(got) - whole(model, tokens)[19:]).abs().max() <= TOL
    assert ex.seq_len(seq) == len(tokens) == 30
    assert ex.forward_calls == 11


def test_k_token_scoring_and_unsorted_repeated_positions(model):
    """logits_at in any order, negative or repeated: each row is the logits of that position."""
    ex = LlamaCppExecutor(model)
    seq = ex.new_sequence()
    rng = random.Random(2)
    tokens = [rng.randrange(VOCAB) for _ in range(12)]
    ex.step([StepInput(seq, tokens[:7], logits_at=())])  # a prompt chunk that scores nothing
    (got,) = ex.step([StepInput(seq, tokens[7:], logits_at=(-1, 0, 2, -1))])
    ref = whole(model, tokens)
    assert got.shape == (4, VOCAB)
    assert (got - ref[[11, 7, 9, 11]]).abs().max() <= TOL


def test_mixed_lengths_in_one_batch_with_growth(model):
    """Sequences of different cached lengths and new-token counts share one forward; the pool and the sequence ids
    grow (the context is rebuilt and every sequence moved) without changing anyone's logits."""
    ex = LlamaCppExecutor(model, initial_tokens=256, initial_sequences=1)
    rng = random.Random(3)
    seqs = {}
    for n in (3, 100, 9):
        sid = ex.new_sequence()
        seqs[sid] = [rng.randrange(VOCAB) for _ in range(n)]
        ex.step([StepInput(sid, seqs[sid], logits_at=(-1,))])
    assert ex.cells == 256 and ex.allocated_bytes() > 0
    new = {sid: [rng.randrange(VOCAB) for _ in range(k)] for sid, k in zip(seqs, (1, 150, 3))}
    calls = ex.forward_calls
    outs = ex.step([StepInput(sid, toks, logits_at=tuple(range(len(toks)))) for sid, toks in new.items()])
    assert ex.cells == 512  # 112 + 154 cached tokens outgrew 256 cells
    assert ex.footprint(3, 250) >= ex.cells and ex.footprint(1, 1) == ex.cells  # sequences x longest bounds it
    assert ex.forward_calls == calls + 3  # 154 rows of logits, at most 64 per llama_decode
    for (sid, toks), got in zip(new.items(), outs):
        want = whole(model, seqs[sid] + toks)[len(seqs[sid]):]
        assert got.shape == want.shape
        assert (got - want).abs().max() <= TOL


def test_rollback_one_sequence_leaves_others(model):
    """Score 5 drafted tokens, keep 2, roll back: next logits equal the whole sequence's (across the window)."""
    ex = LlamaCppExecutor(model)
    rng = random.Random(4)
    a, b = ex.new_sequence(), ex.new_sequence()
    ta = [rng.randrange(VOCAB) for _ in range(14)]  # past the sliding window of 8
    tb = [rng.randrange(VOCAB) for _ in range(11)]
    ex.step([StepInput(a, ta), StepInput(b, tb)])
    for _ in range(4):  # several verify/reject rounds, each crossing the window edge
        draft_a = [rng.randrange(VOCAB) for _ in range(5)]
        draft_b = [rng.randrange(VOCAB) for _ in range(2)]
        scored_a, _ = ex.step([StepInput(a, draft_a, logits_at=range(5)), StepInput(b, draft_b, logits_at=range(2))])
        assert (scored_a - whole(model, ta + draft_a)[-5:]).abs().max() <= TOL
        ex.rollback(a, 3)  # keep 2 of 5
        ta += draft_a[:2]
        tb += draft_b  # b keeps everything
        assert ex.seq_len(a) == len(ta) and ex.seq_len(b) == len(tb)
        nxt_a, nxt_b = rng.randrange(VOCAB), rng.randrange(VOCAB)
        ga, gb = ex.step([StepInput(a, [nxt_a]), StepInput(b, [nxt_b])])
        ta.append(nxt_a)
        tb.append(nxt_b)
        assert (ga[0] - whole(model, ta)[-1]).abs().max() <= TOL
        assert (gb[0] - whole(model, tb)[-1]).abs().max() <= TOL


def test_copy_prefix_matches_whole_sequence_and_leaves_the_source_alone(model):
    ex = LlamaCppExecutor(model)
    rng = random.Random(5)
    shared = [rng.randrange(VOCAB) for _ in range(14)]  # longer than Gemma's window of 8
    src_tokens = shared + [rng.randrange(VOCAB) for _ in range(6)]
    src = ex.new_sequence()
    ex.step([StepInput(src, src_tokens)])
    dst = ex.new_sequence()
    ex.copy_prefix(dst, src, len(shared))
    assert ex.seq_len(dst) == len(shared) and ex.seq_len(src) == len(src_tokens)
    tail = [rng.randrange(VOCAB) for _ in range(5)]
    more = rng.randrange(VOCAB)
    got_dst, got_src = ex.step([StepInput(dst, tail, logits_at=range(5)), StepInput(src, [more])])
    assert (got_dst - whole(model, shared + tail)[-5:]).abs().max() <= TOL
    assert (got_src[0] - whole(model, src_tokens + [more])[-1]).abs().max() <= TOL
    ex.rollback(src, 10)  # the source goes back inside the shared part: the copy keeps its own cells
    (again,) = ex.step([StepInput(dst, [more])])
    assert (again[0] - whole(model, shared + tail + [more])[-1]).abs().max() <= TOL
    with pytest.raises(ValueError):
        ex.copy_prefix(dst, src, 3)  # only into an empty sequence
    with pytest.raises(ValueError):
        ex.copy_prefix(ex.new_sequence(), src, len(src_tokens) + 2)  # not more than the source holds


def test_prompt_chunk_beside_decodes_matches_whole_sequence(model):
    ex = LlamaCppExecutor(model)
    rng = random.Random(6)
    a, b = ex.new_sequence(), ex.new_sequence()
    ta = [rng.randrange(VOCAB) for _ in range(6)]
    ex.step([StepInput(a, ta, logits_at=(-1,))])
    tb = [rng.randrange(VOCAB) for _ in range(30)]
    calls = ex.forward_calls
    out_a, out_b = ex.step([StepInput(a, [7], logits_at=(0,)), StepInput(b, tb, logits_at=(-1, 3))])
    assert ex.forward_calls == calls + 1
    assert (out_a[0] - whole(model, ta + [7])[-1]).abs().max() <= TOL
    assert (out_b - whole(model, tb)[[-1, 3]]).abs().max() <= TOL


def test_a_step_longer_than_a_batch_is_cut_into_forwards(model):
    ex = LlamaCppExecutor(model, batch_tokens=16, max_outputs=4)
    seq = ex.new_sequence()
    rng = random.Random(7)
    tokens = [rng.randrange(VOCAB) for _ in range(40)]
    (got,) = ex.step([StepInput(seq, tokens, logits_at=tuple(range(30, 40)))])
    assert ex.forward_calls == 4  # 16 tokens (no row), 16 (2 rows), then 8 tokens of 8 rows as 4 + 4
    assert (got - whole(model, tokens)[30:]).abs().max() <= TOL


def test_free_reuses_ids_and_the_pool_shrinks_back(model):
    """A burst grows the pool; once it is freed the pool follows the one sequence left, whose logits stay right."""
    ex = LlamaCppExecutor(model, initial_tokens=256, initial_sequences=2)
    base = ex.allocated_bytes()
    rng = random.Random(8)
    keep = ex.new_sequence()
    kept = [rng.randrange(VOCAB) for _ in range(10)]
    ex.step([StepInput(keep, kept)])
    burst = [ex.new_sequence() for _ in range(7)]
    ex.step([StepInput(s, [rng.randrange(VOCAB) for _ in range(100)]) for s in burst])
    assert ex.cells == 1024 and ex.allocated_bytes() == 4 * base
    assert ex.cached_tokens() == ex.peak_cached_tokens() == 710
    for s in burst:
        ex.free(s)
    assert ex.cells == 256 and ex.allocated_bytes() == base
    assert ex.cached_tokens() == 10 and ex.peak_cached_tokens() == 710
    tok = rng.randrange(VOCAB)
    (got,) = ex.step([StepInput(keep, [tok])])
    assert (got[0] - whole(model, kept + [tok])[-1]).abs().max() <= TOL
    again = ex.new_sequence()  # a freed id: nothing of the burst's cache is left in it
    toks = [rng.randrange(VOCAB) for _ in range(5)]
    (fresh,) = ex.step([StepInput(again, toks, logits_at=range(5))])
    assert (fresh - whole(model, toks)).abs().max() <= TOL


def test_a_pool_sized_for_the_steady_stream_is_not_resized_by_it(model):
    """The prefix cache's pattern: prompts held, each request copying one and growing past it. A pool started at
    what that holds is never resized by it (a resize moves the whole cache); a burst beyond it grows the pool, and
    freeing the burst brings it back to its starting size, not below."""
    ex = LlamaCppExecutor(model, initial_tokens=1024, initial_sequences=4)
    rng = random.Random(9)
    prompts = [[rng.randrange(VOCAB) for _ in range(120)] for _ in range(2)]
    held = [ex.new_sequence() for _ in prompts]
    ex.step([StepInput(s, p) for s, p in zip(held, prompts)])
    ctx, sizes = ex._ctx, []
    for _ in range(3):
        seqs = [ex.new_sequence() for _ in prompts]
        for s, h in zip(seqs, held):
            ex.copy_prefix(s, h, 120)
        tails = [[rng.randrange(VOCAB) for _ in range(130)] for _ in prompts]
        got = ex.step([StepInput(s, t) for s, t in zip(seqs, tails)])
        for g, p, t in zip(got, prompts, tails):
            assert (g[0] - whole(model, p + t)[-1]).abs().max() <= TOL
        for s in seqs:
            ex.free(s)
        sizes.append(ex.cells)
    assert sizes == [1024, 1024, 1024] and ex._ctx == ctx  # 240 held + 2 x 250: the same context throughout
    burst = [ex.new_sequence() for _ in range(10)]
    ex.step([StepInput(s, [rng.randrange(VOCAB) for _ in range(220)]) for s in burst])
    assert ex.cells == 4096
    for s in burst:
        ex.free(s)
    assert ex.cells == 1024  # under a quarter used: back to the starting size, which is more than 240 need
    (back,) = ex.step([StepInput(held[0], [7])])
    assert (back[0] - whole(model, prompts[0] + [7])[-1]).abs().max() <= TOL


def test_context_overflow_and_bad_tokens_are_refused_before_running(model):
    ex = LlamaCppExecutor(model, max_context=16)
    seq = ex.new_sequence()
    with pytest.raises(ContextOverflow):
        ex.step([StepInput(seq, list(range(17)))])
    with pytest.raises(ValueError):
        ex.step([StepInput(seq, [1, VOCAB])])  # not a token id of the model
    with pytest.raises(ValueError):
        ex.step([StepInput(seq, [1, 2], logits_at=(2,))])
    assert ex.forward_calls == 0 and ex.seq_len(seq) == 0


def test_a_failed_forward_leaves_every_sequence_as_it_was(model, monkeypatch):
    ex = LlamaCppExecutor(model, batch_tokens=8)
    rng = random.Random(9)
    a, b = ex.new_sequence(), ex.new_sequence()
    ta, tb = [rng.randrange(VOCAB) for _ in range(6)], [rng.randrange(VOCAB) for _ in range(4)]
    ex.step([StepInput(a, ta), StepInput(b, tb)])
    real, calls = ex._lib.llama_decode, {"n": 0}

    def fails_second(ctx, batch):
        calls["n"] += 1
        return real(ctx, batch) if calls["n"] == 1 else 1  # the first forward ran: its tokens are in the cache

    monkeypatch.setattr(ex._lib, "llama_decode", fails_second)
    with pytest.raises(LlamaCppError):
        ex.step([StepInput(a, [rng.randrange(VOCAB) for _ in range(9)]), StepInput(b, [3])])
    monkeypatch.setattr(ex._lib, "llama_decode", real)
    assert ex.seq_len(a) == 6 and ex.seq_len(b) == 4
    ga, gb = ex.step([StepInput(a, [5]), StepInput(b, [6])])
    assert (ga[0] - whole(model, ta + [5])[-1]).abs().max() <= TOL
    assert (gb[0] - whole(model, tb + [6])[-1]).abs().max() <= TOL


def test_rollback_bounds_and_a_cache_that_lost_positions_is_refused(model):
    ex = LlamaCppExecutor(model)
    seq = ex.new_sequence()
    ex.step([StepInput(seq, [1, 2, 3])])
    with pytest.raises(ValueError):
        ex.rollback(seq, 4)
    lib().llama_memory_seq_rm(ex._mem, ex._lseq[seq], 0, 1)  # llama.cpp drops position 0 behind our back
    with pytest.raises(LlamaCppError, match=r"positions 1\.\.1 of sequence"):
        ex.rollback(seq, 1)


def test_small_allowed_sets_are_scored_alone(model):
    """A forward whose every scored row allows a few ids stops before the output layer: exactly those logits (the
    whole sequence's), -inf elsewhere; a forward with any other row is scored in full; the cache is untouched."""
    ex = LlamaCppExecutor(model)
    assert ex.restricted_logits_max == 1024  # F32 output rows: scored here
    rng = random.Random(12)
    a_tokens, b_tokens = [rng.randrange(VOCAB) for _ in range(12)], [rng.randrange(VOCAB) for _ in range(7)]
    a, b = ex.new_sequence(), ex.new_sequence()
    ids_a, ids_b = torch.tensor([3, 40, 96]), torch.tensor([0, 1, 2, 50, 51, 52, 53, 90])
    assert ex.head_seconds == 0
    got_a, got_b = ex.step([StepInput(a, a_tokens, logits_at=(-3, -1), allowed=(ids_a, ids_a)),
                            StepInput(b, b_tokens, logits_at=(-1,), allowed=(ids_b,))])
    head = ex.head_seconds
    assert head > 0  # the output layer's time is the model's, counted apart from the engine's
    ref_a, ref_b = whole(model, a_tokens), whole(model, b_tokens)
    for row, ref, ids in ((got_a[0], ref_a[-3], ids_a), (got_a[1], ref_a[-1], ids_a), (got_b[0], ref_b[-1], ids_b)):
        assert (row[ids] - ref[ids]).abs().max() <= TOL
        rest = torch.ones(VOCAB, dtype=torch.bool)
        rest[ids] = False
        assert torch.isneginf(row[rest]).all()
    more = rng.randrange(VOCAB)
    mixed_a, mixed_b = ex.step([StepInput(a, [more], logits_at=(0,), allowed=(None,)),
                                StepInput(b, [more], logits_at=(0,), allowed=(ids_b,))])
    assert (mixed_a[0] - whole(model, a_tokens + [more])[-1]).abs().max() <= TOL  # all of it: one row is wide
    assert (mixed_b[0] - whole(model, b_tokens + [more])[-1]).abs().max() <= TOL
    assert ex.head_seconds == head  # scored in full by llama.cpp
    wide = torch.arange(VOCAB)
    ex.restricted_logits_max = 32
    (too_many,) = ex.step([StepInput(a, [more], logits_at=(0,), allowed=(wide,))])  # over the limit: in full
    assert (too_many[0] - whole(model, a_tokens + [more, more])[-1]).abs().max() <= TOL


def test_inputs_at_fault_are_named_and_the_others_run_again_without_them(model, monkeypatch):
    """Four inputs in one step: one whose allowed ids the restricted layer fails on (after the forward ran), then
    one with a token past the vocabulary (before it runs). Each time ``InputError`` names just that sequence, every
    sequence is as it was, and the others then run without it exactly as ever; an empty allowed set (a grammar dead
    end) is a row of -inf, not a fault."""
    ex = LlamaCppExecutor(model)
    assert ex.restricted_logits_max > 0
    rng = random.Random(15)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 9, 3, 7)]
    seqs = [ex.new_sequence() for _ in prompts]
    ids, poison, empty = torch.tensor([3, 40, 96]), torch.tensor([4, 41]), torch.empty(0, dtype=torch.long)
    real = ex._head.logits
    monkeypatch.setattr(ex._head, "logits", lambda hidden, at: (_ for _ in ()).throw(ValueError("bad rows"))
                        if at is poison else real(hidden, at))
    inputs = [StepInput(s, p, logits_at=(-1,), allowed=(ids,)) for s, p in zip(seqs, prompts)]
    inputs[1] = StepInput(seqs[1], prompts[1], logits_at=(-1,), allowed=(poison,))
    inputs[3] = StepInput(seqs[3], prompts[3], logits_at=(-1,), allowed=(empty,))
    calls = ex.forward_calls
    with pytest.raises(InputError) as err:
        ex.step(inputs)
    assert err.value.reasons == {seqs[1]: "scoring its allowed ids failed: ValueError: bad rows"}
    assert ex.forward_calls == calls + 1 and all(ex.seq_len(s) == 0 for s in seqs)
    bad_token = StepInput(seqs[2], [1, VOCAB], logits_at=(-1,))
    with pytest.raises(InputError) as err:
        ex.step([inputs[0], bad_token, inputs[3]])
    assert list(err.value.reasons) == [seqs[2]] and "token ids" in err.value.reasons[seqs[2]]
    assert ex.forward_calls == calls + 1 and all(ex.seq_len(s) == 0 for s in seqs)
    got_a, got_d = ex.step([inputs[0], inputs[3]])
    want = whole(model, prompts[0])[-1]
    assert (got_a[0, ids] - want[ids]).abs().max() <= TOL
    assert torch.isneginf(got_a[0]).sum() == VOCAB - len(ids)
    assert torch.isneginf(got_d[0]).all()
    assert ex.seq_len(seqs[0]) == len(prompts[0]) and ex.seq_len(seqs[1]) == 0


def test_a_restricted_path_that_disagrees_with_llama_cpp_is_turned_off(model, monkeypatch):
    from structspec.models.restricted_head import RestrictedHead

    monkeypatch.setattr(RestrictedHead, "logits", lambda self, hidden, ids: torch.zeros(len(ids)))
    ex = LlamaCppExecutor(model)
    assert ex.restricted_logits_max == 0
    seq = ex.new_sequence()
    (got,) = ex.step([StepInput(seq, [1, 2, 3], logits_at=(-1,), allowed=(torch.tensor([4, 5]),))])
    assert (got[0] - whole(model, [1, 2, 3])[-1]).abs().max() <= TOL  # every row in full


# -- Gemma 3 270M Q4_K_M, the profile's own GGUF ---------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    from structspec.models import gemma

    return LlamaCppModel(gemma.ensure_gguf(progress=lambda _: None))


def test_gemma_pieces_rollbacks_and_copies_equal_llama_cpp_fed_the_same_forwards(gemma):
    """Past the 512-token window: prefill chunks, 5-token scoring rolled back to 2, decodes, and a copied prefix
    continued; every row equals llama.cpp's own evaluation of the kept tokens fed in the same forwards."""
    rng = random.Random(10)
    text = [rng.randrange(1000, 50000) for _ in range(600)]
    ex = LlamaCppExecutor(gemma)
    seq = ex.new_sequence()
    pieces, outputs, got = [], [], []
    for start in range(0, 600, 256):
        chunk = text[start:start + 256]
        got.append(ex.step([StepInput(seq, chunk, logits_at=(-1,))])[0])
        pieces.append(chunk)
        outputs.append([len(chunk) - 1])
    for _ in range(6):
        draft = [rng.randrange(1000, 50000) for _ in range(5)]
        (scored,) = ex.step([StepInput(seq, draft, logits_at=range(5))])
        ex.rollback(seq, 3)
        nxt = rng.randrange(1000, 50000)
        (decoded,) = ex.step([StepInput(seq, [nxt], logits_at=(0,))])
        got += [scored[:2], decoded]
        pieces += [draft[:2], [nxt]]
        outputs += [[0, 1], [0]]
    assert torch.equal(torch.cat(got), llama_reference(gemma, pieces, outputs))
    kept = [t for p in pieces for t in p]
    copy = ex.new_sequence()
    ex.copy_prefix(copy, seq, 560)  # a prompt prefix past the window, its cells shared
    ex.free(seq)
    tail = [rng.randrange(1000, 50000) for _ in range(3)]
    (cont,) = ex.step([StepInput(copy, tail, logits_at=range(3))])
    want = llama_reference(gemma, [kept[:256], kept[256:512], kept[512:600], tail], [[], [], [], [0, 1, 2]],
                           drop={2: 40})  # positions 512..559 were computed by the 88-token chunk
    assert torch.equal(cont, want)


def test_gemma_restricted_rows_equal_llama_cpp_and_leave_the_cache_as_a_full_forward_does(gemma):
    """Q8_0 output rows scored from the file equal llama.cpp's own logits for those ids (up to summation order),
    and a restricted forward leaves exactly the cache a full one does."""
    rng = random.Random(13)
    prompt = [rng.randrange(1000, 50000) for _ in range(300)]
    ids = torch.tensor(sorted(rng.sample(range(262_144), 300)))
    ex = LlamaCppExecutor(gemma)
    assert ex.restricted_logits_max == 1024
    seq = ex.new_sequence()
    ex.step([StepInput(seq, prompt, logits_at=())])
    (full,) = ex.step([StepInput(seq, [5000, 6000], logits_at=(0, 1))])
    ex.rollback(seq, 2)
    (restricted,) = ex.step([StepInput(seq, [5000, 6000], logits_at=(0, 1), allowed=(ids, ids))])
    assert (restricted[:, ids] - full[:, ids]).abs().max() <= 1e-4
    assert torch.isneginf(restricted).sum() == 2 * (262_144 - len(ids))
    ex.rollback(seq, 2)  # a grammar dead end allows nothing: its row is -inf everywhere, the other scored as ever
    (dead,) = ex.step([StepInput(seq, [5000, 6000], logits_at=(0, 1), allowed=(torch.empty(0, dtype=torch.long), ids))])
    assert torch.isneginf(dead[0]).all() and torch.equal(dead[1], restricted[1])
    (after,) = ex.step([StepInput(seq, [7000], logits_at=(0,))])
    assert torch.equal(after, llama_reference(gemma, [prompt, [5000, 6000], [7000]], [[], [], [0]]))


def test_gemma_several_sequences_in_one_forward_equal_each_alone(gemma):
    """Three sequences decoding and scoring in one forward of 7 tokens get exactly what each gets in a forward of
    its own from the same cache. Prompts under 64 tokens (whose forward does not use llama.cpp's tiled attention,
    which groups cache cells in blocks of 64, so that a prompt's logits depend on where its cells sit in the pool)
    also equal llama.cpp's own token-by-token evaluation of the sequence in a fresh context."""
    rng = random.Random(11)
    prompts = [[rng.randrange(1000, 50000) for _ in range(n)] for n in (40, 90, 7)]
    new = [[rng.randrange(1000, 50000) for _ in range(k)] for k in (1, 2, 4)]

    def prepared():
        ex = LlamaCppExecutor(gemma)
        seqs = [ex.new_sequence() for _ in prompts]
        for sid, p in zip(seqs, prompts):
            ex.step([StepInput(sid, p, logits_at=())])
        return ex, seqs

    ex, seqs = prepared()
    together = ex.step([StepInput(sid, t, logits_at=range(len(t))) for sid, t in zip(seqs, new)])
    assert ex.forward_calls == 4
    ex, seqs = prepared()
    alone = [ex.step([StepInput(sid, t, logits_at=range(len(t)))])[0] for sid, t in zip(seqs, new)]
    for got, want in zip(together, alone):
        assert torch.equal(got, want)
    for p, t, got in zip(prompts, new, together):
        if len(p) < 64:
            assert torch.equal(got, llama_reference(gemma, [p] + [[x] for x in t], [[]] + [[0]] * len(t)))
