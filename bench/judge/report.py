"""
The tables of bench/judge/README.md, from the scores.jsonl and time.json run.sh wrote here.

    python bench/judge/report.py        # prints the markdown tables

Each figure is measured on 1,000 held-out pairs (a tie is wrong), so one run's accuracy has a
standard error of about 0.015; a fine-tuned model is trained with several seeds, and a row gives
the mean and the standard deviation over them (a zero-shot judge is the one SFT policy: one
value). The gaps are taken seed by seed (a judge of a seed against the reward model of the same
seed), then summarised the same way.
"""

import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = {"in_dist": "in distribution", "long": "numbers up to 99", "mul": "multiplication"}
MODELS = {
    "rm": "pairwise RM (train_rm.py --lm_coef 0)",
    "yes_no_zero": "Yes/No judge, zero-shot",
    "yes_no_tuned": "Yes/No judge, fine-tuned",
    "a_b_zero": "A/B judge, zero-shot (both orders)",
    "a_b_tuned": "A/B judge, fine-tuned (both orders)",
}
YES_NO = {"pointwise": "pointwise accuracy", "yes_rate": "share of rows judged Yes"}
A_B = {
    "acc_right_first": "accuracy, right answer shown first",
    "acc_right_second": "accuracy, right answer shown second",
    "consistency": "consistency (same pick in both orders)",
    "first_rate": "first-position rate (0.5: no bias)",
}


def load():
    with open(os.path.join(HERE, "scores.jsonl")) as f:
        return [json.loads(line) for line in f]


def shown(values, digits=3):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def table(head, lines):
    print(f"| {head} | seeds | " + " | ".join(SETS.values()) + " |")
    print("|---|---|" + "---|" * len(SETS))
    for name, cells in lines:
        print(f"| {name} | {len(cells[0])} | " + " | ".join(map(shown, cells)) + " |")


def main():
    v = {}  # (model, metric, set) -> {seed: value}
    for r in load():
        v.setdefault((r["model"], r["metric"], r["set"]), {})[r["seed"]] = r["value"]
    seeds = sorted({s for d in v.values() for s in d if s is not None})

    def cells(model, metric):
        return [list(v[model, metric, s].values()) for s in SETS]

    print(f"Pairwise accuracy, mean ± standard deviation over {len(seeds)} seeds ({seeds}):\n")
    table("model", [(name, cells(m, "acc")) for m, name in MODELS.items()])

    print("\nGaps, seed by seed, in accuracy points (mean ± standard deviation):\n")
    print("| gap | " + " | ".join(SETS.values()) + " |")
    print("|---|" + "---|" * len(SETS))
    for a, b, name in (
        ("yes_no_tuned", "rm", "Yes/No judge - pairwise RM"),
        ("a_b_tuned", "rm", "A/B judge - pairwise RM"),
        ("yes_no_tuned", "a_b_tuned", "Yes/No judge - A/B judge"),
    ):
        gap = [[100 * (v[a, "acc", s][k] - v[b, "acc", s][k]) for k in seeds] for s in SETS]
        print(f"| {name} | " + " | ".join(shown(g, digits=1) for g in gap) + " |")

    print("\nThe Yes/No judge read pointwise (Yes when p('Y') > p('N')):\n")
    lines = [(f"{MODELS[m]}: {name}", cells(m, k)) for m in ("yes_no_zero", "yes_no_tuned")
             for k, name in YES_NO.items()]  # fmt: skip
    table("judge: metric", lines)

    print("\nPosition bias of the A/B judge, every pair shown in both orders:\n")
    lines = [(f"{MODELS[m].split(' (')[0]}: {name}", cells(m, k)) for m in ("a_b_zero", "a_b_tuned")
             for k, name in A_B.items()]  # fmt: skip
    table("judge: metric", lines)

    print("\nEach seed (pairwise accuracy; the A/B judge's first-position rate):\n")
    print("| model | seed | " + " | ".join(SETS.values()) + " |")
    print("|---|---|" + "---|" * len(SETS))
    rows = [(m, "acc", name) for m, name in MODELS.items()]
    rows.append(("a_b_tuned", "first_rate", "A/B judge, fine-tuned: first-position rate"))
    for model, metric, name in rows:
        for seed in sorted(v[model, metric, "in_dist"], key=lambda k: (k is not None, k)):
            values = [f"{v[model, metric, s][seed]:.3f}" for s in SETS]
            print(f"| {name} | {'-' if seed is None else seed} | " + " | ".join(values) + " |")
    path = os.path.join(HERE, "time.json")
    if os.path.exists(path):
        with open(path) as f:
            t = json.load(f)
        print(f"\nrun.sh took {t['seconds']} s for seeds {t['seeds']}, the SFT policy included.")


if __name__ == "__main__":
    main()
