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

Greedy requests draft greedily (point masses, q = None). Sampled requests draw
from the draft's processed distribution without EOS (see ``propose``) with noise
independent of the verifier's (its own salt), and return those distributions as q.
"""

from __future__ import annotations

import torch

from structspec.engine.sampling import keyed_gumbel, target_logprobs
from structspec.grammar.base import allocate_bitmask, apply_token_bitmask
from structspec.models.executor import ForwardStep, StepInput
from structspec.speculation.base import Draft, DraftContext, SequenceSpeculation


class DraftModelProposer:
    name = "draft"

    def __init__(self, executor: ForwardStep, eos_token_id: int, confidence: float = 0.4):
        self.executor = executor
        self.eos = eos_token_id
        self.confidence = confidence

    def propose(self, ctx: DraftContext, k: int) -> Draft | None:
        committed = ctx.prompt_ids + ctx.output_ids
        sid = ctx.state.draft_seq_id
        if sid is None:
            sid = ctx.state.draft_seq_id = self.executor.new_sequence()
        cached = self.executor.seq_len(sid)
        if cached >= len(committed):  # re-score the last committed token to get the next distribution
            self.executor.rollback(sid, cached - len(committed) + 1)
            cached = len(committed) - 1
        (logits,) = self.executor.step([StepInput(sid, committed[cached:], logits_at=(-1,))])
        matcher, greedy = ctx.matcher, ctx.sampling.greedy
        bitmask = allocate_bitmask(1, self.executor.vocab_size)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            matcher.fill_mask(bitmask, 0)
            masked = apply_token_bitmask(logits[:1], bitmask)[0]  # [V]
            if not greedy:
                # A sampled draft never proposes EOS: ending the draft on a drawn EOS would make whether a
                # token is drafted here depend on that very draw, and the output would get EOS too rarely
                # (p(EOS) q(EOS) + ... instead of p(EOS)). Drafting from q without EOS and reporting that q
                # keeps rejection sampling exact; the verifier still emits EOS from the residual.
                masked[self.eos] = float("-inf")
            if torch.isinf(masked).all():
                break
            if greedy:
                tok = int(torch.argmax(masked))
                sure = float(torch.softmax(masked, dim=-1)[tok])
            else:
                logp = target_logprobs(masked, ctx.sampling)
                tok = int(torch.argmax(logp + keyed_gumbel(ctx.seed, len(ctx.output_ids) + i, logp.shape[-1], "draft")))
                qs.append(logp.exp())
                sure = float(qs[-1][tok])
            if tok == self.eos or not matcher.consume([tok]):
                qs = qs[: len(tokens)]
                break
            tokens.append(tok)
            if matcher.is_stopped() or i == k - 1 or sure < self.confidence:
                break
            (logits,) = self.executor.step([StepInput(sid, [tok], logits_at=(0,))])
        matcher.rollback(len(tokens))
        self.executor.rollback(sid, self.executor.seq_len(sid) - len(committed))  # keep only committed tokens
        if not tokens:
            return None
        return Draft(tokens, None if greedy else torch.stack(qs), self.name)

    def release(self, state: SequenceSpeculation) -> None:
        """Free the draft's KV cache of a finished sequence."""
        if state.draft_seq_id is not None:
            self.executor.free(state.draft_seq_id)
            state.draft_seq_id = None
