"""
Exercise 2: the Bradley-Terry (LogSig) loss.

A reward model is trained on pairs: people preferred response `chosen` over `rejected`. The
Bradley-Terry model says P(chosen beats rejected) = sigmoid(r_chosen - r_rejected), so the
loss is the negative log-likelihood of the observed preferences:

    loss = mean over pairs of  -log sigmoid(r_chosen - r_rejected - margin)

The optional margin (Llama 2) asks for a larger gap on pairs rated "significantly better".

Fill in `logsig_loss`, then run:  python notebooks/exercises/check.py ex2
nanoRM's version is reward.pairwise_loss("logsig", ...); read it only after your own passes.
"""

import torch


def logsig_loss(
    r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean over pairs of -log sigmoid(r_chosen - r_rejected - margin), a scalar tensor.

    r_chosen, r_rejected: (B,) rewards of the preferred and the other response.
    margin: (B,) or None (None means 0).

    The result must be differentiable (stay in torch: no .item(), numpy or detach) and finite
    for rewards as large as +-1000: sigmoid(-200) is 0 in float32 and log(0) = -inf, so do not
    compute log(sigmoid(x)) in two steps (torch.nn.functional has a function for this).
    """
    # TODO: your code here (two or three lines)
    raise NotImplementedError
