# %% [markdown]
# # 03 · Verifiable rewards
#
# When the answer can be checked, a reward needs no learned model: pull the final answer out of
# the response and compare it with the reference. That is RLVR (reinforcement learning with
# verifiable rewards), and [`verifiable.py`](../verifiable.py) does it in pure Python. This
# notebook:
#
# 1. extracts and matches answers on real **GSM8K** and **MATH-500** items;
# 2. works through a **reward-hacking** example: why a format bonus must *gate* the accuracy
#    reward rather than be *added* to it;
# 3. trains a small learned reward model on the built-in data and measures how well it
#    **agrees with the verifier** that labelled that data.
#
# **The printed outputs** stored with this notebook are one machine's run: a 2-core AMD EPYC
# without AVX-512 (PyTorch's AVX2 kernels). On another CPU the digits differ (PyTorch and MKL
# pick other kernels there, which add floats in another order, and a training run drifts from
# that), while the claims the text makes hold: `tests/test_notebooks.py` checks each of them on
# a fresh run.

# %% tags=["shared-data"]
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.abspath(".."))  # the project root

import matplotlib.pyplot as plt
import torch

import train_rm
from data.arith.prepare import built_in
from data.pairs import PairDataset
from data.tokenizer import load_tokenizer
from reward import accuracy
from nanorm.ckpt import load_reward_model
from verifiable import (
    answers_match,
    extract_answer,
    extract_boxed,
    extract_gsm8k,
    format_gated,
    format_reward,
    gsm8k_reward,
    overlong_penalty,
)

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.manual_seed(0)
torch.set_num_threads(1)  # a 0.2M-parameter model gains nothing from threads; kind to a shared CPU
# ../shared/data holds the real data sets; NANORM_DATA=none runs the small fallbacks instead
DATA = os.environ.get("NANORM_DATA", os.path.join("..", "..", "shared", "data"))
read_jsonl = lambda path: [json.loads(line) for line in open(path, encoding="utf-8")]
HAVE_GSM8K = os.path.exists(os.path.join(DATA, "gsm8k", "test.jsonl"))
HAVE_MATH = os.path.exists(os.path.join(DATA, "math500", "test.jsonl"))
print("GSM8K:", HAVE_GSM8K, " MATH-500:", HAVE_MATH)

# %% [markdown]
# ## 1. GSM8K: grade-school word problems
#
# Every GSM8K solution ends with `#### <answer>`; `extract_gsm8k` reads it.

# %% tags=["shared-data"]
if HAVE_GSM8K:
    gsm8k = read_jsonl(os.path.join(DATA, "gsm8k", "test.jsonl"))
    item = gsm8k[0]
    print(item["question"], "\n\nsolution:\n" + item["answer"])
    golds = [extract_gsm8k(row["answer"]) for row in gsm8k]
    print(f"\nextract_gsm8k finds an answer in {sum(g is not None for g in golds)} of "
          f"{len(gsm8k)} solutions; some use thousands commas: {[g for g in golds if ',' in g][:3]}")
else:
    print("GSM8K not found: using one item written here")
    item = {"question": "Janet's ducks lay 16 eggs per day. ... How much does she make?",
            "answer": "16 - 3 - 4 = 9 eggs; 9 * 2 = 18 dollars.\n#### 18"}
gold = extract_gsm8k(item["answer"])

# %% [markdown]
# A model's response is not in GSM8K's format, so `extract_answer` looks for a final-answer
# mark (`nanorm/base/algebra/extract.py`'s docstring has the whole order). It reads inside the last
# `<answer>...</answer>` block when there is one, and there takes the first that is found of:
# the last `\boxed{...}`, then `#### x`, then what follows the last "the answer is" (or
# "Answer:"), then a concluding sentence ("Thus he spent $58 in all."). One exception: an
# "answer is" written *after* the last box goes before the box, because it is the response's
# later word (`\boxed{12} ... The answer is 18` gives 18).
# There is deliberately **no "last number in the text" fallback**: it would pay any response
# that merely ends on the right number, and a policy learns to exploit that fast.

# %%
responses = [
    "16 - 3 - 4 = 9 eggs are left, and 9 * 2 = 18. The answer is 18.",
    "She makes $18.00 every day, so the answer is $18.00.",
    "Janet makes \\boxed{18} dollars a day.",
    "<think>9 eggs at $2 each</think> <answer>18 dollars</answer>",
    "#### 18",
    "The answer is 18 dollars per day.",
    "She sells 9 eggs at $2 each, making 18 dollars.",  # no final-answer marker
    "16 - 3 - 4 = 9, so the answer is 9.",  # wrong
    "The answer is 18. No wait, the answer is 20.",  # the last statement counts
    "First \\boxed{12}; checking again, the answer is 18.",  # said after the box: it wins
]
print(f"gold answer {gold!r}\n")
print(f"{'response':58} {'extracted':>12}  reward")
for r in responses:
    print(f"{r:58.58} {extract_answer(r)!r:>12}  {gsm8k_reward(r, item['answer']):.0f}")
print("\n'2,125' matches '2125':", answers_match("2,125", "2125"))

# %% [markdown]
# ## 2. MATH-500: answers in LaTeX
#
# MATH solutions put the final answer in `\boxed{...}`, which may hold nested braces
# (`\boxed{\frac{14}{3}}`). `extract_boxed` matches the braces by scanning (exercise 5). The
# same answer can be written many ways, so `answers_match` compares *values*, exactly: numbers
# and simple expressions as exact sums of terms (no floating point), tuples in order, lists and
# sets in any order, `x = 5` as `5`.

# %% tags=["shared-data"]
if HAVE_MATH:
    math500 = read_jsonl(os.path.join(DATA, "math500", "test.jsonl"))
    boxed = [extract_boxed(row["solution"]) for row in math500]
    agree = sum(b is not None and answers_match(b, row["answer"]) for b, row in zip(boxed, math500))
    print(f"the last \\boxed{{}} of the solution matches the 'answer' field in {agree} of {len(math500)} items")
    row = math500[2]
    print(f"\nexample ({row['subject']}, level {row['level']}): ...{row['solution'][-120:]!r}"
          f"\n-> extract_boxed: {extract_boxed(row['solution'])!r}")
    answers = {row["answer"] for row in math500}
else:
    print("MATH-500 not found: the table below still runs on the answers written here")
    answers = set()

cases = [  # (a model's answer, a MATH-500 reference answer)
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("14/3", "\\frac{14}{3}"),
    ("4.667", "\\frac{14}{3}"),
    ("90", "90^\\circ"),
    ("\\sqrt{117}", "3\\sqrt{13}"),
    ("-5i + 6", "6 - 5i"),
    ("-2, 1", "1,-2"),
    ("5", "x=5"),
    ("Evelyn", "\\text{Evelyn}"),
    ("evelyn", "\\text{Evelyn}"),
    ("q - p", "p - q"),
]
print(f"\n{'model answer':>14}   {'MATH-500 answer':36} match  (in MATH-500)")
for predicted, reference in cases:
    print(f"{predicted:>14}   {reference:36} {answers_match(predicted, reference)!s:5}  "
          f"({reference in answers})")

# %% [markdown]
# Each match above is a policy, written down in `verifiable.py`'s docstring, and each is a
# choice a policy could exploit if it were made loosely:
#
# * **Rounding.** A decimal written with two or more places matches a value with no exact
#   decimal that long, rounded *or* cut: `4.667` and `4.66` both answer $14/3$ (a student who
#   gives the quotient to two places is right), but `4.6` and `4.7` do not, and `0.8` is not
#   $3/4$ (that value *has* an exact decimal, so a different one is simply wrong).
# * **Case.** Words of two or more letters ignore case (`evelyn` answers `\text{Evelyn}`);
#   single letters keep it (`b` is not `B`: a variable's name is part of the answer).
# * **Algebra stays exact.** `q - p` is not `p - q`, whatever its form.
#
# The cell below checks each of these claims. Matching is the verifier's whole job, and every
# mistake in it is a reward the policy will find.

# %%
frac = "\\frac{14}{3}"
assert answers_match("4.667", frac) and answers_match("4.66", frac)  # rounded or cut, 2+ places
assert not answers_match("4.6", frac) and not answers_match("4.7", frac)  # one place: too coarse
assert not answers_match("0.8", "3/4")  # 3/4 is exactly 0.75
assert answers_match("evelyn", "\\text{Evelyn}") and not answers_match("b", "B")
assert not answers_match("q - p", "p - q")
print("every claim above holds")

# %% [markdown]
# ## 3. Why a format bonus must gate, not add
#
# R1-style training asks for `<think>...</think><answer>...</answer>`. A tempting reward is
# `format + accuracy`. GRPO, the usual algorithm for RLVR, samples a **group** of responses per
# prompt and uses each one's reward relative to its group as the advantage,
# $A_i = (r_i - \mathrm{mean}(r)) / \mathrm{std}(r)$; the scale of the rewards does not matter,
# only who beats whom in the group.
#
# Take two prompts. On a hard one (Josh's house, gold 70000) nobody in the group is right, but
# one response writes a long, well-formatted derivation to a wrong number. On an easy one
# (Janet's ducks, gold 18) most are right; one of them is terse. `format_gated(gsm8k_reward)`
# pays the accuracy reward only when the format is right (allenai/open-instruct#659).

# %%
house = "#### 70000"  # GSM8K test item 2: Josh flips a house
ducks = "#### 18"
long_wrong = (
    "<think>Josh buys the house for $80,000 and puts in $50,000 of repairs, so he spends "
    "80,000 + 50,000 = $130,000 in total. The repairs increased the value of the house by "
    "150%. The value before was $80,000, so 150% of 80,000 is 1.5 * 80,000 = $120,000, and "
    "this is the new value of the house. His profit is the new value minus what he spent: "
    "120,000 - 130,000 = -10,000. So he loses money. Let me double-check the costs: 80,000 "
    "for the house plus 50,000 for repairs is 130,000, and the sale brings 120,000. Yes, "
    "the profit is -10,000.</think> <answer>-10000</answer>"
)
groups = {
    "hard prompt (house)": (house, [
        ("A1 long, formatted, wrong", long_wrong),
        ("A2 wrong", "The answer is 50000."),
        ("A3 wrong", "#### 120000"),
        ("A4 wrong, no marker", "He made 40000 dollars."),
    ]),
    "easy prompt (ducks)": (ducks, [
        ("B1 terse, formatted, right", "<think>(16-3-4)*2</think><answer>18</answer>"),
        ("B2 formatted, right", "<think>16 - 3 - 4 = 9 eggs; 9 * 2 = 18</think> <answer>18</answer>"),
        ("B3 formatted, right", "<think>She sells 9 eggs at $2.</think><answer>$18</answer>"),
        ("B4 formatted, wrong", "<think>16 - 3 = 13; 13 * 2 = 26</think><answer>26</answer>"),
    ]),
}
additive = lambda r, gt: format_reward(r) + gsm8k_reward(r, gt)
gated = format_gated(gsm8k_reward)


def grpo_advantages(rewards):
    """GRPO's group-relative advantage: (r - mean) / (std + eps) within one prompt's group."""
    r = torch.tensor(rewards)
    return ((r - r.mean()) / (r.std() + 1e-4)).tolist()


items = [(name, text, gt) for gt, members in groups.values() for name, text in members]
names = [name for name, _, _ in items]
rewards, advantages = {}, {}
for kind, fn in (("additive", additive), ("gated", gated)):
    rewards[kind] = [fn(text, gt) for _, text, gt in items]
    advantages[kind] = [a for gt, members in groups.values()
                        for a in grpo_advantages([fn(text, gt) for _, text in members])]
print(f"{'response':28} {'chars':>5}  format  accuracy | additive  adv. | gated  adv.")
for i, (name, text, gt) in enumerate(items):
    print(f"{name:28} {len(text):5}  {format_reward(text):6.0f}  {gsm8k_reward(text, gt):8.0f} |"
          f" {rewards['additive'][i]:8.0f} {advantages['additive'][i]:+5.2f} |"
          f" {rewards['gated'][i]:5.0f} {advantages['gated'][i]:+5.2f}")

# %%
fig, ax = plt.subplots(1, 2, figsize=(11, 3.6), sharey=False)
x = torch.arange(len(names)).float()
for a, values, title in ((ax[0], rewards, "reward"), (ax[1], advantages, "GRPO advantage (within its group)")):
    a.bar(x - 0.2, values["additive"], 0.4, label="additive: format + accuracy", color="tab:red")
    a.bar(x + 0.2, values["gated"], 0.4, label="gated: format_gated(accuracy)", color="tab:blue")
    a.set_xticks(x.tolist(), [n.split(" ", 1)[0] for n in names])
    a.axvline(3.5, color="gray", lw=0.8)
    a.axhline(0, color="k", lw=0.6)
    a.set(title=title)
for i in (0, 4):  # the two responses of the story
    ax[1].annotate(names[i][3:], (i, max(advantages["additive"][i], advantages["gated"][i])),
                   xytext=(0, 8), textcoords="offset points", ha="center", fontsize=8)
ax[0].legend(fontsize=8, loc="upper left")
ax[1].set_ylim(-1.8, 2.0)
ax[0].text(1.5, -0.35, "hard prompt: nobody right", ha="center", fontsize=8)
ax[0].text(5.5, -0.35, "easy prompt: most right", ha="center", fontsize=8)
ax[0].set_ylim(-0.5, 2.4)
fig.tight_layout()

# %% [markdown]
# Under the **additive** reward the long, well-formatted *wrong* answer (A1) gets the largest
# advantage of all, about three times that of the terse *right* one (B1): GRPO pushes up wrong
# derivations, as long as they are in tags, on exactly the prompts the model cannot solve yet.
# Its reward alone (1) even equals that of a right answer without tags. Under the **gated**
# reward a group where nobody is right has no signal at all (every advantage 0), and B1 is
# reinforced. The format is still learned: a right answer without tags gets 0.
#
# Length is a separate lever: DAPO's `overlong_penalty` subtracts up to 1 as a response nears
# a length limit, and it is *added*, because it should be paid whether or not the answer is
# right:

# %%
penalty = overlong_penalty(max_length=600, buffer=200)  # characters here; tokens in training
for name, text, _ in (items[0], items[4]):
    print(f"{name:28} {len(text):4} chars  overlong_penalty {penalty(text):+.2f}")

# %% [markdown]
# ## 4. A learned reward model versus the verifier
#
# The built-in preference data (`data/arith`) was **labelled by the verifier**: chosen is the
# response `gsm8k_reward` scores 1, rejected the one it scores 0. A reward model trained on it
# learns to imitate the verifier. How well does a short run manage? We train the same small
# model as notebook 02 (150 steps, under a minute on a laptop CPU).

# %%
out_dir = tempfile.mkdtemp(prefix="nanorm_rm_")
args = ["--dataset", "arith", "--out_dir", out_dir, "--model", "nano", "--lm_coef", "1.0",
        "--max_iters", "150", "--batch_size", "32", "--lr", "3e-3", "--min_lr", "3e-4",
        "--warmup", "10", "--eval_interval", "150", "--eval_pairs", "300",
        "--log_interval", "50", "--seed", "1337", "--device", "cpu", "--dtype", "float32"]
backend = plt.get_backend()
train_rm.main(args)
plt.switch_backend(backend)  # train_rm set matplotlib to Agg to write its PNGs; undo that
model, _ = load_reward_model(os.path.join(out_dir, "ckpt.pt"))

# %% [markdown]
# Now score every held-out response both ways. The verifier needs the gold answer, which we
# compute from the prompt (`What is 12 + 7?`); the reward model needs only the text.

# %%
data_dir = built_in()
meta = json.load(open(os.path.join(data_dir, "meta.json")))
tok = load_tokenizer(meta["tokenizer"])
val = PairDataset(os.path.join(data_dir, "val.npz"))
texts = [tuple(tok.decode(part) for part in val[i]) for i in range(len(val))]  # (prompt, c, r)


def gold_of(prompt):
    a, op, b = re.search(r"(\d+) ([-+]) (\d+)", prompt).groups()
    return int(a) + int(b) if op == "+" else int(a) - int(b)


golds = [gold_of(p) for p, _, _ in texts]
v_c = torch.tensor([gsm8k_reward(c, str(g)) for (_, c, _), g in zip(texts, golds)])
v_r = torch.tensor([gsm8k_reward(r, str(g)) for (_, _, r), g in zip(texts, golds)])
with torch.no_grad():
    r_c, r_r = [], []
    for i in range(0, len(val), 100):
        b = val.collate(range(i, min(i + 100, len(val))), meta["pad_id"])
        rc, rr = model.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
        r_c.append(rc)
        r_r.append(rr)
r_c, r_r = torch.cat(r_c), torch.cat(r_r)
print(f"verifier: chosen scores 1 in {int(v_c.sum())}/{len(val)} pairs, rejected 0 in "
      f"{int((v_r == 0).sum())}/{len(val)}: it labelled the data, so it agrees with itself")
print(f"reward model: prefers the verifier's choice in {accuracy(r_c, r_r):.1%} of the pairs")

# %% [markdown]
# A reward model's number has no absolute meaning (only differences were trained), so for a
# per-response confusion table we call a response "good" when its reward is above the median of
# all 2000 held-out rewards. The pairwise view above is the fairer one; the table shows how
# much a single reward, without the other response beside it, tells you.

# %%
rewards_all = torch.cat([r_c, r_r])
verdict = torch.cat([v_c, v_r]).bool()  # the verifier: right answer?
says_good = rewards_all > rewards_all.median()
table = torch.tensor([[(says_good & verdict).sum(), (~says_good & verdict).sum()],
                      [(says_good & ~verdict).sum(), (~says_good & ~verdict).sum()]])

# which wrong answers fool the model? the kind of error, and the answer format
def error_kind(rejected, gold):
    wrong = extract_answer(rejected)
    off = abs(int(wrong) - gold)
    return "off by 1-2" if off <= 2 else "off by 10" if off == 10 else "digits swapped"


def style(response):
    return "\\boxed{}" if "boxed" in response else "####" if "####" in response else "answer is"


agree = (r_c > r_r).float()
groups_of = {
    "error": [error_kind(r, g) for (_, _, r), g in zip(texts, golds)],
    "format": [style(c) for _, c, _ in texts],
}
fig, ax = plt.subplots(1, 3, figsize=(12, 3.2), gridspec_kw={"width_ratios": [1, 1.2, 1]})
ax[0].imshow(table, cmap="Blues")
for i in range(2):
    for j in range(2):
        dark = table[i, j] > (table.max() + table.min()) / 2
        ax[0].text(j, i, int(table[i, j]), ha="center", va="center", fontsize=12,
                   color="white" if dark else "black")
ax[0].set_xticks([0, 1], ["RM: above median", "RM: below"])
ax[0].set_yticks([0, 1], ["verifier: right", "verifier: wrong"])
ax[0].set_title(f"per response: {(table[0, 0] + table[1, 1]) / table.sum():.0%} agree")
print(f"per response, reward above the median vs. the verifier: "
      f"{(table[0, 0] + table[1, 1]) / table.sum():.2f} agree")
for a, (what, labels) in zip(ax[1:], groups_of.items()):
    kinds = sorted(set(labels))
    rates = [agree[[i for i, k in enumerate(labels) if k == kind]].mean().item() for kind in kinds]
    counts = [labels.count(kind) for kind in kinds]
    print(f"ranked as the verifier does, by {what}: "
          + ", ".join(f"{k} {r:.2f} of {n}" for k, r, n in zip(kinds, rates, counts)))
    a.bar(kinds, rates, color="tab:green")
    for i, (rate, n) in enumerate(zip(rates, counts)):
        a.text(i, rate + 0.02, f"{rate:.0%} of {n}", ha="center", fontsize=8)
    a.axhline(0.5, color="gray", ls=":")
    a.set(ylim=(0, 1.1), title=f"pairs ranked as the verifier does, by {what}")
fig.tight_layout()

# %% [markdown]
# Finally, ask the model directly: for a few held-out prompts, score the same sentence with
# every candidate answer near the right one. A perfect imitation of the verifier would put a
# single peak at the gold answer.

# %%
fig, ax = plt.subplots(1, 3, figsize=(12, 2.8))
for a, i in zip(ax, (0, 1, 2)):
    prompt, gold = texts[i][0], golds[i]
    candidates = list(range(gold - 12, gold + 13))
    rows = [tok.encode(prompt, bos=True) + tok.encode(f"The answer is {x}.", eos=True) for x in candidates]
    T = max(map(len, rows))
    ids = torch.tensor([row + [meta["pad_id"]] * (T - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (T - len(row)) for row in rows])
    with torch.no_grad():
        scores = model(ids, mask)
    a.plot(candidates, scores, "o-", ms=3)
    a.axvline(gold, color="tab:green", lw=2, alpha=0.6, label=f"gold {gold}")
    a.set(title=repr(prompt), xlabel="candidate answer x in 'The answer is x.'")
    a.legend(fontsize=8)
ax[0].set_ylabel("reward")
fig.tight_layout()

# %% [markdown]
# What a short run achieves, honestly: the model ranks most pairs the way the verifier does,
# but far from all (about 6 in 10). The breakdown says which: it catches most answers that are
# off by 10 and most swaps of two different digits (8 or 9 in 10 of each), but it separates
# answers off by 1 or 2 barely better than a coin. It has learned roughly where the answer
# lies, not yet its last digit; the last plot shows the same thing as a plateau of high rewards
# around the gold answer instead of the verifier's single spike. The answer's format matters
# far less than the kind of error.
#
# That is the general situation: a learned reward model approximates whatever labelled its
# data, with blind spots a policy can find and exploit (here: be off by one). When the answer
# can be checked, RLVR uses the checker itself. Learned reward models earn their keep where
# nothing can be checked (helpfulness, style, safety), as in the HH-RLHF pairs of notebook 02.
#
# **Next:** [04_critic.ipynb](04_critic.ipynb): the value model PPO trains beside the policy.
# **Exercise:** `exercises/ex5_boxed.py` (write `extract_boxed`).
