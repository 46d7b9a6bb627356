"""
Solution to exercise 2: the Bradley-Terry (LogSig) loss.

A reward model is trained on pairs: people preferred response `chosen` over `rejected`. The
Bradley-Terry model says P(chosen beats rejected) = sigmoid(r_chosen - r_rejected), so the
loss is the negative log-likelihood of the observed preferences:

    loss = mean over pairs of  -log sigmoid(r_chosen - r_rejected - margin)

The optional margin (Llama 2) asks for a larger gap on pairs rated "significantly better".

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex2
nanoRM's version is reward.pairwise_loss("logsig", ...), for comparison.
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
    diff = r_chosen - r_rejected
    if margin is not None:
        diff = diff - margin
    # logsigmoid(x) = -log(1 + exp(-x)), computed without forming exp of a large number
    return -torch.nn.functional.logsigmoid(diff).mean()
