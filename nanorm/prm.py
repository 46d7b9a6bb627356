"""
A process reward model (a score per step) against an outcome reward model (a score per
solution), on chains of arithmetic written out step by step, measured by best-of-N.

    python -m nanorm.prm                                     # one seed, the defaults
    python -m nanorm.prm --seed 1 --labels soft --rollouts 16 --eval_questions 100
    bash bench/prm/run.sh                                    # the runs of bench/prm/README.md

The pieces, in the order a run meets them:
  0. the world: "5 + 3 - 2 + 7 = ?" (2 to 5 operations on one-digit operands), answered
     " 5 + 3 = 8. 8 - 2 = 6. 6 + 7 = 13. The answer is 13." in the built-in tokenizer.
  1. once, cached in --cache_dir: a policy (nanorm.rl's shape) taught by SFT on right chains,
     for few enough steps that sampling at temperature 1 still slips: its solutions are often
     wrong, and wrong at a step one can point at.
  2. exact step labels: step k is 1 iff steps 1..k each apply the prompt's next operation to
     the previous result and compute it right (the chain is still on track).
  3. Math-Shepherd labels (Wang et al. 2023): from each step's prefix, --rollouts completions by
     the policy; soft = the share the verifier (verifiable.gsm8k_reward) finds right, hard = 1 if
     any is. No human and no exact labeller needed: what Lightman et al. 2023 paid people for.
  4. the PRM (reward.ProcessRewardModel) trained with BCE on those labels of sampled training
     solutions; the ORM (reward.RewardModel) with BCE on each solution's outcome; both from the
     SFT policy's weights with a new head, the same steps, batch and learning rate.
  5. measured on held-out questions: step accuracy against the exact labels, and best-of-N:
     --samples solutions per question, the expected gold of the one selected among N of them by
     PRM min, PRM product, ORM, majority vote, against pass@N.
Output in --out_dir: prm.jsonl (rows: the labels' agreement, step accuracies, a row per N) and
prm.png (the best-of-N curves), checked and recorded first (command.Outputs) as nanorm.rl does.

Simplified on purpose: one process on the CPU, float32; the ORM is trained on the same sampled
solutions as the PRM, not on more; best-of-N reuses one pool of --samples solutions per question
(subsets drawn from it, not fresh samples), which is exact for the score selectors below.
"""

import copy
import json
import math
import operator
import os
import random
import re
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from data.pairs import right_pad
from model import Transformer
from nanorm.base.checkpoints import load_transformer
from nanorm.base.command import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    Outputs,
    UsageError,
    atomic_write,
    one_of,
    opt,
    parse_config,
    run,
    run_folders,
)
from nanorm.ckpt import save_checkpoint
from nanorm.dpo import policy_config
from nanorm.rl import arith, best_of_n_gold, rollout
from nanorm.run_dir import save_figure
from reward import ProcessRewardModel, RewardModel, solution_reward
from verifiable import extract_answer, gsm8k_reward


@dataclass
class PRMConfig:
    seed: int = opt(0, "seeds the PRM's and ORM's training and all sampling", NON_NEGATIVE)
    out_dir: str = opt("out/prm", "where prm.jsonl and prm.png go")
    cache_dir: str = opt("", "where the SFT policy is kept (default out_dir)")
    sft_steps: int = opt(700, "SFT steps on right chains (cached): few, so it slips", AT_LEAST_1)
    train_solutions: int = opt(256, "sampled solutions the PRM and ORM learn", AT_LEAST_1)
    rollouts: int = opt(8, "Math-Shepherd completions from each step's prefix", AT_LEAST_1)
    labels: str = opt("hard", "the PRM's target: hard (any right) or soft (their share)",
                      one_of("hard", "soft"))  # fmt: skip
    rm_steps: int = opt(150, "optimizer steps of the PRM and of the ORM", AT_LEAST_1)
    batch_size: int = opt(32, "solutions per step", AT_LEAST_1)
    lr: float = opt(1e-3, "learning rate of both (AdamW)", POSITIVE)
    eval_questions: int = opt(128, "held-out questions (the same for every seed)", AT_LEAST_1)
    samples: int = opt(64, "solutions sampled per held-out question; N up to it", AT_LEAST_1)
    subsets: int = opt(256, "random subsets per N and question for the vote", AT_LEAST_1)
    temperature: float = opt(1.0, "temperature of every solution and rollout", POSITIVE)
    max_new_tokens: int = opt(72, "longest solution sampled (5 steps fit)", AT_LEAST_1)


def parse_args(argv=None) -> PRMConfig:
    cfg = parse_config(PRMConfig, argv, description=__doc__.split("\n")[1])
    cfg = run_folders(cfg)
    room = policy_config({"vocab_size": 1}).max_seq_len - 32  # the longest prompt: 25 tokens
    if cfg.max_new_tokens > room:
        raise UsageError(
            f"--max_new_tokens {cfg.max_new_tokens}: at most {room} fit the policy's 256 positions"
        )
    return cfg


# ----------------------------------------------------------------------------- 0. the world
OPS = {"+": operator.add, "-": operator.sub}
STEP = re.compile(r"(-?\d+) ([+-]) (-?\d+) = (-?\d+)\.")  # an operation: "8 - 2 = 6."
ANSWER = re.compile(r"The answer is (-?\d+)\.")  # the last step


def make_question(rng):
    """(operands, operators): 2 to 5 operations on one-digit operands."""
    k = rng.randint(2, 5)
    return tuple(rng.randint(0, 9) for _ in range(k + 1)), tuple(rng.choice("+-") for _ in range(k))


def results(q):
    """The running value after each operation."""
    (first, *rest), ops = q
    out = [first]
    for op, b in zip(ops, rest, strict=True):
        out.append(OPS[op](out[-1], b))
    return out[1:]


def prompt_text(q):
    return (
        " ".join([str(q[0][0])] + [f"{op} {b}" for op, b in zip(q[1], q[0][1:], strict=True)])
        + " = ?"
    )


def solution_text(q):
    """The right response, one sentence per operation, then the answer."""
    values = [q[0][0], *results(q)]
    steps = [
        f"{a} {op} {b} = {c}."
        for a, op, b, c in zip(values, q[1], q[0][1:], values[1:], strict=False)
    ]
    return " " + " ".join(steps) + f" The answer is {values[-1]}."


def split_steps(tok, response):
    """(ends, texts): each step's last token (its "." in response ids) and its text, a step a
    sentence; the sentence stating the answer is the last step. A response with no "." is one
    step, ending at its last token, so every solution has a score."""
    dot = tok.encode(".")[-1]
    ends = [i for i, t in enumerate(response) if t == dot]
    texts = [
        tok.decode(response[s + 1 : e + 1]).strip() for s, e in zip([-1, *ends], ends, strict=False)
    ]
    return (ends, texts) if ends else ([len(response) - 1], [tok.decode(response)])


def exact_labels(q, texts):
    """1 at step k iff steps 1..k are each right. An operation is right from the previous
    result (the first operand for the first), with the prompt's next operator and operand and
    the right value; the answer is right after the last operation, stating its result. Any
    other sentence is wrong: an operation past the last, an answer before it."""
    (first, *rest), ops = q
    value, on_track, labels = first, True, []
    for k, text in enumerate(texts):
        m, said = STEP.fullmatch(text), ANSWER.fullmatch(text)
        if k < len(ops):
            right = m is not None and int(m[1]) == value and m[2] == ops[k]
            right = right and int(m[3]) == rest[k] and int(m[4]) == OPS[ops[k]](value, rest[k])
        else:
            right = k == len(ops) and said is not None and int(said[1]) == value
        on_track = on_track and right
        labels.append(int(on_track))
        if on_track and k < len(ops):
            value = int(m[4])
    return labels


# ----------------------------------------------------------------------------- 1. the policy
def encode(tok, q, response=None):
    """(prompt ids, response ids) as the built-in data lays them out: BOS + prompt, response +
    EOS (the leading space dropped: the tokenizer's dummy prefix puts it back)."""
    text = solution_text(q) if response is None else response
    return tok.encode(prompt_text(q), bos=True), tok.encode(text.removeprefix(" "), eos=True)


def sft_lr(step, steps, peak=4e-3):
    """20 steps of linear warmup, then a cosine from peak to peak / 10: a constant rate left
    the policy's accuracy jumping by 0.15 from one hundred steps to the next."""
    return peak * min(1.0, (step + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))


def sft_policy(tok, meta, args, avoid):
    """Next-token cross-entropy on right chains' responses (the prompt read, not learned), on
    questions never in `avoid` (the held-out ones). Kept in cache_dir/prm_sft<steps>.pt."""
    path = os.path.join(args.cache_dir, f"prm_sft{args.sft_steps}.pt")
    if os.path.exists(path):
        return load_transformer(path)
    torch.manual_seed(0)
    policy = Transformer(policy_config(meta))  # nanorm.rl's shape, 256 positions
    opt = torch.optim.AdamW(policy.parameters(), weight_decay=0.0)
    rng, t0 = random.Random(1), time.time()
    for step in range(args.sft_steps):
        for group in opt.param_groups:
            group["lr"] = sft_lr(step, args.sft_steps)
        qs = [q for q in (make_question(rng) for _ in range(40)) if q not in avoid][:32]
        pairs = [encode(tok, q) for q in qs]
        rows = [p + r for p, r in pairs]
        tokens = right_pad(rows, meta["pad_id"])  # (B, T)
        t = torch.arange(tokens.size(1))
        mask = t < torch.tensor([len(r) for r in rows])[:, None]
        learn = mask & (t >= torch.tensor([len(p) for p, _ in pairs])[:, None])  # the response
        logits = policy(tokens[:, :-1], mask[:, :-1])  # predicts tokens[:, 1:]
        ce = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        loss = (ce * learn[:, 1:]).sum() / learn[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.sft_steps - 1:
            print(f"sft step {step}: loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    os.makedirs(args.cache_dir, exist_ok=True)
    save_checkpoint(path, policy)
    return policy


@torch.no_grad()
def complete(policy, prefixes, args, meta, chunk=1024):
    """The policy's continuation (ids up to and including EOS) of each prefix."""
    policy.eval()
    out = []
    for i in range(0, len(prefixes), chunk):
        seq, _, P, resp_mask = rollout(policy, prefixes[i : i + chunk], args, *pad_eos(meta))
        out += [s[P:][m].tolist() for s, m in zip(seq, resp_mask, strict=True)]
    return out


def pad_eos(meta):
    return meta["pad_id"], meta["eos_id"]


def sample_solutions(policy, tok, qs, k, args, meta):
    """k sampled solutions to each question, each with its steps, exact labels and gold."""
    prompts = [encode(tok, q)[0] for q in qs for _ in range(k)]
    sols = []
    for i, response in enumerate(complete(policy, prompts, args, meta)):
        q, text = qs[i // k], tok.decode(response)
        ends, texts = split_steps(tok, response)
        sols.append(dict(q=q, prompt=prompts[i], response=response, ends=list(ends)))
        sols[-1].update(exact=exact_labels(q, texts), answer=extract_answer(text))
        sols[-1]["gold"] = gsm8k_reward(text, str(results(q)[-1]))
    return sols


# ----------------------------------------------------------------------------- 3. Math-Shepherd
def math_shepherd(policy, tok, sols, n, args, meta):
    """Label each step of each solution by n completions from its prefix (prompt + steps
    1..k): soft = the share the verifier finds right, hard = 1 if any is."""
    jobs = [(i, e) for i, s in enumerate(sols) for e in s["ends"] for _ in range(n)]
    prefixes = [sols[i]["prompt"] + sols[i]["response"][: e + 1] for i, e in jobs]
    done = complete(policy, prefixes, args, meta)
    right = {}
    for (i, e), rest in zip(jobs, done, strict=True):
        text = tok.decode(sols[i]["response"][: e + 1] + rest)
        right.setdefault((i, e), []).append(gsm8k_reward(text, str(results(sols[i]["q"])[-1])))
    for i, s in enumerate(sols):
        s["soft"] = [sum(right[i, e]) / n for e in s["ends"]]
        s["hard"] = [float(max(right[i, e])) for e in s["ends"]]


# ----------------------------------------------------------------------------- 4. PRM and ORM
def batch(sols, pad_id, labels="hard"):
    """tokens, mask (B, T) right-padded; step_ends (B, S), -1 past a row's steps; the step
    labels (B, S) and the outcome (B,)."""
    rows = [s["prompt"] + s["response"] for s in sols]
    tokens, mask = right_pad(rows, pad_id), right_pad([[1] * len(r) for r in rows])
    ends = right_pad([[len(s["prompt"]) + e for e in s["ends"]] for s in sols], -1)
    steps = right_pad([torch.tensor(s[labels], dtype=torch.float) for s in sols])
    return tokens, mask, ends, steps, torch.tensor([float(s["gold"]) for s in sols])


def prm_loss(prm, tokens, mask, ends, labels, gold):
    return prm.loss(tokens, mask, ends, labels)[0]


def orm_loss(orm, tokens, mask, ends, labels, gold):
    return F.binary_cross_entropy_with_logits(orm(tokens, mask), gold)


def train(model, loss_fn, sols, args, meta):
    """The same loop for both: AdamW, batch_size random solutions a step, rm_steps steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)
    model.train()
    for step in range(args.rm_steps):
        idx = torch.randint(len(sols), (args.batch_size,), generator=g).tolist()
        loss = loss_fn(model, *batch([sols[i] for i in idx], meta["pad_id"], args.labels))
        if not math.isfinite(loss.item()):
            raise UsageError(f"the loss is {loss.item()} at step {step}: lower --lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def score(prm, orm, sols, pad_id, chunk=256):
    """Per solution: the PRM's step probabilities, the ORM's step logits (its head read at each
    step's end, as a baseline) and its reward (at the last token)."""
    for i in range(0, len(sols), chunk):
        part = sols[i : i + chunk]
        tokens, mask, ends, _, _ = batch(part, pad_id, "exact")
        p = prm.step_scores(tokens, mask, ends).sigmoid()  # (B, S)
        last = mask.sum(1, keepdim=True) - 1  # (B, 1)
        at = torch.cat([ends.clamp(min=0), last], 1)
        r = orm.score(orm.backbone.hidden_states(tokens, mask, at=at))  # (B, S + 1)
        how = {h: solution_reward(p, ends >= 0, h) for h in ("min", "prod")}  # (B,) each
        for j, s in enumerate(part):
            n = len(s["ends"])
            s.update(prm=p[j, :n].tolist(), orm_steps=r[j, :n].tolist(), orm=r[j, -1].item())
            s.update(prm_min=how["min"][j].item(), prm_prod=how["prod"][j].item())


# ----------------------------------------------------------------------------- 5. best-of-N
def pass_at_n(gold, n):
    """P(at least one right among n drawn): 1 - C(wrong, n) / C(k, n)."""
    k, wrong = len(gold), len(gold) - int(sum(gold))
    return 1.0 - math.comb(wrong, n) / math.comb(k, n)


def majority(answers, gold, subsets):
    """The mean over subsets (index lists) of the gold of the most frequent final answer in
    each, ties at their mean gold (a random pick); a solution with no answer has no vote."""
    total = 0.0
    for idx in subsets:
        votes = {}
        for i in idx:
            if answers[i] is not None:
                votes.setdefault(answers[i], []).append(gold[i])
        top = max((len(v) for v in votes.values()), default=0)
        won = [v[0] for v in votes.values() if len(v) == top]
        total += sum(won) / len(won) if won else 0.0
    return total / len(subsets)


def curves(sols, k, args):
    """One row per N: each selector's gold, averaged over the questions (k solutions each)."""
    rng, rows = np.random.default_rng(args.seed), []
    ns = [2**i for i in range(int(math.log2(k)) + 1)]
    groups = [sols[i : i + k] for i in range(0, len(sols), k)]
    golds = [[s["gold"] for s in grp] for grp in groups]  # (Q, k)
    scored = {
        how: best_of_n_gold([[s[how] for s in grp] for grp in groups], golds)  # N = 1..k
        for how in ("prm_min", "prm_prod", "orm")
    }
    for n in ns:
        acc = dict(majority=[], pass_at_n=[], random=[])
        acc.update({how: [gold_n[n - 1]] for how, gold_n in scored.items()})
        for grp, gold in zip(groups, golds, strict=True):
            subsets = [
                rng.choice(k, n, replace=False) for _ in range(1 if n == k else args.subsets)
            ]
            acc["majority"].append(majority([s["answer"] for s in grp], gold, subsets))
            acc["pass_at_n"].append(pass_at_n(gold, n))
            acc["random"].append(float(np.mean(gold)))
        rows.append(
            dict(measure="best_of_n", n=n, **{a: float(np.mean(v)) for a, v in acc.items()})
        )
    return rows


# ----------------------------------------------------------------------------- the run
PRM = "nanorm.prm"  # the command that writes a run's files, in --out_dir's record
PRM_FILES = ("prm.jsonl", "prm.png")


def held_out(n):
    """n distinct questions from a fixed generator: the same set whatever --seed."""
    rng, qs = random.Random(12345), {}
    while len(qs) < n:
        qs[make_question(rng)] = None
    return list(qs)


def share(flags):
    """The mean of 0/1 flags; None (JSON null) for none at all."""
    return float(np.mean(flags)) if len(flags) else None


def main(argv=None):
    args = parse_args(argv)
    outputs = Outputs(args.out_dir, PRM, PRM_FILES, "--out_dir")
    outputs.check()  # a file there that is not ours: refused now, before any work
    # a 0.2M-parameter model: one thread is as fast as two, and never waits on a busy core
    torch.set_num_threads(1)
    _, _, _, meta, tok = arith()
    t0, held = time.time(), held_out(args.eval_questions)
    policy = sft_policy(tok, meta, args, set(held))
    print(f"SFT policy ready in {time.time() - t0:.0f}s")

    # the training solutions, one per question never held out, and their two kinds of labels
    torch.manual_seed(args.seed)  # the sampling and the new heads
    rng, qs = random.Random(1000 + args.seed), []
    while len(qs) < args.train_solutions:
        q = make_question(rng)
        qs += [] if q in held else [q]
    sols = sample_solutions(policy, tok, qs, 1, args, meta)
    math_shepherd(policy, tok, sols, args.rollouts, args, meta)
    exact = [x for s in sols for x in s["exact"]]
    hard = [x for s in sols for x in s["hard"]]
    soft = [x for s in sols for x in s["soft"]]
    labels = dict(measure="labels", steps=len(exact), on_track=share(exact))
    labels.update(policy_accuracy=share([s["gold"] for s in sols]))
    labels["hard_agrees"] = share([h == e for h, e in zip(hard, exact, strict=True)])
    labels["soft_agrees"] = share([(x >= 0.5) == e for x, e in zip(soft, exact, strict=True)])
    labels["hard_on_off_track"] = share([h for h, e in zip(hard, exact, strict=True) if not e])
    labels["hard_on_on_track"] = share([h for h, e in zip(hard, exact, strict=True) if e])
    print(f"labels ({time.time() - t0:.0f}s): {labels}")

    # the PRM and the ORM: the same start, steps, batch and learning rate
    prm = train(ProcessRewardModel(copy.deepcopy(policy)), prm_loss, sols, args, meta)
    orm = train(RewardModel(copy.deepcopy(policy)), orm_loss, sols, args, meta)
    print(f"PRM and ORM trained ({time.time() - t0:.0f}s)")

    # held out: step accuracy against the exact labels, then best-of-N
    test = sample_solutions(policy, tok, held, args.samples, args, meta)
    score(prm, orm, test, meta["pad_id"])
    exact = [x for s in test for x in s["exact"]]
    steps = dict(measure="step_accuracy", steps=len(exact), on_track=share(exact))
    steps["prm"] = share(
        [(p > 0.5) == e for s in test for p, e in zip(s["prm"], s["exact"], strict=True)]
    )
    steps["orm"] = share(
        [(r > 0) == e for s in test for r, e in zip(s["orm_steps"], s["exact"], strict=True)]
    )
    steps["always_on_track"] = steps["on_track"]  # the majority class, for scale
    rows = [labels, steps] + curves(test, args.samples, args)
    for row in rows:
        row.update(seed=args.seed, labels_used=args.labels, time=round(time.time() - t0, 1))
        if not all(math.isfinite(v) for v in row.values() if isinstance(v, float)):
            raise UsageError(f"a measure is not finite: {row}; nothing written")
    outputs.claim()  # prm.jsonl and prm.png in the record, before they are written
    path = os.path.join(args.out_dir, "prm.jsonl")
    with atomic_write(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    plot(rows[2:], os.path.join(args.out_dir, "prm.png"), f"seed {args.seed}, {args.labels} labels")
    print(f"step accuracy: {steps}")
    for r in rows[2:]:
        print(
            " | ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
        )
    print(f"done in {time.time() - t0:.0f}s; wrote {path}, prm.png")
    return rows


NAMES = {"prm_min": "PRM, min over steps", "prm_prod": "PRM, product over steps"}
NAMES |= {"orm": "ORM", "majority": "majority vote", "pass_at_n": "pass@N (any right)"}
NAMES |= {"random": "N = 1 (one at random)"}


def plot(rows, path, title=""):
    """The gold of the selected solution against N (matplotlib's object API, as nanorm.rl)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ns = [r["n"] for r in rows]
    for key, name in NAMES.items():
        ax.plot(
            ns,
            [r[key] for r in rows],
            marker="o",
            label=name,
            ls="--" if key in ("pass_at_n", "random") else "-",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (solutions to choose from)")
    ax.set_ylabel("accuracy of the chosen solution")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    run(main)
