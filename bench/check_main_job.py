"""
The README's claim about its main job (`python train_rm.py`), checked on a finished run's folder:
what holds on every CPU it was measured on, under every kernel path (see bench/README.md, "The
main job on any CPU"), not one machine's digits.

    python train_rm.py && python bench/check_main_job.py out
    ATEN_CPU_CAPABILITY=avx2 python train_rm.py --out_dir out/avx2 && python bench/check_main_job.py out/avx2

Exit status 1, with the figure that missed, if a claim does not hold.
"""

import json
import os
import sys

HELD_OUT_ACC = 0.95  # held-out accuracy at the end: at least this (measured 0.975-0.999)
LONGER_WINS = (
    0.454  # the "longer response wins" baseline of the built-in data (a property of the data)
)
LOSS_BY = (500, 0.6)  # the held-out pairwise loss is below 0.6 by step 500


def main(out_dir):
    with open(os.path.join(out_dir, "eval.json")) as f:
        overall = json.load(f)["overall"]
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if r["split"] == "eval"]
    step, bound = LOSS_BY
    early = [r["loss"] for r in evals if r["step"] <= step]
    problems = []
    if overall["accuracy"] < HELD_OUT_ACC:
        problems.append(f"held-out accuracy {overall['accuracy']:.4f} is below {HELD_OUT_ACC}")
    if abs(overall["longer_wins"] - LONGER_WINS) > 0.001:
        problems.append(f"'longer wins' {overall['longer_wins']:.4f}, the data's is {LONGER_WINS}")
    if not early or min(early) >= bound:
        problems.append(f"held-out loss {min(early, default=float('nan')):.4f} by step {step}")
    for p in problems:
        print(f"{out_dir}: the main job's claim fails: {p}")
    if not problems:
        print(f"{out_dir}: held-out accuracy {overall['accuracy']:.4f} >= {HELD_OUT_ACC}; loss below "
              f"{bound} by step {step}; 'longer wins' {overall['longer_wins']:.3f}")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "out"))
