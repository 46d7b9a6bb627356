"""
Evaluate a reward model the way the field does, and show what it has learned.

    python eval_rm.py --ckpt out/ckpt.pt --data data/arith --out out/eval      # the default run
    python eval_rm.py --ckpt out/ckpt.pt --data data/hh_rlhf/helpful-tok512 \
        ../shared/data/hh-rlhf/harmless-base/test.jsonl.gz --out out/eval_hh  # several at once
    python eval_rm.py --ckpt HF_DIR --data rewardbench.jsonl --out out/rb   # LlamaForSequenceClassification
    python eval_rm.py --ckpt out/ckpt.pt --data gsm8k:../shared/data/gsm8k/test.jsonl --out out/gsm8k
    python eval_rm.py --ckpt model.gguf --data pairs.jsonl --out out/x     # a backbone: random head

One process on one device (no torchrun: scoring a few thousand pairs is a forward pass each).

--ckpt: a train_rm.py checkpoint, an HF LlamaForSequenceClassification directory (its `score` is
the head), or any backbone reward.py loads (.gguf, llama2.c, HF causal LM: the head is random,
and we say so). The tokenizer is the one the checkpoint records, the HF directory's or the
.gguf's own, or --tokenizer.

--data, each one or more subsets:
    a prepared directory (data/arith, data/hh_rlhf/<name>)   its val.npz, split by meta's groups
    HH-RLHF .jsonl(.gz), or a folder of <subset>/*.jsonl.gz   tokenized here, in the chat layout
    RewardBench JSONL: rows {prompt, chosen, rejected, subset} one subset per name, + sections
    gsm8k:PATH, or rows {question, answer[, solutions]}       verifier-labelled pairs, best-of-N

Writes DIR/eval.json {"subsets": {name: metrics}, "overall": metrics, "sections": ...} and
DIR/reward_hist.png, reward_length.png, reliability.png; prints a table. The metrics:
    accuracy       pairs with r_chosen > r_rejected, strictly (a tie is wrong; ties: their count)
    longer_wins    "the longer response wins" on the same pairs, by response tokens, ties half
    length_corr    Pearson correlation of reward with response length over all responses
    ece            calibration of sigmoid(r_c - r_r) as P(chosen wins), 10 bins (calibrate.py)
    acc_chosen_longer, acc_chosen_shorter   accuracy on the pairs whose chosen response is
                   longer / shorter (in tokens; equal lengths: in neither, length_ties counts them)
    length_balanced_accuracy   their mean: 0.5 for "the longer wins", whatever the data's mix

A length calibration stored in the checkpoint (or an HF export's config.json) is applied unless
--calibrate_length false; --calibrate_length fits one if none is stored; --save_calibration stores
it and the rewards' mean and std on --data (held-out pairs) in --ckpt. See calibrate.py.

`evaluate` below is what train_rm.py calls for its held-out evaluation too (imports go one way:
train_rm imports eval_rm), so a prepared dataset gives train_rm's accuracy to the last digit.
"""

import json
import os
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

import calibrate
from ckpt import checkpoint_tokenizer, update_checkpoint
from cli import ArgumentParser, UsageError, atomic_write, boolean, check_device, run
from data.pairs import PairDataset, dataset_dir, length_heuristics
from data.sources import SECTIONS, data_kind, load_source
from reward import load_for_scoring, pairwise_loss, pearson


@dataclass
class Scored:
    """One subset's pairs after scoring: rewards (n, 2) and response lengths (n, 2) in tokens,
    (chosen, rejected) per row, plus metrics only this kind of data has (best-of-N)."""

    rewards: torch.Tensor
    lengths: torch.Tensor
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- scoring
@torch.no_grad()
def evaluate(
    rm,
    data,
    pad_id,
    batch_size,
    n_pairs=None,
    loss="logsig",
    margin=0.0,
    center_coef=0.0,
    ctx=None,
    rank=0,
    world=1,
    return_rewards=False,
    cache=None,
):
    """(metrics, rewards) on the first n_pairs pairs of data (default all), split over the
    ranks (all take part): metrics = {loss, acc, chosen, rejected, margin}, the pairwise loss
    `loss`, accuracy (a tie is wrong), the mean rewards and their difference. rewards (n, 2):
    each pair's (r_chosen, r_rejected) in the data's order, if return_rewards (else None).
    ctx: e.g. the training's autocast. The batches are right-padded (data.collate), the layout
    reward.py scores; the forward skips the padding. cache: a cache.FrozenCache of data, whose
    stored bottom layers the forward starts from (packed rows: the same rewards)."""
    ctx, was_training = ctx or nullcontext(), rm.training
    rm.eval()
    n_pairs = min(len(data), n_pairs or len(data))
    idx = list(range(n_pairs))[rank::world]
    device = rm.head.weight.device
    sums = dict(loss=0.0, acc=0.0, chosen=0.0, rejected=0.0, n=0.0)  # totals over the pairs
    kept = []
    for i in range(0, len(idx), batch_size):
        ids = idx[i : i + batch_size]
        with ctx:
            if cache is None:
                b = data.collate(ids, pad_id).to(device)
                r_c, r_r = rm.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
            else:  # packed rows from the frozen layers' stored output (cache.py)
                b = data.collate_packed(ids, pad_id, cache).to(device)
                ends = (b.chosen_end, b.rejected_end)
                r_c, r_r = rm.forward_pair_packed(
                    b.tokens, b.segments, b.positions, *ends, states=b.states
                )
        r_c, r_r, n = r_c.float(), r_r.float(), len(r_c)
        sums["loss"] += pairwise_loss(loss, r_c, r_r, None, margin, center_coef).item() * n
        sums["acc"] += (r_c > r_r).sum().item()  # a tie is wrong
        sums["chosen"] += r_c.sum().item()
        sums["rejected"] += r_r.sum().item()
        sums["n"] += n
        kept.append(torch.stack([r_c, r_r], 1).cpu())
    sums = all_reduce_sum(sums, world, device)
    rm.train(was_training)
    n = sums.pop("n")
    metrics = {k: v / n for k, v in sums.items()}
    metrics["margin"] = metrics["chosen"] - metrics["rejected"]
    if not return_rewards:
        return metrics, None
    rewards = torch.cat(kept) if kept else torch.zeros(0, 2)
    if world > 1:  # rank r scored pairs r, r + world, ...: put them back in order
        shards = [None] * world
        dist.all_gather_object(shards, rewards)
        rewards = torch.empty(n_pairs, 2)
        for r, shard in enumerate(shards):
            rewards[r::world] = shard
    return metrics, rewards


def all_reduce_sum(metrics, world, device):
    """A dict of numbers summed over the ranks, in one all_reduce."""
    if world == 1:
        return metrics
    t = torch.tensor(list(metrics.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(metrics, t.tolist(), strict=True))


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
        "accuracy": int((r_c > r_r).sum()) / n,  # as train_rm.evaluate counts: a tie is wrong
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
    # matplotlib's object API, as train_rm.plot: no pyplot, no backend switch
    from matplotlib.figure import Figure

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
    save(fig, out_dir, "reward_hist.png")

    rewards = torch.cat([s.rewards for s in per_subset.values()])
    lengths = torch.cat([s.lengths for s in per_subset.values()])
    fig = Figure(figsize=(5, 3.5))
    ax = fig.subplots()
    for j, label in enumerate(("chosen", "rejected")):
        ax.scatter(lengths[:, j].numpy(), rewards[:, j].numpy(), s=6, alpha=0.4, label=label)
    corr = result["overall"]["length_corr"]
    ax.set_title(f"reward vs length: Pearson r = {corr:.3f}" if corr is not None else "reward")
    ax.set_xlabel("response tokens"), ax.set_ylabel("reward"), ax.legend()
    save(fig, out_dir, "reward_length.png")

    fig = Figure(figsize=(4, 4))
    ax = fig.subplots()
    calibrate.plot_reliability(ax, rewards[:, 0], rewards[:, 1])
    save(fig, out_dir, "reliability.png")


def save(fig, out_dir, name):
    """Every figure of a run (train_rm's curves too): laid out, 100 dpi, written atomically."""
    fig.tight_layout()
    with atomic_write(os.path.join(out_dir, name)) as f:
        fig.savefig(f, dpi=100, format="png")


# ----------------------------------------------------------------------------- the model
def load_model(path):
    """(reward model, info): info holds the training data's meta.json ({} if unknown), its
    training batch size, whether the checkpoint carries a tokenizer (ckpt.checkpoint_tokenizer
    reads it), where the head's weights come from: "trained" (train_rm), "score" (an HF
    classifier's) or "random", the record of its length calibration and normalization (the
    ckpt.pt dict, an export's config.json "nanorm_reward") and the dataset it was trained on."""
    rm, ckpt = load_for_scoring(path)
    if ckpt is not None:
        train = ckpt.get("train_config") or {}
        info = dict(meta=ckpt.get("data_meta") or {}, batch_size=train.get("batch_size"))
        info.update(has_tokenizer=True, head="trained", record=ckpt, dataset=train.get("dataset"))
        return rm, info
    config, classifier, record = os.path.join(path, "config.json"), False, {}
    if os.path.isfile(config):
        with open(config) as f:
            config = json.load(f)
        names = config.get("architectures") or []
        classifier = any(a.endswith("ForSequenceClassification") for a in names)
        record = config.get("nanorm_reward") or {}  # an export's calibration (export_hf.py)
    own_tok = path.endswith(".gguf") or os.path.isdir(path)  # else llama2.c: none inside
    head = "score" if classifier else "random"
    info = dict(meta={}, batch_size=None, has_tokenizer=own_tok, head=head)
    return rm, info | dict(record=record, dataset=None)


def fit_calibration(rm, data, pad_id, batch_size, n_pairs=None, **scoring):
    """calibrate.fit_length on the rewards of a PairDataset's first n_pairs pairs (default
    all): its TRAINING pairs, by eval_rm.py --calibrate_length and train_rm.py's. scoring:
    evaluate's ctx, rank, world, cache."""
    n = min(len(data), n_pairs or len(data))
    _, rewards = evaluate(rm, data, pad_id, batch_size, n, return_rewards=True, **scoring)
    return calibrate.fit_length(rewards, response_lengths(data, n))


def as_served(per_subset, cal):
    """{name: Scored} with the length calibration cal (or None) applied, as the model serves
    its rewards, and their normalization (calibrate.normalization over all of them)."""
    out = {
        k: Scored(calibrate.apply_length(cal, s.rewards, s.lengths), s.lengths, s.extra)
        for k, s in per_subset.items()
    }
    rewards = torch.cat([s.rewards for s in out.values()])
    return out, calibrate.normalization(rewards, calibrated=cal is not None)


def score(rm, source, batch_size):
    """{subset name: Scored} for a Source, the rewards from train_rm.evaluate."""
    n = len(source.names)
    _, rewards = evaluate(rm, source.data, source.pad_id, batch_size, n, return_rewards=True)
    lengths = response_lengths(source.data, n)
    out = {}
    for name in dict.fromkeys(source.names):  # in order of first appearance
        sel = torch.tensor([x == name for x in source.names])
        out[name] = Scored(rewards[sel], lengths[sel])
    if source.candidates is not None:  # one subset: the rows are the pairs
        (only,) = out.values()
        only.extra = best_of_n(rewards, source.candidates)
    return out


# ----------------------------------------------------------------------------- command line
def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--ckpt", required=True, help="train_rm checkpoint, HF dir, .gguf, backbone")
    data_help = "prepared dir, .jsonl(.gz) pairs, RewardBench JSONL, gsm8k:PATH"
    p.add_argument("--data", nargs="+", required=True, help=data_help)
    p.add_argument("--out", required=True, help="where eval.json and the plots go")
    p.add_argument("--tokenizer", default=None, help="default: the checkpoint's")
    layouts = ("auto", "plain", "chatml", "llama3")  # auto: the checkpoint's data, or the tok's
    p.add_argument("--chat", default="auto", choices=layouts, help="layout of raw text")
    p.add_argument("--batch_size", type=int, help="default: the ckpt's training batch size")
    p.add_argument("--max_len", type=int, help="raw text: tokens per pair (default: the model's)")
    p.add_argument("--max_pairs", type=int, help="per --data (GSM8K: questions); to fit on")
    p.add_argument("--device", default="cpu")
    # --calibrate_length: the stored one, else fit on --calibration_data's training pairs
    cal_help = "subtract a length fit (default: the stored one if any; false: raw rewards)"
    p.add_argument("--calibrate_length", type=boolean, nargs="?", const=True, help=cal_help)
    p.add_argument("--calibration_data", help="prepared dir to fit on (default: the ckpt's)")
    p.add_argument(
        "--save_calibration", action="store_true", help="store it, and mean/std, in ckpt"
    )
    args = p.parse_args(argv)
    for name in ("batch_size", "max_len", "max_pairs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    check_device(args.device)  # before the weights are read: a CPU build fails fast
    if not os.path.exists(args.ckpt):
        p.error(f"--ckpt {args.ckpt} not found")
    try:
        kinds = [data_kind(spec) for spec in args.data]
    except ValueError as e:
        p.error(str(e))
    try:
        rm, info = load_model(args.ckpt)  # a missing, truncated or foreign file: UsageError
    except UsageError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        p.error(f"{args.ckpt}: not a reward model or backbone checkpoint ({e})")
    rm = rm.to(args.device).eval()
    info["max_len"] = rm.backbone.config.max_seq_len
    if info["head"] == "random":
        print(
            f"note: {args.ckpt} is a backbone without a reward head: the head is random, "
            "so these scores measure nothing yet"
        )
    batch_size = args.batch_size or info["batch_size"] or 32
    if args.save_calibration and info["head"] != "trained":
        p.error(f"--save_calibration: {args.ckpt} is not a train_rm.py checkpoint (ckpt.pt)")
    cal = info["record"].get("length_calibration") if args.calibrate_length is not False else None
    if args.calibrate_length and cal is None:
        dataset = args.calibration_data or info["dataset"]
        if dataset is None:
            p.error("--calibrate_length: pass --calibration_data DIR, a prepared dataset")
        try:
            d = dataset_dir(dataset)
            with open(os.path.join(d, "meta.json")) as f:
                pad_id = json.load(f)["pad_id"]
            data = PairDataset(os.path.join(d, "train.npz"))
            print(f"fitting the length calibration on the training pairs of {d}")
            cal = fit_calibration(rm, data, pad_id, batch_size, args.max_pairs)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--calibration_data {dataset}: {e}")
    if cal is not None:
        print(f"length calibration: {calibrate.describe(cal)}")

    tok_cache = []

    def tokenizer():
        if not tok_cache:
            from data.chat import chat_format
            from data.tokenizer import load_tokenizer

            if args.tokenizer is None and not info["has_tokenizer"]:
                p.error(f"{args.ckpt} holds no tokenizer: pass --tokenizer")
            try:
                if args.tokenizer:
                    tok = load_tokenizer(args.tokenizer)
                else:  # the checkpoint's own, the .gguf's or the HF directory's
                    tok = checkpoint_tokenizer(args.ckpt)
                name = args.chat if args.chat != "auto" else info["meta"].get("chat_format", "auto")
                tok_cache.append((tok, chat_format(tok, name)))
            except (OSError, ValueError) as e:
                p.error(f"tokenizer of {args.tokenizer or args.ckpt}: {e}")
        return tok_cache[0]

    per_subset = {}
    for spec, (kind, path) in zip(args.data, kinds, strict=True):
        try:
            source = load_source(kind, path, args, info, tokenizer)
        except (OSError, ValueError, KeyError) as e:
            p.error(str(e))
        vocab = rm.backbone.config.vocab_size
        if int(source.data.tokens.max(initial=0)) >= vocab:
            p.error(f"{spec}: token ids reach past the model's vocabulary of {vocab}")
        for name, scored in score(rm, source, batch_size).items():
            key = name if name not in per_subset else f"{os.path.basename(path)}:{name}"
            per_subset[key] = scored
        print(f"{spec}: {kind}, {len(source.names)} pairs")
    per_subset, norm = as_served(per_subset, cal)  # the rewards as the model serves them
    who = dict(ckpt=args.ckpt, head=info["head"], data=args.data, batch_size=batch_size)
    who.update(length_calibration=cal, reward_normalization=norm)
    result = write_report(args.out, per_subset, info=who)
    if args.save_calibration:  # written aside and renamed: the checkpoint is never half-written
        update_checkpoint(args.ckpt, length_calibration=cal, reward_normalization=norm)
        print(f"stored in {args.ckpt}: length calibration and reward mean/std ({norm['n']})")
    print(f"wrote {args.out}/eval.json, reward_hist.png, reward_length.png, reliability.png")
    return result


if __name__ == "__main__":
    run(main)
