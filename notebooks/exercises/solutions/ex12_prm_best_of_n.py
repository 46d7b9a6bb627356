"""
Exercise 12: best-of-N by a process reward model. The solution.
"""

import torch


def select_best(step_probs: torch.Tensor, steps: torch.Tensor, how: str) -> torch.Tensor:
    # a step past the solution's end must change neither the minimum nor the product: make it 1
    p = torch.where(steps.bool(), step_probs, torch.ones_like(step_probs))
    reward = p.min(dim=-1).values if how == "min" else p.prod(dim=-1)  # (Q, N)
    return reward.argmax(dim=-1)
