# %% [markdown]
# # 05 · Evaluating a reward model: what it learned, and where length fools it
#
# Held-out accuracy is the one number `train_rm.py` prints, and it is not enough: a reward
# model can reach it by rewarding *length* instead of quality, and a policy trained against it
# will then learn to ramble. [`eval_rm.py`](../eval_rm.py) reports, per subset of the data:
#
# * `accuracy` (a tie is wrong) next to `longer_wins`, the accuracy of "pick the longer
#   response" on the same pairs: the baseline a reward model must beat;
# * `length_corr`, the correlation of the reward with the response length;
# * `ece`, how well `sigmoid(r_chosen - r_rejected)` works as a probability;
#
# and draws the histograms, the reward against length, and a reliability diagram. Here we
# 1. train a small reward model from scratch on HH-RLHF's helpful-base pairs (about a minute),
# 2. evaluate it on its held-out pairs, on the *harmless* subset it never saw, and on a length
#    trap built from its own pairs,
# 3. read the plots.
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
from IPython.display import Image, display

import eval_rm
import train_rm
from data import sources
from data.arith.prepare import built_in
from data.hh_rlhf.prepare import main as prepare_hh
from data.pairs import PairDataset
from data.rows import read_pairs
from data.tokenizer import load_tokenizer

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.set_num_threads(1)  # a 0.2M-parameter model gains nothing from threads; kind to a shared CPU
# ../shared/data holds the real data sets; NANORM_DATA=none runs the small fallbacks instead
SHARED = os.environ.get("NANORM_DATA", os.path.join("..", "..", "shared", "data"))
HH = os.path.join(SHARED, "hh-rlhf")
HAVE_HH = os.path.exists(os.path.join(HH, "helpful-base", "test.jsonl.gz"))
work = tempfile.mkdtemp(prefix="nanorm_eval_")

# %% [markdown]
# ## 1. Data and a small model
#
# `data/hh_rlhf/prepare.py` splits helpful-base's 2,354 test pairs into a training part and a
# fixed 20% held out, tokenized with stories260K's 512-piece vocabulary (no vocabulary to
# train), at most 192 tokens a pair. It also records the length heuristic of each part: in
# helpful-base, the longer response is the chosen one about 60% of the time.

#
# Without `../shared/data` the built-in arithmetic pairs of notebook 02 stand in: the code and
# the plots are the same, the story is not (there the longer response is *not* the better one,
# `longer_wins` about 0.45, so a model cannot lean on length). The numbers the real run gives
# are in the prose below each cell.

# %% tags=["shared-data"]
tok = os.path.join(SHARED, "llama2c", "stories260K", "tok512.bin")
src = os.path.join(HH, "helpful-base", "test.jsonl.gz")
if HAVE_HH:
    train_dir = f"{work}/helpful"
    meta = prepare_hh(["--src", src, "--tokenizer", tok, "--out_dir", train_dir,
                       "--max_len", "192"])  # fmt: skip
    print(json.dumps(meta["subsets"], indent=1))
else:
    train_dir = built_in()
    meta = json.load(open(os.path.join(train_dir, "meta.json")))
    print(f"{src} not found: training on the built-in arithmetic pairs instead "
          f"(longer wins {meta['length_baseline_val']:.2f} of the held-out pairs)")

# %% [markdown]
# A 4-layer LLaMA (`--model nano`, 0.26M parameters) trained from scratch with the plain
# pairwise loss, 50 steps of 16 pairs (under a minute on a laptop CPU). At its end `train_rm`
# writes the same `eval.json` and plots for its final evaluation as `eval_rm.py` does: one code
# path for both.

# %% tags=["shared-data"]
run = f"{work}/run"
args = ["--dataset", train_dir, "--out_dir", run, "--model", "nano", "--lm_coef", "0",
        "--max_seq_len", "192", "--max_iters", "50", "--batch_size", "16", "--warmup", "10",
        "--eval_interval", "50", "--eval_first", "false", "--eval_pairs", "1000", "--log_interval", "10",
        "--device", "cpu", "--dtype", "float32"]  # fmt: skip
final = train_rm.main(args)

# %% [markdown]
# ## 2. Evaluation on three sets
#
# * `helpful`: the held-out pairs of the training data (a prepared directory: its `val.npz`);
# * `harmless-base`: Anthropic's harmless subset, raw `.jsonl.gz`, tokenized here with the
#   checkpoint's own tokenizer. The model never saw it, and there the **shorter** response is
#   usually preferred (a refusal beats a long harmful answer);
# * a **length trap** in RewardBench's format (`prompt`, `chosen`, `rejected`, `subset`): the
#   chosen response is a held-out helpful-base answer, the rejected one is the *same* answer
#   followed by a filler sentence. Nothing is better about the rejected one; it is only longer.

# %% tags=["shared-data"]
FILLER = " I hope this helps! Let me know if you have any other questions."
if HAVE_HH:
    pairs, _ = read_pairs(src, strict=False, report=lambda *a: None)
else:  # the held-out arithmetic pairs, decoded back to text
    arith_tok = load_tokenizer(meta["tokenizer"])
    held_out = PairDataset(os.path.join(train_dir, "val.npz"))
    pairs = [dict(zip(("prompt", "chosen", "rejected"), map(arith_tok.decode, held_out[i])))
             for i in range(300)]  # fmt: skip
trap = os.path.join(work, "length_trap.jsonl")
with open(trap, "w") as f:
    for p in pairs[:300]:
        row = dict(prompt=p["prompt"], chosen=p["chosen"], rejected=p["chosen"] + FILLER)
        f.write(json.dumps(row | {"subset": "length-trap"}) + "\n")

harmless = [os.path.join(HH, "harmless-base", "test.jsonl.gz")] if HAVE_HH else []
out = f"{work}/eval"
result = eval_rm.main(["--ckpt", f"{run}/ckpt.pt", "--data", train_dir, *harmless, trap,
                       "--max_pairs", "500", "--out", out])  # fmt: skip

# %% [markdown]
# ## 3. Reading the plots
#
# **Histograms.** On helpful-base the chosen rewards sit a little to the right of the rejected
# ones: the model separates the pairs somewhat. On harmless-base the two overlap or even swap.

# %%
display(Image(os.path.join(out, "reward_hist.png")))

# %% [markdown]
# **Reward against length.** Every response, chosen and rejected, at its length in tokens. The
# reward climbs with length almost as a straight line: `length_corr` is the number in the
# title. This is the model's main "feature".

# %%
display(Image(os.path.join(out, "reward_length.png")))

# %% [markdown]
# **Reliability.** Each pair is counted in both orders, so the diagram asks: of the pairs the
# model gives 70%, is the first response preferred 70% of the time? ECE is the mean distance of
# the points from the diagonal, each bin weighted by its share of the pairs (a weighted mean
# of the gaps, not their sum). The diagram pools **every set evaluated above** (the held-out
# pairs, harmless-base where it is present, and the length trap), so it is no one set's
# calibration: a set the model gets backwards pulls the pooled points below the diagonal
# where another's would sit on it. Each set's own ECE is the `ece` column of the table. The
# pooled points lie near the diagonal only around 0.5: the model is rarely sure.

# %%
display(Image(os.path.join(out, "reliability.png")))

# %% [markdown]
# ## 4. Is it quality, or length?
#
# The accuracy alone cannot tell. Split the held-out pairs by whether the chosen response is
# the longer one: a model that reads quality is right on both kinds; a model that reads length
# is right when the chosen is longer and wrong when it is shorter. `eval_rm.score` gives the
# per-pair rewards (the same `eval_rm.evaluate` call train_rm.py and the report use).

# %% tags=["shared-data"]
rm, info = eval_rm.load_model(f"{run}/ckpt.pt")
val = PairDataset(os.path.join(train_dir, "val.npz"))
source = sources.Source(val, ["held-out"] * len(val), pad_id=meta["pad_id"])
s = eval_rm.score(rm, source, batch_size=16)["held-out"]
win = s.rewards[:, 0] > s.rewards[:, 1]
longer, shorter = s.lengths[:, 0] > s.lengths[:, 1], s.lengths[:, 0] < s.lengths[:, 1]
split = {"chosen longer": win[longer].float().mean().item(),
         "chosen shorter": win[shorter].float().mean().item()}  # fmt: skip
print({k: round(v, 3) for k, v in split.items()}, f"({int(longer.sum())} / {int(shorter.sum())} pairs)")
fig, ax = plt.subplots(figsize=(4, 2.6))
ax.bar(list(split), list(split.values()), color=["tab:green", "tab:red"])
ax.axhline(0.5, color="gray", ls=":")
ax.set(ylim=(0, 1), ylabel="accuracy", title="held-out pairs")
fig.tight_layout()

# %% [markdown]
# ## What the reward model learned
#
# The table printed by `eval_rm` says it in numbers. On its own held-out pairs the model's
# accuracy is close to `longer_wins`, and its rewards correlate strongly with length; split by
# length, it is right mostly when the chosen response is the longer one. A small model trained
# on two thousand pairs found the cheapest feature that explains them: **length**.
#
# Where length fools it:
# * on **harmless-base**, where the preferred answer is usually the shorter one, its accuracy
#   falls to about `longer_wins`, below chance;
# * on the **length trap** it prefers the padded answer to the same answer without padding in
#   most pairs (its accuracy there is below 0.3 on every CPU measured), although the padding
#   adds nothing. (Its `longer_wins` is not 0:
#   an answer longer than 192 tokens keeps only its end, so some trap pairs tie in length.) A policy optimised against this reward would
#   learn to add such sentences (the "thanks" exploit reported against DeepSpeed-Chat).
#
# What to do about it: compare every accuracy with `longer_wins` on the same pairs (RewardBench
# does this with its length-controlled subsets); train on data whose pairs differ in quality but
# not in length (in the arithmetic pairs of notebook 02 `longer_wins` is 0.454 on the held-out
# pairs: there the longer answer is more often the wrong one, and a model trained there has to
# read the numbers); or give length its own head so the quality head is decorrelated from it
# (ODIN, length_head.py's length-debiased model).
#
# The same report on other data, from the command line:
#
# ```
# python eval_rm.py --ckpt out/ckpt.pt --data data/arith --out out/eval
# python eval_rm.py --ckpt out/ckpt.pt --data gsm8k:../shared/data/gsm8k/test.jsonl --out out/gsm8k
# ```
#
# The second one labels pairs of a correct and a wrong GSM8K solution with `verifiable.py` and
# reports best-of-N agreement with the verifier.
