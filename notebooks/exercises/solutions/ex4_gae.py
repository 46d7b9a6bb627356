"""
Solution to exercise 4: generalized advantage estimation (GAE).

PPO asks of every response token (action) "was it better than expected?". The critic's value
V_t estimates the reward still to come before action t; GAE mixes one-step and long-horizon
estimates of the advantage with a parameter lam:

    delta_t = r_t + gamma * V_{t+1} - V_t         (V after the last action is 0: the episode ends)
    A_t     = delta_t + gamma * lam * A_{t+1}     (computed from the last action backwards)
    returns = A + V                               (the value loss's target)

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex4
nanoRM's version is critic.gae, for comparison.
"""

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, R), for a batch of B responses of R steps.

    rewards, values: (B, R) float; mask: (B, R) float, long or bool, 1 on actions and 0 on
    steps that are not actions. Masked steps are:
      - padding (a response shorter than R), on the right or on the left, and
      - steps inside a response that the policy did not choose (e.g. a tool's output).
    A masked step is not a step at all: skip it, so the action before it bootstraps from the
    next real action (its V and its A), or from 0 if there is none. Masked positions get
    advantage 0 and return 0. Do not modify the inputs.

    Example (one row, gamma = 1, lam = 1): rewards [0, 0, 1], values [0.5, 0.5, 0.5]
    -> advantages [0.5, 0.5, 0.5], returns [1, 1, 1].
    Hint: loop t from R - 1 down to 0 and carry V_{t+1} and A_{t+1} per row.
    """
    mask = mask.bool()
    B, R = rewards.shape
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(B)  # V_{t+1} of the next real action, per row (on values' device)
    next_adv = values.new_zeros(B)  # A_{t+1}
    for t in reversed(range(R)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        real = mask[:, t]
        advantages[:, t] = torch.where(real, adv, torch.zeros_like(adv))
        # a masked step is skipped: what the step before it sees is still the next real one
        next_value = torch.where(real, values[:, t], next_value)
        next_adv = torch.where(real, adv, next_adv)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages.detach(), returns.detach()
