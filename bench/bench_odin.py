"""
Length under control on the HH recipe: held-out accuracy, length-balanced accuracy and
reward-length correlation of the plain reward model, its post-hoc length calibration, and ODIN's
length head over --length_coef and batch size, per HH-RLHF subset.

    nice -n 19 python bench/bench_odin.py                       # all settings, ~11 min each
    nice -n 19 python bench/bench_odin.py --only plain odin0.1   # some of them
    python bench/bench_odin.py --reuse                           # only tabulate and plot the runs done

Each setting is one run of bench/recipes/hh_smollm2.sh (SmolLM2-135M-Instruct, one reward model for
the four shared HH-RLHF subsets, 800 training pairs per subset, the top 4 layers trained from
the frozen layers' cache) at configuration C of the README (2 epochs, lr 5e-5, head lr 1e-3),
with --calibrate_length, so every run also yields its calibrated rewards (OUT/calibrated/). The
held-out part is the recipe's: 1,699 pairs, 20% of each subset. Writes bench/odin_frontier.json
(every run's per-subset metrics) and bench/odin_frontier.png (accuracy and length-balanced
accuracy against the correlation, overall), and prints the table the README shows.

ODIN's correlation term is estimated over the responses of one micro-batch, so the batch size
is a setting of its own here (32 pairs: 64 responses per estimate, against 16 at 8 pairs).
One seed each: with ~400 held-out pairs per subset a difference of 0.03 is about one binomial
standard deviation (0.025); the overall figures (1,699 pairs) are good to about 0.012.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from matplotlib.figure import Figure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: (pairs per batch, length_coef or None for the plain reward model)
SETTINGS = {
    "plain": (8, None),
    "odin1": (8, 1.0),
    "odin0.1": (8, 0.1),
    "odin1-b32": (32, 1.0),
    "odin0.03": (8, 0.03),
    "odin0.3-b32": (32, 0.3),
}
RECIPE = dict(EPOCHS="2", LR="5e-5", HEAD_LR="1e-3", CALIBRATE="true")
KEYS = ("accuracy", "length_balanced_accuracy", "acc_chosen_longer", "acc_chosen_shorter")


def run(name, out):
    batch, coef = SETTINGS[name]
    extra = "" if coef is None else f"--length_head --length_coef {coef:g}"
    env = dict(os.environ, **RECIPE, OUT=out, BATCH=str(batch), EXTRA=extra)
    with open(f"{out}.log", "w") as log:
        cmd = ["nice", "-n", "19", "bash", "bench/recipes/hh_smollm2.sh"]
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)


def rows_of(name, out):
    """One row per (model, subset): the run as trained, and its calibrated rewards."""
    rows = []
    for model, path in (("as trained", "eval.json"), ("calibrated", "calibrated/eval.json")):
        path = os.path.join(out, path)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            res = json.load(f)
        for subset, m in {**res["subsets"], "overall": res["overall"]}.items():
            row = dict(setting=name, model=model, subset=subset, n=m["n"])
            row.update({k: m[k] for k in KEYS}, length_corr=m["length_corr"])
            rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--only", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    p.add_argument("--out", default="out/odin", help="one folder per setting in here")
    p.add_argument("--reuse", action="store_true", help="run nothing: tabulate what exists")
    args = p.parse_args()
    rows, seconds = [], {}
    for name in args.only:
        out = os.path.join(ROOT, args.out, name)
        done = os.path.exists(os.path.join(out, "eval.json"))
        if not args.reuse and not done:
            t0 = time.time()
            run(name, out)
            seconds[name] = round(time.time() - t0)
        rows += rows_of(name, out)
    if not rows:
        sys.exit(f"no finished run under {args.out}: run without --reuse first")
    with open(os.path.join(ROOT, "bench", "odin_frontier.json"), "w") as f:
        json.dump(dict(settings=SETTINGS, recipe=RECIPE, seconds=seconds, rows=rows), f, indent=1)
    print(table(rows))
    plot(rows)


def table(rows):
    fmt = lambda v: "  n/a" if v is None else f"{v:5.3f}" if v >= 0 else f"{v:+5.2f}"
    lines = [f"{'setting':12s} {'model':10s} {'subset':26s} acc   len_bal longer shorter corr"]
    for r in rows:
        vals = " ".join(fmt(r[k]) for k in (*KEYS, "length_corr"))
        lines.append(f"{r['setting']:12s} {r['model']:10s} {r['subset']:26s} {vals}")
    return "\n".join(lines)


def plot(rows):
    """Overall accuracy and length-balanced accuracy against the reward-length correlation."""
    fig = Figure(figsize=(10, 3.8))
    for ax, key in zip(fig.subplots(1, 2), KEYS[:2], strict=True):
        for r in (r for r in rows if r["subset"] == "overall"):  # a color per setting
            marker = "s" if r["model"] == "calibrated" else "o"  # squares: calibrated
            label = r["setting"] + (" + calibration" if r["model"] == "calibrated" else "")
            color = f"C{list(SETTINGS).index(r['setting'])}"
            ax.scatter(r["length_corr"], r[key], s=36, marker=marker, color=color, label=label)
        ax.axvline(0, lw=0.5, color="gray")
        ax.axvspan(-0.1, 0.1, color="green", alpha=0.06)  # the aim: |corr| <= 0.1
        ax.set_xlabel("reward-length correlation (held-out responses)")
        ax.set_ylabel(key.replace("_", " "))
        ax.set_title(f"SmolLM2-135M, HH-RLHF (4 subsets): {key}", fontsize=9)
    fig.axes[1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "bench", "odin_frontier.png"), dpi=100)
    print("wrote bench/odin_frontier.png, bench/odin_frontier.json")


if __name__ == "__main__":
    main()
