"""
The tables and the figure of bench/rl/README.md, from the rl.jsonl files run.sh copied here.

    python bench/rl/report.py          # prints the two markdown tables, writes bench/rl/rl.png

gold is the verifier's accuracy of one step's sampled answers (128 of them), so one step's
value has a standard error of about 0.04: every curve is a 5-step moving average (the KL's too),
the peak is read on it, and the end is the mean of the last 5 rows. A setting (algorithm,
reward, KL coefficient) is run with several seeds; its summary gives the mean and the standard
deviation over the seeds, and counts the seeds in which each claim of the README holds.
"""

import glob
import json
import math
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
SMOOTH = 5  # steps in the moving average the peak is read on
RISE = 0.04  # a peak this far above the start is two standard errors of a 5-step mean of gold


def smooth(values, k=SMOOTH):
    windows = [values[max(0, i - k // 2) : i + k // 2 + 1] for i in range(len(values))]
    return [sum(w) / len(w) for w in windows]


def load():
    """{setting: {seed: rows}}, a setting named as the files are, without _seed<N>."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(HERE, "*_seed*.jsonl"))):
        name = os.path.basename(path).removesuffix(".jsonl")
        setting, seed = name.rsplit("_seed", 1)
        with open(path) as f:
            runs.setdefault(setting, {})[int(seed)] = [json.loads(line) for line in f]
    return runs


def summary(rows):
    """The figures of one run: gold's start, peak (step, KL) and end, the proxy's start and end."""
    gold, kl = smooth([r["gold"] for r in rows]), smooth([r["kl"] for r in rows])
    i = max(range(len(gold)), key=gold.__getitem__)
    return dict(
        gold_start=gold[0],
        gold_peak=gold[i],
        peak_step=rows[i]["step"],
        peak_kl=kl[i],
        gold_end=sum(r["gold"] for r in rows[-SMOOTH:]) / SMOOTH,
        proxy_start=rows[0]["proxy"],
        proxy_end=sum(r["proxy"] for r in rows[-SMOOTH:]) / SMOOTH,
        final_kl=kl[-1],
        steps=rows[-1]["step"],
        time=rows[-1].get("time", float("nan")),
    )


def spread(values):
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def runs_table(runs):
    head = "| setting | seed | final KL | proxy start -> end | gold start | gold peak (step, KL) | gold end | RL loop |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for setting, seeds in runs.items():
        for seed, rows in sorted(seeds.items()):
            s = summary(rows)
            lines.append(
                f"| {setting} | {seed} | {s['final_kl']:.2f} | {s['proxy_start']:+.2f} -> "
                f"{s['proxy_end']:+.2f} | {s['gold_start']:.3f} | {s['gold_peak']:.3f} "
                f"({s['peak_step']}, {s['peak_kl']:.2f}) | {s['gold_end']:.3f} | {s['time']:.0f} s |"
            )
    return "\n".join(lines)


def settings_table(runs):
    """Mean ± standard deviation over the seeds, and in how many seeds gold rose by RISE above
    its start, and ended below its start."""
    head = (
        "| setting | seeds | gold start | gold peak | peak step | sqrt(KL) at the peak | gold end "
        "| proxy start -> end | final KL | gold rose | gold ended below its start |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for setting, seeds in runs.items():
        s = [summary(rows) for rows in seeds.values()]

        def pm(key, fmt=".3f", f=lambda v: v, s=s):
            m, sd = spread([f(x[key]) for x in s])
            return f"{m:{fmt}} ± {sd:{fmt}}"

        rose = sum(x["gold_peak"] - x["gold_start"] >= RISE for x in s)
        fell = sum(x["gold_end"] < x["gold_start"] for x in s)
        proxy = f"{pm('proxy_start', '+.2f')} -> {pm('proxy_end', '+.2f')}"
        lines.append(
            f"| {setting} | {len(s)} | {pm('gold_start')} | {pm('gold_peak')} | "
            f"{pm('peak_step', '.0f')} | {pm('peak_kl', '.2f', lambda v: math.sqrt(max(v, 0)))} | "
            f"{pm('gold_end')} | {proxy} | {pm('final_kl', '.2f')} | {rose} of {len(s)} | "
            f"{fell} of {len(s)} |"
        )
    return "\n".join(lines)


def mean_curve(seeds, key):
    """Per step: the mean over the seeds of the smoothed value, and its standard deviation."""
    curves = [smooth([r[key] for r in rows]) for rows in seeds.values()]
    n = min(len(c) for c in curves)
    return [spread([c[i] for c in curves]) for i in range(n)]


def figure(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
    for k, (setting, seeds) in enumerate(runs.items()):
        color, label = f"C{k}", f"{setting} ({len(seeds)} seeds)"
        x = [math.sqrt(max(m, 0.0)) for m, _ in mean_curve(seeds, "kl")]
        steps = list(range(len(x)))
        panels = [(ax[2], steps, "gold")]
        if setting.startswith("ppo"):  # the over-optimization panels: against sqrt(KL)
            panels += [(ax[0], x, "gold"), (ax[1], x, "proxy")]
        for a, xs, key in panels:
            curve = mean_curve(seeds, key)[: len(xs)]
            mean = [m for m, _ in curve]
            a.plot(xs, mean, color=color, lw=1.2, label=label)
            lo, hi = [m - sd for m, sd in curve], [m + sd for m, sd in curve]
            a.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)
    ax[0].set(title="PPO against a proxy: gold (verifier accuracy)", xlabel="sqrt(KL), nats^0.5")
    ax[1].set(title="PPO against a proxy: proxy reward", xlabel="sqrt(KL), nats^0.5")
    ax[2].set(title="gold against the step (every setting)", xlabel="step")
    for a in ax:
        a.legend(fontsize=7)
    fig.suptitle(
        f"mean over random seeds of {SMOOTH}-step moving averages (the KL's too); band: ± one standard "
        "deviation over the runs; x of the sqrt(KL) panels: the runs' mean KL at each step",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    runs = load()
    print(settings_table(runs))
    print()
    print(runs_table(runs))
    figure(runs, os.path.join(HERE, "rl.png"))
    print(f"wrote {os.path.join(HERE, 'rl.png')}")
