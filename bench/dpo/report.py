"""
The tables of bench/dpo/README.md, from the scores.jsonl and time.json run.sh wrote here.

    python bench/dpo/report.py          # prints the markdown tables

Each figure is an accuracy on 1,000 held-out pairs (a tie is wrong), so one run's value has a
standard error of about 0.015; a model is trained with several seeds, and a row gives the mean
and the standard deviation over them. The gaps are taken seed by seed (the explicit RM of a seed
against the DPO policy of the same seed), then summarised the same way.
"""

import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = {"in_dist": "in distribution", "long": "numbers up to 99", "mul": "multiplication"}
MODELS = {  # (model, scoring) -> the row's name
    ("dpo", "sum"): "DPO implicit reward, sum",
    ("dpo", "mean"): "DPO implicit reward, mean",
    ("dpo", "ref_free"): "DPO policy, reference-free",
    ("rm", ""): "explicit RM (--lm_coef 0)",
    ("rm_lm", ""): "explicit RM + LM term (--lm_coef 1)",
    ("sft", "ref_free"): "SFT policy, reference-free (before DPO)",
}


def load():
    with open(os.path.join(HERE, "scores.jsonl")) as f:
        return [json.loads(line) for line in f]


def spread(values):
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def shown(values, digits=3):
    mean, sd = spread(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def main():
    rows = load()
    acc = {}  # (model, scoring, set) -> {seed: accuracy}
    for r in rows:
        acc.setdefault((r["model"], r["scoring"], r["set"]), {})[r["seed"]] = r["acc"]
    seeds = sorted({r["seed"] for r in rows if r["seed"] is not None})
    print(f"Held-out accuracy, mean ± standard deviation over {len(seeds)} seeds ({seeds}):\n")
    print("| model | seeds | " + " | ".join(SETS.values()) + " |")
    print("|---|---|" + "---|" * len(SETS))
    for (model, scoring), name in MODELS.items():
        cells = [list(acc[model, scoring, s].values()) for s in SETS]
        print(f"| {name} | {len(cells[0])} | " + " | ".join(map(shown, cells)) + " |")

    print("\nGaps, seed by seed, in accuracy points (mean ± standard deviation):\n")
    print("| gap | " + " | ".join(SETS.values()) + " |")
    print("|---|" + "---|" * len(SETS))
    pairs = [
        (("rm", ""), ("dpo", "sum"), "explicit RM - DPO sum"),
        (("rm_lm", ""), ("dpo", "sum"), "explicit RM + LM - DPO sum"),
        (("dpo", "mean"), ("dpo", "sum"), "DPO mean - DPO sum"),
        (("dpo", "ref_free"), ("dpo", "sum"), "DPO reference-free - DPO sum"),
    ]
    for a, b, name in pairs:
        cells = []
        for s in SETS:
            x, y = acc[(*a, s)], acc[(*b, s)]
            cells.append(shown([100 * (x[k] - y[k]) for k in seeds], digits=1))
        print(f"| {name} | " + " | ".join(cells) + " |")

    print("\nEach seed:\n")
    print("| model | seed | " + " | ".join(SETS.values()) + " |")
    print("|---|---|" + "---|" * len(SETS))
    for (model, scoring), name in MODELS.items():
        for seed in sorted(acc[model, scoring, "in_dist"], key=lambda k: (k is not None, k)):
            cells = [f"{acc[model, scoring, s][seed]:.3f}" for s in SETS]
            print(f"| {name} | {'-' if seed is None else seed} | " + " | ".join(cells) + " |")
    path = os.path.join(HERE, "time.json")
    if os.path.exists(path):
        with open(path) as f:
            t = json.load(f)
        print(f"\nrun.sh took {t['seconds']} s for seeds {t['seeds']}, the SFT policy included.")


if __name__ == "__main__":
    main()
