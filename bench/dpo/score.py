"""
Every model of bench/dpo/run.sh scored on three held-out sets, one row per (seed, model, set)
into bench/dpo/scores.jsonl; report.py makes the tables from it.

    python bench/dpo/score.py out/dpo_bench 0 1 2      # run.sh's folder and seeds

The sets: the built-in's val.npz (in distribution), and run.sh's two shifted sets, numbers up to
99 (long) and multiplication (mul). The models: the DPO policy's implicit reward in its three
scorings (nanorm.dpo.held_out_accuracy: one policy and one reference call per batch gives all
three), the explicit reward models through eval_rm.evaluate (the accuracy eval_rm.py reports),
and the SFT policy alone read reference-free (before DPO: beta * log pi(y|x)). Accuracy counts a
tie as wrong.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.pairs import PairDataset
from eval_rm import evaluate
from nanorm.base.checkpoints import load_transformer
from nanorm.base.command import atomic_write, run
from nanorm.ckpt import load_reward_model
from nanorm.dpo import held_out_accuracy
from reward import ImplicitReward

HERE = os.path.dirname(os.path.abspath(__file__))
N = 1000  # pairs per set


def sets(out):
    """{name: (PairDataset of held-out pairs, pad id)}."""
    found = {}
    for name, folder in (("in_dist", "data/arith"), ("long", f"{out}/long"), ("mul", f"{out}/mul")):
        with open(os.path.join(folder, "meta.json")) as f:
            pad = json.load(f)["pad_id"]
        found[name] = (PairDataset(os.path.join(folder, "val.npz")), pad)
    return found


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out, seeds = argv[0], [int(s) for s in argv[1:]]
    torch.set_num_threads(1)
    data, rows = sets(out), []
    sft = load_transformer(f"{out}/cache/sft400_policy.pt")
    before = ImplicitReward(sft, sft, beta=0.1)  # policy == reference: sum and mean are 0
    for name, (d, pad) in data.items():
        acc = held_out_accuracy(before, d, pad, N)["ref_free"]
        rows.append(dict(seed=None, model="sft", scoring="ref_free", set=name, acc=acc))
    for seed in seeds:
        ir, _ = load_reward_model(f"{out}/dpo_seed{seed}/dpo.pt")
        for name, (d, pad) in data.items():
            for scoring, acc in held_out_accuracy(ir, d, pad, N).items():
                rows.append(dict(seed=seed, model="dpo", scoring=scoring, set=name, acc=acc))
        for model in ("rm", "rm_lm"):
            rm, _ = load_reward_model(f"{out}/{model}_seed{seed}/ckpt.pt")
            for name, (d, pad) in data.items():
                metrics, _ = evaluate(rm, d, pad, batch_size=100, n_pairs=N)
                rows.append(dict(seed=seed, model=model, scoring="", set=name, acc=metrics["acc"]))
        print(f"seed {seed} scored")
    with atomic_write(os.path.join(HERE, "scores.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {os.path.join(HERE, 'scores.jsonl')}: {len(rows)} rows")


if __name__ == "__main__":
    run(main)
