"""
Solution to exercise 7: the LM-regularized reward loss, LLMBook's three bugs fixed.

    loss = -log sigmoid(r_chosen - r_rejected) + lm_coef * (next-token cross-entropy of the
           chosen response, averaged over each response's tokens, then over the pairs)

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex7
nanoRM's version is reward.LMRegularizedRewardModel.loss (its docstring lists the three bugs).
"""

import torch
import torch.nn.functional as F


def lm_regularized_loss(
    reward_head, lm_head, h_chosen, h_rejected, chosen_mask, rejected_mask, chosen_ids,
    response_mask, lm_coef,
):  # fmt: skip
    """The pairwise loss plus lm_coef times the chosen response's LM loss, a scalar tensor
    (the arguments are the exercise file's)."""
    B = h_chosen.size(0)
    rows = torch.arange(B, device=h_chosen.device)

    # bug 1 fixed: one reward per sequence, read at its last real token (padding on any side)
    def pooled(h, mask):
        t = torch.arange(mask.size(1), device=mask.device)
        last = (t * mask.bool()).max(dim=-1).values  # (B,) the largest t with mask 1
        return reward_head(h[rows, last]).squeeze(-1)  # (B,)

    r_c, r_r = pooled(h_chosen, chosen_mask), pooled(h_rejected, rejected_mask)
    # bug 2 fixed: the chosen must win, -log sigmoid(r_c - r_r), i.e. BCE with label 1
    rm_loss = -F.logsigmoid(r_c - r_r).mean()

    # bug 3 fixed: the state at t predicts the token at t + 1, on the response's tokens only
    logits = lm_head(h_chosen[:, :-1])  # (B, T - 1, vocab)
    targets = chosen_ids[:, 1:]  # (B, T - 1)
    where = response_mask[:, 1:].float()  # 1 where the predicted token is a response's
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T - 1)
    per_pair = (ce * where).sum(-1) / where.sum(-1).clamp(min=1)  # each response's mean
    return rm_loss + lm_coef * per_pair.mean()
