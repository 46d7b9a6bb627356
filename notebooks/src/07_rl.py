# %% [markdown]
# # 07 · The reward model in use: PPO against a learned reward, GRPO against a verifier
#
# A reward model exists to be optimized against. This notebook runs [`nanorm/rl.py`](../nanorm/rl.py) on the
# built-in arithmetic questions ("What is 7 - 9?"), where a verifier knows the right answer,
# so we can watch two rewards at once: the **proxy** (a reward model trained by `train_rm.py`
# on some of the data's pairs: 300 in the cells here, 5,000 or 1,000 in the full runs of
# section 6), which the policy is trained on, and the **gold** (the verifier's accuracy), which
# it never sees. We walk through one PPO step by hand:
#
# 1. the pieces: an SFT policy that answers, the proxy, the verifier;
# 2. the **rollout** (KV-cache sampling) and the **reward at the last token**;
# 3. the **per-token KL penalty** to the frozen reference policy;
# 4. the **critic's values and GAE** on these real rollouts;
# 5. the **update**: the clipped policy loss and the clipped value loss;
# 6. a short live run, then the **curves** of the full runs in `bench/rl/`: the proxy climbs
#    while the gold rises and then falls (over-optimization), and GRPO against the verifier.
#
# Everything here is `nanorm/rl.py`'s own functions; the notebook defines none of its own.
#
# **The printed outputs** stored with this notebook are one machine's run: a 2-core AMD EPYC
# without AVX-512 (PyTorch's AVX2 kernels). On another CPU the digits differ (PyTorch and MKL
# pick other kernels there, which add floats in another order, and a training run drifts from
# that), while the claims the text makes hold: `tests/test_notebooks.py` checks each of them on
# a fresh run.

# %%
import copy
import importlib.util
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.abspath(".."))  # the project root

import matplotlib.pyplot as plt
import torch

from nanorm import rl
from critic import Critic, clipped_policy_loss, gae, kl_penalty_rewards, response_values, value_loss, whiten

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.set_num_threads(1)  # a 0.2M-parameter model gains nothing from threads; kind to a shared CPU
work = tempfile.mkdtemp(prefix="nanorm_rl_")

# %% [markdown]
# ## 1. The pieces
#
# `rl.proxy_reward_model` runs `python train_rm.py` on the first 300 training pairs (a small
# set on purpose: a proxy that has seen few pairs is easy to fool); `rl.sft_policy` teaches a
# LLaMA of the same shape to answer, by next-token cross-entropy on the right answers only.
# Both are cached in `--cache_dir`, so `nanorm/rl.py`'s later runs reuse them. The gold is
# `RLVRRewardModel([gsm8k_reward])`: 1 when the answer is right ("The answer is 11.",
# "#### 11", "\boxed{11}"), else 0. (Much shorter than `nanorm/rl.py`'s defaults, 400 SFT
# steps and a proxy of 1,000 steps on 5,000 pairs: each cell below takes well under a minute
# on a laptop CPU.)

# %%
SHORT = ["--out_dir", work, "--sft_steps", "200", "--proxy_pairs", "300", "--proxy_iters", "150"]
args = rl.parse_args(SHORT)
data_dir, train, val, meta, tok = rl.arith()  # data/arith/, made on first use

# %%
proxy = rl.proxy_reward_model(data_dir, args)

# %% [markdown]
# The SFT policy: 200 steps of 64 right answers each, the loss on the response tokens only
# (`nanorm/rl.py` takes 400: its policy answers more questions right, and takes twice as long).

# %%
policy = rl.sft_policy(train, meta, copy.deepcopy(proxy.backbone.config), args)
gold_rm = rl.verifier(tok)
print(f"proxy: {type(proxy).__name__}, policy: {sum(p.numel() for p in policy.parameters()):,} "
      f"parameters; {len(rl.questions(train, tok))} distinct questions")

# %% [markdown]
# ## 2. The rollout, and the reward at the last token
#
# `rl.rollout` left-pads the prompts (generation appends at the right end), samples with
# `model.generate` and its KV cache, and cuts each response at its first EOS: the response mask
# is 1 up to and including it. The proxy reads its reward at each row's **last real token**,
# the EOS, whatever padding surrounds it (`reward.last_real_index`); the verifier decodes the
# response and checks the answer.
#
# **Predict:** the SFT policy samples at temperature 1. Will it be right more or less often
# than greedy decoding? (Eight answers cannot tell; the cell also asks all 600 questions.)

# %%
torch.manual_seed(0)
qs = rl.questions(train, tok)
prompts, answers = [q for q, _ in qs[:8]], [a for _, a in qs[:8]]
policy.eval()
seq, mask, P, resp_mask = rl.rollout(policy, prompts, args, meta["pad_id"], meta["eos_id"])
last = P + resp_mask.long().sum(1) - 1  # (B,) each response's last token
with torch.no_grad():
    score = proxy(seq, mask)
gold = gold_rm(seq, mask, response_start=torch.full_like(last, P), response_end=last, gt_answer=answers)
print(f"prompts left-padded to P = {P}, responses of at most {resp_mask.size(1)} tokens\n")
for b in range(8):
    q, r = tok.decode(prompts[b]), tok.decode(seq[b, P:last[b] + 1].tolist())
    print(f"{q:>22} -> {r!r:30} proxy {score[b]:+.2f}  gold {gold[b]:.0f}  (answer {answers[b]})")

# eight answers cannot answer the question above: ask every distinct question, four sampled
# answers each (temperature 1) and one greedy answer, each answer cut at its EOS
accuracy = {}
for name, temperature, rows in (("sampled", args.temperature, qs * 4), ("greedy", 0.0, qs)):
    decoding = copy.copy(args)
    decoding.temperature = temperature
    all_seq, all_mask, all_P, all_resp = rl.rollout(policy, [q for q, _ in rows], decoding, meta["pad_id"], meta["eos_id"])
    ends = all_P + all_resp.long().sum(1) - 1
    right = gold_rm(all_seq, all_mask, response_start=torch.full_like(ends, all_P), response_end=ends,
                    gt_answer=[a for _, a in rows])
    accuracy[name] = right.mean().item()
print(f"\nthese 8 sampled answers: {gold.mean():.2f} right. All {len(qs)} questions, each answer cut at its EOS: "
      f"sampled {accuracy['sampled']:.3f} right (4 answers each), greedy {accuracy['greedy']:.3f} right")

# %% [markdown]
# Greedy decoding is right more often (the last line): a sampled answer takes a less likely digit
# now and then, and one wrong digit makes a wrong answer. PPO samples all the same: it learns
# from the spread of its own answers, the better ones made more likely.
#
# ## 3. The per-token KL penalty
#
# PPO does not hand the score alone to the policy: every token pays for moving away from the
# **reference** (the frozen SFT policy), `-kl_coef * (log pi - log pi_ref)`, and the last
# token also gets the score (`kl_penalty_rewards` in critic.py, exercise 10). Summed over a response the
# penalty is `-kl_coef` times the sampled log-ratio, whose mean is the KL to the reference in
# nats: the `kl` column of `rl.jsonl`.
#
# **Predict:** before any update, what is the KL, and what are the per-token rewards?

# %%
reference = copy.deepcopy(policy).eval()
with torch.no_grad():
    old_logp = rl.token_logprobs(policy, seq, mask, P)
    ref_logp = rl.token_logprobs(reference, seq, mask, P)
rewards = kl_penalty_rewards(old_logp, ref_logp, resp_mask, score, kl_coef=0.05)
kl = ((old_logp - ref_logp) * resp_mask).sum(1)
print("KL per sequence:", [round(v, 3) for v in kl.tolist()])
print("row 0's rewards:", [round(v, 3) for v in rewards[0].tolist()])
print("row 0's log-probabilities:", [round(v, 2) for v in old_logp[0, : int(resp_mask[0].sum())].tolist()])

# %% [markdown]
# The policy *is* the reference so far: the KL is 0 and the reward is the score at the last
# token, 0 elsewhere. The penalty starts to bite after the first update (section 5).
#
# ## 4. The critic's values and GAE, on these rollouts
#
# `Critic.from_reward_model(proxy)` copies the proxy: at a response's last token it starts out
# predicting the proxy's reward. `response_values` picks, for each response token, the value
# of the state *before* it (notebook 04); `gae` turns the per-token rewards into advantages and
# returns (gamma 1, lambda 0.95).

# %%
critic = Critic.from_reward_model(proxy)
with torch.no_grad():
    values = critic(seq, mask)  # (B, P + R): the value of each prefix
old_values = response_values(values, P, resp_mask.size(1))  # (B, R)
adv, ret = gae(rewards, old_values, resp_mask, gamma=1.0, lam=0.95)
n0 = int(resp_mask[0].sum())
print(f"critic at row 0's last token {values[0, last[0]]:+.3f}, proxy {score[0]:+.3f}")
for name, row in [("rewards", rewards), ("values", old_values), ("advantages", adv), ("returns", ret)]:
    print(f"{name:>10}", [round(v, 2) for v in row[0, :n0].tolist()])

# %% [markdown]
# The critic reproduces the proxy at the last token (the value of the full text), but the
# values *before* each token read prefixes the reward model never saw in training, so the
# early advantages are noisy: the critic learns them with the value loss below.
#
# ## 5. The update
#
# One minibatch of PPO: the clipped surrogate `-min(ratio * A, clip(ratio, 0.8, 1.2) * A)` on
# whitened advantages, then `value_loss` on the critic. On the first pass the policy is the one
# that sampled, so every ratio is 1 and nothing is clipped. After the step, the penalty of a
# token can have either sign (the policy now likes that token more, or less, than the
# reference does); the KL, its mean over the policy's own samples, is never negative.
#
# The step uses `nanorm/rl.py`'s learning rates (`--lr` 1e-4 for the policy, `--critic_lr` 1e-3
# for the critic). Adam's first step moves every weight by about the learning rate, whatever its
# gradient, so the KL a small step moves grows about with the square of it: the cell also takes
# the same step at ten times the rate from the same start, which moves the policy fifty to a
# hundred times further (`bench/rl/README.md` calls 1e-3 a step far too large).

# %%
before = copy.deepcopy(policy)  # for the same step at ten times the learning rate, below
policy_opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
critic_opt = torch.optim.AdamW(critic.parameters(), lr=args.critic_lr)
policy.train()
logp = rl.token_logprobs(policy, seq, mask, P)
ratio = (logp - old_logp).exp()
loss = clipped_policy_loss(logp, old_logp, whiten(adv, resp_mask), resp_mask, 0.2)
print(f"ratios in [{ratio[resp_mask].min():.3f}, {ratio[resp_mask].max():.3f}], policy loss {loss.item():+.4f}")
policy_opt.zero_grad()
loss.backward()
policy_opt.step()
v_loss = value_loss(response_values(critic(seq, mask), P, resp_mask.size(1)), old_values, ret, resp_mask)
critic_opt.zero_grad()
v_loss.backward()
critic_opt.step()
policy.eval()
with torch.no_grad():
    new_logp = rl.token_logprobs(policy, seq, mask, P)
print(f"value loss {v_loss.item():.4f}")
print("row 0's KL penalty now:", [round(v, 4) for v in (-0.05 * (new_logp - ref_logp) * resp_mask)[0, :n0].tolist()])

fast = before.train()  # the same policy step at ten times the learning rate
fast_opt = torch.optim.AdamW(fast.parameters(), lr=10 * args.lr, weight_decay=0.0)
fast_loss = clipped_policy_loss(rl.token_logprobs(fast, seq, mask, P), old_logp, whiten(adv, resp_mask), resp_mask, 0.2)
fast_opt.zero_grad()
fast_loss.backward()
fast_opt.step()
fast.eval()
# the KL is an expectation under the policy: measure it on each updated policy's own samples,
# exactly at each token (the sum over the vocabulary, never negative) and as rl.jsonl's kl
# estimates it (the sampled log-ratio, which can come out negative)
for lr, moved in ((args.lr, policy), (10 * args.lr, fast)):
    torch.manual_seed(1)
    seq2, mask2, P2, resp2 = rl.rollout(moved, prompts * 8, args, meta["pad_id"], meta["eos_id"])
    with torch.no_grad():
        logp_new = torch.log_softmax(moved(seq2, mask2)[:, P2 - 1 : -1].float(), -1)  # (B, R, vocab)
        logp_ref = torch.log_softmax(reference(seq2, mask2)[:, P2 - 1 : -1].float(), -1)
    exact = (logp_new.exp() * (logp_new - logp_ref)).sum(-1)  # (B, R): each token's KL
    taken = seq2[:, P2:, None]
    log_ratio = (logp_new.gather(-1, taken) - logp_ref.gather(-1, taken)).squeeze(-1)
    print(f"one step at lr {lr:g}: KL to the reference on 64 fresh samples {(exact * resp2).sum(1).mean():.4f} "
          f"nats (exact per token); the sampled log-ratio {(log_ratio * resp2).sum(1).mean():+.4f}")

# %% [markdown]
# ## 6. A short live run, then the full curves
#
# `rl.main` runs the same steps in a loop: 128 answers per step, two passes of two minibatches.
# Ten steps here (the SFT policy and proxy come from the cache above); `rl.jsonl` gets one row
# per step. Lines with times are left out of the notebook tests, the summary is compared.

# %%
rows = rl.main(SHORT + ["--max_steps", "10", "--seed", "0"])
print(f"\nstep 0: kl {rows[0]['kl']:.2f}, proxy {rows[0]['proxy']:.2f}, gold {rows[0]['gold']:.2f}")
print(f"step {rows[-1]['step']}: kl {rows[-1]['kl']:.2f}, proxy {rows[-1]['proxy']:.2f}, gold {rows[-1]['gold']:.2f}")

# %% [markdown]
# The full runs are in [`bench/rl/`](../bench/rl/README.md), each with its command (2-core CPU,
# a few minutes each). Gao, Schulman and Hilton (2022) plot the gold reward against
# $\sqrt{KL}$: with a proxy, gold $\approx \alpha\sqrt{KL} - \beta KL$, a rise and a fall.
#
# **Predict:** PPO against the proxy with a larger KL coefficient: does the gold peak come at a
# larger or a smaller $\sqrt{KL}$, and is the final gold higher or lower?

# %%
BENCH = os.path.join("..", "bench", "rl")
spec = importlib.util.spec_from_file_location("bench_rl_report", os.path.join(BENCH, "report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)  # bench/rl/report.py: load() and smooth(), as its table uses
runs = report.load()  # {setting: {seed: rows}}: five seeds of each setting
fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
for i, (setting, seeds) in enumerate(runs.items()):
    label = f"{setting} ({len(seeds)} seeds)"
    x = [math.sqrt(max(m, 0)) for m, _ in report.mean_curve(seeds, "kl")]
    panels = [(ax[2], list(range(len(x))), "gold")]
    if setting.startswith("ppo"):
        panels += [(ax[0], x, "gold"), (ax[1], x, "proxy")]
    for a, xs, key in panels:  # the mean over the seeds, and a band of one standard deviation
        curve = report.mean_curve(seeds, key)[: len(xs)]
        a.plot(xs, [m for m, _ in curve], color=f"C{i}", label=label, lw=1)
        lo, hi = [m - sd for m, sd in curve], [m + sd for m, sd in curve]
        a.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.15, lw=0)
ax[0].set(title="PPO against a proxy: gold", xlabel="sqrt(KL to the reference)", ylabel="verifier accuracy")
ax[1].set(title="PPO against a proxy: proxy", xlabel="sqrt(KL to the reference)", ylabel="proxy reward")
ax[2].set(title="gold against the step", xlabel="step", ylabel="verifier accuracy")
for a in ax:
    a.legend(fontsize=7)
fig.tight_layout()
for setting, seeds in runs.items():  # 5-step moving averages: one step's gold is +-0.04
    for seed, rows in sorted(seeds.items()):
        f = report.summary(rows)
        print(f"{setting} seed {seed}: gold {f['gold_start']:.2f} -> peak {f['gold_peak']:.2f} at step "
              f"{f['peak_step']} (kl {f['peak_kl']:.1f}) -> end {f['gold_end']:.2f}; "
              f"proxy {f['proxy_start']:+.2f} -> {f['proxy_end']:+.2f}")

# %% [markdown]
# What the full runs show (the table, with commands and times, is in `bench/rl/README.md`;
# one step's gold is an average over 128 answers, about +-0.04, so read the 5-step averages):
#
# * **Over-optimization against the 5,000-pair proxy (5 of 5 seeds).** The proxy climbs
#   throughout (about +0.9 to +8.7) while the gold rises from about 0.49 to a peak near 0.61 (at
#   sqrt(KL) 2.6-2.9), then falls back by step 100 (by 0.04 or more in 4 of 5 seeds).
# * **A weaker proxy is exploited at a smaller KL (5 of 5 seeds).** Against the 1,000-pair proxy
#   (held-out 0.85) the gold peaks at sqrt(KL) 0.45-1.2, earlier than against the 5,000-pair
#   proxy in every seed, and collapses to 0.08-0.19 by step 100 while that proxy climbs to +7.
# * **A larger KL coefficient** (0.1 against 0.02) barely brakes the drift here: the final KL is
#   smaller in every seed, by 0.1-0.3 nats of about 8; the peak moves in no consistent direction.
# * **GRPO against the verifier** raises the gold from about 0.5 to a peak of 0.74-0.78 in every
#   seed, at a KL under 1 nat, and ends within 0.06 of it (one step's noise): a reward that cannot
#   be fooled is climbed.
#
# **Questions.**
# 1. Why is the KL at step 0 exactly 0, and why does `rl.jsonl`'s `kl` sometimes come out
#    negative on one step? (It is a sampled estimate of a non-negative quantity.)
# 2. GRPO has no critic: where does its baseline come from, and what does a group whose 8
#    answers are all right contribute to the gradient?
# 3. The full runs' proxies saw 5,000 and 1,000 pairs, the live run's 300. From those two, what
#    do you expect of the gold over 100 steps against a proxy of 300 pairs
#    (`python -m nanorm.rl --proxy_pairs 300`), and against one of all 20,000 training pairs?
#
# **Exercise:** `exercises/ex10_kl_penalty.py` (write `kl_penalty_rewards`), checked by
# `python notebooks/exercises/check.py ex10`.
