"""Draft-model proposer: a small LM sharing the target's tokenizer drafts k tokens under the grammar.

The draft keeps its own KV cache per sequence (through the same forward-step
API as the target). Before drafting it catches up on the tokens committed since
its last call (forced, accepted and recovered tokens) in one forward; then it
decodes k tokens one at a time, each masked by the grammar state after the
previous draft tokens, so drafts are always grammatical. Afterwards the matcher
and the draft's cache are rolled back to the committed point: the verifier
decides what stays.

Drafting stops early after a token the draft itself doubts (its probability under
the draft below ``confidence``): such a token is rarely accepted, and every further
draft step and verified row costs time (the demo draft step is ~0.6 ms, an eighth of
a target step). The stopping rule looks only at the draft's own distribution, so
rejection sampling stays exact.

Greedy requests draft greedily. Sampled requests draft with the target's own keyed noise:
at output position j the draft takes argmax(log q_j + g_j) with the Gumbel noise g_j the
verifier uses for that position (``choose``), so the draft is a point mass and the verifier
accepts x_j exactly when the target's keyed sample at j is x_j. The output is then the one
plain keyed sampling gives, token for token, whatever was drafted: the same text with
speculation on or off, alone or in any batch, with any history (for the same model, dtype
and device). Acceptance is the chance the two Gumbel-max draws agree, a little below
rejection sampling's 1 - TV(p, q) (measured in the README).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from structspec.engine.sampling import keyed_gumbel, target_logprobs
from structspec.grammar.base import allocate_bitmask, apply_token_bitmask
from structspec.models.end_of_turn import as_id_set
from structspec.models.executor import ForwardStep, StepInput
from structspec.speculation.base import Draft, DraftContext, SequenceSpeculation


def bits_at(row: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[len(ids)] bool: the bits of ``ids`` in one int32 bitmask row (token t is bit t % 32 of word t // 32)."""
    return ((row[ids >> 5] >> (ids & 31)) & 1).bool()


class DraftModelProposer:
    name = "draft"

    def __init__(self, executor: ForwardStep, end_of_turn: int | Iterable[int], confidence: float = 0.4,
                 context_tokens: int | None = None):
        self.executor = executor
        self.eos = as_id_set(end_of_turn)  # a draft stops before any id that ends the turn
        self.confidence = confidence
        # A draft whose logits depend on the last ``context_tokens`` tokens only (sliding-window layers) prefills
        # just those of a prompt: the gemma draft reads 768 of a 3-shot prompt's ~2,000.
        self.context_tokens = context_tokens

    def propose(self, ctx: DraftContext, k: int) -> Draft | None:
        committed = ctx.prompt_ids + ctx.output_ids
        sid = ctx.state.draft_seq_id
        if sid is None:
            sid = ctx.state.draft_seq_id = self.executor.new_sequence()
            if self.context_tokens:
                ctx.state.draft_offset = max(0, len(committed) - self.context_tokens)
        committed = committed[ctx.state.draft_offset:]
        cached = self.executor.seq_len(sid)
        if cached >= len(committed):  # re-score the last committed token to get the next distribution
            self.executor.rollback(sid, cached - len(committed) + 1)
            cached = len(committed) - 1
        # A restricted draft (``models.draft_vocab``) is scored over the ids it covers alone: its mask, argmax
        # and softmax then run over those few thousand columns instead of the target's whole vocabulary.
        covered = getattr(self.executor, "covered_ids", None)
        step = self.executor.step
        if covered is not None:  # the restricted draft's own step (not part of ForwardStep)
            step = getattr(self.executor, "step_covered", step)
        (logits,) = step([StepInput(sid, committed[cached:], logits_at=(-1,))])
        matcher, greedy = ctx.matcher, ctx.sampling.greedy
        bitmask = allocate_bitmask(1, self.executor.vocab_size)
        tokens: list[int] = []
        for i in range(k):
            matcher.fill_mask(bitmask, 0)
            if covered is not None:
                masked = logits[0].masked_fill(~bits_at(bitmask[0], covered), float("-inf"))  # [C]
            else:
                masked = apply_token_bitmask(logits[:1], bitmask)[0]  # [V]
            if torch.isinf(masked).all():
                break
            if greedy:
                j = int(torch.argmax(masked))
                sure = float(torch.softmax(masked, dim=-1)[j])
            else:  # the verifier's noise for this output position: a point-mass draft (see the module docstring)
                logp = target_logprobs(masked, ctx.sampling)
                noise = keyed_gumbel(ctx.seed, len(ctx.output_ids) + i, self.executor.vocab_size)
                j = int(torch.argmax(logp + (noise[covered] if covered is not None else noise)))
                sure = float(logp[j].exp())
            tok = int(covered[j]) if covered is not None else j
            if tok in self.eos or not matcher.consume([tok]):
                break
            tokens.append(tok)
            if matcher.is_stopped() or i == k - 1 or sure < self.confidence:
                break
            (logits,) = step([StepInput(sid, [tok], logits_at=(0,))])
        matcher.rollback(len(tokens))
        self.executor.rollback(sid, self.executor.seq_len(sid) - len(committed))  # keep only committed tokens
        return Draft(tokens, None, self.name) if tokens else None

    def release(self, state: SequenceSpeculation) -> None:
        """Free the draft's KV cache of a finished sequence."""
        if state.draft_seq_id is not None:
            self.executor.free(state.draft_seq_id)
            state.draft_seq_id = None

    def close(self) -> None:
        """Let the executor go (its weights and KV caches): a replaced draft, once its last sequence has finished.
        Drafting afterwards raises (the engine then ends drafting for that request, never the request)."""
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()
        self.executor = None  # type: ignore[assignment]  # let it go: drafting afterwards raises, as documented
