"""
Every model of bench/judge/run.sh scored on three held-out sets, one row per (seed, model, set,
metric) into bench/judge/scores.jsonl; report.py makes the tables from it.

    python bench/judge/score.py out/judge_bench 0 1 2     # run.sh's folder and seeds

The sets: the built-in's val.npz (in distribution), and run.sh's two shifted sets, numbers up to
99 (long) and multiplication (mul). The models: the explicit pairwise reward model through
eval_rm.evaluate (the accuracy eval_rm.py reports), and the two judges through
nanorm.judge.evaluate, each fine-tuned (per seed) and zero-shot (the SFT policy, seed None).
Accuracy counts a tie as wrong.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.pairs import PairDataset
from data.tokenizer import load_tokenizer
from eval_rm import evaluate as evaluate_rm
from nanorm.base.checkpoints import load_transformer
from nanorm.base.command import atomic_write, run
from nanorm.ckpt import load_reward_model
from nanorm.judge import JUDGES, JudgeText, evaluate, make_judge

HERE = os.path.dirname(os.path.abspath(__file__))
N = 1000  # pairs per set


def sets(out):
    """{name: (PairDataset of held-out pairs, meta)}."""
    found = {}
    for name, folder in (("in_dist", "data/arith"), ("long", f"{out}/long"), ("mul", f"{out}/mul")):
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        found[name] = (PairDataset(os.path.join(folder, "val.npz")), meta)
    return found


def judge_rows(path, kind, data, text, seed, model):
    """The rows of the LM at path read as a judge of this kind, on every set."""
    policy = load_transformer(path)
    judge, rows = make_judge(policy, text, kind), []
    for name, (d, meta) in data.items():
        for metric, v in evaluate(judge, kind, d, text, meta["pad_id"], N).items():
            rows.append(dict(seed=seed, model=model, set=name, metric=metric, value=v))
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out, seeds = argv[0], [int(s) for s in argv[1:]]
    torch.set_num_threads(1)
    data = sets(out)
    meta = data["in_dist"][1]  # the shifted sets share its tokenizer and ids
    text = JudgeText.from_tokenizer(load_tokenizer(meta["tokenizer"]), meta["end_id"])
    rows = []
    for kind in JUDGES:  # zero-shot: the one SFT policy, before any fine-tuning
        rows += judge_rows(f"{out}/cache/sft400_policy.pt", kind, data, text, None, f"{kind}_zero")
    for seed in seeds:
        for kind in JUDGES:  # each judge's own fine-tuned LM
            path = f"{out}/{kind}_seed{seed}/judge_policy.pt"
            rows += judge_rows(path, kind, data, text, seed, f"{kind}_tuned")
        rm, _ = load_reward_model(f"{out}/rm_seed{seed}/ckpt.pt")
        for name, (d, m) in data.items():
            metrics, _ = evaluate_rm(rm, d, m["pad_id"], batch_size=100, n_pairs=N)
            rows.append(dict(seed=seed, model="rm", set=name, metric="acc", value=metrics["acc"]))
        print(f"seed {seed} scored")
    with atomic_write(os.path.join(HERE, "scores.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {os.path.join(HERE, 'scores.jsonl')}: {len(rows)} rows")


if __name__ == "__main__":
    run(main)
