# %% [markdown]
# # 02 · From a preference pair to a scalar reward
#
# A reward model reads a prompt and a response and returns **one number**. It is trained on
# pairs: for the same prompt, people (or here, a verifier) preferred response `chosen` over
# response `rejected`. This notebook follows one pair through [`reward.py`](../reward.py):
#
# 1. a preference pair from the built-in arithmetic data, as tokens;
# 2. **last-real-token pooling**: where the number is read, whatever the padding;
# 3. the **LogSig / LogExp / BCE** losses, plotted against the reward difference;
# 4. a small reward model **trained** with `train_rm.py` (about a minute on a CPU), its
#    curves, and the **chosen-vs-rejected reward histogram**;
# 5. a look at **real HH-RLHF pairs**, and the length cue they hide.
#
# **The printed outputs** stored with this notebook are one machine's run: a 2-core AMD EPYC
# without AVX-512 (PyTorch's AVX2 kernels). On another CPU the digits differ (PyTorch and MKL
# pick other kernels there, which add floats in another order, and a training run drifts from
# that), while the claims the text makes hold: `tests/test_notebooks.py` checks each of them on
# a fresh run.

# %%
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.abspath(".."))  # the project root

import matplotlib.pyplot as plt
import torch

import train_rm
from data.arith.prepare import built_in
from data.pairs import PairDataset, length_heuristics
from data.rows import read_pairs
from data.tokenizer import load_tokenizer
from model import ModelConfig
from reward import RewardModel, accuracy, last_real_index, pairwise_loss, score_last_token
from nanorm.ckpt import load_reward_model

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.manual_seed(0)
torch.set_num_threads(1)  # a 0.2M-parameter model gains nothing from threads; kind to a shared CPU
# ../shared/data holds the real data sets; NANORM_DATA=none runs the small fallbacks instead
DATA = os.environ.get("NANORM_DATA", os.path.join("..", "..", "shared", "data"))
HH = os.path.join(DATA, "hh-rlhf")

# %% [markdown]
# ## 1. A preference pair
#
# The built-in dataset (`data/arith/prepare.py`, made on first use) asks for a sum or a
# difference; the chosen response states the right result, the rejected one a close wrong one
# (off by 1 or 2, by 10, or with two digits swapped) in the same words. The labels come from
# `verifiable.gsm8k_reward`. Both responses have the same words, and in 753 of the 1000
# held-out pairs the same length in tokens; but where the lengths differ the shorter response
# is the right one 170 times in 247 (a close wrong result often has one digit more). So length
# is a weak cue here, not none: "shorter wins" scores 0.55 (ties counted half), "longer wins"
# 0.45. To do better a reward model must read the numbers.

# %%
data_dir = built_in()  # prepares data/arith/ the first time
meta = json.load(open(os.path.join(data_dir, "meta.json")))
tok = load_tokenizer(meta["tokenizer"])
val = PairDataset(os.path.join(data_dir, "val.npz"))
print(f"{len(val)} held-out pairs, vocabulary {meta['vocab_size']}, pad id {meta['pad_id']}"
      f" (= eos id {meta['eos_id']}: LLaMA has no pad token)")
for i in range(3):
    p, c, r = val[i]
    print(f"\nprompt   {tok.decode(p)!r}\nchosen   {tok.decode(c)!r}\nrejected {tok.decode(r)!r}")
p, c, r = val[0]
print("\nas tokens: prompt", p.tolist(), " chosen", c.tolist(), " rejected", r.tolist())

# %% [markdown]
# The prompt starts with BOS and every response ends with EOS: the reward will be read at that
# EOS, the one token that has seen the whole text. `PairDataset.collate` makes a batch:
# prompt + response per row, **right-padded**, with an attention mask.

# %%
batch = val.collate(range(4), meta["pad_id"])
print("chosen tokens:\n", batch.chosen, "\nmask:\n", batch.chosen_mask)

# %% [markdown]
# ## 2. Last-real-token pooling
#
# The backbone gives a hidden state per token, `(B, T, dim)`; the head is a `Linear(dim, 1)`.
# Which token's state? The last **real** one, found from the mask:
# `last_real_index(mask)` is the largest `t` with `mask[b, t] = 1`, for any padding side.
# Two common mistakes: reading the last **column** (with right padding that is a pad token),
# and searching for the first pad id (LLaMA pads with EOS, so that search finds the response's
# own EOS, or nothing in the longest row).

# %%
def left_pad(tokens, mask, pad_id):
    """The same rows, padding moved to the left."""
    out_t, out_m = torch.full_like(tokens, pad_id), torch.zeros_like(mask)
    for b in range(len(tokens)):
        n = int(mask[b].sum())
        out_t[b, -n:], out_m[b, -n:] = tokens[b, :n], 1
    return out_t, out_m


right_t, right_m = batch.chosen, batch.chosen_mask
left_t, left_m = left_pad(right_t, right_m, meta["pad_id"])
print("last_real_index, right padding:", last_real_index(right_m).tolist())
print("last_real_index, left padding: ", last_real_index(left_m).tolist())

fig, axes = plt.subplots(1, 2, figsize=(10, 2.4))
for ax, (name, m) in zip(axes, (("right padding", right_m), ("left padding", left_m))):
    ax.imshow(m, cmap="Greens", vmin=-0.3, vmax=1.3, aspect="auto")
    idx = last_real_index(m)
    ax.scatter([m.size(1) - 1] * len(m), range(len(m)), marker="s", s=90, facecolors="none",
               edgecolors="k", label="last column")
    ax.scatter(idx, range(len(m)), marker="*", s=110, c="crimson", label="reward read here")
    ax.set_yticks(range(len(m)))
    ax.set(title=f"{name} (green: real tokens)", xlabel="column", ylabel="row")
axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()

# %% [markdown]
# With an (untrained) reward model the three ways of batching give the same rewards, because
# positions and pooling both come from the mask (notebook 01). Reading the last column does not:

# %%
cfg = ModelConfig(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=meta["vocab_size"],
                  multiple_of=32, max_seq_len=256)
rm = RewardModel.from_config(cfg).eval()
with torch.no_grad():
    r_right = rm(right_t, right_m)
    r_left = rm(left_t, left_m)
    r_alone = torch.cat([rm(right_t[b : b + 1, : int(right_m[b].sum())]) for b in range(4)])
    h = rm.backbone.hidden_states(right_t, right_m)
    r_last_col = score_last_token(rm.head, h, None)  # no mask: reads the last column
print("right-padded batch:", r_right.numpy().round(5))
print("left-padded batch: ", r_left.numpy().round(5))
print("one row at a time: ", r_alone.numpy().round(5))
print("last column, right padding:", r_last_col.numpy().round(5), " <- padding, not the text")

# %% [markdown]
# (The last-column rewards of the padded rows are the head applied to a padding slot: a
# constant that has nothing to do with the text. `exercises/ex1_pooling.py` asks you to write
# `last_real_index`.)
#
# ## 3. The pairwise losses
#
# Bradley-Terry: $P(\text{chosen} \succ \text{rejected}) = \sigma(r_c - r_r)$, so the loss is
# the negative log-likelihood, a function of the difference $\Delta = r_c - r_r$ only:
#
# * **LogSig** `pairwise_loss("logsig", ...)`: $-\log\sigma(\Delta)$;
# * **LogExp** `pairwise_loss("logexp", ...)`: $\log(1 + e^{-\Delta})$, the same function
#   written as in ColossalChat;
# * **BCE** `pairwise_loss("bce", ...)` with label 1: binary cross-entropy on $\sigma(\Delta)$,
#   the same again.
#   With label 0 it mirrors (the LLMBook bug that `LMRegularizedRewardModel`'s docstring
#   describes: it trains the model to prefer the rejected response).
#
# An optional **margin** $m$ (Llama 2) shifts the curve: $-\log\sigma(\Delta - m)$ keeps pushing
# until the gap exceeds $m$.

# %%
deltas = torch.linspace(-6, 6, 121)


def curve(loss_fn):
    """loss and -d loss / d delta at each delta (one pair each, r_rejected = 0)."""
    values, pushes = [], []
    for d in deltas:
        r_c = d.clone().view(1).requires_grad_()
        loss = loss_fn(r_c, torch.zeros(1))
        (g,) = torch.autograd.grad(loss, r_c)
        values.append(loss.item())
        pushes.append(-g.item())
    return values, pushes


curves = {
    "LogSig": (curve(lambda a, b: pairwise_loss("logsig", a, b)), "-", 3),
    "LogExp": (curve(lambda a, b: pairwise_loss("logexp", a, b)), "--", 2),
    "BCE, label 1": (curve(lambda a, b: pairwise_loss("bce", a, b, labels=torch.ones(1))), ":", 2),
    "BCE, label 0 (wrong)": (curve(lambda a, b: pairwise_loss("bce", a, b, labels=torch.zeros(1))), "-", 1),
    "LogSig, margin 2": (curve(lambda a, b: pairwise_loss("logsig", a, b, margin=2.0)), "-.", 1.5),
}
fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
for name, ((values, pushes), style, lw) in curves.items():
    ax[0].plot(deltas, values, style, lw=lw, label=name)
    ax[1].plot(deltas, pushes, style, lw=lw, label=name)
ax[0].set(xlabel=r"$\Delta = r_{chosen} - r_{rejected}$", ylabel="loss", ylim=(-0.2, 6.5),
          title="three names, one curve (until a label or a margin changes it)")
ax[1].set(xlabel=r"$\Delta$", ylabel=r"$-\partial$ loss / $\partial r_{chosen}$",
          title="the push on r_chosen: strong when wrong, fading once right")
for a in ax:
    a.grid(alpha=0.3)
    a.axvline(0, color="gray", lw=0.7)
fig.legend(*ax[0].get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=8)
fig.tight_layout(rect=(0, 0.08, 1, 1))

x = torch.tensor([-1e4, 0.0, 1e4])
print("naive log(1 + exp(-delta)) at delta = 1e4, 0, -1e4:", torch.log(1 + torch.exp(-x)).tolist())
print('pairwise_loss("logexp"), pair by pair:              ',
      [pairwise_loss("logexp", d.view(1), torch.zeros(1)).item() for d in x])
print("accuracy counts a tie as wrong:", accuracy(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])).item())

# %% [markdown]
# At $\Delta = 0$ every loss is $\log 2 \approx 0.693$, where training starts (the head is
# initialised small, so every reward starts near 0). The push is $\sigma(-\Delta)$: pairs the
# model already ranks right by a few units stop contributing, which is why rewards do not grow
# without bound. (`exercises/ex2_logsig.py` asks you to write `logsig_loss`, stably.)
#
# ## 4. Training a small reward model
#
# `train_rm.main` takes the same arguments as the command line and returns the final held-out
# metrics. A short run on a laptop CPU, with every setting we rely on spelled out:
#
# * `--model nano`: a 4-layer LLaMA with `dim` 64, trained from scratch on the arithmetic data;
# * `--lm_coef 1`: the **LM-regularized** reward model (`reward.LMRegularizedRewardModel`):
#   it also predicts the chosen response's next tokens. For a model that starts from random
#   weights this extra signal teaches it to read numbers much sooner than the single bit per
#   pair of the ranking loss alone;
# * 150 steps of 32 pairs, evaluated every 50 steps on 300 held-out pairs: under a minute on a
#   laptop CPU, a short run on purpose (what a longer one adds is at the end of section 5).
#
# The training loss it prints includes the LM term; the held-out loss is the pairwise loss alone.

# %%
out_dir = tempfile.mkdtemp(prefix="nanorm_rm_")
args = ["--dataset", "arith", "--out_dir", out_dir, "--model", "nano", "--lm_coef", "1.0",
        "--max_iters", "150", "--batch_size", "32", "--lr", "3e-3", "--min_lr", "3e-4",
        "--warmup", "10", "--eval_interval", "50", "--eval_pairs", "300",
        "--log_interval", "25", "--seed", "1337", "--device", "cpu", "--dtype", "float32"]
backend = plt.get_backend()
final = train_rm.main(args)
plt.switch_backend(backend)  # train_rm set matplotlib to Agg to write its PNGs; undo that
print({k: round(v, 3) for k, v in final.items()})

# %%
rows = [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]
ev = [r for r in rows if r["split"] == "eval"]
tr = [r for r in rows if r["split"] == "train"]
fig, ax = plt.subplots(1, 3, figsize=(11, 3))
ax[0].plot([r["step"] for r in ev], [r["loss"] for r in ev], "o-", label="held-out")
ax[0].axhline(0.693, color="gray", ls=":", label="log 2 (chance)")
ax[0].set(title="pairwise loss", xlabel="step")
ax[1].plot([r["step"] for r in tr], [r["acc"] for r in tr], "-", alpha=0.6, label="train batch")
ax[1].plot([r["step"] for r in ev], [r["acc"] for r in ev], "o-", label="held-out")
ax[1].axhline(0.5, color="gray", ls=":", label="chance")
ax[1].axhline(meta["length_baseline_val"], color="tab:red", ls="--", lw=1, label="longer wins")
ax[1].set(title="accuracy: P(r_chosen > r_rejected)", xlabel="step", ylim=(0.3, 1))
ax[2].plot([r["step"] for r in ev], [r["chosen"] for r in ev], "o-", label="chosen")
ax[2].plot([r["step"] for r in ev], [r["rejected"] for r in ev], "s-", label="rejected")
ax[2].set(title="mean held-out reward", xlabel="step")
for a in ax:
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# The train curve is noisy (32 pairs a step). The held-out loss starts at $\log 2$ (every
# reward near 0) and falls as the model learns to read the numbers. Only the *difference*
# between chosen and rejected is trained, so where the two mean rewards sit is arbitrary (use
# `--center_coef` to pin them near 0).
#
# ## 5. Chosen vs. rejected rewards on all held-out pairs
#
# `train_rm` saved the model to `ckpt.pt`; `load_reward_model` reads it back (whichever class it
# holds). We score all held-out pairs with `forward_pair` (one backbone call for both halves).

# %%
model, _ = load_reward_model(os.path.join(out_dir, "ckpt.pt"))
r_c, r_r = [], []
with torch.no_grad():
    for i in range(0, len(val), 100):
        b = val.collate(range(i, min(i + 100, len(val))), meta["pad_id"])
        rc, rr = model.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
        r_c.append(rc)
        r_r.append(rr)
r_c, r_r = torch.cat(r_c), torch.cat(r_r)
print(f"{type(model).__name__}: held-out accuracy {accuracy(r_c, r_r):.3f} on {len(val)} pairs "
      f"(chance 0.5; 'longer response wins' {meta['length_baseline_val']:.3f})")

fig, ax = plt.subplots(1, 2, figsize=(10, 3))
bins = torch.linspace(min(r_c.min(), r_r.min()).item(), max(r_c.max(), r_r.max()).item(), 40)
ax[0].hist(r_c.numpy(), bins=bins.numpy(), alpha=0.6, label="chosen (right answer)")
ax[0].hist(r_r.numpy(), bins=bins.numpy(), alpha=0.6, label="rejected (close wrong answer)")
ax[0].set(title="rewards of held-out responses", xlabel="reward")
ax[0].legend(fontsize=8)
margin = (r_c - r_r).numpy()
ax[1].hist(margin, bins=40, color="tab:purple")
ax[1].axvline(0, color="k", lw=1)
ax[1].set(title=f"r_chosen - r_rejected per pair: {100 * (margin > 0).mean():.0f}% > 0",
          xlabel="reward difference")
fig.tight_layout()

# %% [markdown]
# After 150 steps the two histograms still overlap: many rejected responses sit right on top of
# the chosen ones (near misses the model cannot tell apart yet: the mass near 0 on the right).
# And the rewards only mean something **relative to other responses to the same prompt**: the
# pairwise loss never saw an absolute value. The right panel is what the loss trained; its
# share above 0 is the held-out accuracy. Some pairs the short run still gets wrong:

# %%
wrong = torch.nonzero(r_c <= r_r).flatten()
for i in wrong[:4].tolist():
    p, c, r = val[i]
    print(f"{tok.decode(p)!r:24} chosen {tok.decode(c)!r:30} {r_c[i]:+.2f}   "
          f"rejected {tok.decode(r)!r:30} {r_r[i]:+.2f}")

# %% [markdown]
# A longer run (`python train_rm.py`, the defaults) gets most of these. Notebook 03 asks which
# wrong answers fool this model, and how far it agrees with the verifier that labelled the data.
#
# ## 6. Real preference pairs: HH-RLHF
#
# Anthropic's HH-RLHF: two full dialogues per row that share the prompt and differ in the last
# assistant turn. `read_pairs` splits them (`split_dialogue`) and reports every row it cannot
# use, by file and line; nothing is dropped silently. (The `harmless-base` subset contains
# harmful requests by design; we only count it.)

# %% tags=["shared-data"]
path = os.path.join(HH, "helpful-base", "test.jsonl.gz")
if os.path.exists(path):
    helpful, skipped = read_pairs(path, strict=False)
    harmless, _ = read_pairs(os.path.join(HH, "harmless-base", "test.jsonl.gz"), strict=False)
    print(f"helpful-base: {len(helpful)} pairs, skipped {skipped}")
    pair = next((p for p in helpful if "most similar to the United States" in p["prompt"]), helpful[0])
    print(f"\nprompt:   {pair['prompt']!r}\nchosen:   {pair['chosen']!r}\nrejected: {pair['rejected']!r}")
    turns = sum(p["prompt"].count("Human:") for p in helpful) / len(helpful)
    print(f"\nhuman turns per prompt: {turns:.1f} on average")
else:
    helpful = None
    print(f"{path} not found: the HH-RLHF cells are skipped")

# %% tags=["shared-data"]
if helpful:
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
    for a, (name, pairs) in zip(ax, (("helpful-base", helpful), ("harmless-base", harmless))):
        lc = torch.tensor([len(p["chosen"]) for p in pairs], dtype=torch.float)
        lr = torch.tensor([len(p["rejected"]) for p in pairs], dtype=torch.float)
        ratio = torch.log2(lc / lr).clamp(-5, 5).numpy()
        a.hist(ratio, bins=50, color="tab:green" if name == "helpful-base" else "tab:orange")
        a.axvline(0, color="k", lw=1)
        a.set(title=f"{name}: 'longer wins' {length_heuristics((len(p['chosen']), len(p['rejected'])) for p in pairs).longer_wins:.2f}",
              xlabel="log2(len(chosen) / len(rejected))")
    fig.tight_layout()

# %% [markdown]
# In `helpful-base` the chosen answer is longer 60% of the time; in `harmless-base` it is
# shorter more often (a refusal beats a detailed harmful answer). A reward model can reach
# 0.6 on helpful pairs by counting characters, and a policy optimised against it learns to
# ramble: the length bias of RLHF. The arithmetic data above mostly hides the cue (three pairs
# in four have equal lengths, and length alone scores 0.55 at best), though not entirely. To
# train on HH-RLHF instead:
#
# ```bash
# python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz \
#     --tokenizer ../shared/data/llama2c/stories260K/tok512.bin     # stories260K's vocabulary
# python train_rm.py --dataset hh_rlhf/helpful-base --init ../shared/data/llama2c/stories260K/stories260K.bin
# ```
#
# **Next:** [03_verifiable_rewards.ipynb](03_verifiable_rewards.ipynb): rewards without a
# learned model. **Exercises:** `exercises/ex1_pooling.py`, `exercises/ex2_logsig.py`.
