"""
Train a reward model on preference pairs: one readable loop, CPU or GPUs.

    python train_rm.py                                   # built-in arithmetic pairs, laptop CPU, minutes
    python train_rm.py --help                            # every option with its default
    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz --tokenizer ../shared/data/llama2c/stories260K/tok512.bin --out_dir data/hh_rlhf/helpful-tok512
    python train_rm.py --dataset hh_rlhf/helpful-tok512 --init ../shared/data/llama2c/stories260K/stories260K.bin
    torchrun --standalone --nproc_per_node=8 train_rm.py --model small --batch_size 16
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train_rm.py

One optimizer step sees batch_size * grad_accum * world_size pairs. Under torchrun each rank takes
its own slice of that global batch (NCCL on CUDA, gloo on CPU), gradients are averaged by DDP,
and only rank 0 writes. Output in --out_dir: ckpt.pt (written atomically), log.jsonl,
curves.png and reward_hist.png.

Simplified on purpose: pairs are batched in random order, not by length (bench/ shows bucketing);
no mixed fp16 (bf16 needs no loss scaling); a single fixed train/val split from the prepare script.
"""

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from data.pairs import PairDataset, bucketed_order
from model import ModelConfig, estimate_mfu
from reward import LMRegularizedRewardModel, RewardModel, accuracy, checkpoint_dict, pairwise_loss

HERE = os.path.dirname(os.path.abspath(__file__))

# model shapes for --init scratch (a loaded checkpoint brings its own shape)
MODELS = {
    "nano": dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2),  # ~0.2M params, CPU minutes
    "tiny": dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2),
    "small": dict(dim=288, n_layers=6, n_heads=6, n_kv_heads=6),  # llama2.c's stories15M shape
    "medium": dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=8),
}


def opt(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    dataset: str = opt("arith", "data/<name>/ with train.npz, val.npz, meta.json, or a directory")
    out_dir: str = opt("out", "where ckpt.pt, log.jsonl and the plots go")
    init: str = opt("scratch", "scratch, a llama2.c .bin/.pt, an HF directory or a Meta directory")
    model: str = opt("nano", f"shape for --init scratch: {', '.join(MODELS)}")
    max_seq_len: int = opt(256, "for --init scratch; loaded checkpoints keep theirs")
    dropout: float = opt(0.0, "dropout in the backbone")
    loss: str = opt("logsig", "pairwise loss: logsig, logexp or bce")
    margin: float = opt(0.0, "logsig margin: -logsigmoid(r_c - r_r - margin)")
    center_coef: float = opt(0.0, "reward centering: + coef * mean((r_c + r_r)^2)")
    lm_coef: float = opt(1.0, "> 0: the LM-regularized reward model with this LM weight; 0: plain")
    batch_size: int = opt(32, "pairs per micro-step per process")
    grad_accum: int = opt(1, "micro-steps per optimizer step")
    max_iters: int = opt(1500, "optimizer steps")
    eval_interval: int = opt(250, "evaluate and checkpoint every this many steps")
    eval_pairs: int = opt(1000, "held-out pairs per evaluation (at most)")
    log_interval: int = opt(25, "print and log training metrics every this many steps")
    lr: float = opt(3e-3, "peak learning rate")
    min_lr: float = opt(3e-4, "learning rate at the end of the cosine")
    warmup: int = opt(50, "linear warmup steps")
    weight_decay: float = opt(0.1, "AdamW decay on matrices (never on norms and biases)")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)")
    seed: int = opt(1337, "seeds the initial weights and the data order")
    device: str = opt("auto", "auto, cpu, cuda, cuda:1, mps")
    dtype: str = opt("auto", "auto (bf16 on CUDA, else fp32), float32 or bfloat16")
    compile: bool = opt(False, "torch.compile the training step (faster on GPU, slow to start)")
    pack: bool = opt(False, "shared-prompt packing: [prompt|chosen|rejected] in one row (plain RM)")
    bucket: bool = opt(False, "length-bucketed batches: less padding, a less random order")
    grad_ckpt: bool = opt(
        False, "activation checkpointing: recompute layers in backward (long rows)"
    )
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")


def parse_args(argv=None) -> TrainConfig:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[1], formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    for f in fields(TrainConfig):
        if f.type is bool or f.type == "bool":
            p.add_argument(f"--{f.name}", type=lambda s: s.lower() in ("1", "true", "yes"),
                           nargs="?", const=True, default=f.default, help=f.metadata["help"])  # fmt: skip
        else:
            p.add_argument(f"--{f.name}", type=type(f.default), default=f.default, help=f.metadata["help"])  # fmt: skip
    return TrainConfig(**vars(p.parse_args(argv)))


def get_lr(step, cfg):
    """Linear warmup to cfg.lr, then cosine decay to cfg.min_lr at cfg.max_iters."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_iters - cfg.warmup))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


@lru_cache(maxsize=2)
def epoch_order(data, seed, G, bucket, packed):
    if bucket:  # each run of G pairs (one global batch) has similar lengths
        return bucketed_order(data.lengths(packed), G, seed)
    return torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))


def batch_indices(step, micro, rank, world, cfg, data):
    """The pairs of one micro-step. The global batch of a step is fixed by (seed, step) alone, so
    any split of it over ranks and micro-steps sees the same pairs, and resuming needs no state."""
    G, n = cfg.batch_size * cfg.grad_accum * world, len(data)
    if n < G:
        raise ValueError(f"the dataset has {n} pairs, fewer than one global batch of {G}")
    epoch, k = divmod(step, n // G)  # drop the last partial batch of each epoch
    chunk = epoch_order(data, cfg.seed + epoch, G, cfg.bucket, cfg.pack)[k * G : (k + 1) * G]
    slot = rank * cfg.grad_accum + micro
    return chunk[slot * cfg.batch_size : (slot + 1) * cfg.batch_size].tolist()


class PairStep(nn.Module):
    """What DDP wraps: it syncs gradients only for work done inside a module's forward()."""

    def __init__(self, rm, cfg):
        super().__init__()
        self.rm, self.cfg = rm, cfg

    def forward(self, b):
        c = self.cfg
        if c.pack:  # one row per pair, the prompt computed once (data/pairs.py pack_pairs)
            r_c, r_r = self.rm.forward_pair_packed(b.tokens, b.segments, b.positions,
                                                   b.chosen_end, b.rejected_end, flex=b.tokens.is_cuda)  # fmt: skip
        elif isinstance(self.rm, LMRegularizedRewardModel):
            loss, stats = self.rm.loss(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask,
                                       b.chosen_response_mask, c.lm_coef, c.loss, c.margin, c.center_coef)  # fmt: skip
            return loss, stats["r_chosen"], stats["r_rejected"]
        else:
            r_c, r_r = self.rm.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
        return pairwise_loss(c.loss, r_c, r_r, c.margin, c.center_coef), r_c, r_r


@torch.no_grad()
def evaluate(rm, data, cfg, rank, world, device, ctx, pad_id, keep_rewards=False):
    """Loss, accuracy, mean chosen / rejected reward and margin over held-out pairs (all ranks)."""
    rm.eval()
    idx = list(range(min(len(data), cfg.eval_pairs)))[rank::world]
    sums = torch.zeros(5, device=device, dtype=torch.float64)  # loss, correct, r_c, r_r, n
    kept = []
    for i in range(0, len(idx), cfg.batch_size):
        b = data.collate(idx[i : i + cfg.batch_size], pad_id).to(device)
        with ctx:
            r_c, r_r = rm.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
        r_c, r_r, n = r_c.float(), r_r.float(), len(r_c)
        loss = pairwise_loss(cfg.loss, r_c, r_r, cfg.margin, cfg.center_coef)
        sums += torch.tensor([loss.item() * n, accuracy(r_c, r_r).item() * n,
                              r_c.sum().item(), r_r.sum().item(), n], device=device, dtype=torch.float64)  # fmt: skip
        if keep_rewards:
            kept.append(torch.stack([r_c, r_r], 1).cpu())
    if world > 1:
        dist.all_reduce(sums)
    loss, correct, rc, rr, n = sums.tolist()
    rm.train()
    out = dict(loss=loss / n, acc=correct / n, chosen=rc / n, rejected=rr / n, margin=(rc - rr) / n)
    return (out, torch.cat(kept)) if keep_rewards else out


def save_checkpoint(path, rm, optimizer, step, cfg, meta):
    ckpt = checkpoint_dict(rm)  # kind, config, model: what reward.load_reward_model reads
    ckpt.update(optimizer=optimizer.state_dict(), step=step, train_config=asdict(cfg),
                rng=torch.get_rng_state(), tokenizer=meta["tokenizer"], data_position=step)  # fmt: skip
    if torch.cuda.is_available():
        ckpt["cuda_rng"] = torch.cuda.get_rng_state_all()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:  # write aside, flush to disk, then rename over the old file:
        torch.save(ckpt, f)  # a kill at any moment leaves the previous checkpoint intact
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def plot(out_dir, rewards):
    # matplotlib's object API: no pyplot and no backend switch, so a notebook that calls
    # main() keeps showing its own figures
    from matplotlib.figure import Figure

    with open(os.path.join(out_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    fig = Figure(figsize=(10, 3.5))
    for ax, key in zip(fig.subplots(1, 2), ("loss", "acc"), strict=True):
        for split, style in (("train", "-"), ("eval", "o-")):
            pts = [(r["step"], r[key]) for r in rows if r["split"] == split]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=split, alpha=0.8)
        ax.set_xlabel("step"), ax.set_title(key), ax.legend(), ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "curves.png"), dpi=100)
    fig = Figure(figsize=(5, 3.5))
    ax = fig.subplots()
    bins = torch.linspace(rewards.min().item(), rewards.max().item(), 40).tolist()
    ax.hist(rewards[:, 0].tolist(), bins=bins, alpha=0.6, label="chosen")
    ax.hist(rewards[:, 1].tolist(), bins=bins, alpha=0.6, label="rejected")
    ax.set_xlabel("reward"), ax.set_title("held-out rewards"), ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "reward_hist.png"), dpi=100)


def dataset_dir(name):
    d = name if os.path.isdir(name) else os.path.join(HERE, "data", name)
    if name == "arith" and not os.path.exists(os.path.join(d, "meta.json")):
        from data.arith.prepare import main as prepare  # the built-in data makes itself

        prepare([])
    if not os.path.exists(os.path.join(d, "meta.json")):
        raise FileNotFoundError(f"{d}/meta.json not found: run data/{name}/prepare.py first")
    return d


def main(argv=None):
    cfg = parse_args(argv)
    # ---- processes and devices: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE
    ddp = "RANK" in os.environ
    rank, local_rank, world = 0, 0, 1
    device = (
        cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if ddp:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        world = int(os.environ["WORLD_SIZE"])
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
    master = rank == 0
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = (
            "bfloat16"
            if device.startswith("cuda") and torch.cuda.is_bf16_supported()
            else "float32"
        )
    ctx = (torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
           if dtype == "bfloat16" else nullcontext())  # fmt: skip
    torch.manual_seed(cfg.seed)  # same initial weights on every rank

    # ---- data and model
    if master:
        dataset_dir(cfg.dataset)  # rank 0 prepares the built-in data if it is missing
    if ddp:
        dist.barrier()  # the other ranks wait for it, then everyone reads the same files
    d = dataset_dir(cfg.dataset)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    train, val = PairDataset(os.path.join(d, "train.npz")), PairDataset(os.path.join(d, "val.npz"))
    Head = LMRegularizedRewardModel if cfg.lm_coef > 0 else RewardModel
    if cfg.pack and Head is not RewardModel:
        raise ValueError("--pack packs the plain reward model's pair: use it with --lm_coef 0")
    if cfg.init == "scratch":
        mc = ModelConfig(**MODELS[cfg.model], vocab_size=meta["vocab_size"], multiple_of=32,
                         max_seq_len=cfg.max_seq_len, dropout=cfg.dropout)  # fmt: skip
        rm = Head.from_config(mc)
    else:
        rm = Head.from_backbone_checkpoint(cfg.init)
    if rm.backbone.config.vocab_size < meta["vocab_size"]:
        raise ValueError(f"{cfg.init} has vocab_size {rm.backbone.config.vocab_size}, the data's "
                         f"tokenizer {meta['tokenizer']} has {meta['vocab_size']}")  # fmt: skip
    if Head is RewardModel and not rm.backbone.config.tie_embeddings:
        # a plain reward model never uses the LM head: freeze it, or DDP waits for its gradient
        rm.backbone.output.weight.requires_grad_(False)
    if cfg.center_coef == 0 and not isinstance(rm, LMRegularizedRewardModel):
        # a constant added to every reward cancels in r_c - r_r, so the head's bias gets a zero
        # gradient plus float noise, which Adam would blow up into steps of size lr. Centering
        # (center_coef > 0) is what gives the bias something to learn.
        rm.value_head.bias.requires_grad_(False)
    rm.backbone.gradient_checkpointing = cfg.grad_ckpt
    rm.to(device).train()
    params = [p for p in rm.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]  # norms, biases
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95),
                                  fused=device.startswith("cuda"))  # fmt: skip
    ckpt_path, log_path = (
        os.path.join(cfg.out_dir, "ckpt.pt"),
        os.path.join(cfg.out_dir, "log.jsonl"),
    )
    step = 0
    if cfg.resume:
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        rm.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
        torch.set_rng_state(ckpt["rng"])
        if "cuda_rng" in ckpt and device.startswith("cuda"):
            torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
    if master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        if os.path.exists(log_path):  # keep the log of the steps the checkpoint contains
            with open(log_path) as f:
                rows = [r for r in f if cfg.resume and json.loads(r)["step"] <= step]
            with open(log_path, "w") as f:
                f.writelines(rows)
    trainer = PairStep(rm, cfg)
    if cfg.compile:
        trainer = torch.compile(trainer)
    if ddp:
        trainer = DDP(trainer, device_ids=[local_rank] if device.startswith("cuda") else None)
    n_params = sum(p.numel() for p in rm.parameters())
    # the weights a token is multiplied by (for MFU): not the embedding lookup, nor an unused LM head
    n_matmul = sum(p.numel() for n, p in rm.named_parameters()
                   if "tok_embeddings" not in n and (p.requires_grad or "output" not in n))  # fmt: skip
    if master:
        print(f"{Head.__name__}: {n_params:,} parameters, {len(train)} train / {len(val)} val pairs, "
              f"device {device} x {world}, dtype {dtype}, {cfg.batch_size} pairs x {cfg.grad_accum} "
              f"accumulation x {world} ranks = {cfg.batch_size * cfg.grad_accum * world} pairs/step")  # fmt: skip

    def log(row):
        if master:
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    t0, tokens_seen, computed_seen, t_start, start_step = time.time(), 0, 0, time.time(), step
    while True:
        if step % cfg.eval_interval == 0 or step == cfg.max_iters:
            if not (cfg.resume and step == start_step):  # already evaluated before the save
                ev = evaluate(rm, val, cfg, rank, world, device, ctx, meta["pad_id"])
                log(dict(step=step, split="eval", **ev))
                if master:
                    print(f"step {step}: eval loss {ev['loss']:.4f} acc {ev['acc']:.4f} "
                          f"margin {ev['margin']:.3f}")  # fmt: skip
                if master and step > start_step:
                    save_checkpoint(ckpt_path, rm, optimizer, step, cfg, meta)
        if step == cfg.max_iters:
            break
        lr = get_lr(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr
        # objective (what backward sees), pairwise loss (comparable with eval), correct, tokens,
        # tokens computed (for MFU: with --pack each prompt is computed once, not twice)
        metrics = torch.zeros(5, device=device, dtype=torch.float64)
        for micro in range(cfg.grad_accum):
            idx = batch_indices(step, micro, rank, world, cfg, train)
            collate = train.collate_packed if cfg.pack else train.collate
            b = collate(idx, meta["pad_id"]).to(device)
            # sync gradients across ranks only on the last micro-step: once per optimizer step
            sync = nullcontext() if not ddp or micro == cfg.grad_accum - 1 else trainer.no_sync()
            with sync, ctx:
                loss, r_c, r_r = trainer(b)
                # each micro-step's loss is a mean over its pairs; dividing by grad_accum makes
                # the summed gradient the mean over the whole batch, as one big step would give
                (loss / cfg.grad_accum).backward()
            with torch.no_grad():
                pair_loss = pairwise_loss(cfg.loss, r_c.float(), r_r.float(), cfg.margin, cfg.center_coef)  # fmt: skip
                metrics += torch.tensor([loss.item(), pair_loss.item(), accuracy(r_c, r_r).item(), 0, 0],
                                        device=device, dtype=torch.float64) / cfg.grad_accum  # fmt: skip
            metrics[3] += b.n_tokens
            metrics[4] += b.n_packed if cfg.pack else b.n_tokens
        if ddp:
            dist.all_reduce(metrics)
        objective, tr_loss, tr_acc = (metrics[:3] / world).tolist()
        n_tok, n_computed = metrics[3].item(), metrics[4].item()
        if not math.isfinite(objective):
            last = (
                f"the last good checkpoint stays at {ckpt_path}"
                if os.path.exists(ckpt_path)
                else "no checkpoint was written yet"
            )
            msg = f"loss is {objective} at step {step}: stopping; {last}"
            raise FloatingPointError(msg)
        # the norm before clipping is logged: it shows instabilities, and it is what the tests use
        # to check that accumulation scales the gradient right (Adam alone would hide a 4x error)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or math.inf).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += n_tok
        computed_seen += n_computed
        if step % cfg.log_interval == 0 or step == cfg.max_iters:
            dt = time.time() - t0
            tok_s = tokens_seen / dt
            mfu = ""  # useful tokens only, per GPU, against an H100's bf16 peak
            if device.startswith("cuda"):
                mfu = estimate_mfu(rm.backbone.config, n_matmul, computed_seen / dt / world)
                mfu = f" | mfu {mfu:.1%}"
            eta = (time.time() - t_start) / (step - start_step) * (cfg.max_iters - step)
            log(
                dict(
                    step=step,
                    split="train",
                    loss=tr_loss,
                    acc=tr_acc,
                    objective=objective,
                    lr=lr,
                    grad_norm=grad_norm,
                    tok_per_s=tok_s,
                )
            )
            if master:
                print(f"step {step}/{cfg.max_iters} | loss {tr_loss:.4f} | acc {tr_acc:.3f} | objective {objective:.4f} | "
                      f"lr {lr:.2e} | {tok_s / 1e3:.1f}k tok/s{mfu} | eta {eta:.0f}s")  # fmt: skip
            t0, tokens_seen, computed_seen = time.time(), 0, 0

    result = None
    if master:  # the loop saved the final checkpoint with its last evaluation
        result, rewards = evaluate(
            rm, val, cfg, 0, 1, device, ctx, meta["pad_id"], keep_rewards=True
        )
        plot(cfg.out_dir, rewards)
        print(f"done in {time.time() - t_start:.0f}s: held-out accuracy {result['acc']:.4f}; "
              f"'longer response wins' baseline {meta.get('length_baseline_val', float('nan')):.3f}; "
              f"wrote {ckpt_path}, {log_path}, curves.png, reward_hist.png")  # fmt: skip
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
