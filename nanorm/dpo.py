"""
DPO: the SFT policy trained on the preference pairs themselves, no reward model in between;
then read back as a reward model, its implicit reward beta * log(pi / pi_ref).

    python -m nanorm.dpo                                     # the built-in arithmetic pairs
    python -m nanorm.dpo --beta 0.1 --max_steps 300 --pairs 5000 --seed 1
    python eval_rm.py --ckpt out/dpo/dpo.pt --data data/arith --out out/dpo/eval   # a reward model
    python -m nanorm.sample --ckpt out/dpo/dpo.pt           # the policy answers
    bash bench/dpo/run.sh                                    # the runs of bench/dpo/README.md

The pieces, in the order a run meets them:
  0. once, cached in --cache_dir: the SFT policy nanorm/rl.py trains (next-token loss on the
     right answers; the same file, so the RL runs and these share it).
  1. the reference: a frozen copy of it. The policy starts equal to it: every implicit reward
     is 0 and the first loss is log 2.
  2. each step: --batch_size pairs of the first --pairs training pairs (an epoch in a random
     order, then the next), right-padded (PairDataset.collate, with both responses' masks);
     reward.ImplicitReward.loss: one policy call and one reference call on the 2B rows, DPO's
     loss -log sigmoid(beta * (log-ratio chosen - log-ratio rejected)), which is
     reward.pairwise_loss on the implicit rewards; AdamW, clipped gradients.
  3. at the end: the implicit reward's accuracy on the held-out pairs, by each scoring
     (sum, mean, ref_free: reward.ImplicitReward).
Output in --out_dir: dpo.jsonl (a row per --log_interval steps: the loss, the batch's mean
implicit rewards and accuracy; then a row of the held-out accuracies) and dpo.pt, a ckpt.pt of
kind ImplicitReward holding the policy and the reference beside it, beta and --scoring
(nanorm/ckpt.py): eval_rm.py --ckpt reads it as a reward model, nanorm.sample --ckpt samples
its policy, train_rm.py --init starts a reward model from its policy. They are checked before
any work and listed in --out_dir's record (.nanorm) before they are written: a file of the
same name that nanorm.dpo did not write is refused, never replaced (command.Outputs).

Simplified on purpose: one process on the CPU, float32; the reference runs at every step (it
could score each pair once, before training); a constant learning rate after a linear warmup;
no label smoothing (conservative DPO) or IPO's squared loss.
"""

import copy
import json
import os
import time
from dataclasses import dataclass

import torch

from model import ModelConfig
from nanorm.base.command import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    Outputs,
    UsageError,
    append_text,
    atomic_write,
    one_of,
    opt,
    parse_config,
    run,
    run_folders,
)
from nanorm.base.runtime import check_finite
from nanorm.build import MODELS
from nanorm.ckpt import save_checkpoint
from nanorm.rl import arith, sft_policy
from reward import SCORINGS, ImplicitReward, ranked_right


@dataclass
class DPOConfig:
    beta: float = opt(0.1, "DPO's beta: the implicit reward is beta * log(pi / pi_ref)", POSITIVE)
    max_steps: int = opt(300, "optimizer steps", AT_LEAST_1)
    batch_size: int = opt(32, "pairs per step", AT_LEAST_1)
    pairs: int = opt(5000, "train on the first this many training pairs (0: all)", NON_NEGATIVE)
    lr: float = opt(1e-3, "peak learning rate (AdamW)", POSITIVE)
    warmup: int = opt(20, "linear warmup steps", NON_NEGATIVE)
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)", NON_NEGATIVE)
    scoring: str = opt("sum", "the scoring dpo.pt serves (eval_rm.py)", one_of(*SCORINGS))
    eval_pairs: int = opt(1000, "held-out pairs scored at the end (at most)", AT_LEAST_1)
    log_interval: int = opt(25, "log the loss every this many steps", AT_LEAST_1)
    seed: int = opt(0, "seeds the order of the pairs (not the SFT policy)", NON_NEGATIVE)
    out_dir: str = opt("out/dpo", "where dpo.jsonl and dpo.pt go")
    cache_dir: str = opt("", "where the SFT policy is kept (default out_dir)")
    sft_steps: int = opt(400, "steps of SFT on the right answers (cached)", AT_LEAST_1)


def parse_args(argv=None) -> DPOConfig:
    """The options (each checked by its field), then the checks across options."""
    cfg = parse_config(DPOConfig, argv, description=__doc__.split("\n")[1])
    return run_folders(cfg)


def policy_config(meta):
    """The shape of the SFT policy: nanorm.rl's (train_rm.py's default nano model), so one
    cached SFT policy serves both."""
    shape = dict(MODELS["nano"], multiple_of=32, max_seq_len=256)
    return ModelConfig(**shape, vocab_size=meta["vocab_size"], dropout=0.0)


def pair_batch(data, indices, pad_id):
    """(chosen, chosen_mask, rejected, rejected_mask, their response masks): what
    ImplicitReward.loss and forward_pair take, from PairDataset.collate."""
    b = data.collate(indices, pad_id)
    pair = (b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
    return (*pair, b.chosen_response_mask, b.rejected_response_mask)


@torch.no_grad()
def held_out_accuracy(ir, data, pad_id, n_pairs, batch_size=100):
    """{scoring: accuracy} of the implicit reward on the first n_pairs pairs of data, every
    scoring from the same two forward calls (a tie is wrong: reward.ranked_right)."""
    was_training, n = ir.training, min(n_pairs, len(data))
    ir.eval()
    right = dict.fromkeys(SCORINGS, 0)
    for i in range(0, n, batch_size):
        pair = pair_batch(data, range(i, min(n, i + batch_size)), pad_id)
        B = pair[0].size(0)
        for scoring, r in ir.scores(*ir.rows(*pair)).items():  # (2B,) each
            right[scoring] += ranked_right(r[:B], r[B:]).sum().item()
    ir.train(was_training)
    return {s: right[s] / n for s in SCORINGS}


# ----------------------------------------------------------------------------- the loop
DPO = "nanorm.dpo"  # the command that writes a run's files, in --out_dir's record
DPO_FILES = ("dpo.jsonl", "dpo.pt")


def main(argv=None):
    args = parse_args(argv)
    outputs = Outputs(args.out_dir, DPO, DPO_FILES, "--out_dir")
    outputs.check()  # a file there that is not ours: refused now, before the SFT
    # a 0.2M-parameter model: one thread is as fast as two, and never waits on a busy core
    torch.set_num_threads(1)
    _, train, val, meta, _ = arith()
    pad_id = meta["pad_id"]
    n_pairs = args.pairs or len(train)
    if n_pairs > len(train) or n_pairs < args.batch_size:
        raise UsageError(
            f"--pairs {args.pairs}: give from --batch_size {args.batch_size} to the "
            f"{len(train)} training pairs (0: all)"
        )
    t_setup = time.time()
    policy = sft_policy(train, meta, policy_config(meta), args)  # cached in --cache_dir
    print(f"SFT policy ready in {time.time() - t_setup:.0f}s")

    torch.manual_seed(args.seed)
    reference = copy.deepcopy(policy)  # frozen by ImplicitReward: the log-ratio's denominator
    ir = ImplicitReward(policy, reference, args.beta, args.scoring).train()
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)
    order = []  # the pairs still to visit in this epoch
    log_path = os.path.join(args.out_dir, "dpo.jsonl")
    outputs.claim()  # dpo.jsonl and dpo.pt in the record, before they are written
    with atomic_write(log_path, "w"):  # a new, empty log
        pass
    t0 = time.time()
    for step in range(args.max_steps):
        # the batch: the next batch_size pairs of a random order of the first n_pairs
        if len(order) < args.batch_size:
            order = torch.randperm(n_pairs, generator=g).tolist()
        idx, order = order[: args.batch_size], order[args.batch_size :]
        lr = args.lr * min(1.0, (step + 1) / max(1, args.warmup))
        for group in opt.param_groups:
            group["lr"] = lr

        # forward, backward, update
        loss, stats = ir.loss(*pair_batch(train, idx, pad_id))
        check_finite(loss.item(), step, None)  # a NaN loss: one line, nothing saved
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), args.grad_clip)
        opt.step()

        if step % args.log_interval == 0 or step == args.max_steps - 1:
            row = dict(step=step, loss=loss.item(), lr=lr, time=round(time.time() - t0, 2))
            for k in ("r_chosen", "r_rejected"):
                row[k] = stats[k].mean().item()  # the implicit rewards, sum scoring
            row["accuracy"] = stats["accuracy"].item()
            append_text(log_path, json.dumps(row) + "\n")
            print(
                f"step {step}: loss {row['loss']:.4f} | margin "
                f"{row['r_chosen'] - row['r_rejected']:+.3f} | acc {row['accuracy']:.2f} | "
                f"{row['time']:.0f}s"
            )

    finite = all(torch.isfinite(p).all() for p in policy.parameters())
    if not finite:  # never a non-finite policy on disk
        raise UsageError(
            f"the policy's weights are not finite after {args.max_steps} steps: lower --lr; "
            "nothing saved"
        )
    acc = held_out_accuracy(ir, val, pad_id, args.eval_pairs)
    append_text(log_path, json.dumps(dict(step=args.max_steps, held_out=acc)) + "\n")
    save_checkpoint(os.path.join(args.out_dir, "dpo.pt"), ir.eval(), meta, train_config=args)
    print(
        f"done in {time.time() - t0:.0f}s: held-out accuracy "
        + ", ".join(f"{s} {a:.3f}" for s, a in acc.items())
        + f"; wrote {log_path}, dpo.pt"
    )
    return acc


if __name__ == "__main__":
    run(main)
