# %% [markdown]
# # 06 · Where the reward model sits, and training it at scale on a laptop
#
# 1. **The pipeline**: pretraining → SFT → reward model → PPO or GRPO, and where verifiable
#    rewards and the critic come in.
# 2. **Training at scale on a laptop**: gradient accumulation gives the gradients of one big
#    batch; why Adam magnifies rounding at a large learning rate; DDP with two processes
#    launched from here with torchrun, `no_sync`; what FSDP shards and when to use it.
# 3. **The LM-regularized reward model**: `--lm_coef 0` against `--lm_coef 1` on the same pairs,
#    the response-only shifted LM term, and LLMBook's three bugs (exercise 7).
# 4. **The reward model in use**: best-of-N on GSM8K answers from SmolLM2-135M-Instruct, a
#    reward model trained on HH-RLHF as the proxy and the verifier as the gold reward, and what
#    over-optimization looks like.
#
# Every claim a cell can check is an `assert`. A few minutes on a laptop CPU, no cell much over
# a minute.
#
# **The printed outputs** stored with this notebook are one machine's run: a 2-core AMD EPYC
# without AVX-512 (PyTorch's AVX2 kernels). On another CPU the digits differ (PyTorch and MKL
# pick other kernels there, which add floats in another order, and a training run drifts from
# that), while the claims the text makes hold: `tests/test_notebooks.py` checks each of them on
# a fresh run.

# %%
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from itertools import combinations
from math import comb, log

sys.path.insert(0, os.path.abspath(".."))  # the project root

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import FancyBboxPatch
from torch.utils.data import DataLoader

import reward
import train_rm
from data.arith.prepare import built_in
from model import ModelConfig, Transformer
from nanorm.base.checkpoints import load as read_checkpoint
from reward import LogSigLoss, RewardModel
from train_rm import MODELS, RewardModelTrainer

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.set_num_threads(1)  # tiny models gain nothing from threads; kind to a shared CPU
built_in()  # data/arith/, the built-in pairs, made on first use
work = tempfile.mkdtemp(prefix="nanorm_scale_")

# %% [markdown]
# ## 1. Where the reward model sits
#
# A chat model is made in stages. **Pretraining** predicts the next token of web text.
# **SFT** (supervised fine-tuning) continues on written demonstrations of good answers, so the
# model answers instead of continuing. Then people compare two answers to one prompt: the
# **reward model** learns from those pairs to give one number to any answer (notebooks 02 and
# 05; `reward.py`). **PPO** (or **GRPO**) then samples answers from the policy, scores them,
# and moves the policy towards higher reward, with a KL penalty that keeps it near the SFT
# model. PPO also trains a **critic** (`critic.py`, notebook 04), a value head that predicts
# the reward from each prefix, so that each token gets an advantage; GRPO drops the critic and
# compares several samples of the same prompt instead.
#
# Where the answer can be checked (math, code), a **verifiable reward** (`verifiable.py`,
# notebook 03) replaces the learned one: RLVR. The reward model is often initialised from the
# SFT model, and the critic from the reward model.

# %%
fig, ax = plt.subplots(figsize=(11, 3.4))
ax.set(xlim=(0, 10.2), ylim=(0, 4.3))
ax.axis("off")
boxes = {  # name: (x, y, text, colour); each box 2.0 x 1.3
    "pre": (0.1, 2.4, "pretraining\nnext token of web text", "#dddddd"),
    "sft": (2.7, 2.4, "SFT\ndemonstrations", "#dddddd"),
    "rm": (5.3, 2.4, "reward model\npairs, Bradley-Terry\nreward.py, train_rm.py", "#f6c667"),
    "rl": (8.0, 2.4, "PPO or GRPO\nsample, score, update\n(KL to the SFT model)", "#9ecae1"),
    "ver": (5.3, 0.2, "verifiable reward\ncheck the answer\nverifiable.py", "#a1d99b"),
    "critic": (
        8.0,
        0.2,
        "critic (PPO only)\nvalue per token, GAE\ncritic.py; init: the RM",
        "#c6b3e6",
    ),
}
for x, y, text, colour in boxes.values():
    ax.add_patch(FancyBboxPatch((x, y), 2.0, 1.3, boxstyle="round,pad=0.05", fc=colour, ec="k"))
    ax.text(x + 1.0, y + 0.65, text, ha="center", va="center")
arrow = dict(arrowstyle="->", lw=1.5)
for a, b, label in [("pre", "sft", ""), ("sft", "rm", "init"), ("rm", "rl", "reward")]:
    (xa, ya, *_), (xb, _, *_) = boxes[a], boxes[b]
    ax.annotate("", (xb - 0.08, ya + 0.65), (xa + 2.08, ya + 0.65), arrowprops=arrow)
    ax.text((xa + 2.0 + xb) / 2, ya + 0.8, label, ha="center", fontsize=8)
ax.annotate("", (8.0, 2.45), (7.35, 1.2), arrowprops=arrow)  # verifiable -> RL
ax.text(7.45, 1.75, "the reward, where\nanswers check", fontsize=8, ha="right")
ax.annotate("", (9.0, 2.32), (9.0, 1.58), arrowprops=arrow)  # critic -> RL
ax.text(9.1, 1.9, "advantages", fontsize=8)
ax.annotate("", (3.7, 3.8), (9.0, 3.8), arrowprops=dict(arrowstyle="<-", ls="--", lw=1))
ax.text(6.35, 3.95, "the policy starts from the SFT model", ha="center", fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## 2. Training at scale on a laptop
#
# ### Gradient accumulation: k micro-batches give the gradients of one big batch
#
# A batch of 64 pairs may not fit in memory where 4 micro-batches of 16 do. Gradients add up
# in `.grad` over backward calls, so running backward on each micro-batch and stepping once
# gives the big batch's gradient, *if* each micro-step's loss (a mean over its 16 pairs) is
# divided by k = 4. `train_rm.py --grad_accum 4` does exactly this (exercise 8 asks you to
# write it). Below: a tiny reward model, one batch of 64 random pairs, and the two ways.

# %%
cfg = ModelConfig(dim=32, n_layers=2, n_heads=4, vocab_size=64, max_seq_len=32, multiple_of=16)
torch.manual_seed(0)
rm = reward.RewardModel(Transformer(cfg))
B, T, k = 64, 12, 4
chosen, rejected = torch.randint(64, (B, T)), torch.randint(64, (B, T))
lengths = torch.randint(4, T + 1, (2, B))
masks = [(torch.arange(T) < n[:, None]).long() for n in lengths]  # right padding


def gradients(micro_batches):
    """The summed gradients of loss / len(micro_batches) over the micro-batches."""
    rm.zero_grad()
    for idx in micro_batches:
        loss, _ = rm.loss(chosen[idx], masks[0][idx], rejected[idx], masks[1][idx])
        (loss / len(micro_batches)).backward()
    # the LM head (backbone.output) gets no gradient: a reward model does not use it
    return torch.cat([p.grad.flatten() for p in rm.parameters() if p.grad is not None])


big = gradients([torch.arange(B)])
accumulated = gradients(torch.arange(B).chunk(k))
unscaled = accumulated * k  # what forgetting the 1/k gives
diff = (big - accumulated).abs().max().item()
print(f"{big.numel()} gradient entries, largest |g| {big.abs().max():.3e}")
print(f"max |big batch - {k} accumulated micro-batches| = {diff:.1e}")
print(
    f"without the 1/{k}: |gradient| / |big batch's| = {(unscaled.norm() / big.norm()).item():.2f}"
)
assert diff < 1e-6 * max(1.0, big.abs().max().item())  # equal up to float32 rounding
assert torch.allclose(unscaled.norm(), k * big.norm(), rtol=1e-5)

# %% [markdown]
# The two agree to float32 rounding (the sums are done in another order), not bit for bit.
# That matters less than it seems, except with Adam at a large learning rate:
#
# ### Why Adam magnifies rounding at a large learning rate
#
# SGD's step is `lr * g`: a rounding difference of 1e-8 in g moves the weights by
# `lr * 1e-8`. Adam's step is `lr * m / (sqrt(v) + eps)`, about `lr * sign(g)` in its first
# steps, whatever the size of g. Where a gradient entry is itself near 0 (a tiny
# contribution, a symmetric weight), rounding can flip its sign, and the step flips by `2 lr`.
# From then on the two runs follow different trajectories, and the difference grows with lr.

# %%
flipped = ((torch.sign(big) != torch.sign(accumulated)) & (big != 0)).sum().item()
print(f"entries whose sign differs between the two gradients: {flipped} of {big.numel()}")


def adam_gap(lr, steps=30):
    """Max weight difference after `steps` Adam steps fed the big-batch gradient versus the
    accumulated one (each recomputed on its own weights)."""
    finals = []
    for split in (1, k):
        torch.manual_seed(0)
        model = reward.RewardModel(Transformer(cfg))
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            for idx in torch.arange(B).chunk(split):
                loss, _ = model.loss(chosen[idx], masks[0][idx], rejected[idx], masks[1][idx])
                (loss / split).backward()
            opt.step()
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    return (finals[0] - finals[1]).abs().max().item()


gaps = {lr: adam_gap(lr) for lr in (1e-5, 1e-3, 1e-1)}
for lr, gap in gaps.items():
    print(f"Adam lr {lr:.0e}: max weight difference after 30 steps {gap:.1e}")
assert gaps[1e-1] > 10 * gaps[1e-5]  # the same rounding, magnified by the step size

# %% [markdown]
# So a test of "accumulation equals one big batch" compares gradients (or one SGD step), not
# weights after many Adam steps at a large learning rate; and two runs that differ only in how
# the batch was split are equal in distribution, not in their last digits.
#
# ### DDP: two processes, launched from here with torchrun
#
# DistributedDataParallel runs one copy of the model per process; each takes its slice of the
# batch, and after backward the gradients are averaged over the processes (an all-reduce), so
# every copy takes the same step. On a CPU the backend is gloo. `train_rm.py` splits each
# global batch by (seed, step) alone, so two processes with `--batch_size 8` see the same
# pairs as one process with `--batch_size 8 --grad_accum 2`, and should end with the same
# weights:
#
# ```
# python -m torch.distributed.run --standalone --nproc_per_node=2 ../train_rm.py ...
# ```

# %%
common = ["--dataset", "arith", "--model", "nano", "--lm_coef", "1", "--max_iters", "20",
          "--batch_size", "8", "--lr", "3e-3", "--warmup", "5", "--eval_interval", "20",
          "--eval_pairs", "64", "--log_interval", "10", "--device", "cpu",
          "--dtype", "float32", "--seed", "1337"]  # fmt: skip
env = dict(os.environ, OMP_NUM_THREADS="1")
ddp_dir, one_dir = os.path.join(work, "ddp"), os.path.join(work, "one")
torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
ddp = subprocess.run(torchrun + ["../train_rm.py", *common, "--out_dir", ddp_dir],
                     env=env, capture_output=True, text=True)  # fmt: skip
assert ddp.returncode == 0, ddp.stderr[-2000:]
print("torchrun:", next(line for line in ddp.stdout.splitlines() if "ranks" in line))
one = subprocess.run([sys.executable, "../train_rm.py", *common, "--grad_accum", "2",
                      "--out_dir", one_dir], env=env, capture_output=True, text=True)  # fmt: skip
assert one.returncode == 0, one.stderr[-2000:]
states = [read_checkpoint(os.path.join(d, "ckpt.pt")).record["model"] for d in (ddp_dir, one_dir)]
gap = max((states[0][n].float() - states[1][n].float()).abs().max().item() for n in states[0])
print(
    f"{len(states[0])} tensors; max |two processes - one process with --grad_accum 2| = {gap:.1e}"
)
assert gap < 1e-6

# %% [markdown]
# Equal weights: DDP is gradient accumulation across processes. Inside each process
# `train_rm.py` also accumulates (`--grad_accum`), and there `no_sync` matters: every backward
# of a DDP model all-reduces its gradients, so with k micro-steps all but the last run inside
# `with model.no_sync():`, the gradients add up locally, and the last backward averages the
# sum once: one all-reduce per step instead of k. (DDP decides when the model is *called*, so
# the forward goes inside the `with`.) The loop, from `RewardModelTrainer.fit` in `train_rm.py`:
#
# ```python
# n, metrics, tokens, computed = len(micro_batches), {}, 0, 0
# for micro, b in enumerate(micro_batches):  # the sampler's micro-batches of one step
#     b = as_batch(b).to(proc.device)
#     sync = self.no_sync() if proc.ddp and micro < n - 1 else nullcontext()
#     with sync, proc.ctx:
#         out = self.step_fn(b)
#         (out["objective"] / n).backward()
# ```
#
# That loop is ColossalChat's `RewardModelTrainer`, which `python train_rm.py` builds from its
# flags. It takes a model, optimizer, scheduler and loss module made in Python, and DataLoaders
# of ColossalChat's preference dicts. Here a fresh nano model learns a rule it can only see at
# the last token (every chosen response ends in token 100), from 256 pairs in batches of 8, 2
# micro-batches a step, evaluated on 64 held-out pairs after each epoch.

# %%
torch.manual_seed(0)
pairs = torch.randint(3, 512, (320, 2, 10))  # (pair, chosen/rejected, tokens)
pairs[:, 0, -1] = 100
ones = torch.ones(8, 10, dtype=torch.long)


def collate(rows):
    rows = torch.stack(rows)
    return dict(
        chosen_input_ids=rows[:, 0],
        chosen_attention_mask=ones[: len(rows)],
        reject_input_ids=rows[:, 1],
        reject_attention_mask=ones[: len(rows)],
    )


train_dl, eval_dl = (DataLoader(p, batch_size=8, collate_fn=collate) for p in pairs.split(256))
model = RewardModel(config=ModelConfig(**MODELS["nano"], vocab_size=512, max_seq_len=64))
optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=32, eta_min=3e-4)
trainer = RewardModelTrainer(
    model,
    optimizer=optim,
    lr_scheduler=lr_scheduler,
    loss_fn=LogSigLoss(),
    max_epochs=2,
    accumulation_steps=2,
    log_interval=8,
)
final = trainer.fit(train_preference_dataloader=train_dl, eval_preference_dataloader=eval_dl)
print(
    f"{trainer.step} optimizer steps, scheduler at {lr_scheduler.last_epoch}; "
    f"held-out accuracy {final['acc']:.3f}"
)
assert trainer.step == lr_scheduler.last_epoch == 32  # the scheduler steps once per step
assert final["acc"] > 0.9  # the rule at the last token, learned

# %% [markdown]
#
# ### FSDP: what it shards, and when to use it
#
# DDP keeps a whole copy of everything on every GPU. With fp32 weights and AdamW that is 16
# bytes a parameter: 4 for the weight, 4 for its gradient, 8 for Adam's two moments (plus the
# activations). FSDP (`train_rm.py --fsdp`, `nanorm/fsdp.py`) shards all three over the N
# processes: each keeps 1/N of the weights, gradients and Adam state, gathers a layer's full
# weights just before using it, and reduce-scatters the gradients so each rank gets its shard.
# The price is more communication (an all-gather per layer, twice a step). Use it when the 16
# bytes a parameter do not fit one GPU; otherwise DDP is simpler and faster.

# %%
GiB = 2**30
for name, n_params in [("SmolLM2-135M", 135e6), ("SmolLM2-1.7B", 1.7e9), ("Llama-2-7B", 6.7e9)]:
    ddp_gib = 16 * n_params / GiB
    fsdp = ", ".join(f"FSDP/{n} {ddp_gib / n:5.1f}" for n in (2, 8))
    print(
        f"{name:>13}: DDP {ddp_gib:6.1f} GiB per GPU; {fsdp} (weights, grads, AdamW; no activations)"
    )
assert (
    16 * 6.7e9 / GiB > 80 > 16 * 6.7e9 / 8 / GiB
)  # 7B: DDP does not fit an 80 GB GPU, FSDP/8 does

# %% [markdown]
# ## 3. The LM-regularized reward model
#
# `reward.LMRegularizedRewardModel` (after LLMBook) adds a language-modelling term to the
# pairwise loss: `loss = pairwise + lm_coef * CE(chosen response)`. The LM term keeps the
# backbone a language model, and, for a model trained from scratch, it is a dense signal
# (every response token) next to the one bit per pair of the ranking loss. Two runs on the
# same pairs with the settings of notebook 02 (150 steps of 32 pairs), only `--lm_coef`
# differs, one cell each:

# %%
runs = {}
backend = plt.get_backend()


def lm_run(coef):
    """Notebook 02's run with --lm_coef coef; prints its last line, returns its log.jsonl rows."""
    out_dir = os.path.join(work, f"lm{coef}")
    args = ["--dataset", "arith", "--out_dir", out_dir, "--model", "nano", "--lm_coef", coef,
            "--max_iters", "150", "--batch_size", "32", "--lr", "3e-3", "--min_lr", "3e-4",
            "--warmup", "10", "--eval_interval", "50", "--eval_pairs", "300",
            "--log_interval", "25", "--seed", "1337", "--device", "cpu", "--dtype", "float32"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # its log: in log.jsonl
        train_rm.main(args)
    plt.switch_backend(backend)  # train_rm set matplotlib to Agg to write its PNGs; undo that
    print(f"lm_coef {coef}:", printed.getvalue().strip().splitlines()[-1].split(": ", 1)[1])
    return [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]


runs["0"] = lm_run("0")

# %%
runs["1"] = lm_run("1")
evals = {c: [r for r in rows if r["split"] == "eval"] for c, rows in runs.items()}
for c, ev in evals.items():
    print(f"lm_coef {c}: held-out (step, accuracy, pairwise loss)",
          [(r["step"], round(r["acc"], 3), round(r["loss"], 3)) for r in ev])
assert evals["1"][-1]["loss"] < evals["0"][-1]["loss"]  # the LM term helps from scratch

# %%
fig, ax = plt.subplots(1, 2, figsize=(10, 3))
for c, ev in evals.items():
    ax[0].plot([r["step"] for r in ev], [r["acc"] for r in ev], "o-", label=f"lm_coef {c}")
    tr = [r for r in runs[c] if r["split"] == "train"]
    ax[1].plot([r["step"] for r in tr], [r["loss"] for r in tr], "-", label=f"lm_coef {c}")
ax[0].axhline(0.5, color="gray", ls=":", label="chance")
ax[0].set(title="held-out accuracy (same pairs, same seed)", xlabel="step", ylim=(0.4, 1))
ax[1].set(title="pairwise loss, mean over each log interval", xlabel="step")
for a in ax:
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# ### The response-only, shifted LM term
#
# The LM term is the next-token cross-entropy of the **chosen response**: the state at
# position t predicts the token at t + 1, only where that token is a response token (the
# prompt is given, not generated; padding is nothing), averaged over each response's tokens
# and then over the pairs, so every pair weighs the same, as in the pairwise term. Checked
# here against a direct computation:

# %%
torch.manual_seed(1)
lm = reward.LMRegularizedRewardModel(Transformer(cfg))
ids = torch.randint(64, (3, 10))
response = torch.zeros(3, 10, dtype=torch.long)
response[0, 4:9], response[1, 2:10], response[2, 6:8] = 1, 1, 1  # prompt, response, padding
h = lm.backbone.hidden_states(ids, torch.ones_like(ids))
term = lm.response_lm_loss(h, ids, response)
logits = lm.backbone.output(h)
by_hand = torch.stack([
    F.cross_entropy(logits[b, :-1][response[b, 1:] == 1], ids[b, 1:][response[b, 1:] == 1])
    for b in range(3)
]).mean()  # fmt: skip
no_shift = F.cross_entropy(logits[response == 1], ids[response == 1])
print(f"response_lm_loss {term:.4f}; by hand {by_hand:.4f}; without the shift {no_shift:.4f}")
assert torch.allclose(term, by_hand, atol=1e-5)

# %% [markdown]
# Without the shift the term asks each position to output its own input token. On random
# tokens, where nothing can be predicted, 60 steps of the LM term alone: the shifted term stays
# at log 64 = 4.16 (the right answer: the next token is random), the unshifted one learns to
# copy and falls towards 0. It teaches nothing about language.


# %%
def lm_alone(shift, steps=60):
    torch.manual_seed(2)
    model = reward.LMRegularizedRewardModel(Transformer(cfg))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        x = torch.randint(64, (16, 12))
        logits = model.backbone.output(model.backbone.hidden_states(x, torch.ones_like(x)))
        loss = F.cross_entropy(logits[:, : 12 - shift].flatten(0, 1), x[:, shift:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


shifted, copying = lm_alone(1), lm_alone(0)
print(f"after 60 steps on random tokens: shifted {shifted:.2f}, without the shift {copying:.2f}")
assert shifted > 3.5 and copying < 0.5

# %% [markdown]
# ### LLMBook's three bugs (exercise 7)
#
# The published code of this model has three bugs, corrected in `reward.py` (its
# `LMRegularizedRewardModel` docstring explains each):
#
# 1. **No pooling**: `reward_head(last_hidden_state).squeeze(-1)` is one score per *position*,
#    and `reward0 - reward1` compares token t of one answer with token t of the other.
# 2. **Label 0**: all its labels are 0, and `BCE(r1 - r2, 0) = -log sigmoid(r2 - r1)`
#    trains the *rejected* answer to win.
# 3. **No shift**: `CrossEntropy(logits[:, t], ids[:, t])` asks each position to copy its own
#    input token, which a transformer learns at once and which teaches nothing.
#
# Bug 2 in one line: the gradient of the label-0 loss pushes the chosen reward *down*.

# %%
r_c, r_r = torch.tensor([0.5], requires_grad=True), torch.tensor([0.0], requires_grad=True)
F.binary_cross_entropy_with_logits(r_c - r_r, torch.zeros(1)).backward()
print(f"label 0: d loss / d r_chosen = {r_c.grad.item():+.3f} (gradient descent lowers r_chosen)")
assert r_c.grad.item() > 0
# %% [markdown]
# `exercises/ex7_lm_loss.py` hands you the published loss, runnable on a batch, and asks for the
# corrected one; `python notebooks/exercises/check.py ex7` names each bug as you meet it.
# `exercises/ex8_grad_accum.py` is the accumulation loop with `no_sync`.

# %% [markdown]
# ## 4. The reward model in use: best-of-N, and over-optimization
#
# The simplest way to use a reward model is **best-of-N** (rejection sampling): sample N answers
# from the policy, keep the one the reward model scores highest. No gradient step, yet it is a
# real optimization of the policy against the reward: Gao et al. (2022, "Scaling Laws for
# Reward Model Overoptimization") use it beside PPO, with a closed form for how far the
# best-of-N policy moves from the base one, KL = log N - (N - 1) / N nats.
#
# Their finding: a **proxy** reward model, trained on a finite set of preferences, is only
# correlated with what we want (the **gold** reward). Optimize the proxy harder and its score
# keeps rising while the gold reward rises, peaks and falls: Goodhart's law, measured. Here the
# gold reward is one we can check, `verifiable.gsm8k_reward` (is the final answer right?), the
# policy is SmolLM2-135M-Instruct answering GSM8K questions, and the proxy is a reward model
# trained on HH-RLHF preferences (bench/recipes/hh_smollm2.sh), a general "which answer do
# people prefer" model that was never shown a math answer checked.
#
# `bench/best_of_n.py` sampled K = 16 answers to each of 40 questions and stored both rewards
# of each (`bench/best_of_n.json`; about 20 minutes on a 2-core CPU). From K samples we get
# best-of-N for every N <= K without sampling again: sort a question's answers by proxy score;
# the answer at rank j (1 = lowest) is the best of a random N-subset with probability
# C(j-1, N-1) / C(K, N). The cell checks that formula against all subsets of a small example.

# %%


def best_of_n(proxy, value, n):
    """E[value of the proxy's favourite among n answers drawn without replacement from these
    K], exactly: sum over ranks j of C(j-1, n-1) / C(K, n) * value at rank j."""
    order = sorted(range(len(proxy)), key=lambda i: proxy[i])
    K = len(proxy)
    return sum(comb(j, n - 1) / comb(K, n) * value[i] for j, i in enumerate(order))


def pass_at_n(gold, n):
    """P(at least one of n answers drawn from these K is right): the oracle's best-of-N."""
    K, right = len(gold), int(sum(gold))
    return 1 - comb(K - right, n) / comb(K, n)


g = torch.Generator().manual_seed(0)
proxy6, gold6 = torch.randn(6, generator=g).tolist(), [0, 1, 0, 1, 1, 0]
for n in (1, 2, 3, 6):
    subsets = list(combinations(range(6), n))
    brute = sum(gold6[max(s, key=lambda i: proxy6[i])] for s in subsets) / len(subsets)
    oracle = sum(max(gold6[i] for i in s) for s in subsets) / len(subsets)
    assert abs(best_of_n(proxy6, gold6, n) - brute) < 1e-12
    assert abs(pass_at_n(gold6, n) - oracle) < 1e-12
print("best_of_n and pass_at_n equal the average over every subset")

# %%
with open(os.path.join("..", "bench", "best_of_n.json")) as f:
    bon = json.load(f)
qs, K = bon["questions"], bon["info"]["k"]
Ns = [n for n in (1, 2, 4, 8, 16, 32) if n <= K]
mean = lambda xs: sum(xs) / len(xs)
curve = {
    "gold, proxy's pick": [mean([best_of_n(q["proxy"], q["gold"], n) for q in qs]) for n in Ns],
    "gold, oracle's pick": [mean([pass_at_n(q["gold"], n) for q in qs]) for n in Ns],
    "proxy, proxy's pick": [mean([best_of_n(q["proxy"], q["proxy"], n) for q in qs]) for n in Ns],
    "tokens, proxy's pick": [mean([best_of_n(q["proxy"], q["tokens"], n) for q in qs]) for n in Ns],
}
kl = [log(n) - (n - 1) / n for n in Ns]
info = bon["info"]
print(
    f"{len(qs)} GSM8K questions x {K} answers (temperature {info['temperature']}); "
    f"{int(sum(sum(q['gold']) for q in qs))} of {len(qs) * K} answers right"
)
print(f"{'N':>3s} {'KL':>5s} " + " ".join(f"{k:>21s}" for k in curve))
for i, n in enumerate(Ns):
    print(f"{n:3d} {kl[i]:5.2f} " + " ".join(f"{curve[k][i]:21.3f}" for k in curve))
# the proxy's score of its own pick can only rise with N: the max of more draws
rising = curve["proxy, proxy's pick"]
assert all(a <= b + 1e-9 for a, b in zip(rising, rising[1:], strict=False))
# no reward model beats the oracle, and at N = 1 every pick is a random answer
proxy_pick, oracle = curve["gold, proxy's pick"], curve["gold, oracle's pick"]
assert all(a <= b + 1e-9 for a, b in zip(proxy_pick, oracle, strict=True))
assert abs(curve["gold, proxy's pick"][0] - curve["gold, oracle's pick"][0]) < 1e-9
# what the prose below reads off this run: the proxy's pick is never better than the oracle's
# at N = 16, and the proxy's own score of it rose by more than its spread at N = 1
assert curve["gold, proxy's pick"][-1] < curve["gold, oracle's pick"][-1]
assert curve["proxy, proxy's pick"][-1] > curve["proxy, proxy's pick"][0]

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
a1.plot(Ns, curve["gold, oracle's pick"], "o-", label="oracle's pick (pass@N)")
a1.plot(Ns, curve["gold, proxy's pick"], "o-", label="proxy RM's pick")
a1.set(xscale="log", xticks=Ns, xticklabels=Ns, xlabel="N", ylabel="gold: fraction right")
a1.set_title("best-of-N, gold reward")
a1.legend()
a2.plot(kl, curve["proxy, proxy's pick"], "o-", c="C1", label="proxy reward of the pick")
a2.set(xlabel="KL(best-of-N || policy), nats", ylabel="proxy reward")
a2b = a2.twinx()
a2b.plot(kl, curve["gold, proxy's pick"], "s--", c="C2", label="gold of the pick")
a2b.set_ylabel("gold: fraction right")
a2.set_title("the proxy rises; does the gold?")
a2.legend(loc="upper left"), a2b.legend(loc="lower right")
fig.tight_layout()

# %% [markdown]
# **What this run measured.** SmolLM2-135M gets about 2% of these easy questions right (13 of 640
# answers, in 9 of the 40 questions), so the oracle's pass@16 is about 0.22: among 16 answers
# there is often a right one to pick. The proxy does not find it. Its score of its own pick rises
# with every doubling of N (4.60 at N = 1, 5.34 at N = 16), while the gold of that pick stays
# near the random 2% up to N = 4 and falls to 0 at N = 16: the proxy's favourite answer is never
# a right one. The proxy also picks shorter answers as N grows (the last column): a reward model
# trained on HH-RLHF's preferences knows style, not arithmetic.
#
# That is the shape Gao et al. describe, but read it with its error bars: 13 right answers are
# too few to place the peak, and the fall from 2.3% to 0 rests on 9 questions. What would make
# it a measurement: a policy that is right far more often (a 1-2B model, or SmolLM2 fine-tuned
# on GSM8K), a few hundred questions, N up to 256, and a proxy trained on math preferences
# (pairs of a right and a wrong answer, labelled by the verifier, `eval_rm.py --data gsm8k:...`
# makes them) whose quality can be varied by its number of training pairs. On this CPU
# sampling runs at about 28 s per question for 16 answers of up to 192 tokens, so 300 questions
# at N = 256 would take about 37 hours; on one GPU, minutes.
