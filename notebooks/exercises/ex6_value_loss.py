"""
Exercise 6: PPO's clipped value loss.

The critic is trained to predict the returns G that GAE computed with the old values. PPO keeps
it from moving too far in one update: the new value V is also evaluated clipped to within
clip_eps of the old value, and the loss takes the LARGER of the two errors:

    V_clip = old_V + clamp(V - old_V, -clip_eps, clip_eps)
    loss   = 0.5 * max((V - G)^2, (V_clip - G)^2)        averaged over real tokens

Fill in `value_loss`, then run:  python notebooks/exercises/check.py ex6
nanoRM's version is critic.value_loss; read it only after your own passes.
"""

import torch


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
) -> torch.Tensor:
    """The clipped value loss, a scalar tensor.

    values: (B, R) the critic's new values (requires grad); old_values, returns: (B, R);
    mask: (B, R) float, long or bool, 1 on response tokens (padding on either side). The mean
    is over the tokens where mask is 1 only (padding must not count), and the result must be
    differentiable with respect to values.
    """
    # TODO: your code here (three or four lines)
    raise NotImplementedError
