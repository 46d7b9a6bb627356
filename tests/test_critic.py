"""critic.py: per-token values and their slicing, GAE against a slow loop, the clipped value loss."""

import pytest
import torch
from conftest import tiny_model

from critic import Critic, gae, response_values, value_loss
from nanorm.ckpt import save_checkpoint
from reward import LMRegularizedRewardModel, RewardModel

V = 61


def tiny(cls=Critic, seed=0):
    model = tiny_model(cls, seed)
    if model.head.bias is not None:
        with torch.no_grad():  # a bias would show up at padding if it were not masked
            model.head.bias.fill_(0.3)
    return model


# ---------------------------------------------------------------- the critic model
@torch.no_grad()
def test_values_per_token_zero_at_padding_and_padding_invariant():
    critic = tiny()
    torch.manual_seed(1)
    seqs = [torch.randint(3, V, (n,)) for n in (7, 3, 10)]
    alone = [critic(s[None])[0] for s in seqs]  # (n,) each
    # values[:, t] is the head on the hidden state of token t
    h = critic.backbone.hidden_states(seqs[0][None])[0]
    assert torch.allclose(alone[0], critic.head(h).squeeze(-1), atol=1e-6)
    for side in ("left", "right"):
        tokens = torch.full((3, 12), 5)
        mask = torch.zeros(3, 12, dtype=torch.long)
        for i, s in enumerate(seqs):
            a = 12 - len(s) if side == "left" else 0
            tokens[i, a : a + len(s)], mask[i, a : a + len(s)] = s, 1
        values = critic(tokens, mask)
        assert values.shape == (3, 12)
        assert torch.equal(values[mask == 0], torch.zeros(int((mask == 0).sum())))
        for i in range(3):
            assert (values[i][mask[i] == 1] - alone[i]).abs().max() < 1e-5, (side, i)


@torch.no_grad()
def test_response_values_slicing_conventions():
    critic = tiny()
    torch.manual_seed(2)
    P, R = 5, 4  # left-padded prompts of width P, then a response block of R tokens
    tokens = torch.randint(3, V, (2, P + R))
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0  # the second prompt is shorter
    values = critic(tokens, mask)
    v = response_values(values, P, R)  # (B, R)
    for i in range(R):  # the state before response token P + i ends at token P + i - 1
        assert torch.equal(v[:, i], values[:, P + i - 1])
    assert torch.equal(v, values[:, -R - 1 : -1])  # verl, when the response ends the row
    assert torch.equal(v, values[:, :-1][:, -R:])  # OpenRLHF: drop the last, keep the actions
    # per-row starts (right-padded prompts), as a (B,) tensor
    starts = torch.tensor([3, 5])
    v = response_values(values, starts, 2)
    assert torch.equal(v, torch.stack([values[0, 2:4], values[1, 4:6]]))
    with pytest.raises(ValueError, match="response_start must be >= 1"):
        response_values(values, 0, 2)


@pytest.mark.parametrize("rm_cls", [RewardModel, LMRegularizedRewardModel])
def test_critic_from_reward_model(tmp_path, rm_cls):
    rm = tiny(rm_cls)
    save_checkpoint(tmp_path / "rm.pt", rm)
    tokens = torch.randint(3, V, (2, 9))
    mask = torch.ones_like(tokens)
    mask[0, 6:] = 0
    for critic in (Critic.from_reward_model(rm), Critic(pretrained=tmp_path / "rm.pt")):
        with torch.no_grad():  # at the last real token the critic starts out as the reward
            values, rewards = critic(tokens, mask), rm(tokens, mask)
        assert (values[[0, 1], [5, 8]] - rewards).abs().max() < 1e-5
        assert critic.backbone is not rm.backbone  # PPO trains one and freezes the other
    save_checkpoint(tmp_path / "critic.pt", critic)
    assert torch.equal(
        Critic(pretrained=tmp_path / "critic.pt")(tokens, mask), critic(tokens, mask)
    )


# ---------------------------------------------------------------- GAE
def gae_reference(rewards, values, mask, gamma, lam):
    """The textbook recursion, one row and one real step at a time, in Python floats. Masked
    steps are dropped first, so each real step bootstraps from the next real one."""
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(rewards.size(0)):
        steps = [t for t in range(rewards.size(1)) if mask[b, t]]
        a = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_v = values[b, steps[k + 1]].item() if k + 1 < len(steps) else 0.0
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            a = delta + gamma * lam * a
            adv[b, t], ret[b, t] = a, a + values[b, t].item()
    return adv, ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9), (1.0, 1.0), (0.9, 0.0)])
def test_gae_matches_slow_reference(gamma, lam):
    torch.manual_seed(3)
    B, R = 4, 9
    rewards, values = torch.randn(B, R), torch.randn(B, R)
    mask = torch.ones(B, R, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    mask[2, 3:5] = 0  # a hole: e.g. tool output inside the response
    mask[3, 1:] = 0  # a one-token response
    adv, ret = gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, ref_adv, atol=1e-5) and torch.allclose(ret, ref_ret, atol=1e-5)
    assert torch.equal(adv[mask == 0], torch.zeros(int((mask == 0).sum())))


def test_gae_closed_forms():
    torch.manual_seed(4)
    rewards, values = torch.randn(2, 6), torch.randn(2, 6)
    mask = torch.ones(2, 6)
    mask[1, 4:] = 0
    r, v = rewards * mask, values * mask
    # lam = gamma = 1: Monte Carlo, reward-to-go minus the value; returns are the reward-to-go
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = r.flip(1).cumsum(1).flip(1)
    assert torch.allclose(adv, (to_go - v) * mask, atol=1e-6)
    assert torch.allclose(ret, to_go * mask, atol=1e-6)
    # lam = 0: the one-step TD error r_t + gamma V_{t+1} - V_t, with V after the end = 0
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.0)
    next_v = torch.cat([v[:, 1:], torch.zeros(2, 1)], dim=1)
    assert torch.allclose(adv, (r + 0.9 * next_v - v) * mask, atol=1e-6)
    # RLHF's usual shape: one reward at the last token, gamma 1: A_t = lam-weighted TD errors
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 0.75]])
    adv, _ = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=0.5)
    deltas = [0.25 - 0.5, 0.75 - 0.25, 1.0 - 0.75]
    expected = [deltas[0] + 0.5 * deltas[1] + 0.25 * deltas[2], deltas[1] + 0.5 * deltas[2]]
    assert torch.allclose(adv[0], torch.tensor(expected + [deltas[2]]), atol=1e-7)


# ---------------------------------------------------------------- the clipped value loss
def loss_and_grad(v, old, ret, mask, clip_eps=0.2):
    v = torch.tensor(v, requires_grad=True)
    loss = value_loss(v, torch.tensor(old), torch.tensor(ret), torch.tensor(mask), clip_eps)
    loss.backward()
    return loss.item(), v.grad


def test_value_loss_clipping_cases():
    # inside the clip range: plain 0.5 (V - G)^2, gradient V - G
    loss, g = loss_and_grad([0.1], [0.0], [1.0], [1.0])
    assert loss == pytest.approx(0.5 * 0.81) and g.item() == pytest.approx(-0.9)
    # moved past the range towards G: the clipped error (0.2 - 1)^2 is larger and flat in V
    loss, g = loss_and_grad([0.8], [0.0], [1.0], [1.0])
    assert loss == pytest.approx(0.5 * 0.64) and g.item() == 0.0
    # moved past the range beyond G: the unclipped error is larger, so V is pulled back
    loss, g = loss_and_grad([0.5], [0.0], [0.1], [1.0])
    assert loss == pytest.approx(0.5 * 0.16) and g.item() == pytest.approx(0.4)
    # moved past the range away from G: both errors agree the move was bad, V is pulled back
    loss, g = loss_and_grad([-0.5], [0.0], [1.0], [1.0])
    assert loss == pytest.approx(0.5 * 2.25) and g.item() == pytest.approx(-1.5)


def test_value_loss_masked_mean():
    torch.manual_seed(5)
    v, old, ret = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.ones(3, 5)
    mask[0, 3:], mask[2, 1:] = 0, 0
    loss = value_loss(v, old, ret, mask, clip_eps=0.3)
    clipped = old + (v - old).clamp(-0.3, 0.3)
    per_token = 0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2)
    assert loss.item() == pytest.approx(per_token[mask == 1].mean().item(), abs=1e-6)
    v2 = torch.where(mask == 1, v, torch.full_like(v, 1e6))  # padding never counts
    assert value_loss(v2, old, ret, mask, clip_eps=0.3).item() == pytest.approx(loss.item())
