"""
Exercise 13: an ensemble's conservative reward, against over-optimization.

A policy optimized against one reward model finds where that model is wrong and climbs there:
the learned reward rises while the true quality falls (over-optimization, Gao et al. 2022).
K reward models trained apart (other seeds, other data) rarely share a flaw, so Coste et al.
(2023) optimize a conservative combination of their rewards instead of one model's:

    mean             the mean of the K rewards
    min              the worst case: the smallest of the K rewards
    mean_minus_std   the mean less lam times the members' standard deviation: a response the
                     members disagree on is trusted less

The standard deviation is the spread of the K members themselves (divide by K, not K - 1:
torch's `unbiased=False`, or `correction=0`).

Fill in `conservative_reward`, then run:  python notebooks/exercises/check.py ex13
nanoRM's version is reward.conservative_reward; read it only after yours passes.
"""

import torch


def conservative_reward(rewards: torch.Tensor, rule: str, lam: float) -> torch.Tensor:
    """One reward (B,) for each of B responses, from K reward models' rewards (K, B).

    rule: "mean", "min" or "mean_minus_std"; lam: a float >= 0, read by mean_minus_std alone.
    The result must stay in torch (a policy's training may differentiate through it).

    Example: rewards [[1.0, 0.0], [3.0, 0.0]] (K = 2 models, B = 2 responses):
    mean -> [2.0, 0.0]; min -> [1.0, 0.0]; mean_minus_std with lam 1 -> [1.0, 0.0].
    """
    # TODO: your code here (three to six lines)
    raise NotImplementedError
