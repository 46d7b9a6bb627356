"""
The tables and the figure of bench/ensemble/README.md, from the files run.sh kept here:
ppo_<setting>_seed<N>.jsonl (nanorm.rl's rl.jsonl) and best_of_n_seed<N>.json (nanorm.ensemble).

    python bench/ensemble/report.py      # prints the markdown tables, writes ensemble.png

PPO curves are read as bench/rl/report.py reads them: gold (the verifier's accuracy of one
step's answers) on a 5-step moving average, the KL too; the peak on it; the end the mean of the
last 5 rows; the fall = peak - end. The share of K = 1's fall a rule removes is taken per seed
(the seed seeds both runs), (fall_K1 - fall_rule) / fall_K1. Gao et al.'s fits are made per
seed and given as mean +- std over the seeds: best-of-N's gold gain over N = 1 against
d = sqrt(log N - (N - 1) / N) with R = d (alpha - beta d); PPO's gold gain over its start
against d = sqrt(KL) at every step with R = d (alpha - beta log d).
"""

import glob
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # the project root
from nanorm.base.command import atomic_write  # noqa: E402
from nanorm.ensemble import gao_fit  # noqa: E402

SMOOTH = 5
PPO = ("k1", "k5_mean", "k5_min", "k5_mean_minus_std")  # the order of the tables
BON = ("one", "mean", "min", "mean_minus_std", "mean_minus_2std")


def smooth(values, k=SMOOTH):
    windows = [values[max(0, i - k // 2) : i + k // 2 + 1] for i in range(len(values))]
    return [sum(w) / len(w) for w in windows]


def pm(values, fmt=".3f"):
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


def load_ppo():
    runs = {}
    for path in sorted(glob.glob(os.path.join(HERE, "ppo_*_seed*.jsonl"))):
        setting, seed = os.path.basename(path)[4:-6].rsplit("_seed", 1)
        with open(path) as f:
            runs.setdefault(setting, {})[int(seed)] = [json.loads(line) for line in f]
    return runs


def load_bon():
    out = {}
    for path in sorted(glob.glob(os.path.join(HERE, "best_of_n_seed*.json"))):
        with open(path) as f:
            res = json.load(f)
        out[res["seed"]] = res
    return out


def summary(rows):
    gold, kl = smooth([r["gold"] for r in rows]), smooth([r["kl"] for r in rows])
    i = max(range(len(gold)), key=gold.__getitem__)
    end = sum(r["gold"] for r in rows[-SMOOTH:]) / SMOOTH
    end_kl = sum(r["kl"] for r in rows[-SMOOTH:]) / SMOOTH
    d = [math.sqrt(max(r["kl"], 0.0)) for r in rows]
    alpha, beta, rmse = gao_fit(d, [r["gold"] - gold[0] for r in rows], "rl")
    return dict(
        start=gold[0],
        peak=gold[i],
        peak_step=rows[i]["step"],
        peak_d=math.sqrt(max(kl[i], 0.0)),
        end=end,
        end_d=math.sqrt(max(end_kl, 0.0)),
        fall=gold[i] - end,
        proxy_end=sum(r["proxy"] for r in rows[-SMOOTH:]) / SMOOTH,
        alpha=alpha,
        beta=beta,
        rmse=rmse,
        curve=(smooth([math.sqrt(max(k, 0.0)) for k in kl]), gold),
    )


def gold_at(curve, d):
    """A run's smoothed gold at the first step its smoothed sqrt(KL) reaches d (else its last)."""
    ds, gold = curve
    return next((g for x, g in zip(ds, gold, strict=True) if x >= d), gold[-1])


def bon_summary(res, name):
    gold = res["gold"][name]
    d = [math.sqrt(k) for k in res["kl"]]
    alpha, beta, rmse = gao_fit(d, [g - gold[0] for g in gold], "bon")
    i = max(range(len(gold)), key=gold.__getitem__)
    return dict(
        g1=gold[0],
        g4=gold[3],
        g16=gold[15],
        g64=gold[-1],
        peak=gold[i],
        peak_n=i + 1,
        fall=gold[i] - gold[-1],
        alpha=alpha,
        beta=beta,
        rmse=rmse,
    )


def main():
    ppo, bon = load_ppo(), load_bon()
    S = {s: {seed: summary(rows) for seed, rows in runs.items()} for s, runs in ppo.items()}
    B = {name: {seed: bon_summary(r, name) for seed, r in bon.items()} for name in BON}
    col = lambda table, key: [v[key] for v in table.values()]

    print(f"## Best-of-N ({len(bon)} seeds: mean ± std)\n")
    if bon:
        any_res = next(iter(bon.values()))
        print(f"{any_res['questions']} held-out questions x {any_res['samples']} answers each.\n")
        print("| selector | gold N=1 | N=4 | N=16 | N=64 | peak (N) | fall peak -> 64 |")
        print("|---|---|---|---|---|---|---|")
        for name in BON:
            b = B[name]
            print(
                f"| {name} | {pm(col(b, 'g1'))} | {pm(col(b, 'g4'))} | {pm(col(b, 'g16'))} | "
                f"{pm(col(b, 'g64'))} | {pm(col(b, 'peak'))} ({pm(col(b, 'peak_n'), '.0f')}) | "
                f"{pm(col(b, 'fall'))} |"
            )
        print("\nEach member alone, gold at N = 64, and its held-out pairwise accuracy:\n")
        print("| member | gold N=64 | val accuracy |")
        print("|---|---|---|")
        for k in range(len(any_res["member_alone"])):
            g = [r["member_alone"][k][-1] for r in bon.values()]
            acc = any_res["member_val_accuracy"][k]
            print(f"| {k} | {pm(g)} | {acc:.3f} |")
        print("\nGold at N = 64 with the first K members:\n")
        print(
            "| rule | "
            + " | ".join(f"K={k + 1}" for k in range(len(any_res["member_alone"])))
            + " |"
        )
        print("|---|" + "---|" * len(any_res["member_alone"]))
        for name in any_res["by_k"]:
            cells = [
                pm([r["by_k"][name][k] for r in bon.values()])
                for k in range(len(any_res["by_k"][name]))
            ]
            print(f"| {name} | " + " | ".join(cells) + " |")
        print("\nGao's best-of-N fit, R(d) = d (alpha - beta d), per seed:\n")
        print("| selector | alpha | beta | RMSE |")
        print("|---|---|---|---|")
        for name in BON:
            b = B[name]
            print(
                f"| {name} | {pm(col(b, 'alpha'))} | {pm(col(b, 'beta'))} | "
                f"{pm(col(b, 'rmse'), '.4f')} |"
            )

    print(f"\n## PPO ({', '.join(f'{s}: {len(r)} seeds' for s, r in sorted(ppo.items()))})\n")
    print(
        "| setting | gold start | peak | sqrt(KL) at peak | end | sqrt(KL) at end | fall | "
        "fall removed vs K=1 | K=1's gold at the end's sqrt(KL) | proxy end |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    settings = [s for s in PPO if s in S]
    for s in settings:
        t = S[s]
        removed = matched = ""
        if s != "k1" and "k1" in S:
            same_kl = [gold_at(S["k1"][x]["curve"], t[x]["end_d"]) for x in t if x in S["k1"]]
            matched = pm(same_kl)
            share = [
                (S["k1"][seed]["fall"] - t[seed]["fall"]) / S["k1"][seed]["fall"]
                for seed in t
                if seed in S["k1"] and S["k1"][seed]["fall"] > 0
            ]
            removed = pm(share, ".2f") if share else ""
        print(
            f"| {s} | {pm(col(t, 'start'))} | {pm(col(t, 'peak'))} | {pm(col(t, 'peak_d'), '.2f')} "
            f"| {pm(col(t, 'end'))} | {pm(col(t, 'end_d'), '.2f')} | {pm(col(t, 'fall'))} | "
            f"{removed} | {matched} | {pm(col(t, 'proxy_end'), '.2f')} |"
        )
    print("\nEach run:\n")
    print("| setting | seed | start | peak (step, sqrt KL) | end (sqrt KL) | fall |")
    print("|---|---|---|---|---|---|")
    for s in settings:
        for seed, v in sorted(S[s].items()):
            print(
                f"| {s} | {seed} | {v['start']:.3f} | {v['peak']:.3f} ({v['peak_step']}, "
                f"{v['peak_d']:.2f}) | {v['end']:.3f} ({v['end_d']:.2f}) | {v['fall']:.3f} |"
            )
    print("\nGao's RL fit, R(d) = d (alpha - beta log d), per seed:\n")
    print("| setting | alpha | beta | RMSE |")
    print("|---|---|---|---|")
    for s in settings:
        t = S[s]
        print(
            f"| {s} | {pm(col(t, 'alpha'))} | {pm(col(t, 'beta'))} | {pm(col(t, 'rmse'), '.4f')} |"
        )
    claims(S, B, bon)
    plot(ppo, bon, B)


def claims(S, B, bon):
    """Counts of the seeds on which each README claim holds."""
    print("\n## Seeds on which each comparison holds\n")
    if "k1" in S:
        for s in PPO[1:]:
            if s in S:
                seeds = [x for x in S[s] if x in S["k1"]]
                less = sum(S[s][x]["fall"] < S["k1"][x]["fall"] for x in seeds)
                higher = sum(S[s][x]["end"] > S["k1"][x]["end"] for x in seeds)
                at_kl = sum(
                    S[s][x]["end"] > gold_at(S["k1"][x]["curve"], S[s][x]["end_d"]) for x in seeds
                )
                closer = sum(S[s][x]["end_d"] < S["k1"][x]["end_d"] for x in seeds)
                print(
                    f"- PPO {s}: fall smaller than K=1's in {less} of {len(seeds)}; "
                    f"end gold higher in {higher} of {len(seeds)}; higher than K=1's gold at "
                    f"the same sqrt(KL) in {at_kl} of {len(seeds)}; ends at a smaller KL in "
                    f"{closer} of {len(seeds)}"
                )
    if bon:
        for name in BON[1:]:
            better = sum(B[name][x]["g64"] > B["one"][x]["g64"] for x in bon)
            less = sum(B[name][x]["fall"] < B["one"][x]["fall"] for x in bon)
            print(
                f"- best-of-64 {name}: gold above one member's in {better} of {len(bon)}; "
                f"fall from its peak smaller in {less} of {len(bon)}"
            )


def plot(ppo, bon, B):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 4))
    ax_bon, ax_ppo, ax_k = fig.subplots(1, 3)
    for j, name in enumerate(BON):
        if not bon:
            break
        d = [math.sqrt(k) for k in next(iter(bon.values()))["kl"]]
        gold = [statistics.mean(r["gold"][name][i] for r in bon.values()) for i in range(len(d))]
        ax_bon.plot(d, gold, color=f"C{j}", label=name)
        a = statistics.mean(col["alpha"] for col in B[name].values())
        b = statistics.mean(col["beta"] for col in B[name].values())
        ax_bon.plot(d, [gold[0] + x * (a - b * x) for x in d], color=f"C{j}", ls=":")
    ax_bon.set_xlabel("sqrt(KL), KL = log N - (N-1)/N")
    ax_bon.set_ylabel("gold (verifier accuracy)")
    ax_bon.set_title("best-of-N from the SFT policy (dotted: Gao fit)", fontsize=9)
    ax_bon.legend(fontsize=7)
    for j, s in enumerate(PPO):
        for i, rows in enumerate(ppo.get(s, {}).values()):
            d = [math.sqrt(max(k, 0.0)) for k in smooth([r["kl"] for r in rows])]
            gold = smooth([r["gold"] for r in rows])
            ax_ppo.plot(d, gold, color=f"C{j}", alpha=0.7, label=s if i == 0 else None)
    ax_ppo.set_xlabel("sqrt(KL to the SFT policy), nats")
    ax_ppo.set_ylabel("gold, 5-step moving average")
    ax_ppo.set_title("PPO against one proxy or an ensemble of 5 (each seed)", fontsize=9)
    ax_ppo.legend(fontsize=7)
    if bon:
        by_k = next(iter(bon.values()))["by_k"]
        for j, name in enumerate(by_k):
            K = range(1, len(by_k[name]) + 1)
            g = [statistics.mean(r["by_k"][name][k - 1] for r in bon.values()) for k in K]
            ax_k.plot(K, g, marker="o", color=f"C{j + 1}", label=name)
        ax_k.set_xlabel("K, members")
        ax_k.set_ylabel("gold of best-of-64")
        ax_k.set_title("best-of-64 against the ensemble's size", fontsize=9)
        ax_k.legend(fontsize=7)
    fig.tight_layout()
    with atomic_write(os.path.join(HERE, "ensemble.png")) as f:
        fig.savefig(f, dpi=100, format="png")


if __name__ == "__main__":
    main()
