"""The forward-step API against a plain full-sequence forward (fp32, max abs diff <= 1e-4).

Both profiles' architectures: Llama (demo) and Gemma 3 (gemma-3-270m, here a tiny
random config with a sliding window of 8 so rollbacks cross the window).
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from structspec.models.executor import ContextOverflow, InputError, StepInput
from structspec.models.hf_executor import TransformersExecutor, cache_keyword

TOL = 1e-4
VOCAB = 97


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def tiny_gemma3() -> Gemma3ForCausalLM:
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
                           num_key_value_heads=1, head_dim=16, intermediate_size=128, max_position_embeddings=256,
                           sliding_window=8, query_pre_attn_scalar=16)
    model = Gemma3ForCausalLM(cfg).eval()
    assert "sliding_attention" in model.config.layer_types and "full_attention" in model.config.layer_types
    return model


MODELS = {"llama": tiny_llama, "gemma3": tiny_gemma3}


@torch.no_grad()
def reference_logits(model, tokens: list[int]) -> torch.Tensor:
    """[T, V] logits of a plain forward over the whole sequence, no cache."""
    return model(torch.tensor([tokens])).logits[0].float()


@pytest.fixture(params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def test_prefill_then_decode_matches_full_forward(model):
    ex = TransformersExecutor(model)
    seq = ex.new_sequence()
    rng = random.Random(1)
    tokens = [rng.randrange(VOCAB) for _ in range(20)]
    (first,) = ex.step([StepInput(seq, tokens, logits_at=(-1,))])
    assert torch.allclose(first[0], reference_logits(model, tokens)[-1], atol=TOL)
    for _ in range(10):
        tok = rng.randrange(VOCAB)
        tokens.append(tok)
        (got,) = ex.step([StepInput(seq, [tok], logits_at=(0,))])
        assert (got[0] - reference_logits(model, tokens)[-1]).abs().max() <= TOL
    assert ex.seq_len(seq) == len(tokens)
    assert ex.forward_calls == 11


def test_mixed_lengths_in_one_batch(model):
    """Sequences with different cached lengths and different new-token counts share one pass."""
    ex = TransformersExecutor(model, initial_slots=1, initial_capacity=4)  # forces slot and capacity growth
    rng = random.Random(2)
    seqs = {}
    for n in (3, 17, 9):
        sid = ex.new_sequence()
        seqs[sid] = [rng.randrange(VOCAB) for _ in range(n)]
        ex.step([StepInput(sid, seqs[sid], logits_at=(-1,))])
    new = {sid: [rng.randrange(VOCAB) for _ in range(k)] for sid, k in zip(seqs, (1, 5, 3))}
    outs = ex.step([StepInput(sid, toks, logits_at=tuple(range(len(toks)))) for sid, toks in new.items()])
    for (sid, toks), got in zip(new.items(), outs):
        full = seqs[sid] + toks
        want = reference_logits(model, full)[len(seqs[sid]):]
        assert got.shape == want.shape
        assert (got - want).abs().max() <= TOL


def test_rollback_one_sequence_leaves_others(model):
    """Verify 5 drafted tokens, reject after 2, roll back: next logits equal a fresh forward (across the window)."""
    ex = TransformersExecutor(model)
    rng = random.Random(3)
    a, b = ex.new_sequence(), ex.new_sequence()
    ta = [rng.randrange(VOCAB) for _ in range(14)]  # past the sliding window of 8
    tb = [rng.randrange(VOCAB) for _ in range(11)]
    ex.step([StepInput(a, ta), StepInput(b, tb)])
    for _ in range(4):  # several verify/reject rounds, each crossing the window edge
        draft_a = [rng.randrange(VOCAB) for _ in range(5)]
        draft_b = [rng.randrange(VOCAB) for _ in range(2)]
        ex.step([StepInput(a, draft_a, logits_at=range(5)), StepInput(b, draft_b, logits_at=range(2))])
        ex.rollback(a, 3)  # keep 2 of 5
        ta += draft_a[:2]
        tb += draft_b  # b keeps everything
        assert ex.seq_len(a) == len(ta) and ex.seq_len(b) == len(tb)
        nxt_a, nxt_b = rng.randrange(VOCAB), rng.randrange(VOCAB)
        ga, gb = ex.step([StepInput(a, [nxt_a]), StepInput(b, [nxt_b])])
        ta.append(nxt_a)
        tb.append(nxt_b)
        assert (ga[0] - reference_logits(model, ta)[-1]).abs().max() <= TOL
        assert (gb[0] - reference_logits(model, tb)[-1]).abs().max() <= TOL


def test_free_reuses_slot_without_leaking_state(model):
    ex = TransformersExecutor(model, initial_slots=1)
    rng = random.Random(4)
    first = ex.new_sequence()
    ex.step([StepInput(first, [rng.randrange(VOCAB) for _ in range(30)])])
    ex.free(first)
    second = ex.new_sequence()
    assert ex.slots == 1  # the freed slot was reused
    toks = [rng.randrange(VOCAB) for _ in range(5)]
    (got,) = ex.step([StepInput(second, toks, logits_at=range(5))])
    assert (got - reference_logits(model, toks)).abs().max() <= TOL


def test_context_overflow_is_refused_before_running(model):
    ex = TransformersExecutor(model, max_context=16)
    seq = ex.new_sequence()
    with pytest.raises(ContextOverflow):
        ex.step([StepInput(seq, list(range(17)))])
    assert ex.forward_calls == 0 and ex.seq_len(seq) == 0


def test_rollback_bounds(model):
    ex = TransformersExecutor(model)
    seq = ex.new_sequence()
    ex.step([StepInput(seq, [1, 2, 3])])
    with pytest.raises(ValueError):
        ex.rollback(seq, 4)


def test_copy_prefix_matches_full_forward_and_leaves_the_source_alone(model):
    ex = TransformersExecutor(model, initial_slots=2, initial_capacity=8)  # the step grows the buffers
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
    assert (got_dst - reference_logits(model, shared + tail)[-5:]).abs().max() <= TOL
    assert (got_src[0] - reference_logits(model, src_tokens + [more])[-1]).abs().max() <= TOL
    with pytest.raises(ValueError):
        ex.copy_prefix(dst, src, 3)  # only into an empty sequence
    with pytest.raises(ValueError):
        ex.copy_prefix(ex.new_sequence(), src, len(src_tokens) + 2)  # not more than the source holds


def test_prompt_chunk_beside_decodes_matches_full_forward(model):
    """A long prompt chunk and a one-token decode packed into one forward give the reference logits."""
    ex = TransformersExecutor(model)
    rng = random.Random(5)
    a, b = ex.new_sequence(), ex.new_sequence()
    ta = [rng.randrange(VOCAB) for _ in range(6)]
    ex.step([StepInput(a, ta, logits_at=(-1,))])
    tb = [rng.randrange(VOCAB) for _ in range(30)]
    calls = ex.forward_calls
    out_a, out_b = ex.step([StepInput(a, [7], logits_at=(0,)), StepInput(b, tb, logits_at=(-1, 3))])
    assert ex.forward_calls == calls + 1
    assert torch.allclose(out_a[0], reference_logits(model, ta + [7])[-1], atol=TOL)
    ref_b = reference_logits(model, tb)
    assert torch.allclose(out_b, ref_b[[-1, 3]], atol=TOL)


def test_plain_transformers_calls_still_work_on_the_same_model(model):
    """The executor installs its attention on the model; outside its steps the model behaves as before."""
    tokens = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26]
    before = reference_logits(model, tokens)
    greedy_before = model.generate(torch.tensor([tokens]), max_new_tokens=6, do_sample=False)
    TransformersExecutor(model)
    assert torch.allclose(reference_logits(model, tokens), before, atol=TOL)
    assert torch.equal(model.generate(torch.tensor([tokens]), max_new_tokens=6, do_sample=False), greedy_before)


def test_small_allowed_sets_are_scored_alone(model):
    """Rows with a small allowed set get exactly those logits (others -inf); other rows are untouched."""
    ex = TransformersExecutor(model)
    assert ex.restricted_logits_max == 0  # 97 ids: scoring a subset would save nothing
    ex.restricted_logits_max = 8  # exercise the path on the tiny model
    rng = random.Random(5)
    a_tokens = [rng.randrange(VOCAB) for _ in range(12)]
    b_tokens = [rng.randrange(VOCAB) for _ in range(7)]
    a, b = ex.new_sequence(), ex.new_sequence()
    ids_a, ids_b = torch.tensor([3, 40, 96]), torch.tensor([0, 1, 2, 50, 51, 52, 53, 90])
    wide = torch.arange(20)  # more than restricted_logits_max: computed in full
    got_a, got_b = ex.step([StepInput(a, a_tokens, logits_at=(-3, -2, -1), allowed=(ids_a, None, wide)),
                            StepInput(b, b_tokens, logits_at=(-1,), allowed=(ids_b,))])
    ref_a, ref_b = reference_logits(model, a_tokens), reference_logits(model, b_tokens)
    for row, ref, ids in ((got_a[0], ref_a[-3], ids_a), (got_b[0], ref_b[-1], ids_b)):
        assert (row[ids] - ref[ids]).abs().max() <= TOL
        rest = torch.ones(VOCAB, dtype=torch.bool)
        rest[ids] = False
        assert torch.isneginf(row[rest]).all()
    assert (got_a[1] - ref_a[-2]).abs().max() <= TOL
    assert (got_a[2] - ref_a[-1]).abs().max() <= TOL


def test_inputs_at_fault_are_named_and_the_others_run_again_without_them(model, monkeypatch):
    """One input whose allowed ids fail to score (after the forward), one with a token past the vocabulary (before
    it): ``InputError`` names just that sequence, none is cached, and the others then run as ever; an empty allowed
    set is a row of -inf."""
    ex = TransformersExecutor(model)
    ex.restricted_logits_max = 8
    rng = random.Random(16)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 9, 3, 7)]
    seqs = [ex.new_sequence() for _ in prompts]
    ids, poison, empty = torch.tensor([3, 40, 96]), torch.tensor([4, 41]), torch.empty(0, dtype=torch.long)
    real = ex._finish_logits

    def finishing(logits):
        if logits.shape == (len(poison),):  # the poisoned row alone has two ids
            raise RuntimeError("bad rows")
        return real(logits)

    monkeypatch.setattr(ex, "_finish_logits", finishing)
    inputs = [StepInput(s, p, logits_at=(-1,), allowed=(ids,)) for s, p in zip(seqs, prompts)]
    inputs[1] = StepInput(seqs[1], prompts[1], logits_at=(-1,), allowed=(poison,))
    inputs[3] = StepInput(seqs[3], prompts[3], logits_at=(-1,), allowed=(empty,))
    with pytest.raises(InputError) as err:
        ex.step(inputs)
    assert err.value.reasons == {seqs[1]: "scoring its allowed ids failed: RuntimeError: bad rows"}
    assert all(ex.seq_len(s) == 0 for s in seqs)
    with pytest.raises(InputError) as err:
        ex.step([inputs[0], StepInput(seqs[2], [1, VOCAB], logits_at=(-1,)), inputs[3]])
    assert list(err.value.reasons) == [seqs[2]] and "token ids" in err.value.reasons[seqs[2]]
    got_a, got_d = ex.step([inputs[0], inputs[3]])
    assert (got_a[0, ids] - reference_logits(model, prompts[0])[-1, ids]).abs().max() <= TOL
    assert torch.isneginf(got_a[0]).sum() == VOCAB - len(ids) and torch.isneginf(got_d[0]).all()
    assert ex.seq_len(seqs[0]) == len(prompts[0]) and ex.seq_len(seqs[1]) == 0


def test_large_vocabularies_restrict_by_default():
    cfg = LlamaConfig(vocab_size=40000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=32, max_position_embeddings=64)
    assert TransformersExecutor(LlamaForCausalLM(cfg).eval()).restricted_logits_max > 0


def test_buffers_shrink_back_to_the_live_sequences_and_survivors_keep_their_cache(model):
    """A burst of long sequences grows the buffers; once they are freed the footprint follows the one left
    (moved to slot 0), whose next logits still equal a plain forward over its whole history."""
    ex = TransformersExecutor(model, initial_slots=2, initial_capacity=16)
    base = ex.allocated_bytes()
    rng = random.Random(6)
    keep = ex.new_sequence()
    kept = [rng.randrange(VOCAB) for _ in range(10)]
    ex.step([StepInput(keep, kept)])
    burst = [ex.new_sequence() for _ in range(7)]
    ex.step([StepInput(s, [rng.randrange(VOCAB) for _ in range(100)]) for s in burst])
    assert ex.slots >= 8 and ex.capacity >= 100 and ex.allocated_bytes() >= 16 * base
    assert ex.cached_tokens() == ex.peak_cached_tokens() == 10 + 7 * 100
    for s in burst:
        ex.free(s)
    assert ex.allocated_bytes() == base  # 2 slots x 16 positions again
    assert ex.cached_tokens() == 10 and ex.peak_cached_tokens() == 710  # the peak stays
    tok = rng.randrange(VOCAB)
    (got,) = ex.step([StepInput(keep, [tok])])
    assert (got[0] - reference_logits(model, kept + [tok])[-1]).abs().max() <= TOL
    again = ex.new_sequence()  # the freed slots are usable: no id clash with the moved one
    toks = [rng.randrange(VOCAB) for _ in range(5)]
    (fresh,) = ex.step([StepInput(again, toks, logits_at=range(5))])
    assert (fresh - reference_logits(model, toks)).abs().max() <= TOL


def test_buffers_in_moderate_use_are_not_reallocated(model):
    """Over a quarter in use: freeing one sequence keeps the buffers (no copy on every request's end)."""
    ex = TransformersExecutor(model, initial_slots=2, initial_capacity=16)
    seqs = [ex.new_sequence() for _ in range(4)]
    ex.step([StepInput(s, [1, 2, 3]) for s in seqs])
    before = ex._k[0]
    ex.free(seqs[0])
    assert ex._k[0] is before


class _ForwardNew(torch.nn.Module):
    def forward(self, input_ids, cache=None, **kwargs):
        return input_ids


class _ForwardOld(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, **kwargs):
        return input_ids


class _ForwardNeither(torch.nn.Module):
    def forward(self, input_ids, **kwargs):  # a keyword here would be swallowed, the cache silently dropped
        return input_ids


def test_the_cache_keyword_is_read_from_the_models_signature():
    assert cache_keyword(_ForwardNew()) == "cache"
    assert cache_keyword(_ForwardOld()) == "past_key_values"
    with pytest.raises(TypeError, match="neither cache nor past_key_values"):
        cache_keyword(_ForwardNeither())

