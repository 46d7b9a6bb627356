"""
ODIN's frontier at small scale: held-out accuracy against reward-length correlation for a plain
reward model and --length_head over a few --length_coef values (train_rm.py, eval.json).

    nice -n 19 python bench/bench_odin.py                         # writes bench/odin_frontier.png
    nice -n 19 python bench/bench_odin.py --coefs 1 0.1 0.01 --train_pairs 304 --eval_pairs 150
    nice -n 19 python bench/bench_odin.py --reuse     # keep the runs whose eval.json exists

What it runs, one training at a time: SmolLM2-135M-Instruct (the .gguf) on HH-RLHF helpful-base
rendered at --max_len 256, the top 2 layers and the head trained (--train_layers 2 --pack
--lm_coef 0), 8 pairs per step for train_pairs / 8 steps, then the first eval_pairs held-out
pairs scored by train_rm's final evaluation. The figure and bench/odin_frontier.json are
rewritten after every run, so a sweep cut short still shows the runs it finished.

Simplified, to fit a shared 2-core CPU: a few hundred training pairs and one seed, where the
recipe trains on 1,879 pairs. Differences of a few points are within the noise of 150 pairs
(binomial std about 0.04); the plot shows the direction of the trade-off, not its exact place.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from matplotlib.figure import Figure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF = "../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SRC = "../shared/data/hh-rlhf/helpful-base/test.jsonl.gz"


def sh(*argv):
    """Run a step of the pipeline under nice, in the repository root; its output streams."""
    subprocess.run(["nice", "-n", "19", sys.executable, *argv], cwd=ROOT, check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--coefs", type=float, nargs="+", default=[1.0, 0.1, 0.01])
    p.add_argument("--train_pairs", type=int, default=304, help="a multiple of 8")
    p.add_argument("--eval_pairs", type=int, default=150)
    p.add_argument("--data", default="data/hh_rlhf/smollm2-helpful-256")
    p.add_argument("--out", default="out/bench_odin")
    p.add_argument("--reuse", action="store_true", help="skip runs whose eval.json exists")
    args = p.parse_args()
    if not os.path.exists(os.path.join(ROOT, args.data, "meta.json")):
        sh(
            *["data/hh_rlhf/prepare.py", "--src", SRC, "--tokenizer", GGUF, "--max_len", "256"],
            *["--out_dir", args.data],
        )
    results = []
    for coef in [0.0, *args.coefs]:  # 0: the plain reward model, no length head
        out = os.path.join(args.out, f"coef{coef:g}")
        extra = ["--length_head", "--length_coef", str(coef)] if coef else []
        t0, done = time.time(), os.path.join(ROOT, out, "eval.json")
        if not (args.reuse and os.path.exists(done)):
            sh(
                *["train_rm.py", "--init", GGUF, "--dataset", args.data, "--out_dir", out],
                *["--overwrite", "--lm_coef", "0", "--pack", "--train_layers", "2"],
                *["--batch_size", "8", "--max_iters", str(args.train_pairs // 8), "--lr", "3e-5"],
                *["--min_lr", "3e-6", "--warmup", "5", "--weight_decay", "0", "--eval_first", "0"],
                *["--eval_interval", "100000", "--eval_pairs", str(args.eval_pairs)],
                *["--log_interval", "10", *extra],
            )
        with open(done) as f:
            m = json.load(f)["overall"]
        row = dict(length_coef=coef, seconds=round(time.time() - t0), **m)
        results.append(row)
        print(json.dumps(row))
        write(args, results)


def write(args, results):
    """bench/odin_frontier.json and .png from the runs so far."""
    with open(os.path.join(ROOT, "bench", "odin_frontier.json"), "w") as f:
        json.dump(dict(args=vars(args), results=results), f, indent=1)

    fig = Figure(figsize=(5, 3.8))
    ax = fig.subplots()
    for r in results:
        label = "plain RM" if r["length_coef"] == 0 else f"ODIN, length_coef {r['length_coef']:g}"
        ax.scatter(r["length_corr"], r["accuracy"], s=30, label=label)
    ax.axhline(results[0]["longer_wins"], ls=":", color="gray", label="longer response wins")
    ax.axvline(0, lw=0.5, color="gray")
    ax.set_xlabel("reward-length correlation (held-out responses)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(
        f"SmolLM2-135M, HH helpful-base: {args.train_pairs} train / {args.eval_pairs} eval pairs",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "bench", "odin_frontier.png"), dpi=100)
    print("wrote bench/odin_frontier.png, bench/odin_frontier.json")


if __name__ == "__main__":
    main()
