"""
Exercise 11: DPO's loss, the pairwise loss on the policy's own implicit reward.

DPO (Rafailov et al. 2023) trains the policy on preference pairs directly, with no reward model
in between: the policy is its own reward model. The implicit reward of a response y to a
prompt x is

    r(x, y) = beta * (log pi(y|x) - log pi_ref(y|x))

where pi is the policy being trained, pi_ref the frozen reference it started from (the SFT
policy), and log pi(y|x) the sum of the log-probabilities of the response's tokens. The loss is
exercise 2's Bradley-Terry loss on those rewards:

    loss = mean over pairs of  -log sigmoid(r(x, y_chosen) - r(x, y_rejected))

The reference is what makes it a reward: without it, the policy is pushed to make the chosen
response likely in absolute terms, not more likely than where it started. beta sets the scale:
a larger beta makes the same change of log-probabilities a larger reward gap.

Fill in `dpo_loss`, then run:  python notebooks/exercises/check.py ex11
nanoRM's version is reward.dpo_loss; read it only after your own passes.
"""

import torch


def dpo_loss(
    logp_chosen: torch.Tensor,
    logp_rejected: torch.Tensor,
    ref_logp_chosen: torch.Tensor,
    ref_logp_rejected: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """The mean DPO loss of B pairs, a scalar tensor.

    logp_chosen, logp_rejected: (B,) log pi(y|x) of each pair's chosen and rejected response
    under the policy, summed over the response's tokens. ref_logp_chosen, ref_logp_rejected:
    (B,) the same under the reference. beta: a float > 0.

    The result must be differentiable in the policy's log-probabilities (stay in torch) and
    finite when the log-ratios are hundreds of nats apart (see exercise 2).

    Example: logp_chosen [-1.0], logp_rejected [-3.0], ref_logp_chosen [-1.5],
    ref_logp_rejected [-2.0], beta 0.5: the rewards are 0.25 and -0.5, the loss
    -log sigmoid(0.75) = 0.3869.
    """
    # TODO: your code here (two or three lines)
    raise NotImplementedError
