"""nanorm/rl.py: the pieces of PPO and GRPO against closed forms and plain loops (the KL-shaped
rewards, GRPO's group advantages, the clipped loss at known ratios, the k3 estimator's
expectation, rollout masks and log-probabilities against a step-by-step forward), and one tiny
end-to-end step of each algorithm."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

import critic
from critic import gae
from nanorm import rl
from nanorm.base.checkpoints import load


def test_kl_penalty_rewards_closed_form():
    """-coef * (logp - ref) on every response token, the score added at the last one, 0 after."""
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    lengths = [5, 2, 1]
    mask = torch.arange(5) < torch.tensor(lengths)[:, None]
    score = torch.tensor([1.5, -2.0, 0.25])
    got = critic.kl_penalty_rewards(logp, ref, mask, score, kl_coef=0.1)
    for b, n in enumerate(lengths):
        for t in range(5):
            want = -0.1 * (logp[b, t] - ref[b, t]) if t < n else 0.0
            want = want + (score[b] if t == n - 1 else 0.0)
            assert math.isclose(float(got[b, t]), float(want), abs_tol=1e-6), (b, t)


def test_kl_penalty_sums_to_the_sequence_kl():
    """Summed over a sequence, the penalty is -coef times the sampled log-ratio, rl.jsonl's kl."""
    logp, ref = torch.log(torch.tensor([[0.5, 0.25]])), torch.log(torch.tensor([[0.25, 0.5]]))
    r = critic.kl_penalty_rewards(
        logp, ref, torch.ones(1, 2, dtype=torch.bool), torch.zeros(1), 1.0
    )
    assert math.isclose(r.sum().item(), -(math.log(2) + math.log(0.5)), abs_tol=1e-6)


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # two groups of 4
    got = critic.group_advantages(r, group=4, eps=0.0 + 1e-12)
    # group 1: mean 0.25, unbiased std sqrt(((0.75)^2 + 3 * 0.25^2) / 3) = 0.5
    assert torch.allclose(got[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-6)
    assert torch.equal(got[4:], torch.zeros(4))  # all right: nothing to learn


def test_clipped_policy_loss_at_known_ratios():
    """ratio 1.5 with A = +1 is clipped to 1.2; ratio 0.5 with A = +1 is not (min keeps 0.5);
    ratio 0.5 with A = -1 is clipped to 0.8 (-0.8 < -0.5); ratio 1.5 with A = -1 keeps -1.5."""
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss = critic.clipped_policy_loss(logp, old, adv, torch.ones(1, 4), clip_eps=0.2)
    assert math.isclose(loss.item(), -(1.2 + 0.5 - 0.8 - 1.5) / 4, abs_tol=1e-6)
    # a masked token counts for nothing
    loss = critic.clipped_policy_loss(logp, old, adv, torch.tensor([[1, 0, 0, 0]]), clip_eps=0.2)
    assert math.isclose(loss.item(), -1.2, abs_tol=1e-6)


def test_k3_is_unbiased_for_the_kl():
    """E_{a ~ p}[exp(d) - d - 1], d = log q(a) - log p(a), equals KL(p || q) exactly."""
    g = torch.Generator().manual_seed(1)
    p, q = F.softmax(torch.randn(7, generator=g), -1), F.softmax(torch.randn(7, generator=g), -1)
    expected = (p * critic.k3_kl(p.log(), q.log())).sum()
    assert torch.allclose(expected, (p * (p / q).log()).sum(), atol=1e-6)


def test_whitened_advantages_have_zero_mean_unit_variance_on_the_mask():
    x, mask = torch.randn(4, 6), torch.rand(4, 6) > 0.3
    w = critic.whiten(x, mask)
    assert abs(w[mask].mean().item()) < 1e-5 and abs(w[mask].var(unbiased=False).item() - 1) < 1e-4
    assert torch.equal(w[~mask], torch.zeros_like(w[~mask]))


def test_rollout_masks_after_the_first_eos_and_logprobs_match_a_plain_forward():
    model = tiny_model()
    model.row_attention = False
    eos, pad = 2, 0
    prompts = [[1, 5, 9, 4], [1, 7]]  # different lengths: left-padded
    args = rl.parse_args(["--max_new_tokens", "6", "--temperature", "1.0"])
    torch.manual_seed(0)
    seq, mask, P, resp_mask = rl.rollout(model, prompts, args, pad, eos)
    assert P == 4 and seq.shape == (2, 10)
    for b in range(2):
        resp = seq[b, P:].tolist()
        n = int(resp_mask[b].sum())
        # the mask covers every token up to and including the first EOS, nothing after
        assert eos not in resp[: n - 1] and (n == 6 or resp[n - 1] == eos)
        assert all(t == pad for t in resp[n:])
    logp = rl.token_logprobs(model, seq, mask, P)
    for b, prompt in enumerate(prompts):  # each token from a forward of its own prefix, unpadded
        ids = prompt + seq[b, P:].tolist()
        for i in range(int(resp_mask[b].sum())):
            prefix = torch.tensor([ids[: len(prompt) + i]])
            want = F.log_softmax(model(prefix)[0, -1].float(), -1)[ids[len(prompt) + i]]
            assert math.isclose(logp[b, i].item(), want.item(), abs_tol=1e-4), (b, i)


def test_gae_on_kl_shaped_rewards_is_the_return_when_values_are_zero():
    """With V = 0, gamma = lam = 1, each token's advantage is the reward still to come: the
    score minus coef times the log-ratios from that token on."""
    logp, ref = torch.randn(2, 4), torch.randn(2, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    rewards = critic.kl_penalty_rewards(logp, ref, mask, torch.tensor([1.0, -1.0]), 0.05)
    adv, _ = gae(rewards, torch.zeros(2, 4), mask, gamma=1.0, lam=1.0)
    want = (rewards * mask).flip(1).cumsum(1).flip(1) * mask
    assert torch.allclose(adv, want, atol=1e-6)


def test_verifier_reads_exactly_the_response():
    """Called with inclusive ends, the gold reads the response and nothing after it."""

    class Chars:  # a tokenizer of characters: id = ord
        def decode(self, ids):
            return "".join(map(chr, ids))

    text = [ord(c) for c in "Q? #### 18"] + [ord("7")]  # a token after the response
    ids = torch.tensor([text, text])
    start, end = torch.tensor([2, 2]), torch.tensor([9, 10])  # the second row reads "187"
    got = rl.verifier(Chars())(ids, response_start=start, response_end=end, gt_answer=["18"] * 2)
    assert got.tolist() == [1.0, 0.0]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_one_step_end_to_end(tmp_path, algo):
    """SFT, the proxy (train_rm.py), one update: rl.jsonl has a row per step with the fields."""
    args = ["--algo", algo, "--max_steps", "1", "--out_dir", str(tmp_path), "--sft_steps", "2"]
    args += ["--proxy_pairs", "64", "--proxy_iters", "2", "--batch_size", "8", "--group", "4"]
    rows = rl.main(args)
    logged = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1] and logged == json.loads(json.dumps(rows))
    assert {"step", "kl", "proxy", "gold"} <= set(logged[0])
    assert logged[0]["kl"] == 0.0  # before any update the policy is the reference
    assert 0.0 <= logged[1]["gold"] <= 1.0 and (tmp_path / "rl.png").is_file()
    # the SFT policy and the trained one are nanoRM checkpoints, read back by the one reader
    for name in ("sft2_policy.pt", "policy.pt"):
        c = load(tmp_path / name)
        assert c.kind == "Transformer" and c.head == "random" and not c.heads
