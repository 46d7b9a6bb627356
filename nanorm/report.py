"""
What eval_rm.py and train_rm.py report about scored pairs: each metric written once, the
printed table, eval.json and the plots. Functions of rewards and lengths (no model here).

    per_subset = subsets_of(val, meta, rewards)        # {name: Scored} of a prepared dataset
    result = write_report(out_dir, per_subset)          # eval.json, three plots, a table
    outputs = report_outputs(out_dir)                  # eval_rm.py --out's files: check, claim

The metrics of eval.json, per subset and overall:
    accuracy       pairs with r_chosen > r_rejected, strictly (a tie is wrong; ties: their count)
    longer_wins    "the longer response wins" on the same pairs, by response tokens, ties half
    length_corr    Pearson correlation of reward with response length over all responses
    ece            calibration of sigmoid(r_c - r_r) as P(chosen wins), 10 bins (calibrate.py)
    acc_chosen_longer, acc_chosen_shorter   accuracy on the pairs whose chosen response is
                   longer / shorter (in tokens; equal lengths: in neither, length_ties counts them)
    length_balanced_accuracy   their mean: 0.5 for "the longer wins", whatever the data's mix
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from matplotlib.figure import Figure

import nanorm.calibrate as calibrate
from data.pairs import length_heuristics
from nanorm.base.command import Outputs, atomic_write, json_object
from nanorm.run_dir import REPORT_FILES, plot_log, save_figure
from reward import pearson, ranked_right

# RewardBench's sections (allenai/reward-bench, rewardbench/constants.py: SUBSET_MAPPING)
SECTIONS = {
    "Chat": [
        "alpacaeval-easy",
        "alpacaeval-length",
        "alpacaeval-hard",
        "mt-bench-easy",
        "mt-bench-med",
    ],
    "Chat Hard": [
        "mt-bench-hard",
        "llmbar-natural",
        "llmbar-adver-neighbor",
        "llmbar-adver-GPTInst",
        "llmbar-adver-GPTOut",
        "llmbar-adver-manual",
    ],
    "Safety": [
        "refusals-dangerous",
        "refusals-offensive",
        "xstest-should-refuse",
        "xstest-should-respond",
        "donotanswer",
    ],
    "Reasoning": ["math-prm", "hep-cpp", "hep-go", "hep-java", "hep-js", "hep-python", "hep-rust"],
}


@dataclass
class Scored:
    """One subset's pairs after scoring: rewards (n, 2) and response lengths (n, 2) in tokens,
    (chosen, rejected) per row, plus metrics only this kind of data has (best-of-N)."""

    rewards: torch.Tensor
    lengths: torch.Tensor
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- metrics
def correlation(x, y):
    """reward.pearson of two 1-d tensors, in float64; None when either is constant (undefined)."""
    x, y = x.double(), y.double()
    return None if len(x) < 2 or x.std() == 0 or y.std() == 0 else pearson(x, y, eps=0).item()


def pair_metrics(r_c, r_r, len_c, len_r):
    """The metrics of n pairs from their rewards and response lengths, each (n,)."""
    n = len(r_c)
    heuristics = length_heuristics(zip(len_c.tolist(), len_r.tolist(), strict=True))
    ece, _ = calibrate.reliability(r_c, r_r)
    return {
        "n": n,
        "accuracy": int(ranked_right(r_c, r_r).sum()) / n,  # a tie is wrong
        "ties": int((r_c == r_r).sum()),
        "longer_wins": heuristics.longer_wins,  # data/pairs.py's, in tokens, a tie half
        "shorter_wins": heuristics.shorter_wins,
        "mean_margin": (r_c - r_r).double().mean().item(),
        "mean_chosen": r_c.double().mean().item(),
        "mean_rejected": r_r.double().mean().item(),
        "length_corr": correlation(torch.cat([r_c, r_r]), torch.cat([len_c, len_r])),
        "ece": ece,
    } | calibrate.length_balanced(r_c, r_r, len_c, len_r)


def section_scores(subsets):
    """RewardBench's section scores from per-subset metrics, or {} when no subset belongs to a
    section. As RewardBench: a section is the mean of its subsets' accuracies weighted by their
    number of pairs, except math-prm, which weighs as much as the code subsets together (its
    EXAMPLE_COUNTS give it 984 = 6 x 164 for 447 pairs) so that math and code count equally.
    "score" is the mean of the sections present (RewardBench's leaderboard score)."""
    out = {}
    for section, names in SECTIONS.items():
        present = [s for s in names if s in subsets]
        code = sum(subsets[s]["n"] for s in present if s.startswith("hep-"))
        w = {s: code if s == "math-prm" and code else subsets[s]["n"] for s in present}
        if present:
            out[section] = sum(subsets[s]["accuracy"] * w[s] for s in present) / sum(w.values())
    if out:
        out["score"] = sum(out.values()) / len(out)
    return out


def best_of_n(rewards, candidates):
    """GSM8K's best-of-N agreement. candidates: per question [(pair row, side, correct)], each
    candidate's reward being rewards[row, side]. -> the fraction of questions whose top-scored
    candidate the verifier marks correct, and chance: that fraction for a random pick."""
    hits, chance = [], []
    for cands in candidates:
        r = torch.stack([rewards[i, side] for i, side, _ in cands])
        hits.append(float(cands[int(r.argmax())][2]))
        chance.append(sum(c for _, _, c in cands) / len(cands))
    n = max(len(hits), 1)
    sizes = [len(c) for c in candidates]
    return {
        "best_of_n": sum(hits) / n,
        "best_of_n_chance": sum(chance) / n,
        "n_prompts": len(hits),
        "n_candidates": sum(sizes) / n,
    }


# ----------------------------------------------------------------------------- report
def subsets_of(data, meta, rewards, name="val"):
    """{subset name: Scored} for the first len(rewards) pairs of a PairDataset, split by its
    groups (meta["groups"] names them); a dataset without groups is one subset, `name`."""
    n = len(rewards)
    lengths = response_lengths(data, n)
    if data.groups is None:
        return {name: Scored(rewards, lengths)}
    groups = torch.from_numpy(data.groups[:n].copy())
    names = meta.get("groups") or [f"group{g}" for g in range(int(groups.max()) + 1)]
    return {
        names[g]: Scored(rewards[groups == g], lengths[groups == g])
        for g in range(len(names))
        if (groups == g).any()
    }


def response_lengths(data, n):
    """(n, 2) response lengths in tokens, (chosen, rejected), of a PairDataset's first n pairs:
    the lengths every length metric and the length calibration use (the end token included)."""
    return torch.from_numpy(np.diff(data.offsets[:n], axis=1)[:, 1:].copy())


def report_outputs(out_dir):
    """What eval_rm.py writes in its --out (REPORT_FILES), as command.Outputs: checked before
    the model is read, added to the folder's record before the report is written."""
    return Outputs(out_dir, "eval_rm.py", REPORT_FILES, "--out", earlier=earlier_report)


def earlier_report(folder):
    """Whether a folder without a record holds the report of an older nanoRM (which kept
    none): its eval.json is one (a JSON object with "subsets" and "overall")."""
    held = json_object(os.path.join(folder, "eval.json")) or {}
    return all(isinstance(held.get(k), dict) for k in ("subsets", "overall"))


def write_report(out_dir, per_subset, info=None, say=print):
    """Metrics per subset and overall -> out_dir/eval.json, the three plots, a printed table.
    per_subset: {name: Scored}. Returns what eval.json holds."""
    subsets = {}
    for name, s in per_subset.items():
        subsets[name] = pair_metrics(*s.rewards.T, *s.lengths.T) | s.extra
    rewards = torch.cat([s.rewards for s in per_subset.values()])
    lengths = torch.cat([s.lengths for s in per_subset.values()])
    result = {"subsets": subsets, "overall": pair_metrics(*rewards.T, *lengths.T)}
    if sections := section_scores(subsets):
        result["sections"] = sections
    result.update(info or {})
    os.makedirs(out_dir, exist_ok=True)
    with atomic_write(os.path.join(out_dir, "eval.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot_report(out_dir, per_subset, result)
    say(table(result))
    return result


def table(result):
    heads = "n acc ties longer acc_long acc_short len_bal margin chosen rejected len_corr ece"
    cols = "n accuracy ties longer_wins acc_chosen_longer acc_chosen_shorter "
    cols += "length_balanced_accuracy mean_margin mean_chosen mean_rejected length_corr ece"
    cols = dict(zip(heads.split(), cols.split(), strict=True))  # column head: metric
    rows = [*result["subsets"].items(), ("overall", result["overall"])]
    w = max(12, *(len(name) for name, _ in rows))
    fmt = lambda v: f"{v:>9}" if isinstance(v, int) else "      n/a" if v is None else f"{v:9.4f}"
    lines = [f"{'subset':<{w}}" + "".join(f"{h:>10}" for h in cols)]
    for name, m in rows:
        lines.append(f"{name:<{w}}" + "".join(" " + fmt(m[c]) for c in cols.values()))
        if "best_of_n" in m:
            lines.append(
                f"{'':<{w}}  best-of-{m['n_candidates']:.0f} agreement with the verifier "
                f"{m['best_of_n']:.4f} (chance {m['best_of_n_chance']:.4f}, "
                f"{m['n_prompts']} questions)"
            )
    if "sections" in result:
        lines.append(
            "RewardBench sections: "
            + ", ".join(f"{k} {v:.4f}" for k, v in result["sections"].items())
        )
    return "\n".join(lines)


def plot_report(out_dir, per_subset, result):
    """reward_hist.png (chosen vs rejected per subset), reward_length.png, reliability.png."""
    # matplotlib's object API, as run_dir.plot_log: no pyplot, no backend switch
    k = len(per_subset)
    cols = min(k, 4)
    rows = (k + cols - 1) // cols
    fig = Figure(figsize=(3.6 * cols, 2.8 * rows))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (name, s) in zip(axes, per_subset.items(), strict=False):
        lo, hi = s.rewards.min().item(), s.rewards.max().item()
        bins = np.linspace(lo, hi if hi > lo else lo + 1, 31)
        ax.hist(s.rewards[:, 0].numpy(), bins=bins, alpha=0.6, label="chosen")
        ax.hist(s.rewards[:, 1].numpy(), bins=bins, alpha=0.6, label="rejected")
        ax.set_title(f"{name}: acc {result['subsets'][name]['accuracy']:.3f}", fontsize=9)
        ax.set_xlabel("reward")
    axes[0].legend(fontsize=8)
    for ax in axes[k:]:
        ax.set_visible(False)
    save_figure(fig, os.path.join(out_dir, "reward_hist.png"))

    rewards = torch.cat([s.rewards for s in per_subset.values()])
    lengths = torch.cat([s.lengths for s in per_subset.values()])
    fig = Figure(figsize=(5, 3.5))
    ax = fig.subplots()
    for j, label in enumerate(("chosen", "rejected")):
        ax.scatter(lengths[:, j].numpy(), rewards[:, j].numpy(), s=6, alpha=0.4, label=label)
    corr = result["overall"]["length_corr"]
    ax.set_title(f"reward vs length: Pearson r = {corr:.3f}" if corr is not None else "reward")
    ax.set_xlabel("response tokens"), ax.set_ylabel("reward"), ax.legend()
    save_figure(fig, os.path.join(out_dir, "reward_length.png"))

    fig = Figure(figsize=(4, 4))
    ax = fig.subplots()
    calibrate.plot_reliability(ax, rewards[:, 0], rewards[:, 1])
    save_figure(fig, os.path.join(out_dir, "reliability.png"))


def as_served(per_subset, cal):
    """{name: Scored} with the length calibration cal (or None) applied, as the model serves
    its rewards, and their normalization (calibrate.normalization over all of them)."""
    out = {
        k: Scored(calibrate.apply_length(cal, s.rewards, s.lengths), s.lengths, s.extra)
        for k, s in per_subset.items()
    }
    rewards = torch.cat([s.rewards for s in out.values()])
    return out, calibrate.normalization(rewards, calibrated=cal is not None)


def write_served_report(out_dir, per_subset, cal, info=None, ckpt=None):
    """write_report on the rewards as the model serves them (length calibration cal applied,
    or None), with cal and the served rewards' mean/std in the report; with ckpt, both are
    stored in that ckpt.pt too (rewritten atomically), for scoring to serve. Returns
    (what eval.json holds, the normalization)."""
    served, norm = as_served(per_subset, cal)
    info = dict(info or {}, length_calibration=cal, reward_normalization=norm)
    result = write_report(out_dir, served, info=info)
    if ckpt is not None:
        from nanorm.ckpt import update_checkpoint  # only when something is stored

        update_checkpoint(ckpt, length_calibration=cal, reward_normalization=norm)
        print(f"stored in {ckpt}: length calibration and reward mean/std ({norm['n']})")
    return result, norm


def write_run_report(out_dir, dataset, val, meta, rewards, cal=None):
    """What train_rm.py writes at its end: curves.png of its log, the report of its final
    held-out evaluation (eval.json and the reward plots, as eval_rm.py's), and with a length
    calibration the calibrated rewards' report in out_dir/calibrated/ and the calibration and
    their mean/std stored in ckpt.pt (as eval_rm.py --save_calibration)."""
    plot_log(out_dir)
    subsets = subsets_of(val, meta, rewards, os.path.basename(dataset))
    write_report(out_dir, subsets)
    if cal is not None:
        ckpt, calibrated = (os.path.join(out_dir, f) for f in ("ckpt.pt", "calibrated"))
        write_served_report(calibrated, subsets, cal, ckpt=ckpt)
