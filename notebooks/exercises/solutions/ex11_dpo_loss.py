"""
Solution to exercise 11: DPO's loss.

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex11
nanoRM's version is reward.dpo_loss.
"""

import torch.nn.functional as F


def dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta):
    """The mean DPO loss of B pairs (the exercise file's docstring)."""
    # the implicit rewards' difference: beta times the difference of the two log-ratios
    margin = beta * ((logp_chosen - ref_logp_chosen) - (logp_rejected - ref_logp_rejected))
    return -F.logsigmoid(margin).mean()  # logsigmoid: finite at any margin
