"""
PPO's critic: a LLaMA with a value head that estimates, at every token, the reward still to come;
and PPO's mathematics, in one place: generalized advantage estimation and the clipped value loss
on the critic's side; the per-token KL-penalized rewards, the clipped policy loss, GRPO's group
advantages and the k3 KL estimate on the policy's side. nanorm/rl.py is the loop that uses them.

    python -m pytest tests/test_critic.py    # no command line: a PPO loop calls these functions

    critic = Critic.from_reward_model(rm)                # PPO usually starts from the RM's weights
    critic = Critic(pretrained="out/ckpt.pt")            # the same, from a trained reward model
    critic = Critic(pretrained="stories260K.bin")        # or a new head on any checkpoint
    values = critic(input_ids, attention_mask)           # (B, T), 0 at padding
    old_v = response_values(values, prompt_len, R)       # (B, R), aligned with the response tokens
    rewards = kl_penalty_rewards(old_logp, ref_logp, response_mask, score, kl_coef=0.05)
    adv, ret = gae(rewards, old_v, response_mask, gamma=1.0, lam=0.95)
    loss = clipped_policy_loss(logp, old_logp, adv, response_mask, clip_eps=0.2)
    loss = loss + value_loss(new_v, old_v, ret, response_mask, clip_eps=0.2)

Which token a value belongs to. values[:, t] = head(h_t) is computed from tokens 0..t, so it is
the value of the state "the text up to and including token t": one value per input position, as
ColossalChat returns them. PPO needs, for the response token (action) at position s + i, the
value of the state *before* it was chosen, values[:, s + i - 1]. For a response occupying
positions [s, s + R) of every row (prompts left-padded to a common width s):

    response_values(values, s, R) == values[:, s - 1 : s - 1 + R]

which is verl's values[:, -R-1:-1] when the response ends the row, and OpenRLHF's values[:, :-1]
cut to the action mask's last R columns. The value after the last token is never read: the
episode ends there, so GAE takes it as 0.
"""

import copy

import torch

from reward import ScalarHeadModel, apply_head


class Critic(ScalarHeadModel):
    def forward(self, input_ids, attention_mask=None, **kwargs):
        """Values (B, T): values[:, t] is the value of the text up to and including token t;
        exactly 0 at padding. Other keywords are ignored, as ColossalChat's Critic ignores them."""
        h = self.backbone.hidden_states(input_ids, attention_mask)  # (B, T, dim)
        values = apply_head(self.head, h)  # (B, T)
        if attention_mask is not None:
            values = values * attention_mask.to(values.dtype)
        return values

    @classmethod
    def from_reward_model(cls, rm):
        """A copy of a reward model (RewardModel or LMRegularizedRewardModel): at a sequence's
        last token the critic starts out predicting exactly the reward. The backbone is copied,
        not shared, because PPO trains the critic and keeps the reward model frozen."""
        critic = cls(copy.deepcopy(rm.backbone))
        with torch.no_grad():
            critic.head.weight.copy_(rm.head.weight)
            if rm.head.bias is not None:  # LMRegularizedRewardModel's head has none: keep 0
                critic.head.bias.copy_(rm.head.bias)
        return critic


def response_values(values, response_start, response_len):
    """(B, R) values of the states before each response token: out[:, i] = values[:, s - 1 + i].

    values (B, T) from Critic; response_start s: int or (B,) first response position per row;
    response_len R: the width of the response block (shorter responses are masked by the
    caller's response mask). s >= 1: a response always follows at least one token (BOS)."""
    start = torch.as_tensor(response_start, device=values.device).reshape(-1, 1)  # (B or 1, 1)
    if (start < 1).any():
        raise ValueError("response_start must be >= 1: the first action's state is token s - 1")
    idx = start - 1 + torch.arange(response_len, device=values.device)  # (B or 1, R)
    return values.gather(1, idx.expand(values.size(0), -1))


def gae(rewards, values, mask, gamma=1.0, lam=0.95):
    """Generalized advantage estimation (Schulman et al. 2016) on (B, R) response-aligned tensors.

        delta_t = r_t + gamma * V_{t+1} - V_t      (V after the last step is 0: the episode ends)
        A_t     = delta_t + gamma * lam * A_{t+1}  (computed from the last step backwards)
        returns = A + V                             (the lambda-return: the value loss's target)

    lam = 1 gives the Monte Carlo advantage sum_k gamma^k r_{t+k} - V_t (unbiased, noisy);
    lam = 0 the one-step TD error (quiet, but only as good as V). In RLHF r_t is the per-token
    KL penalty plus the reward model's score on the last token, and gamma is usually 1.

    mask (B, R) is 1 on actions. A masked step (right padding, or tool output inside a response)
    is not a step at all: it is skipped, so the action before it bootstraps from the next real
    one. Masked positions get advantage and return 0. Returns (advantages, returns), no grad."""
    with torch.no_grad():
        mask = mask.bool()
        B, R = rewards.shape
        advantages = torch.zeros_like(values)
        next_value = torch.zeros(B, dtype=values.dtype, device=values.device)  # V_{t+1}
        next_adv = torch.zeros_like(next_value)  # A_{t+1}
        for t in reversed(range(R)):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            adv = delta + gamma * lam * next_adv
            m = mask[:, t]
            advantages[:, t] = torch.where(m, adv, 0.0)
            # carry the later real step past a masked one
            next_value = torch.where(m, values[:, t], next_value)
            next_adv = torch.where(m, adv, next_adv)
        returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


def masked_mean(x, mask):
    """Mean of x over positions where mask is 1 (every token of the batch weighs the same)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def value_loss(values, old_values, returns, mask, clip_eps=0.2):
    """PPO's clipped value loss, a masked mean over response tokens:

        V_clip = old_V + clamp(V - old_V, -clip_eps, clip_eps)
        loss   = 0.5 * max((V - G)^2, (V_clip - G)^2)

    G = returns from gae with the old values. Taking the larger error is pessimistic: once V has
    moved more than clip_eps from the values the advantages were computed with, moving it
    further towards G earns no gradient (the clipped term is flat and larger), while moving
    back is never blocked. The 0.5 makes the gradient of the unclipped term simply V - G (as in
    OpenAI baselines, OpenRLHF and verl); it is the same loss up to a factor 2 in the learning
    rate."""
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    err = torch.maximum((values - returns).pow(2), (clipped - returns).pow(2))
    return 0.5 * masked_mean(err, mask)


# ----------------------------------------------------------------------------- the policy's side
def kl_penalty_rewards(logp, ref_logp, resp_mask, score, kl_coef):
    """PPO's per-token rewards (B, R): -kl_coef * (log pi - log pi_ref) at every response token
    (the k1 estimate of the KL, whose sum over a sequence is the sampled log-ratio), plus the
    sequence's score at its last token. InstructGPT's shaping, as ColossalChat and TRL do it."""
    m = resp_mask.float()
    rewards = -kl_coef * (logp - ref_logp) * m
    last = resp_mask.long().cumsum(1).argmax(1, keepdim=True)  # (B, 1) last response token
    return rewards.scatter_add(1, last, score[:, None].to(rewards.dtype))


def clipped_policy_loss(logp, old_logp, advantages, mask, clip_eps):
    """PPO's clipped surrogate, a masked mean over response tokens:
    -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A), ratio = pi / pi_old."""
    ratio = (logp - old_logp).exp()
    surrogate = torch.minimum(
        ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    )
    return -masked_mean(surrogate, mask)


def group_advantages(rewards, group, eps=1e-4):
    """GRPO: (B,) rewards in groups of `group` answers to one question -> each answer's reward
    less its group's mean, over its group's std (unbiased, as DeepSeekMath). A group whose
    answers all score the same gets 0: nothing to learn from."""
    r = rewards.view(-1, group)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def k3_kl(logp, ref_logp):
    """Per-token KL estimate exp(d) - d - 1, d = log pi_ref - log pi: never negative, unbiased
    for KL(pi || pi_ref) under pi's samples (Schulman's k3), GRPO's loss term."""
    d = ref_logp - logp
    return d.exp() - d - 1


def whiten(x, mask, eps=1e-8):
    """x less its masked mean, over its masked std: PPO's advantages on one scale per batch."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) / (var + eps).sqrt() * mask
