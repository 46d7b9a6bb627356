"""
Exercise 7: the LM-regularized reward loss, and LLMBook's three bugs.

LLMBook (RUCAIBox, "Large Language Models", chapter 8) trains a reward model with a language
modelling term beside the pairwise one, so the backbone stays a language model while it learns
to score:

    loss = pairwise loss(r_chosen, r_rejected) + lm_coef * LM loss(chosen response)

Its published code has three bugs. `as_published` below is that code, written on this
exercise's inputs (the book calls the model; here you get the final hidden states and the two
heads). Run it, read it, find the three bugs, then write the corrected loss:

    1. the reward of a sequence is ONE number, read at its last real token;
    2. the chosen response must win: -log sigmoid(r_chosen - r_rejected);
    3. the LM term predicts the NEXT token: the state at position t predicts the token at
       t + 1, scored on the chosen response's tokens only (not the prompt, not padding),
       averaged over each response's tokens, then over the pairs.

Fill in `lm_regularized_loss`, then run:  python notebooks/exercises/check.py ex7
nanoRM's version is reward.LMRegularizedRewardModel.loss; its docstring explains the bugs.
Read it only after your own passes.
"""

import torch
import torch.nn.functional as F


def as_published(
    reward_head, lm_head, h_chosen, h_rejected, chosen_mask, rejected_mask, chosen_ids,
    response_mask, lm_coef,
):  # fmt: skip
    """LLMBook's loss on this exercise's inputs (chosen and rejected padded to one length T).
    It runs, and it is wrong three times. Do not edit it: compare your function with it."""
    reward0 = reward_head(h_chosen).squeeze(-1)  # (B, T)
    reward1 = reward_head(h_rejected).squeeze(-1)  # (B, T)
    logits = reward0 - reward1
    labels = torch.zeros_like(logits)  # "the chosen is sentence 0"
    rm_loss = F.binary_cross_entropy_with_logits(logits, labels, reduction="mean")
    lm_logits = lm_head(h_chosen)  # (B, T, vocab)
    response_ids = chosen_ids.masked_fill(response_mask == 0, -100)  # Hugging Face's labels
    lm_loss = F.cross_entropy(lm_logits.flatten(0, 1), response_ids.flatten(), ignore_index=-100)
    return rm_loss + lm_coef * lm_loss


def lm_regularized_loss(
    reward_head, lm_head, h_chosen, h_rejected, chosen_mask, rejected_mask, chosen_ids,
    response_mask, lm_coef,
):  # fmt: skip
    """The corrected loss, a scalar tensor.

    reward_head: Linear(dim, 1), the scoring head.   lm_head: Linear(dim, vocab).
    h_chosen (B, T, dim), h_rejected (B, T2, dim): the backbone's final hidden states.
    chosen_mask (B, T), rejected_mask (B, T2): 1 on real tokens, 0 on padding (either side).
    chosen_ids (B, T): the chosen rows' tokens (prompt, then response, then padding).
    response_mask (B, T): 1 on the chosen response's tokens, 0 on the prompt and padding.
    lm_coef: a float, the weight of the LM term.

        loss = mean over pairs of -log sigmoid(r_c - r_r)
             + lm_coef * mean over pairs of (mean over the response tokens t of
                                             CE(lm_head(h_chosen[b, t - 1]), chosen_ids[b, t]))

    Stay in torch (the result must be differentiable) and make new tensors on the inputs'
    device (torch.arange(T, device=mask.device)).
    """
    # TODO: your code here (about ten lines)
    raise NotImplementedError
