"""
The tables of bench/prm/README.md, from the results.jsonl and time.json run.sh wrote here.

    python bench/prm/report.py          # prints the markdown tables

results.jsonl holds each seed's rows from nanorm/prm.py: the labels of the training solutions,
the step accuracies on the held-out solutions, and a row per N of best-of-N. A cell is the mean
± the standard deviation over the seeds; the gaps are taken seed by seed, then summarised.
"""

import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
SELECTORS = {
    "random": "N = 1 (at random)",
    "majority": "majority vote",
    "orm": "ORM",
    "prm_min": "PRM min",
    "prm_prod": "PRM product",
    "pass_at_n": "pass@N",
}
LABELS = {
    "policy_accuracy": "the policy's accuracy (final answer right)",
    "on_track": "steps on track (exact label 1)",
    "hard_agrees": "hard Math-Shepherd label = exact label",
    "soft_agrees": "soft Math-Shepherd label >= 0.5 = exact label",
    "hard_on_off_track": "hard label 1 on an off-track step (a false 'right')",
    "hard_on_on_track": "hard label 1 on an on-track step",
}
STEPS = {
    "prm": "PRM (sigmoid > 0.5)",
    "orm": "ORM's head at each step's end (> 0)",
    "always_on_track": "always 'on track' (the base rate)",
}


def load():
    with open(os.path.join(HERE, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def shown(values, digits=3):
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "-"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main():
    rows = load()
    seeds = sorted({r["seed"] for r in rows})
    one = {(r["measure"], r["seed"]): r for r in rows if r["measure"] != "best_of_n"}
    bon = {(r["n"], r["seed"]): r for r in rows if r["measure"] == "best_of_n"}
    ns = sorted({n for n, _ in bon})
    used = sorted({r["labels_used"] for r in rows})
    print(
        f"Mean ± standard deviation over {len(seeds)} seeds ({seeds}); the PRM trained on {used} labels.\n"
    )

    steps = one["labels", seeds[0]]["steps"]
    print(f"Labels of the training solutions' steps (about {steps} steps a seed):\n")
    print("| measure | value |\n|---|---|")
    for key, name in LABELS.items():
        print(f"| {name} | {shown([one['labels', s][key] for s in seeds])} |")

    steps = one["step_accuracy", seeds[0]]["steps"]
    print(f"\nStep accuracy against the exact labels, held-out solutions ({steps} steps a seed):\n")
    print("| scorer | accuracy |\n|---|---|")
    for key, name in STEPS.items():
        print(f"| {name} | {shown([one['step_accuracy', s][key] for s in seeds])} |")

    print("\nBest-of-N: the accuracy of the solution selected among N:\n")
    print("| N | " + " | ".join(SELECTORS.values()) + " |")
    print("|---|" + "---|" * len(SELECTORS))
    for n in ns:
        cells = [shown([bon[n, s][k] for s in seeds]) for k in SELECTORS]
        print(f"| {n} | " + " | ".join(cells) + " |")

    print("\nGaps, seed by seed, in accuracy points (mean ± standard deviation):\n")
    gaps = [("prm_min", "orm"), ("prm_min", "majority"), ("prm_prod", "prm_min"), ("orm", "random")]
    print("| N | " + " | ".join(f"{SELECTORS[a]} - {SELECTORS[b]}" for a, b in gaps) + " |")
    print("|---|" + "---|" * len(gaps))
    for n in ns[1:]:
        cells = [shown([100 * (bon[n, s][a] - bon[n, s][b]) for s in seeds], 1) for a, b in gaps]
        print(f"| {n} | " + " | ".join(cells) + " |")

    print("\nEach seed:\n")
    print("| seed | N | " + " | ".join(SELECTORS.values()) + " | step acc. PRM | ORM |")
    print("|---|---|" + "---|" * (len(SELECTORS) + 2))
    for s in seeds:
        acc = one["step_accuracy", s]
        for n in ns:
            cells = [f"{bon[n, s][k]:.3f}" for k in SELECTORS]
            tail = f"{acc['prm']:.3f} | {acc['orm']:.3f}" if n == ns[0] else " | "
            print(f"| {s} | {n} | " + " | ".join(cells) + f" | {tail} |")
    path = os.path.join(HERE, "time.json")
    if os.path.exists(path):
        with open(path) as f:
            t = json.load(f)
        print(f"\nrun.sh took {t['seconds']} s for seeds {t['seeds']}, the SFT policy included.")


if __name__ == "__main__":
    main()
