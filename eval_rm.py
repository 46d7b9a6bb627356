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
DIR/reward_hist.png, reward_length.png, reliability.png, and prints a table: nanorm/report.py, which
defines every metric (train_rm.py writes the same report of its final evaluation).

A length calibration stored in the checkpoint (or an HF export's config.json) is applied unless
--calibrate_length false; --calibrate_length fits one if none is stored; --save_calibration stores
it and the rewards' mean and std on --data (held-out pairs) in --ckpt, holding the lock of the
ckpt's folder (a run's, nanorm/run_dir.py) from before the weights are read until they are
stored: refused while a run writes there. See nanorm/calibrate.py.

--out is checked before any work: a file there that eval_rm.py did not write (its record,
.nanorm, says which it did) is refused, never replaced (nanorm/base/command.py, Outputs).

`evaluate` below is what train_rm.py calls for its held-out evaluation too (imports go one way:
train_rm imports eval_rm), so a prepared dataset gives train_rm's accuracy to the last digit.
"""

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

import nanorm.calibrate as calibrate
from data.pairs import as_batch, open_dataset
from data.tokenizer import load_tokenizer
from nanorm.base.checkpoints import load
from nanorm.base.command import REQUIRED, UsageError, check_device, one_of, opt, parse_config, run
from nanorm.base.runtime import all_reduce_sum, auto_dtype, dtype_context
from nanorm.ckpt import checkpoint_tokenizer, load_reward_model
from nanorm.report import Scored, best_of_n, report_outputs, response_lengths, write_served_report
from nanorm.run_dir import claim, release
from reward import ImplicitReward, LogSigLoss, ranked_right


# ----------------------------------------------------------------------------- scoring
@torch.no_grad()
def evaluate(
    rm,
    data,
    pad_id=None,
    batch_size=None,
    n_pairs=None,
    loss_fn=None,
    ctx=None,
    rank=0,
    world=1,
    return_rewards=False,
    cache=None,
):
    """(metrics, rewards) on the first n_pairs pairs of data (default all), split over the
    ranks (all take part): metrics = {loss, acc, chosen, rejected, margin}, the pairwise loss
    loss_fn (default LogSigLoss()), accuracy (a tie is wrong), the mean rewards and their
    difference. rewards (n, 2): each pair's (r_chosen, r_rejected) in the data's order, if
    return_rewards (else None). ctx: e.g. the training's autocast. data: a PairDataset, batched
    here right-padded (data.collate, the layout reward.py scores; the forward skips the
    padding), or any iterable of batches (a DataLoader of ColossalChat's preference dicts or of
    Batch; its sampler splits it over ranks, and n_pairs does not apply). cache: a
    cache.FrozenCache of data, whose stored bottom layers the forward starts from (packed rows:
    the same rewards)."""
    ctx, was_training = ctx or nullcontext(), rm.training
    rm.eval()
    device = next(rm.parameters()).device
    if hasattr(data, "collate"):
        n_pairs = min(len(data), n_pairs or len(data))
        idx = list(range(n_pairs))[rank::world]
        batches = (idx[i : i + batch_size] for i in range(0, len(idx), batch_size))
    else:
        batches = data  # each rank its own loader: the metrics are summed over the ranks
    sums = dict(loss=0.0, acc=0.0, chosen=0.0, rejected=0.0, n=0.0)  # totals over the pairs
    kept = []
    for ids in batches:
        with ctx:
            if not hasattr(data, "collate"):
                r_c, r_r = pair_rewards(rm, as_batch(ids).to(device))
            elif cache is None:
                r_c, r_r = pair_rewards(rm, data.collate(ids, pad_id).to(device))
            else:  # packed rows from the frozen layers' stored output (nanorm/cache.py)
                b = data.collate_packed(ids, pad_id, cache).to(device)
                ends = (b.chosen_end, b.rejected_end)
                r_c, r_r = rm.forward_pair_packed(
                    b.tokens, b.segments, b.positions, *ends, states=b.states
                )
        r_c, r_r, n = r_c.float(), r_r.float(), len(r_c)
        sums["loss"] += (loss_fn or LogSigLoss())(r_c, r_r).item() * n
        sums["acc"] += ranked_right(r_c, r_r).sum().item()  # a tie is wrong
        sums["chosen"] += r_c.sum().item()
        sums["rejected"] += r_r.sum().item()
        sums["n"] += n
        kept.append(torch.stack([r_c, r_r], 1).cpu())
    sums = all_reduce_sum(sums, world, device)
    rm.train(was_training)
    n = sums.pop("n")
    if n == 0:
        raise UsageError("no pairs to evaluate: the held-out set is empty")
    metrics = {k: v / n for k, v in sums.items()}
    metrics["margin"] = metrics["chosen"] - metrics["rejected"]
    if not return_rewards:
        return metrics, None
    rewards = torch.cat(kept) if kept else torch.zeros(0, 2)
    if world > 1 and hasattr(data, "collate"):  # rank r scored pairs r, r + world, ...: in order
        shards = [None] * world
        dist.all_gather_object(shards, rewards)
        rewards = torch.empty(n_pairs, 2)
        for r, shard in enumerate(shards):
            rewards[r::world] = shard
    return metrics, rewards


def pair_rewards(rm, b):
    """(r_chosen, r_rejected) of a Batch: a reward model reads the rows; an implicit reward
    (DPO's policy against its reference) reads which tokens are the responses too."""
    pair = (b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
    if isinstance(rm, ImplicitReward):
        if b.rejected_response_mask is None:
            raise UsageError(
                "an implicit reward scores the responses alone: give batches with "
                "reject_loss_mask (1 on the rejected response), or a prepared dataset"
            )
        pair += (b.chosen_response_mask, b.rejected_response_mask)
    return rm.forward_pair(*pair)


# ----------------------------------------------------------------------------- the model
def load_model(path):
    """(reward model, info), from one read of path (checkpoints.load): info holds the training
    data's meta.json ({} if unknown), its training batch size, whether the checkpoint carries a
    tokenizer, the checkpoint read (ckpt.checkpoint_tokenizer reads its tokenizer from it),
    where the head's weights come from ("trained" by train_rm, an HF classifier's "score",
    ColossalChat's "value_head", or "random"), the record of its length calibration and
    normalization (the ckpt.pt dict, an export's config.json "nanorm_reward") and the dataset
    it was trained on."""
    c = load(path)
    rm, _ = load_reward_model(c)
    train = c.record.get("train_config") or {} if c.kind else {}
    info = dict(meta=c.record.get("data_meta") or {}, batch_size=train.get("batch_size"))
    info.update(has_tokenizer=c.format != "llama2c", head=c.head, record=c.record)
    return rm, info | dict(checkpoint=c, dataset=train.get("dataset"))


def fit_calibration(rm, data, pad_id, batch_size, n_pairs=None, **scoring):
    """calibrate.fit_length on the rewards of a PairDataset's first n_pairs pairs (default
    all): its TRAINING pairs, by eval_rm.py --calibrate_length and train_rm.py's. scoring:
    evaluate's ctx, rank, world, cache."""
    n = min(len(data), n_pairs or len(data))
    _, rewards = evaluate(rm, data, pad_id, batch_size, n, return_rewards=True, **scoring)
    return calibrate.fit_length(rewards, response_lengths(data, n))


def score(rm, source, batch_size, ctx=None):
    """{subset name: Scored} for a Source, the rewards from evaluate (ctx: its autocast)."""
    n = len(source.names)
    _, rewards = evaluate(
        rm, source.data, source.pad_id, batch_size, n, return_rewards=True, ctx=ctx
    )
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
AT_LEAST_1 = (lambda v: v is None or v >= 1, ">= 1")


@dataclass(kw_only=True)
class EvalConfig:
    ckpt: str = opt(REQUIRED, "train_rm checkpoint, HF dir, .gguf, backbone")
    data: list[str] = opt(
        REQUIRED, "prepared dir, .jsonl(.gz) pairs, RewardBench JSONL, gsm8k:PATH"
    )
    out: str = opt(REQUIRED, "where eval.json and the plots go")
    tokenizer: str | None = opt(None, "default: the checkpoint's")
    # auto: the checkpoint's data's layout, or the tokenizer's
    chat: str = opt("auto", "layout of raw text", one_of("auto", "plain", "chatml", "llama3"))
    batch_size: int | None = opt(None, "default: the ckpt's training batch size", AT_LEAST_1)
    max_len: int | None = opt(
        None,
        "raw text: tokens per pair (default: the model's)",
        (lambda v: v is None or v >= 8, "at least 8, or every response is cut away"),
    )
    max_pairs: int | None = opt(None, "per --data (GSM8K: questions); to fit on", AT_LEAST_1)
    device: str = opt("cpu", "cpu, cuda, cuda:N, mps")
    # --calibrate_length: the stored one, else fit on --calibration_data's training pairs
    calibrate_length: bool | None = opt(
        None, "subtract a length fit (default: the stored one if any; false: raw rewards)"
    )
    calibration_data: str | None = opt(None, "prepared dir to fit on (default: the ckpt's)")
    save_calibration: bool = opt(False, "store it, and mean/std, in ckpt")


def fail(message):
    raise UsageError(message)


def main(argv=None):
    args = parse_config(EvalConfig, argv, description=__doc__.split("\n")[1])
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        fail(f"--out {args.out} is a file: give a folder for eval.json and the plots")
    outputs = report_outputs(args.out)
    outputs.check()  # a file there that is not ours: refused now, not after the scoring
    check_device(args.device)  # before the weights are read: a CPU build fails fast
    if not os.path.exists(args.ckpt):
        fail(f"--ckpt {args.ckpt} not found")
    lock = None  # --save_calibration rewrites --ckpt: its folder's lock, as a run's writes
    if args.save_calibration:
        if not os.path.isfile(args.ckpt):
            fail(f"--save_calibration: {args.ckpt} is not a train_rm.py checkpoint (ckpt.pt)")
        folder = os.path.dirname(os.path.abspath(args.ckpt))
        lock = claim(folder, fix="wait for it to end, then --save_calibration again")
    try:
        return evaluate_and_report(args, outputs)
    finally:
        release(lock)


def evaluate_and_report(args, outputs):
    """main's work, once --out is checked (outputs) and the ckpt's folder locked if asked."""
    # the raw data sources (files, RewardBench, GSM8K labelled by verifiable.py): the command
    # line reads them, training's evaluation (evaluate, above) never does
    from data.sources import data_kind, load_source

    try:
        kinds = [data_kind(spec) for spec in args.data]
    except ValueError as e:
        fail(str(e))
    try:
        rm, info = load_model(args.ckpt)  # a missing, truncated or foreign file: UsageError
    except UsageError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        fail(f"{args.ckpt}: not a reward model or backbone checkpoint ({e})")
    rm = rm.to(args.device).eval()
    info["max_len"] = rm.backbone.config.max_seq_len
    # the dtype training evaluated in (its --dtype, auto's rule on the model's shape), so a
    # checkpoint's held-out accuracy is the one its training printed, to the last digit
    dtype = (info.get("record") or {}).get("train_config", {}).get("dtype", "auto")
    dtype = auto_dtype(args.device, rm.backbone.config) if dtype == "auto" else dtype
    ctx = dtype_context(args.device, dtype)
    if info["head"] == "random":
        print(
            f"note: {args.ckpt} is a backbone without a reward head: the head is random, "
            "so these scores measure nothing yet"
        )
    batch_size = args.batch_size or info["batch_size"] or 32
    if args.save_calibration and info["checkpoint"].kind is None:
        fail(f"--save_calibration: {args.ckpt} is not a train_rm.py checkpoint (ckpt.pt)")
    cal = info["record"].get("length_calibration") if args.calibrate_length is not False else None
    if args.calibrate_length and cal is None:
        dataset = args.calibration_data or info["dataset"]
        if dataset is None:
            fail("--calibrate_length: pass --calibration_data DIR, a prepared dataset")
        try:
            d, meta, (data,) = open_dataset(dataset, "train")
            print(f"fitting the length calibration on the training pairs of {d}")
            cal = fit_calibration(rm, data, meta["pad_id"], batch_size, args.max_pairs, ctx=ctx)
        except (OSError, ValueError, KeyError) as e:
            fail(f"--calibration_data {dataset}: {e}")
    if cal is not None:
        print(f"length calibration: {calibrate.describe(cal)}")

    tok_cache = []

    def tokenizer():
        if not tok_cache:
            if args.tokenizer is None and not info["has_tokenizer"]:
                fail(f"{args.ckpt} holds no tokenizer: pass --tokenizer")
            try:
                if args.tokenizer:
                    tok = load_tokenizer(args.tokenizer)
                else:  # the checkpoint's own, the .gguf's or the HF directory's
                    tok = checkpoint_tokenizer(info["checkpoint"])
                name = args.chat if args.chat != "auto" else info["meta"].get("chat_format", "auto")
                from data.chat import chat_format  # text to score: its chat layout

                tok_cache.append((tok, chat_format(tok, name)))
            except (OSError, ValueError) as e:
                fail(f"tokenizer of {args.tokenizer or args.ckpt}: {e}")
        return tok_cache[0]

    per_subset = {}
    for spec, (kind, path) in zip(args.data, kinds, strict=True):
        try:
            source = load_source(kind, path, args, info, tokenizer)
        except (OSError, ValueError, KeyError) as e:
            fail(str(e))
        vocab = rm.backbone.config.vocab_size
        if int(source.data.tokens.max(initial=0)) >= vocab:
            sizes = f" (a tokenizer of {tok_cache[0][0].vocab_size})" if tok_cache else ""
            fail(
                f"{spec}: token ids reach past the model's vocabulary of {vocab}{sizes}: score "
                "it with a --tokenizer of the model's vocabulary, or data prepared with one"
            )
        for name, scored in score(rm, source, batch_size, ctx).items():
            if not torch.isfinite(scored.rewards).all():  # finite weights can still overflow
                fail(f"{args.ckpt} gives rewards that are not finite on {spec} ({name})")
            key = name if name not in per_subset else f"{os.path.basename(path)}:{name}"
            per_subset[key] = scored
        print(f"{spec}: {kind}, {len(source.names)} pairs")
    who = dict(ckpt=args.ckpt, head=info["head"], data=args.data, batch_size=batch_size)
    ckpt = args.ckpt if args.save_calibration else None  # rewritten atomically, never half
    outputs.claim()  # its files in --out's record, before they are written
    result, _ = write_served_report(args.out, per_subset, cal, info=who, ckpt=ckpt)
    print(f"wrote {args.out}/eval.json, reward_hist.png, reward_length.png, reliability.png")
    return result


if __name__ == "__main__":
    run(main)
