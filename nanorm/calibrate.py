"""
Calibration of a reward after training: whether its pair probabilities mean what they say
(reliability, ECE), how far its accuracy rests on response length, a post-hoc correction of its
length dependence, and the statistics that give it a known scale. Functions of rewards and
lengths (torch only), so reward.py and eval_rm.py share them without importing each other; the
command that fits and stores them is eval_rm.py's:

    nice -n 19 python eval_rm.py --ckpt out/x/ckpt.pt --data data/hh_rlhf/smollm2-helpful-base \
        --out out/x/eval_cal --calibrate_length --save_calibration   # fit, report, store in ckpt
    python eval_rm.py --ckpt out/x/ckpt.pt --data DIR --out D --calibrate_length false  # raw
    python -m nanorm.score --ckpt out/x/ckpt.pt --prompt "Hi" --response "Hello" --normalize

Length-balanced accuracy. Accuracy on the pairs whose chosen response is longer and on those
whose chosen is shorter, and their mean: a model that always prefers the longer response scores
1 and 0, mean 0.5, however often the longer answer is the chosen one. Pairs of equal length (in
tokens) belong to neither group; they are counted (length_ties) and left out.

Length calibration (after Huang et al. 2024, arXiv 2409.17407, which fits the reward's length
dependence post hoc and subtracts it): a least-squares line of reward on log(response tokens)
over the chosen and rejected responses of the TRAINING pairs,

    r_calibrated = r - (a + b * log L),        stored as {"kind": "linear_log_length", "coef": [a, b]}

Why this model: two numbers any consumer can apply; log L because the effect of length is
concave (the 10th token added says more than the 500th) and one outlier of 2,000 tokens should
not set the slope; one line cannot overfit 3,800 responses. The paper's locally weighted
regression follows curvature better but must store its training points. Subtracting a length
term that the data explains also removes whatever true quality goes with length (on
helpful-base the better answer is longer 60% of the time): it trades accuracy for a reward the
policy cannot raise by writing more; measure both (eval_rm.py reports before and after).

Normalization: the mean and standard deviation of the rewards on held-out pairs, chosen and
rejected responses together, after the calibration when one is stored ("calibrated" says
which), so (r - mean) / std has mean 0 and std 1 on that data, as OpenRLHF stores its reward
mean and std with the model.
"""

import torch

from reward import ranked_right

KIND = "linear_log_length"


# ----------------------------------------------------------------------------- the metrics
def length_balanced(r_c, r_r, len_c, len_r):
    """{acc_chosen_longer, acc_chosen_shorter, length_balanced_accuracy, length_ties} of n pairs
    (rewards and response lengths, each (n,)); a reward tie is wrong, as in eval_rm's accuracy.
    A group without pairs: None (and so is the balanced mean), not a made-up number."""
    right = ranked_right(r_c, r_r)
    acc = lambda sel: right[sel].double().mean().item() if sel.any() else None
    longer, shorter = acc(len_c > len_r), acc(len_c < len_r)
    both = None if longer is None or shorter is None else (longer + shorter) / 2
    return {
        "acc_chosen_longer": longer,
        "acc_chosen_shorter": shorter,
        "length_balanced_accuracy": both,
        "length_ties": int((len_c == len_r).sum()),
    }


def reliability(r_c, r_r, bins=10):
    """(ece, [(mean predicted p, observed frequency, count) per bin]) of p = sigmoid(r_c - r_r)
    as the probability that the first response of a pair is preferred.

    Our pairs always list the chosen first, so every label is 1 and ECE would reduce to
    1 - mean(p), a measure of confidence, not calibration. Each pair is therefore counted in both
    orders, (p, 1) and (1 - p, 0): a model is calibrated when, of the pairs it gives 70%, the
    first response is preferred 70% of the time. Bins are equal-width over [0, 1]."""
    p = torch.sigmoid((r_c - r_r).double())
    p, y = torch.cat([p, 1 - p]), torch.cat([torch.ones_like(p), torch.zeros_like(p)])
    b = (p * bins).long().clamp(max=bins - 1)
    ece, table = 0.0, []
    for k in range(bins):
        sel = b == k
        if sel.any():
            conf, freq, n = p[sel].mean().item(), y[sel].mean().item(), int(sel.sum())
            ece += n / len(p) * abs(conf - freq)
            table.append((conf, freq, n))
    return ece, table


def plot_reliability(ax, r_c, r_r):
    """The reliability diagram of reliability() on a matplotlib Axes (eval_rm's reliability.png)."""
    ece, bins = reliability(r_c, r_r)
    ax.plot([0, 1], [0, 1], ":", color="gray", label="calibrated")
    conf, freq, _ = zip(*bins, strict=True)
    ax.plot(conf, freq, "o-", label="model")
    for c, f, m in bins:
        ax.annotate(str(m), (c, f), fontsize=7, textcoords="offset points", xytext=(3, -9))
    ax.set_xlabel("sigmoid(r_first - r_second)"), ax.set_ylabel("first preferred, observed")
    ax.set_title(f"reliability: ECE {ece:.3f}"), ax.legend(loc="upper left")


# ----------------------------------------------------------------------------- length calibration
def fit_length(rewards, lengths):
    """The least-squares line of reward on log(length) over all responses: rewards and lengths
    of the same shape ((n, 2) pairs, or (n,)). -> {"kind", "coef": [a, b], "n"}."""
    x = torch.as_tensor(lengths).double().flatten().clamp(min=1).log()
    y = torch.as_tensor(rewards).double().flatten()
    if len(x) < 2 or x.std() == 0:
        raise ValueError("calibration needs responses of at least two different lengths")
    b = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    a = y.mean() - b * x.mean()  # the line passes through the means: residuals average 0
    return {"kind": KIND, "coef": [a.item(), b.item()], "n": len(x)}


def length_term(cal, lengths):
    """a + b * log(L), what the calibration subtracts, for lengths in tokens (a tensor)."""
    if cal.get("kind") != KIND or len(cal.get("coef", ())) != 2:
        raise ValueError(f"unknown length calibration {cal!r}: this nanoRM applies {KIND}")
    a, b = cal["coef"]
    return a + b * torch.as_tensor(lengths).double().clamp(min=1).log()


def apply_length(cal, rewards, lengths):
    """The calibrated rewards (float64), or the rewards unchanged when cal is None."""
    if cal is None:
        return rewards
    return torch.as_tensor(rewards).double() - length_term(cal, lengths)


# ----------------------------------------------------------------------------- normalization
def normalization(rewards, calibrated):
    """{mean, std, n, calibrated} of the rewards (all responses: chosen and rejected)."""
    r = torch.as_tensor(rewards).double().flatten()
    std = r.std().item() if len(r) > 1 else 0.0
    return {"mean": r.mean().item(), "std": std, "n": len(r), "calibrated": calibrated}


def normalize(norm, rewards):
    """(r - mean) / std; a std of 0 (constant rewards) divides by 1, never by 0."""
    std = norm["std"] if norm["std"] > 0 else 1.0
    return (torch.as_tensor(rewards).double() - norm["mean"]) / std


def served(record, rewards, lengths, normalized=False, name="the checkpoint"):
    """The rewards as this model serves them: its stored length calibration applied, and, when
    normalized, its stored normalization. record: a ckpt.pt dict, or the `nanorm_reward` entry
    of an HF export's config.json. A missing or stale normalization is a ValueError saying what
    to run."""
    cal = record.get("length_calibration")
    r = apply_length(cal, rewards, lengths)
    if not normalized:
        return r
    norm = record.get("reward_normalization")
    fix = "record it with eval_rm.py --save_calibration (see calibrate.py)"
    if norm is None:
        raise ValueError(f"{name} holds no reward normalization: {fix}")
    if norm.get("calibrated") != (cal is not None):
        raise ValueError(
            f"{name}: its normalization was measured {'with' if norm.get('calibrated') else 'without'}"
            f" the length calibration, which is {'now' if cal else 'no longer'} stored: {fix}"
        )
    return normalize(norm, r)


def describe(cal):
    """One line for a report: what the calibration subtracts."""
    a, b = cal["coef"]
    return f"reward - ({a:+.4f} {b:+.4f} * log(response tokens)), fitted on {cal['n']} responses"
