# %% [markdown]
# # 08 · Beyond one score: DPO's implicit reward, process rewards, a judge, ensembles
#
# Notebooks 02 to 07 taught one kind of reward model: a LLaMA with a scalar head, trained on
# preference pairs with the Bradley-Terry loss, read at the last token. The field uses four more
# ideas, each a short piece of [`reward.py`](../reward.py) beside the pairwise head:
#
# 1. **DPO's implicit reward** (`ImplicitReward`, `dpo_loss`): every policy trained with DPO
#    is a reward model, r(x, y) = beta * (log pi(y|x) - log pi_ref(y|x)).
# 2. **A process reward model** (`ProcessRewardModel`, `solution_reward`): a reward at the end
#    of every reasoning step, not only the answer's.
# 3. **A generative judge** (`GenerativeJudge`): the LM asked "Is the answer correct?", its
#    reward the probability of "Yes".
# 4. **Ensembles** (`RewardEnsemble`, `conservative_reward`): K reward models scored as one,
#    conservatively, against over-optimization.
#
# Each section shows the piece on small inputs, then ends with the measured figure of its
# experiment in `bench/` (`bench/dpo`, `bench/prm`, `bench/judge`, `bench/ensemble`): each
# runs from a fresh clone with one command, three seeds, within 10 minutes on a 2-core CPU, and
# the cells here read the results those runs stored. **Predict, then run**: each question's
# answer is the same on every seed of the stored runs.
#
# **The printed outputs** stored with this notebook are one machine's run: a 2-core AMD EPYC
# without AVX-512 (PyTorch's AVX2 kernels). The live cells' digits differ on another CPU; the
# claims the text makes hold, and `tests/test_notebooks.py` checks each of them on a fresh run.

# %%
import importlib.util
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the project root

import matplotlib.pyplot as plt
import torch

import reward
from model import ModelConfig, Transformer

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.set_num_threads(1)  # small models: threads gain nothing; kind to a shared CPU
BENCH = os.path.join("..", "bench")


def bench_module(name):
    """bench/<name>/report.py, imported: its load() reads what that experiment stored."""
    path = os.path.join(BENCH, name, "report.py")
    spec = importlib.util.spec_from_file_location(f"bench_{name}_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# %% [markdown]
# ## 1. DPO's implicit reward
#
# DPO trains a policy on preference pairs with no reward model in between. Its loss is the
# Bradley-Terry loss of a reward model whose reward is the policy's log-ratio to the frozen
# reference it started from, r(x, y) = beta * (log pi(y|x) - log pi_ref(y|x)) (exercise 11).
# Read backwards: a DPO policy *is* a reward model, and RewardBench scores DPO models that way,
# by the sum of the log-ratio over the response, its mean per token, or the policy's
# log-probability alone (reference-free).
#
# **Predict:** at DPO's first step the policy is a copy of the reference. What is every
# implicit reward, and what is the loss?

# %%
torch.manual_seed(0)
cfg = ModelConfig(dim=64, n_layers=2, n_heads=4, vocab_size=32, max_seq_len=32)
policy = Transformer(cfg)
reference = Transformer(cfg)
reference.load_state_dict(policy.state_dict())  # DPO starts from the reference itself
implicit = reward.ImplicitReward(policy, reference, beta=0.1)
tokens = torch.randint(3, 32, (4, 10))  # 2 pairs: rows 0-1 chosen, rows 2-3 rejected
mask = torch.ones_like(tokens)
response = torch.zeros_like(tokens)
response[:, 6:] = 1  # the last 4 tokens are the response
r = implicit(tokens, mask, response)
loss, _ = implicit.loss(tokens[:2], mask[:2], tokens[2:], mask[2:], response[:2], response[2:])
print("implicit rewards at the start:", r.tolist())
print(f"DPO loss at the start: {loss.item():.4f} (log 2 = {torch.log(torch.tensor(2.0)).item():.4f})")

# %% [markdown]
# Every reward is 0 and the loss is log 2: the policy and the reference agree on everything.
# DPO moves the policy so that chosen responses become more likely *than under the reference*,
# and rejected ones less.
#
# The experiment ([`bench/dpo`](../bench/dpo/README.md), `bash bench/dpo/run.sh`, about 8
# minutes): the SFT policy of notebook 07 trained by DPO on 5,000 arithmetic pairs for 150
# steps, against two explicit reward models trained by `train_rm.py` on the same pairs, for the
# same steps, from the same weights; all scored on 1,000 held-out pairs in distribution, on
# numbers up to 99 (training stops at 9) and on multiplication (never seen).
#
# **Predict:** in distribution, does the implicit reward (sum) rank the held-out pairs better
# than the explicit reward model trained without the LM term? And on numbers up to 99, does
# any of them beat chance by much?

# %%
dpo = bench_module("dpo")
rows = dpo.load()
acc = {(r["model"], r["scoring"], r["set"], r["seed"]): r["acc"] for r in rows}
seeds = sorted({r["seed"] for r in rows if r["seed"] is not None})
for seed in seeds:
    line = " | ".join(
        f"{name} {acc[(m, s, 'in_dist', seed)]:.3f} / {acc[(m, s, 'long', seed)]:.3f}"
        for (m, s), name in (
            (("dpo", "sum"), "DPO sum"),
            (("rm", ""), "RM"),
            (("rm_lm", ""), "RM + LM"),
        )
    )
    print(f"seed {seed} (in distribution / up to 99): {line}")

sets = list(dpo.SETS)
fig, ax = plt.subplots(figsize=(8, 3))
for i, ((m, s), name) in enumerate(dpo.MODELS.items()):
    if m == "sft":
        continue
    means = [sum(acc[(m, s, k, seed)] for seed in seeds) / len(seeds) for k in sets]
    ax.bar([j + 0.17 * i for j in range(len(sets))], means, width=0.17, label=name)
ax.axhline(0.5, color="gray", lw=0.8, ls="--")
ax.set_xticks([j + 0.34 for j in range(len(sets))], [dpo.SETS[k] for k in sets])
ax.set_ylabel("held-out accuracy (mean of 3 seeds)")
ax.legend(fontsize=7, loc="upper right")
plt.show()

# %% [markdown]
# In distribution, at this small budget, the implicit reward ranks better than either explicit
# reward model on every seed: the reward models' heads start from nothing, while the implicit
# reward starts from the SFT policy, which already knows most right answers. Away from the
# training distribution every model is near chance on numbers up to 99: none of them learned
# arithmetic it was never shown. (Lin et al. 2024 find DPO's implicit reward a few points
# *worse* than an explicit reward model out of distribution at scale; here both fail there.)
# %% [markdown]
# ## 2. A process reward model
#
# An outcome reward model scores a whole solution. A **process reward model** (PRM) scores each
# reasoning step (Lightman et al. 2023): `reward.ProcessRewardModel` reads the same head at the
# last token of every step, and its sigmoid is the probability that the solution is still on
# track there. Human step labels are expensive (PRM800K); **Math-Shepherd** (Wang et al. 2023)
# makes them automatically: from each step's prefix, let the policy complete the solution N
# times; the step is labelled right if any completion reaches the right answer (hard label), or
# by the share that do (soft).
#
# [`nanorm/prm.py`](../nanorm/prm.py) builds a world where every step can also be checked
# exactly: chains of 2 to 5 additions and subtractions, answered one operation per sentence,
# the answer sentence the last step.
#
# **Predict:** a solution slips at its second step and then computes correctly from the wrong
# value. Which steps does the exact labeller mark on track? And which of two solutions does
# best-of-N keep by the weakest step (`min`), which by the product?

# %%
from nanorm import prm as prm_mod

q = ((5, 3, 2, 7), ("+", "-", "+"))
right = prm_mod.solution_text(q)
slipped = " 5 + 3 = 8. 8 - 2 = 5. 5 + 7 = 12. The answer is 12."
print(f"question {prm_mod.prompt_text(q)!r}")
for name, text in (("right", right), ("slipped", slipped)):
    steps = [s.strip() + "." for s in text.strip().split(".") if s.strip()]
    print(f"{name:>8}: {steps} -> exact labels {prm_mod.exact_labels(q, steps)}")
p = torch.tensor([[0.9, 0.9, 0.9, 0.9, 0.0], [0.99, 0.99, 0.7, 1.0, 0.0]])  # 4 steps each
steps = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]])
print("solution rewards, min:", [round(x, 3) for x in reward.solution_reward(p, steps, "min").tolist()],
      "product:", [round(x, 3) for x in reward.solution_reward(p, steps, "prod").tolist()])

# %% [markdown]
# Every step after the slip is off track, though its own arithmetic is right: the chain can no
# longer reach the answer, which is what a Math-Shepherd label estimates. The two ways of
# combining steps disagree here: the minimum keeps the first solution (its weakest step, 0.9,
# beats 0.7), the product the second (0.686 against 0.656): three near-certain steps and one
# doubtful one, against four steady ones. Exercise 12 is best-of-N by these rules.
#
# The experiment ([`bench/prm`](../bench/prm/README.md), `bash bench/prm/run.sh`, about 9
# minutes): the policy SFT'd on right chains, its sampled solutions to 256 training questions
# labelled the Math-Shepherd way (8 completions per step), a PRM trained on those labels and an
# ORM on each solution's outcome, the same solutions, steps and starting weights; then 128
# held-out questions, 64 solutions each, best-of-N selected by each against the verifier.
#
# **Predict:** how often do the Math-Shepherd labels agree with the exact ones? As N grows from
# 1 to 64, does the PRM's pick get more answers right, and does it beat a plain majority vote
# over the final answers?

# %%
pb = bench_module("prm")
rows = pb.load()
pseeds = sorted({r["seed"] for r in rows})
one = {(r["measure"], r["seed"]): r for r in rows if r["measure"] != "best_of_n"}
bon = {(r["n"], r["seed"]): r for r in rows if r["measure"] == "best_of_n"}
ns = sorted({n for n, _ in bon})
for s in pseeds:
    lab, acc = one["labels", s], one["step_accuracy", s]
    b = bon[ns[-1], s]
    print(f"seed {s}: Math-Shepherd (hard) = exact on {lab['hard_agrees']:.3f} of steps; held-out step "
          f"accuracy PRM {acc['prm']:.3f}, base rate {acc['always_on_track']:.3f}; best-of-{ns[-1]}: "
          f"PRM min {b['prm_min']:.3f}, PRM product {b['prm_prod']:.3f}, ORM {b['orm']:.3f}, "
          f"majority {b['majority']:.3f}, N=1 {b['random']:.3f}, pass@N {b['pass_at_n']:.3f}")

fig, ax = plt.subplots(figsize=(7, 3.6))
for j, (key, name) in enumerate(pb.SELECTORS.items()):
    mean = [sum(bon[n, s][key] for s in pseeds) / len(pseeds) for n in ns]
    ax.plot(ns, mean, marker="o", color=f"C{j}", label=name, ls="--" if key in ("random", "pass_at_n") else "-")
ax.set_xscale("log", base=2)
ax.set_xlabel("N (solutions to choose from)")
ax.set_ylabel("accuracy of the chosen solution (mean of seeds)")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# What every seed shows (the tables, with commands and times, are in `bench/prm/README.md`):
#
# - The Math-Shepherd labels agree with the exact ones on most steps; their error is one-sided:
#   an off-track step is sometimes called right, when a completion stumbles onto the answer.
# - The PRM learns a little (its step accuracy is above the base rate), but best-of-N by the PRM
#   and by the ORM gets **worse** as N grows, while a plain **majority vote** over the final
#   answers gets better. Neither reward model checks the arithmetic; both favour short chains,
#   including ones that stop early or skip an operation, and the more candidates there are,
#   the surer the pick is one of those: over-optimization of a weak verifier by selection
#   alone. The PRM (min) stays ahead of the ORM at N = 64.
# - So this world does **not** reproduce Lightman et al.'s ordering (PRM > ORM > majority on
#   MATH). Their reward models are large LMs trained on 800,000 step labels; ours is a
#   238k-parameter model with about a thousand. `bench/prm/README.md` lists what was tried to
#   turn the curves up (more solutions, more steps, lower learning rates): none did.
# %% [markdown]
# ## 3. A generative judge
#
# A reward model needs a new head trained from nothing. A **generative judge** (Zhang et al.
# 2024) uses the LM as it is: the row ends with a question, "Is the answer correct?", and the
# reward is the probability the LM gives "Yes" next, read from its own LM head
# (`reward.GenerativeJudge`). The built-in tokenizer has no "Yes" piece: it writes " Yes" as '▁'
# 'Y' 'e' 's', so the row ends with '▁' and the judge reads 'Y' against 'N'
# ([`nanorm/judge.py`](../nanorm/judge.py) finds the ids in the tokenizer). A second judge is
# shown two answers together, "Answer A: ... Answer B: ... Which is correct?", and read as
# p('A') against p('B'): asked twice with the answers swapped, a fair judge picks the same
# *answer* both times.
#
# The SFT policy of notebook 07 (200 steps here, about half a minute, kept in a temporary
# folder) as both judges, before any fine-tuning, on one held-out pair.
#
# **Predict:** the policy was taught to answer arithmetic, never to judge. How much probability
# does it give 'Y' after the question?

# %%
import tempfile

from nanorm import judge as judges
from nanorm import rl
from nanorm.dpo import policy_config

work = tempfile.mkdtemp(prefix="nanorm_08_")
args = rl.parse_args(["--out_dir", work, "--sft_steps", "200"])
data_dir, train, val, meta, tok = rl.arith()  # data/arith/, made on first use
policy = rl.sft_policy(train, meta, policy_config(meta), args).eval()
text = judges.JudgeText.from_tokenizer(tok, meta["end_id"])
prompt, right, wrong = val[0]
yes_no = judges.make_judge(policy, text, "yes_no")
for name, answer in (("right", right), ("wrong", wrong)):
    row = text.yes_no_row(prompt, answer)
    p = yes_no(torch.tensor([row])).item()
    print(f"{name}: {tok.decode(row)!r} + '▁' -> p('Y') = {p:.2e}")
a_b = judges.make_judge(policy, text, "a_b")
for order, (first, second) in (("right first", (right, wrong)), ("right second", (wrong, right))):
    row = text.a_b_row(prompt, first, second)
    logits = a_b.next_logits(torch.tensor([row]))[0]
    print(f"A/B, {order}: picks {'A' if logits[text.a] > logits[text.b] else 'B'}")

# %% [markdown]
# Almost none: an LM judges only as well as it was taught to, and a 0.2M-parameter model taught
# to answer has no notion of "Yes". Fine-tuning teaches it: the next-token loss at that one
# position, 'Y' for a right answer and 'N' for a wrong one (`GenerativeJudge.loss`).
#
# The experiment ([`bench/judge`](../bench/judge/README.md), `bash bench/judge/run.sh`, about
# 5 minutes): both judges fine-tuned on bench/dpo's 5,000 pairs for the same 150 steps, from
# the same weights, as the pairwise reward model of section 1; the A/B judge with the right
# answer's position a coin; every judge then asked every held-out pair in both orders.
#
# **Predict:** after the same 150 steps, does the Yes/No judge rank held-out pairs better or
# worse than the pairwise head? The A/B judge was trained with the right answer first half the
# time: after training, how often does it pick A?

# %%
jb = bench_module("judge")
v = {}
for r in jb.load():
    v[(r["model"], r["metric"], r["set"], r["seed"])] = r["value"]
jseeds = sorted({k[3] for k in v if k[3] is not None})
for seed in jseeds:
    print(f"seed {seed}, in distribution: pairwise RM {v[('rm', 'acc', 'in_dist', seed)]:.3f}, "
          f"Yes/No judge {v[('yes_no_tuned', 'acc', 'in_dist', seed)]:.3f}; A/B judge picks A in "
          f"{v[('a_b_tuned', 'first_rate', 'in_dist', seed)]:.3f} of judgments "
          f"(zero-shot {v[('a_b_zero', 'first_rate', 'in_dist', None)]:.3f})")

fig, ax = plt.subplots(1, 2, figsize=(11, 3))
bars = [("pairwise RM", "rm"), ("Yes/No judge", "yes_no_tuned"), ("A/B judge", "a_b_tuned")]
for i, (name, m) in enumerate(bars):
    means = [sum(v[(m, "acc", s, seed)] for seed in jseeds) / len(jseeds) for s in jb.SETS]
    ax[0].bar([j + 0.27 * i for j in range(3)], means, width=0.27, label=name)
ax[0].axhline(0.5, color="gray", lw=0.8, ls="--")
ax[0].set_xticks([j + 0.27 for j in range(3)], list(jb.SETS.values()))
ax[0].set_ylabel("held-out pairwise accuracy")
ax[0].legend(fontsize=7)
rates = [v[("a_b_zero", "first_rate", s, None)] for s in jb.SETS]
tuned = [sum(v[("a_b_tuned", "first_rate", s, seed)] for seed in jseeds) / len(jseeds) for s in jb.SETS]
ax[1].bar([j for j in range(3)], rates, width=0.4, label="zero-shot")
ax[1].bar([j + 0.4 for j in range(3)], tuned, width=0.4, label="fine-tuned")
ax[1].axhline(0.5, color="gray", lw=0.8, ls="--")
ax[1].set_xticks([j + 0.2 for j in range(3)], list(jb.SETS.values()))
ax[1].set_ylabel("A/B judge: share of picks that are A")
ax[1].legend(fontsize=7)
plt.show()

# %% [markdown]
# At this budget the judge is the weaker reward model on every seed: the pairwise head ranks
# the held-out pairs better than the Yes/No judge. Most of the judge's steps go on learning to
# say 'Y' or 'N' at all (its loss starts near 13 nats). The A/B judge shows **position bias**
# at its worst: zero-shot it already prefers the first answer, and fine-tuned it picks A almost
# every time, in both orders, so its accuracy is one half. It learned the answer format, not
# the arithmetic. Large judges show the same bias in a milder form; asking in both orders, and
# counting only consistent verdicts, is the standard check.
# %% [markdown]
# ## 4. Ensembles against over-optimization
#
# Optimized against one reward model, a policy finds where that model is wrong and climbs
# there: the learned reward rises while the gold falls (notebook 07, Gao et al. 2022). K reward
# models trained apart, each on its own pairs with its own seed, rarely share a flaw. Coste et
# al. (2023) optimize a conservative combination of them (`reward.conservative_reward`,
# exercise 13): their **mean**, their **minimum** (the worst case), or **mean - lam * std** (a
# response the members disagree on is trusted less). `RewardEnsemble` first standardises each
# member (mean 0, std 1 on the SFT policy's answers): members trained apart give rewards on
# different scales.
#
# **Predict:** three reward models score four answers; the third model was fooled by answer 3.
# Which answer does each rule rank first?

# %%
r = torch.tensor([[0.0, 1.0, 0.5, -0.5],   # model 1
                  [0.2, 1.2, 0.4, -0.3],   # model 2
                  [0.1, 0.9, 0.6, 4.0]])   # model 3: answer 3 found its flaw
for rule in reward.ENSEMBLE_RULES:
    c = reward.conservative_reward(r, rule, lam=1.0)
    print(f"{rule:>15}: {[round(x, 2) for x in c.tolist()]} -> answer {int(c.argmax())} first")
print(f"{'model 3 alone':>15}: answer {int(r[2].argmax())} first")

# %% [markdown]
# Model 3 alone ranks the exploit first. The mean dilutes it (here it still wins: 4.0 is a large
# error), the minimum ignores it, and mean - std charges it for the disagreement.
#
# The experiment ([`bench/ensemble`](../bench/ensemble/README.md), `bash
# bench/ensemble/run.sh`, about 10 minutes): five proxies, each `train_rm.py` on its own 1,000
# arithmetic pairs for 300 steps (held-out accuracy 0.65-0.78), optimized two ways with the
# verifier as the gold: **best-of-N** from the SFT policy (N = 1 to 64, 100 questions, 64
# answers each; KL = log N - (N - 1)/N), and **PPO** (`nanorm/rl.py --members 5 --rule ...`,
# 50 steps of 64 answers), each against member 0 alone (K = 1) and against the five under each
# rule, three seeds. Gao's forms are fitted to the gold's gain against d = sqrt(KL):
# best-of-N d (alpha - beta d), RL d (alpha - beta log d).
#
# **Predict:** best-of-64 by one proxy: is the gold above or below best-of-1's? By the
# ensemble? Under PPO, which rule keeps the most gold at the end, and is its advantage only
# that it moved less far from the reference?

# %%
eb = bench_module("ensemble")
bon, ppo = eb.load_bon(), eb.load_ppo()
for seed in sorted(bon):
    res = bon[seed]
    g = {name: res["gold"][name] for name in eb.BON}
    print(f"best-of-N seed {seed}: N=1 {g['one'][0]:.3f}; N=64 one member {g['one'][-1]:.3f}, "
          + ", ".join(f"{name} {g[name][-1]:.3f}" for name in eb.BON[1:]))
S = {s: {seed: eb.summary(rows) for seed, rows in runs.items()} for s, runs in ppo.items()}
for seed in sorted(S["k1"]):
    k1 = S["k1"][seed]
    line = ", ".join(
        f"{s[3:]} fall {S[s][seed]['fall']:.3f} end {S[s][seed]['end']:.3f} at sqrt(KL) "
        f"{S[s][seed]['end_d']:.2f} (K=1 there {eb.gold_at(k1['curve'], S[s][seed]['end_d']):.3f})"
        for s in eb.PPO[1:]
    )
    print(f"PPO seed {seed}: K=1 fall {k1['fall']:.3f} end {k1['end']:.3f} at sqrt(KL) {k1['end_d']:.2f}; {line}")
fits = {name: [eb.bon_summary(bon[seed], name) for seed in sorted(bon)] for name in eb.BON}
for name, f in fits.items():
    print(f"Gao best-of-N fit, {name}: alpha {sum(x['alpha'] for x in f) / len(f):.3f}, "
          f"beta {sum(x['beta'] for x in f) / len(f):.3f}, RMSE {max(x['rmse'] for x in f):.4f}")

fig, ax = plt.subplots(1, 2, figsize=(12, 3.6))
d = [k ** 0.5 for k in bon[0]["kl"]]
for j, name in enumerate(eb.BON[:4]):
    mean = [sum(bon[s]["gold"][name][i] for s in bon) / len(bon) for i in range(len(d))]
    ax[0].plot(d, mean, color=f"C{j}", label=name if name != "one" else "one member")
    a, b = (sum(x[k] for x in fits[name]) / len(fits[name]) for k in ("alpha", "beta"))
    ax[0].plot(d, [mean[0] + x * (a - b * x) for x in d], color=f"C{j}", ls=":", lw=0.8)
ax[0].set_xlabel("sqrt(KL), best-of-N (dotted: Gao's fit)")
ax[0].set_ylabel("gold (verifier accuracy)")
ax[0].legend(fontsize=7)
for j, s in enumerate(eb.PPO):
    for seed, f in S[s].items():
        ax[1].plot(*f["curve"], color=f"C{j}", lw=0.8, label=s if seed == 0 else None)
ax[1].set_xlabel("sqrt(KL), PPO (5-step averages)")
ax[1].set_ylabel("gold")
ax[1].legend(fontsize=7)
plt.show()

# %% [markdown]
# What every seed shows (the tables, with commands and times, are in `bench/ensemble/README.md`):
#
# - **Best-of-N over-optimizes one proxy**: by member 0, the gold of best-of-64 ends far below
#   best-of-1's. Each ensemble rule ends higher and falls less from its peak, yet still below
#   best-of-1: five 1,000-pair proxies share much of their blind spot. Gao's best-of-N form fits
#   every curve closely.
# - **Under PPO every rule falls less than one proxy**, and ends with more gold, but every
#   ensemble run also ends closer to the reference (a smaller KL). Read at the same KL, only
#   the **mean** keeps more gold than one proxy on every seed; the minimum keeps less there: its
#   smaller fall is bought by moving less, not by a better reward. (The members here are weak,
#   300 steps; with PPO's 50 steps the gold falls from the start, so Gao's RL form fits a fall,
#   with alpha < 0, not a rise and fall.)
