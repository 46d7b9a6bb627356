"""
ODIN's length head (Chen et al. 2024, arXiv 2402.07319): a reward model that learns to keep
response length out of its reward. Trained by `python train_rm.py --length_head` (see there);
scored, evaluated and exported as a plain RewardModel (its quality head alone).

    rm = LengthDebiasedRewardModel(pretrained=path)
    loss, stats = rm.loss(chosen, chosen_mask, rejected, rejected_mask, chosen_response_mask)
    loss, stats = rm.loss_packed(tokens, segments, positions, chosen_end, rejected_end)

Why a file of its own: the idea is one head and one loss on top of reward.py's RewardModel, and
a first reading of reward modeling can skip it.
"""

import torch

from reward import (
    LogSigLoss,
    RewardModel,
    apply_head,
    last_real_index,
    new_head,
    pad_and_concat,
    pair_stats,
    pearson,
)

# the default weight of the decorrelation terms, chosen on the HH recipe's frontier (README,
# bench/bench_odin.py): at 0.03 the reward-length correlation over the held-out responses falls
# from +0.33 to +0.02 while accuracy (0.547 against 0.550) and length-balanced accuracy (0.545,
# equal) stay the plain model's; 0.1 and 1 decorrelate no further and cost more accuracy.
LENGTH_COEF = 0.03


class LengthDebiasedRewardModel(RewardModel):
    """ODIN (Chen et al. 2024, arXiv 2402.07319): a second head, `length_head`, on the same
    last-token state, made to absorb what response length explains. Training sees their sum:

        loss = loss_fn(q_c + l_c, q_r + l_r)
               + length_coef * (|rho(q, L)| - rho(l, L) + |w_q . w_l|)

    q = head(h), l = length_head(h), L the response lengths in tokens, rho the Pearson
    correlation over the 2B responses of the batch. The length head is pulled towards length,
    the quality head away from it (either sign), and the two weight vectors apart. Scoring
    (forward, forward_pair, evaluation, export) is RewardModel's: the quality head alone, so a
    longer response is no longer paid for being longer. ODIN weighs the correlation and the
    orthogonality terms separately; one coefficient here. Pearson over a batch is a noisy
    estimate: batches of a few pairs decorrelate little."""

    def add_heads(self, dim, device, heads):
        super().add_heads(dim, device, heads)
        self.length_head = new_head(dim, bias=False).to(device)

    def loss(
        self,
        chosen,
        chosen_mask,
        rejected,
        rejected_mask,
        chosen_response_mask,
        loss_fn=None,
        length_coef=LENGTH_COEF,
    ):
        """(total loss, stats) on the right-padded pair batch (data/pairs.py's Batch): prompts
        are shared, so a rejected response's length is its row's length minus the prompt's."""
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        last = last_real_index(mask)
        h = self.backbone.hidden_states(tokens, mask, at=last[:, None])[:, 0]  # (2B, dim)
        n_chosen = chosen_response_mask.sum(1)  # (B,)
        n_prompt = chosen_mask.sum(1) - n_chosen
        lengths = torch.cat([n_chosen, rejected_mask.sum(1) - n_prompt])  # (2B,)
        return self._odin(h, lengths, loss_fn, length_coef)

    def loss_packed(
        self,
        tokens,
        segments,
        positions,
        chosen_end,
        rejected_end,
        loss_fn=None,
        length_coef=LENGTH_COEF,
        flex=False,
        states=None,
    ):
        """loss() on rows [prompt | chosen | rejected] (data/pairs.py's PackedBatch): each
        response's length is the count of its segment's tokens. states: as forward_pair_packed's
        (the frozen layers' cached output)."""
        ends = (chosen_end, rejected_end)
        h = self.packed_end_states(tokens, segments, positions, *ends, flex, states)  # (B, 2, dim)
        h = h.transpose(0, 1).flatten(0, 1)  # (B, 2, dim) -> (2B, dim): chosen rows, then rejected
        lengths = torch.cat([(segments == 1).sum(1), (segments == 2).sum(1)])  # (2B,)
        return self._odin(h, lengths, loss_fn, length_coef)

    def _odin(self, h, lengths, loss_fn, length_coef):
        """The loss above from the 2B last-token states (chosen first) and response lengths."""
        B = h.size(0) // 2
        q, l = apply_head(self.head, h), apply_head(self.length_head, h)  # (2B,) each
        r = q + l
        rm_loss = (loss_fn or LogSigLoss())(r[:B], r[B:])
        lengths = lengths.to(q.dtype)
        rho_q, rho_l = pearson(q, lengths), pearson(l, lengths)
        ortho = (self.head.weight * self.length_head.weight).sum().abs()
        total = rm_loss + length_coef * (rho_q.abs() - rho_l + ortho)
        # r_chosen, r_rejected: the quality head's, what evaluation scores; rm_loss: the
        # pairwise loss of the sum q + l
        return total, pair_stats(q[:B], q[B:], rm_loss, rho_quality=rho_q, rho_length=rho_l)
