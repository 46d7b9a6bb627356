"""
Exercise 10: PPO's per-token rewards, a KL penalty at every token and the score at the last.

The reward model scores a whole response once. PPO turns that into one reward per response
token (InstructGPT's shaping): every token pays for moving the policy away from the frozen
reference policy, and the last token also gets the score:

    r_t = -kl_coef * (log pi(a_t) - log pi_ref(a_t))         for every response token t
    r_T = r_T + score                                          T: the response's LAST token

Summed over a response, the penalty is -kl_coef times the sampled log-ratio log pi/pi_ref of
the whole response, whose mean over samples is the KL to the reference. GAE (exercise 4) then
spreads these rewards back over the tokens.

Fill in `kl_penalty_rewards`, then run:  python notebooks/exercises/check.py ex10
nanoRM's version is critic.kl_penalty_rewards; read it only after your own passes.
"""

import torch


def kl_penalty_rewards(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    response_mask: torch.Tensor,
    score: torch.Tensor,
    kl_coef: float,
) -> torch.Tensor:
    """Per-token rewards (B, R) for B responses of at most R tokens.

    logp, ref_logp: (B, R) float, log-probabilities of each sampled response token under the
    policy and the reference. response_mask: (B, R) bool or 0/1, 1 on a response's tokens; a
    response shorter than R is padded on the right (mask 0 there). score: (B,) the reward
    model's score of each response. Padding gets reward 0. Do not modify the inputs.

    Example: logp [[-1, -2, 0]], ref_logp [[-1.5, -2, 0]], mask [[1, 1, 0]], score [3],
    kl_coef 0.1 -> [[-0.05, 3.0, 0.0]].
    """
    # TODO: your code here (three to five lines)
    raise NotImplementedError
