# %% [markdown]
# # 04 · The critic: per-token values, GAE and the clipped value loss
#
# PPO trains a **critic** beside the policy: a LLaMA with a value head that estimates, at every
# token, the reward still to come. The critic turns one reward at the end of a response into a
# learning signal for each token: the **advantage**, "was this token better than expected?".
# This notebook walks through [`critic.py`](../critic.py):
#
# 1. per-token values, and **which token each value belongs to** (the classic off-by-one);
# 2. **GAE** on a small episode, with a plot of the advantages for several $\lambda$;
# 3. PPO's **clipped value loss**, and why it stops the critic from moving too far at once.
#
# **The printed outputs** stored with this notebook are one machine's run: a 2-core AMD EPYC
# without AVX-512 (PyTorch's AVX2 kernels). On another CPU the digits differ (PyTorch and MKL
# pick other kernels there, which add floats in another order, and a training run drifts from
# that), while the claims the text makes hold: `tests/test_notebooks.py` checks each of them on
# a fresh run.

# %% tags=["shared-data"]
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the project root

import matplotlib.pyplot as plt
import torch

from critic import Critic, gae, response_values, value_loss
from data.tokenizer import load_tokenizer
from model import ModelConfig
from reward import RewardModel

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.manual_seed(0)
torch.set_num_threads(1)  # tiny models: one thread is as fast, and kind to a shared CPU
# ../shared/data holds the real data sets; NANORM_DATA=none runs the small fallbacks instead
DATA = os.environ.get("NANORM_DATA", os.path.join("..", "..", "shared", "data"))
STORIES = os.path.join(DATA, "llama2c", "stories260K")
HAVE_STORIES = os.path.exists(os.path.join(STORIES, "stories260K.bin"))
print("stories260K:", STORIES if HAVE_STORIES else "not found; a random backbone stands in")

# %% [markdown]
# ## 1. Per-token values, and which token each belongs to
#
# PPO usually starts the critic from the reward model's weights: `Critic.from_reward_model`
# copies backbone and head, so at a sequence's last token the critic starts out predicting
# exactly the reward. Here the reward model is stories260K with a fresh (random) head: the
# numbers mean nothing yet, but the bookkeeping is the same as with a trained one.

# %% tags=["shared-data"]
if HAVE_STORIES:
    rm = RewardModel(pretrained=os.path.join(STORIES, "stories260K.bin"))
    tok = load_tokenizer(os.path.join(STORIES, "tok512.bin"))
    encode, decode = tok.encode, tok.decode
else:
    rm = RewardModel.from_config(ModelConfig(dim=64, n_layers=5, n_heads=8, n_kv_heads=4,
                                             vocab_size=512, hidden_dim=172, max_seq_len=512))
    encode = lambda s, bos=False: [1] * bos + [3 + b for b in s.encode()]
    decode = lambda ids: "".join(chr(i - 3) if 3 <= i < 259 else "" for i in ids)
rm.eval()
critic = Critic.from_reward_model(rm).eval()

prompt = encode("Once upon a time", bos=True)
s, R = len(prompt), 10  # the response starts at position s and has R tokens
tokens = rm.backbone.generate(torch.tensor([prompt]), R)  # (1, s + R): prompt + response
with torch.no_grad():
    values = critic(tokens)  # (1, s + R): one value per position
    print("critic's value at the last token:", round(values[0, -1].item(), 6),
          "  reward model:", round(rm(tokens).item(), 6))
print("text:", repr(decode(tokens[0].tolist())))

# %% [markdown]
# `values[:, t]` is computed from tokens `0..t`: it is the value of the state *"the text up to
# and including token t"*. The policy chose response token `s + i` in the state *before* it,
# so the value that goes with action `i` is `values[:, s + i - 1]`. That is
# `response_values(values, s, R)`, and the last position's value is never used (the episode
# ends there; GAE takes the value after the last action as 0).

# %% tags=["shared-data"]
old_v = response_values(values, s, R)  # (1, R), aligned with the response tokens
pieces = [decode([t]).strip() or "<s>" for t in tokens[0].tolist()]
T = s + R
fig, ax = plt.subplots(figsize=(11, 3.4))
colors = ["lightgray"] * T
for t in range(s - 1, s - 1 + R):
    colors[t] = "tab:orange"  # the values response_values picks
ax.bar(range(T), values[0], color=colors, edgecolor="k", lw=0.4)
top = values[0].abs().max().item()
for i in range(R):  # arrow: the value of state s+i-1 goes with the action at s+i
    ax.annotate("", xy=(s + i, 1.25 * top), xytext=(s + i - 1, 1.25 * top),
                arrowprops=dict(arrowstyle="->", color="tab:blue", lw=1))
ax.set_xticks(range(T), [f"{p}\n{t}" for t, p in enumerate(pieces)], fontsize=8)
for t in range(s, T):
    ax.get_xticklabels()[t].set_color("tab:blue")  # the response tokens (actions)
ax.axvline(s - 0.5, color="gray", ls=":")
ax.set_ylim(-1.5 * top, 1.5 * top)
ax.set(ylabel="values[:, t]",
       title="orange: values response_values(values, s, R) picks; arrow: state t-1 -> action t (blue tokens)")
fig.tight_layout()
print("response tokens:", [pieces[t] for t in range(s, T)])
print("their values:    values[:, s-1 : s-1+R] =", old_v[0].numpy().round(4))

# %% [markdown]
# In a batch, prompts are left-padded to a common width `s`, so every response starts at the
# same column and `response_values` works row by row; the critic returns exactly 0 at padding.
# A response that ends early (EOS) is right-padded inside the response block, and a response
# mask marks its real tokens.

# %% tags=["shared-data"]
prompts = [encode("Once upon a time", bos=True), encode("Lily", bos=True)]
s = max(map(len, prompts))
ids = torch.tensor([[0] * (s - len(p)) + p for p in prompts])
mask = torch.tensor([[0] * (s - len(p)) + [1] * len(p) for p in prompts])
batch = rm.backbone.generate(ids, R, attention_mask=mask)  # (2, s + R)
full_mask = torch.cat([mask, torch.ones(2, R, dtype=mask.dtype)], dim=1)
with torch.no_grad():
    v = critic(batch, full_mask)
print("values (0 at the left padding):\n", v.numpy().round(3))
print("response_values:\n", response_values(v, s, R).numpy().round(3))

# %% [markdown]
# ## 2. GAE on a small episode
#
# In RLHF the reward of a response arrives at its last token (the reward model's score), and
# every token also pays a small KL penalty for drifting from the reference model:
# $r_t = -\beta\,\mathrm{KL}_t$, plus the score at the end. With the critic's values $V_t$,
#
# $$\delta_t = r_t + \gamma V_{t+1} - V_t, \qquad A_t = \delta_t + \gamma\lambda A_{t+1},$$
#
# computed backwards from the last token ($V$ after it is 0). $\lambda = 0$ gives the one-step
# TD error (low variance, but only as good as $V$); $\lambda = 1$ the Monte-Carlo advantage
# $\sum_k r_{t+k} - V_t$ (unbiased, noisy). RLHF uses $\gamma = 1$ and $\lambda \approx 0.95$.
# The values below are written by hand: a critic that has learned to expect a score of about
# 0.8, a little too optimistic in the middle of this response, which scored 1.0.

# %%
R = 12
kl = torch.tensor([0.02, 0.01, 0.05, 0.03, 0.02, 0.30, 0.04, 0.02, 0.01, 0.03, 0.02, 0.02])
rewards = -0.1 * kl  # beta = 0.1: the per-token KL penalty
rewards[-1] += 1.0  # the reward model's score, on the last token
V = torch.tensor([0.70, 0.72, 0.75, 0.80, 0.90, 1.10, 0.95, 0.90, 0.90, 0.92, 0.95, 0.97])
full = torch.ones(1, R)
adv = {lam: gae(rewards[None], V[None], full, gamma=1.0, lam=lam)[0][0] for lam in (0.0, 0.5, 0.95, 1.0)}

mc = rewards.flip(0).cumsum(0).flip(0) - V  # sum of the rewards still to come, minus V
td = rewards + torch.cat([V[1:], torch.zeros(1)]) - V
print("lam = 1 is the Monte-Carlo advantage:", torch.allclose(adv[1.0], mc, atol=1e-6))
print("lam = 0 is the one-step TD error:    ", torch.allclose(adv[0.0], td, atol=1e-6))

# a tool's output inside the response: steps 6-8 were not chosen by the policy
holes = full.clone()
holes[0, 6:9] = 0
adv_holes, ret_holes = gae(rewards[None], V[None], holes, gamma=1.0, lam=0.95)

fig, ax = plt.subplots(1, 3, figsize=(12, 3.2))
steps = torch.arange(R)
ax[0].bar(steps, rewards, color="tab:green", label="reward r_t")
ax[0].plot(steps, V, "o-", color="k", label="value V_t")
ax[0].set(title="one episode: KL penalties, score at the end", xlabel="response token t")
ax[0].legend(fontsize=8)
for lam, style in zip(adv, (":", "--", "-", "-.")):
    ax[1].plot(steps, adv[lam], style, marker="o", ms=3, label=f"lam = {lam}")
ax[1].axhline(0, color="k", lw=0.6)
ax[1].set(title="advantages A_t (gamma = 1)", xlabel="response token t")
ax[1].legend(fontsize=8)
ax[2].plot(steps, adv[0.95], "o-", label="all steps are actions")
ax[2].plot(steps, adv_holes[0], "s--", label="steps 6-8 masked (tool output)")
ax[2].axvspan(5.5, 8.5, color="gray", alpha=0.15)
ax[2].axhline(0, color="k", lw=0.6)
ax[2].set(title="masked steps are skipped, not ends", xlabel="response token t")
ax[2].legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Reading the middle panel: with $\lambda = 0$ each token is judged only by the next value, so
# the critic's bump $V_5 = 1.1$ makes token 4 look good (it reached a "valuable" state) and
# token 5 bad. With $\lambda = 1$ each token is judged by the score that actually came minus
# its own value: token 4's credit nearly vanishes, and token 5 stays negative because its
# baseline $V_5$ is high and it paid the largest KL penalty. $\lambda = 0.95$ sits in
# between. On the right, a masked step gets advantage 0 and is skipped: token 5 bootstraps
# from token 9's value, as if the tool's output were part of the environment.
# (`exercises/ex4_gae.py` asks you to write `gae`, masked steps included.)
#
# ## 3. The clipped value loss
#
# The critic is trained to predict the returns $G = A + V_{old}$ that GAE computed with the
# **old** values. PPO also evaluates the new value clipped to within $\epsilon$ of the old one,
# and takes the **larger** error:
#
# $$V_{clip} = V_{old} + \mathrm{clip}(V - V_{old}, -\epsilon, \epsilon), \qquad
# L = \tfrac12 \max\big((V - G)^2, (V_{clip} - G)^2\big)$$
#
# Below, one token with $V_{old} = 0$, target $G = 1$, $\epsilon = 0.2$:

# %%
old, G, eps = torch.zeros(1, 1), torch.ones(1, 1), 0.2
grid = torch.linspace(-1, 2.2, 300)
loss, grad = [], []
for v in grid:
    v = v.view(1, 1).clone().requires_grad_()
    value = value_loss(v, old, G, torch.ones(1, 1), clip_eps=eps)
    (g,) = torch.autograd.grad(value, v)
    loss.append(value.item())
    grad.append(g.item())
fig, ax = plt.subplots(1, 2, figsize=(10, 3))
ax[0].plot(grid, 0.5 * (grid - 1) ** 2, ":", color="gray", label="unclipped 0.5 (V - G)^2")
ax[0].plot(grid, loss, lw=2, label="value_loss")
ax[1].plot(grid, grad, lw=2, color="tab:red")
for a in ax:
    a.axvspan(old.item() + eps, 2 * G.item() - old.item() - eps, color="tab:orange", alpha=0.15)
    a.axvline(G.item(), color="tab:green", lw=1)
    a.set(xlabel="new value V")
    a.grid(alpha=0.3)
ax[0].set(title="loss (V_old = 0, G = 1, eps = 0.2)")
ax[0].legend(fontsize=8)
ax[1].set(title="d loss / d V: zero in the orange band")
fig.tight_layout()

# %% [markdown]
# Once $V$ has moved more than $\epsilon$ from the old value towards $G$ (the orange band),
# the clipped error is the larger one and it does not depend on $V$: no gradient, so the
# critic cannot run further from the values its advantages were computed with. Moving back
# is never blocked. The next rollout brings new old values, and the window moves. Gradient
# descent on one token shows it:

# %%
v = torch.zeros(1, 1, requires_grad=True)
opt = torch.optim.SGD([v], lr=0.1)
path = [v.item()]
for _ in range(8):
    opt.zero_grad()
    value_loss(v, old, G, torch.ones(1, 1), clip_eps=eps).backward()
    opt.step()
    path.append(round(v.item(), 3))
print("V over 8 steps towards G = 1:", path)
# the mean runs over real response tokens only: padding does not dilute it
m = torch.tensor([[1.0, 1.0, 0.0]])
print("masked mean:", value_loss(torch.tensor([[0.5, 0.5, 9.0]]), torch.zeros(1, 3),
                                 torch.ones(1, 3), m).item(), "(the 9.0 sits on padding)")

# %% [markdown]
# The value stops just past `old + eps = 0.2`: the step that crosses the boundary is the last
# one with a gradient.
#
# That is the whole critic: values per token (read one position to the left of each action),
# GAE to turn them and the rewards into advantages, and a clipped regression onto the returns.
# **Exercises:** `exercises/ex4_gae.py` and `exercises/ex6_value_loss.py`.
