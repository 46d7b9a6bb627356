"""
The table and the figure of bench/rl/README.md, from the rl.jsonl files run.sh copied here.

    python bench/rl/report.py          # prints the markdown table, writes bench/rl/rl.png

gold is the verifier's accuracy of one step's sampled answers (128 of them), so one step's
value has a standard error of about 0.04: the peak is read on a 5-step moving average (of the
KL too), the end is the mean of the last 5 rows.
"""

import glob
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SMOOTH = 5  # steps in the moving average the peak is read on


def smooth(values, k=SMOOTH):
    return [
        sum(values[max(0, i - k // 2) : i + k // 2 + 1])
        / len(values[max(0, i - k // 2) : i + k // 2 + 1])
        for i in range(len(values))
    ]


def load():
    runs = {}
    for path in sorted(glob.glob(os.path.join(HERE, "*.jsonl"))):
        with open(path) as f:
            runs[os.path.basename(path).removesuffix(".jsonl")] = [json.loads(line) for line in f]
    return runs


def table(runs):
    head = "| run | algorithm | reward | KL coef | seed | steps | final KL | proxy start -> end | gold start | gold peak (step, KL) | gold end | RL loop |"
    lines = [
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for name, rs in runs.items():
        algo, reward, coef, seed = name.split("_")[:4]
        g, kl = smooth([r["gold"] for r in rs]), smooth([r["kl"] for r in rs])
        i = max(range(len(g)), key=g.__getitem__)
        end = sum(r["gold"] for r in rs[-SMOOTH:]) / SMOOTH
        lines.append(
            f"| {name} | {algo} | {reward} | {coef.removeprefix('kl')} | {seed.removeprefix('seed')} | {rs[-1]['step']} "
            f"| {rs[-1]['kl']:.2f} | {rs[0]['proxy']:+.2f} -> {rs[-1]['proxy']:+.2f} | {g[0]:.3f} "
            f"| {g[i]:.3f} ({rs[i]['step']}, {kl[i]:.2f}) | {end:.3f} | {rs[-1]['time']:.0f} s |"
        )
    return "\n".join(lines)


def figure(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
    colors = {}
    for name, rs in runs.items():
        key = name.rsplit("_", 1)[0]
        c = colors.setdefault(key, f"C{len(colors)}")
        style = "-" if name.endswith("seed0") else "--"
        x = [math.sqrt(max(k, 0.0)) for k in smooth([r["kl"] for r in rs])]
        label = key if name.endswith("seed0") else None
        if name.startswith("ppo"):
            ax[0].plot(x, smooth([r["gold"] for r in rs]), style, color=c, label=label, lw=1)
            ax[1].plot(x, smooth([r["proxy"] for r in rs]), style, color=c, label=label, lw=1)
        ax[2].plot(
            [r["step"] for r in rs],
            smooth([r["gold"] for r in rs]),
            style,
            color=c,
            label=label,
            lw=1,
        )
    ax[0].set(
        title="PPO against a proxy: gold (verifier accuracy)",
        xlabel="sqrt(KL to the reference, nats)",
    )
    ax[1].set(title="PPO against a proxy: proxy reward", xlabel="sqrt(KL to the reference, nats)")
    ax[2].set(title="gold against the step (all runs)", xlabel="step")
    for a in ax:
        a.legend(fontsize=7)
    fig.suptitle(f"{SMOOTH}-step moving averages (KL too); solid seed 0, dashed seed 1", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    runs = load()
    print(table(runs))
    figure(runs, os.path.join(HERE, "rl.png"))
    print(f"wrote {os.path.join(HERE, 'rl.png')}")
