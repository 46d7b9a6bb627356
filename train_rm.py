"""
Train a reward model on preference pairs: one readable loop, CPU or GPUs.

    python train_rm.py                                   # built-in arithmetic pairs, laptop CPU, minutes
    python train_rm.py --help                            # every option with its default
    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz --tokenizer ../shared/data/llama2c/stories260K/tok512.bin --out_dir data/hh_rlhf/helpful-tok512
    python train_rm.py --dataset hh_rlhf/helpful-tok512 --init ../shared/data/llama2c/stories260K/stories260K.bin
    python train_rm.py --dataset DIR --init model.gguf --train_layers 4   # the top 4 layers and the head
    torchrun --standalone --nproc_per_node=8 train_rm.py --model small --batch_size 16
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train_rm.py

One optimizer step sees batch_size * grad_accum * world_size pairs. Under torchrun each rank takes
its own slice of that global batch (NCCL on CUDA, gloo on CPU), gradients are averaged by DDP,
and only rank 0 writes. Output in --out_dir: ckpt.pt (written atomically; it also holds the
dataset's meta.json as `data_meta`), log.jsonl, curves.png, and eval_rm.py's report of the
final evaluation: eval.json, reward_hist.png, reward_length.png, reliability.png.

Simplified on purpose: pairs are batched in random order, not by length (bench/ shows bucketing);
no mixed fp16 (bf16 needs no loss scaling); a single fixed train/val split from the prepare script.
"""

import json
import math
import os
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist
from matplotlib.figure import Figure
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from cache import FrozenCache, cache_key
from ckpt import checkpoint_tokenizer, resume, save_checkpoint
from cli import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    UsageError,
    check_device,
    one_of,
    opt,
    parse_config,
    run,
)
from data.arith.prepare import built_in
from data.pairs import PairDataset, bucketed_order, dataset_dir
from data.tokenizer import tokenizer_fingerprint
from eval_rm import all_reduce_sum, evaluate, save, subsets_of, write_report
from fsdp import full_state, gathered, load_full_state, no_sync, shard
from length_head import LengthDebiasedRewardModel
from lora import add_lora, memory_report
from model import ModelConfig
from reward import LOSSES, LMRegularizedRewardModel, RewardModel, accuracy, pairwise_loss

# model shapes for --init scratch (a loaded checkpoint brings its own shape)
MODELS = {
    "nano": dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2),  # ~0.2M params, CPU minutes
    "tiny": dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2),
    "small": dict(dim=288, n_layers=6, n_heads=6, n_kv_heads=6),  # llama2.c's stories15M shape
    "medium": dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=8),
}


@dataclass
class TrainConfig:
    dataset: str = opt("arith", "data/<name>/ with train.npz, val.npz, meta.json, or a directory")
    out_dir: str = opt("out", "where ckpt.pt, log.jsonl and the plots go")
    init: str = opt("scratch", "scratch, or a checkpoint: llama2.c .bin/.pt, .gguf, HF or Meta dir")
    model: str = opt("nano", f"shape for --init scratch: {', '.join(MODELS)}", one_of(*MODELS))
    max_seq_len: int = opt(256, "for --init scratch; loaded checkpoints keep theirs", AT_LEAST_1)
    dropout: float = opt(0.0, "dropout in the backbone", (lambda v: 0 <= v < 1, "in [0, 1)"))
    loss: str = opt("logsig", "pairwise loss: logsig, logexp or bce", one_of(*LOSSES))
    margin: float = opt(0.0, "logsig margin: -logsigmoid(r_c - r_r - margin)")
    center_coef: float = opt(0.0, "reward centering: + coef * mean((r_c + r_r)^2)", NON_NEGATIVE)
    lm_coef: float = opt(
        1.0, "> 0: the LM-regularized reward model with this LM weight; 0: plain", NON_NEGATIVE
    )
    batch_size: int = opt(32, "pairs per micro-step per process", AT_LEAST_1)
    grad_accum: int = opt(1, "micro-steps per optimizer step", AT_LEAST_1)
    max_iters: int = opt(1500, "optimizer steps", NON_NEGATIVE)
    eval_interval: int = opt(250, "evaluate and checkpoint every this many steps", AT_LEAST_1)
    eval_pairs: int = opt(1000, "held-out pairs per evaluation (at most)", AT_LEAST_1)
    eval_first: bool = opt(True, "evaluate the untrained model at step 0 too (a baseline)")
    log_interval: int = opt(25, "print and log training metrics every this many steps", AT_LEAST_1)
    lr: float = opt(3e-3, "peak learning rate", POSITIVE)
    min_lr: float = opt(3e-4, "learning rate at the end of the cosine", NON_NEGATIVE)
    warmup: int = opt(50, "linear warmup steps", NON_NEGATIVE)
    weight_decay: float = opt(
        0.1, "AdamW decay on matrices (never on norms and biases)", NON_NEGATIVE
    )
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)", NON_NEGATIVE)
    seed: int = opt(1337, "seeds the initial weights and the data order")
    device: str = opt("auto", "auto, cpu, cuda, cuda:1, mps (checked by cli.check_device)")
    dtype: str = opt(
        "auto",
        "auto (bf16 on CUDA, else fp32), float32 or bfloat16",
        one_of("auto", "float32", "bfloat16"),
    )
    compile: bool = opt(False, "torch.compile the training step (faster on GPU, slow to start)")
    pack: bool = opt(False, "shared-prompt packing: [prompt|chosen|rejected] in one row (plain RM)")
    bucket: bool = opt(False, "length-bucketed batches: less padding, a less random order")
    grad_ckpt: bool = opt(False, "activation checkpointing: recompute layers in backward")
    train_layers: int = opt(
        0, "> 0: train only the top N layers, the final norm and the head", NON_NEGATIVE
    )
    length_head: bool = opt(False, "ODIN: a second head absorbs response length; the first scores")
    length_coef: float = opt(1.0, "--length_head: weight of ODIN's decorrelation terms")
    epochs: int = opt(
        0,
        "> 0: this many passes over the training pairs (sets --max_iters), "
        "the held-out evaluation at each one's end",
        NON_NEGATIVE,
    )
    cache: bool = opt(
        True,
        "with --train_layers: the frozen layers' output computed once per "
        "pair and stored (cache.py); every pass trains from it",
    )
    cache_dir: str = opt("", "where the cache goes (default: <dataset>/cache)")
    head_lr: float = opt(0.0, "> 0: the head's peak learning rate (else --lr's)", NON_NEGATIVE)
    lora_rank: int = opt(
        0,
        "> 0: LoRA adapters of this rank (lora.py) on the trained layers' "
        "projections; the head trains fully",
        NON_NEGATIVE,
    )
    lora_alpha: float = opt(16.0, "LoRA's scale alpha (the update is alpha / rank * B @ A)")
    fsdp: bool = opt(False, "under torchrun: shard weights, grads and AdamW state (fsdp.py)")
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")
    overwrite: bool = opt(False, "start afresh in an out_dir that holds a run (replaces its files)")


def parse_args(argv=None) -> TrainConfig:
    """The options (each checked by its field), then the checks across options."""
    cfg = parse_config(TrainConfig, argv, description=__doc__.split("\n")[1])
    if cfg.min_lr > cfg.lr:
        raise UsageError(f"--min_lr {cfg.min_lr} is above --lr {cfg.lr}")
    if cfg.resume and cfg.overwrite:
        raise UsageError("--resume continues the run in --out_dir, --overwrite replaces it")
    return cfg


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
    G, n = cfg.batch_size * cfg.grad_accum * world, len(data)  # n >= G: load_data checks
    epoch, k = divmod(step, n // G)  # drop the last partial batch of each epoch
    chunk = epoch_order(data, cfg.seed + epoch, G, cfg.bucket, cfg.pack)[k * G : (k + 1) * G]
    slot = rank * cfg.grad_accum + micro
    return chunk[slot * cfg.batch_size : (slot + 1) * cfg.batch_size].tolist()


class PairStep(nn.Module):
    """What DDP wraps: it syncs gradients only for work done inside a module's forward().
    Returns {objective: what backward sees, rm_loss: the pairwise loss alone (comparable with
    evaluate's), r_chosen, r_rejected}; the LM-regularized model adds its lm_loss."""

    def __init__(self, rm, cfg):
        super().__init__()
        self.rm, self.cfg = rm, cfg

    def forward(self, b):
        c, rm = self.cfg, self.rm
        if isinstance(rm, LMRegularizedRewardModel):
            pair = (b.chosen, b.chosen_mask, b.rejected, b.rejected_mask, b.chosen_response_mask)
            objective, stats = rm.loss(*pair, c.lm_coef, c.loss, c.margin, c.center_coef)
            return dict(stats, objective=objective)
        if isinstance(rm, LengthDebiasedRewardModel):  # ODIN: the loss sees both heads
            odin = (c.loss, c.margin, c.center_coef, c.length_coef)
            if c.pack:
                row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
                objective, stats = rm.loss_packed(*row, *odin, flex=b.tokens.is_cuda)
            else:
                pair = (b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
                objective, stats = rm.loss(*pair, b.chosen_response_mask, *odin)
            return dict(stats, objective=objective)
        if c.pack:  # one row per pair, the prompt computed once (data/pairs.py pack_pairs)
            ends = (b.chosen_end, b.rejected_end)
            r_c, r_r = rm.forward_pair_packed(
                b.tokens, b.segments, b.positions, *ends, flex=b.tokens.is_cuda, states=b.states
            )
        else:
            r_c, r_r = rm.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
        loss = pairwise_loss(c.loss, r_c, r_r, margin=c.margin, center_coef=c.center_coef)
        return dict(
            objective=loss, rm_loss=loss.detach(), r_chosen=r_c.detach(), r_rejected=r_r.detach()
        )


# ----------------------------------------------------------------------------- setup
@dataclass
class Processes:
    """Who this process is and where it computes (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE)."""

    ddp: bool
    rank: int
    local_rank: int
    world: int
    device: str
    dtype: str
    ctx: AbstractContextManager  # bf16 autocast, or nothing

    @property
    def master(self):  # rank 0 writes the checkpoint, the log and the plots
        return self.rank == 0

    @property
    def cuda(self):
        return self.device.startswith("cuda")


def setup_processes(cfg):
    ddp = "RANK" in os.environ
    rank, local_rank, world = 0, 0, 1
    device = check_device(cfg.device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if ddp:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        world = int(os.environ["WORLD_SIZE"])
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
    dtype = cfg.dtype
    if dtype == "auto":  # bf16 where the GPU has it; on a CPU fp32, which is faster there
        dtype = (
            "bfloat16"
            if device.startswith("cuda") and torch.cuda.is_bf16_supported()
            else "float32"
        )
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16)
    ctx = autocast if dtype == "bfloat16" else nullcontext()
    return Processes(ddp, rank, local_rank, world, device, dtype, ctx)


def load_data(cfg, proc):
    """(meta.json's dict, train pairs, val pairs)."""
    if proc.master and cfg.dataset == "arith":
        built_in()  # the default data makes itself when missing; rank 0 alone writes it
    if proc.ddp:
        dist.barrier()  # the other ranks wait for it, then everyone reads the same files
    d = dataset_dir(cfg.dataset)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    train, val = (PairDataset(os.path.join(d, f"{split}.npz")) for split in ("train", "val"))
    G = cfg.batch_size * cfg.grad_accum * proc.world
    if len(train) < G:
        raise UsageError(
            f"{d} has {len(train)} training pairs, fewer than one global batch of {G}: "
            "lower --batch_size or --grad_accum"
        )
    if cfg.epochs:  # each epoch is len(train) // G steps (the last partial batch is dropped)
        cfg.max_iters = cfg.epochs * (len(train) // G)
    return meta, train, val


def open_caches(cfg, proc, rm, train, val, say):
    """(train, val) FrozenCache of the bottom layers' output, when --train_layers freezes some
    and the model is the plain RM (the LM term and ODIN need more than the reward tokens);
    else (None, None). A cached run trains and evaluates on packed rows, an exact re-layout."""
    if not (cfg.cache and cfg.train_layers and type(rm) is RewardModel and cfg.init != "scratch"):
        return None, None
    cfg.pack, first = True, len(rm.backbone.layers) - cfg.train_layers
    d = dataset_dir(cfg.dataset)
    key = cache_key(cfg.init, os.path.join(d, "train.npz"), os.path.join(d, "val.npz"), first=first)
    folder = os.path.join(cfg.cache_dir or os.path.join(d, "cache"), key)
    say(f"cache of the bottom {first} layers: {folder}")
    caches = []
    for split, data in (("train", train), ("val", val)):
        if proc.master:
            FrozenCache.open_or_build(rm.backbone, data, split, first, folder, 0, say)
        if proc.ddp:
            dist.barrier()  # rank 0 built it; every rank reads it
        caches.append(FrozenCache(folder, split, first))
    return tuple(caches)


def make_batch(data, idx, pad_id, packed, cache=None):
    """One micro-batch: right-padded rows, or packed rows with, from a cache, the output of the
    frozen layers that the forward then starts from."""
    if not packed:
        return data.collate(idx, pad_id)
    b = data.collate_packed(idx, pad_id)
    if cache is not None:
        b.states = (cache.first, cache.rows(idx, b.tokens.size(1)))
    return b


def build_model(cfg, meta):
    """The reward model, on the CPU, its frozen weights marked requires_grad=False."""
    Model = LMRegularizedRewardModel if cfg.lm_coef > 0 else RewardModel
    if cfg.length_head:
        if Model is not RewardModel:
            raise UsageError("--length_head is a second head of the plain RM: use --lm_coef 0")
        Model = LengthDebiasedRewardModel
    if cfg.pack and Model is LMRegularizedRewardModel:
        raise UsageError("--pack packs the plain reward model's pair: use it with --lm_coef 0")
    if cfg.init != "scratch" and not os.path.exists(cfg.init):
        raise UsageError(f"--init {cfg.init} not found (a .bin/.pt, .gguf, HF or Meta dir)")
    check_tokenizer(cfg, meta)  # before the weights are read: a wrong vocabulary fails fast
    if cfg.init == "scratch":
        shape = dict(MODELS[cfg.model], multiple_of=32, max_seq_len=cfg.max_seq_len)
        rm = Model.from_config(
            ModelConfig(**shape, vocab_size=meta["vocab_size"], dropout=cfg.dropout)
        )
    else:
        try:
            rm = Model.from_backbone_checkpoint(cfg.init)
        except ValueError as e:  # the readers' "wrong format, shapes do not fit": one line
            raise UsageError(str(e) if cfg.init in str(e) else f"{cfg.init}: {e}") from None
    vocab = rm.backbone.config.vocab_size
    if vocab < meta["vocab_size"]:
        raise UsageError(
            f"{cfg.init} has vocab_size {vocab}, the data's tokenizer {meta['tokenizer']} "
            f"has {meta['vocab_size']}"
        )
    if cfg.train_layers:
        train_top_layers(rm, cfg.train_layers)
    if cfg.lora_rank:  # on the trained layers (all, without --train_layers); the head trains
        n = len(rm.backbone.layers)
        add_lora(rm, cfg.lora_rank, cfg.lora_alpha, range(n - (cfg.train_layers or n), n))
        print(memory_report(rm))
    if Model is not LMRegularizedRewardModel and not rm.backbone.config.tie_embeddings:
        # a plain reward model never uses the LM head: freeze it, or DDP waits for its gradient
        rm.backbone.output.weight.requires_grad_(False)
    if cfg.center_coef == 0 and rm.head.bias is not None:
        # a constant added to every reward cancels in r_c - r_r, so the head's bias gets a zero
        # gradient plus float noise, which Adam would blow up into steps of size lr. Centering
        # (center_coef > 0) is what gives the bias something to learn.
        rm.head.bias.requires_grad_(False)
    rm.backbone.gradient_checkpointing = cfg.grad_ckpt
    return rm.train()


def check_tokenizer(cfg, meta):
    """Refuse data tokenized with another vocabulary than the --init checkpoint's, when the
    checkpoint carries a tokenizer (a .gguf, an HF or Meta directory): an equal vocab_size is
    not an equal vocabulary. A llama2.c .bin carries none: only its size is checked."""
    want = meta.get("tokenizer_fingerprint")
    if cfg.init == "scratch" or not want:
        return
    tok = checkpoint_tokenizer(cfg.init, missing_ok=True)
    if tok is not None and tokenizer_fingerprint(tok) != want:
        raise UsageError(
            f"{cfg.init} carries tokenizer {tokenizer_fingerprint(tok)}, but the dataset "
            f"{dataset_dir(cfg.dataset)} was tokenized with {meta['tokenizer']} ({want}): "
            f"prepare it again with --tokenizer {cfg.init}"
        )


def train_top_layers(rm, n):
    """Train only the top n layers, the final norm and the head. What is frozen gets no
    gradient, so autograd keeps no activations below the first trained layer (the bottom
    layers run as inference), and it stays out of the optimizer."""
    layers = rm.backbone.layers
    if not 0 < n <= len(layers):
        raise UsageError(f"--train_layers {n}: the model has {len(layers)} layers")
    rm.requires_grad_(False)
    heads = [rm.head, getattr(rm, "length_head", None)]  # --length_head's second head trains too
    for module in (*layers[len(layers) - n :], rm.backbone.norm, *filter(None, heads)):
        module.requires_grad_(True)


def make_optimizer(rm, cfg, device):
    """AdamW on the weights that train, with decay on matrices only (never norms and biases)."""
    head = {id(p) for p in rm.head.parameters()} if cfg.head_lr else set()
    params = [p for p in rm.parameters() if p.requires_grad]
    body = [p for p in params if id(p) not in head]
    groups = [
        {"params": [p for p in body if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in body if p.dim() < 2], "weight_decay": 0.0},
    ]
    if head:  # its own peak, on the same schedule: lr_scale multiplies get_lr's value
        heads = [p for p in params if id(p) in head]
        groups.append({"params": heads, "weight_decay": 0.0, "lr_scale": cfg.head_lr / cfg.lr})
    fused = device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused), params


def describe(rm, cfg, proc, train, val):
    """What a reader needs at startup: sizes, what trains, the device and the batch."""
    n_params = sum(p.numel() for p in rm.parameters())
    n_train = sum(p.numel() for p in rm.parameters() if p.requires_grad)
    G = cfg.batch_size * cfg.grad_accum * proc.world
    which = f" (the top {cfg.train_layers} layers, final norm and head)" if cfg.train_layers else ""
    return (
        f"{type(rm).__name__}: {n_params:,} parameters, {n_train:,} of them train{which}\n"
        f"{len(train)} train / {len(val)} val pairs, device {proc.device} x {proc.world}, "
        f"dtype {proc.dtype}, {cfg.batch_size} pairs x {cfg.grad_accum} accumulation "
        f"x {proc.world} ranks = {G} pairs/step"
    )


def check_out_dir(cfg, proc):
    """Never replace another run by accident, nor resume nothing. Rank 0 looks before any rank
    writes, and every rank gets its answer, so that all of them stop together."""
    ckpt, problem = os.path.join(cfg.out_dir, "ckpt.pt"), None
    if proc.master and cfg.resume and not os.path.exists(ckpt):
        problem = f"{ckpt} not found: nothing to resume (drop --resume to start a new run)"
    elif proc.master and os.path.exists(ckpt) and not (cfg.resume or cfg.overwrite):
        problem = (
            f"{cfg.out_dir} holds a run ({ckpt}): pass --resume to continue it, "
            "--overwrite to replace it, or another --out_dir"
        )
    if proc.ddp:
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem:
        raise UsageError(problem)


def start_log(path, keep_until=None):
    """Keep the log rows of the steps a resumed checkpoint holds (up to keep_until); a new
    run (keep_until None) starts an empty log."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [r for r in f if keep_until is not None and json.loads(r)["step"] <= keep_until]
    with open(path, "w") as f:
        f.writelines(rows)


def append_row(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def matmul_weights(rm):
    """The weights a token is multiplied by (for MFU): not the embedding lookup, nor an LM head
    that is frozen because it is never used."""
    return sum(
        p.numel()
        for n, p in rm.named_parameters()
        if "tok_embeddings" not in n and (p.requires_grad or "output" not in n)
    )


class Speedometer:
    """Tokens per second since the last report, and the time left."""

    def __init__(self):
        self.t0 = self.start = time.time()
        self.tokens = self.computed = 0

    def add(self, tokens, computed):
        self.tokens, self.computed = self.tokens + tokens, self.computed + computed

    def report(self, rm, proc, steps_done, steps_left):
        """(useful tokens/s, a line: tok/s, MFU on CUDA against an H100's bf16 peak, eta)."""
        dt = time.time() - self.t0
        tok_s, line = self.tokens / dt, f"{self.tokens / dt / 1e3:.1f}k tok/s"
        if proc.cuda:  # per GPU; tokens computed (a packed prompt once)
            line += f" | mfu {rm.backbone.estimate_mfu(matmul_weights(rm), self.computed / dt / proc.world):.1%}"
        line += f" | eta {(time.time() - self.start) / steps_done * steps_left:.0f}s"
        self.t0, self.tokens, self.computed = time.time(), 0, 0
        return tok_s, line

    def total(self):
        return time.time() - self.start


def plot(out_dir):
    """curves.png: loss and accuracy over the steps (eval_rm.write_report draws the rest).
    matplotlib's object API: no pyplot and no backend switch, so a notebook that calls main()
    keeps showing its own figures."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    fig = Figure(figsize=(10, 3.5))
    for ax, key in zip(fig.subplots(1, 2), ("loss", "acc"), strict=True):
        for split, style in (("train", "-"), ("eval", "o-")):
            pts = [(r["step"], r[key]) for r in rows if r["split"] == split]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=split, alpha=0.8)
        ax.set_xlabel("step"), ax.set_title(key), ax.legend(), ax.grid(alpha=0.3)
    save(fig, out_dir, "curves.png")


# ----------------------------------------------------------------------------- training
def main(argv=None):
    cfg = parse_args(argv)
    proc = setup_processes(cfg)
    check_out_dir(cfg, proc)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    meta, train, val = load_data(cfg, proc)
    rm = build_model(cfg, meta).to(proc.device)
    if cfg.fsdp:  # before the optimizer, which must hold the shards
        shard(rm, proc)
    optimizer, params = make_optimizer(rm, cfg, proc.device)
    ckpt_path, log_path = (os.path.join(cfg.out_dir, f) for f in ("ckpt.pt", "log.jsonl"))
    load = load_full_state if cfg.fsdp else None  # a full state, scattered into the shards
    step = resume(ckpt_path, rm, optimizer, proc.device, meta, load) if cfg.resume else 0
    say = print if proc.master else lambda *args, **kwargs: None  # rank 0 speaks and writes
    if cfg.resume:
        say(f"resuming from step {step} of {ckpt_path}")
    if proc.master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        start_log(log_path, keep_until=step if cfg.resume else None)
    say(describe(rm, cfg, proc, train, val))
    caches = open_caches(cfg, proc, rm, train, val, say)
    trainer = PairStep(rm, cfg)
    if cfg.compile:
        trainer = torch.compile(trainer)
    if proc.ddp and not cfg.fsdp:
        trainer = DDP(trainer, device_ids=[proc.local_rank] if proc.cuda else None)
    log = lambda row: proc.master and append_row(log_path, row)
    # once in a while: evaluate on the held-out pairs (all ranks take part)
    scoring = dict(loss=cfg.loss, margin=cfg.margin, center_coef=cfg.center_coef, ctx=proc.ctx)
    scoring.update(n_pairs=cfg.eval_pairs, rank=proc.rank, world=proc.world, cache=caches[1])

    def held_out(last):  # under FSDP on the whole weights, gathered once (fsdp.gathered: why)
        with gathered(rm) if cfg.fsdp else nullcontext():
            return evaluate(rm, val, meta["pad_id"], cfg.batch_size, **scoring, return_rewards=last)

    speed, start_step, ev, rewards = Speedometer(), step, None, None
    while True:
        epoch_end = cfg.epochs and step % (cfg.max_iters // cfg.epochs) == 0
        if step % cfg.eval_interval == 0 or step == cfg.max_iters or epoch_end:
            # skipped: a resumed step (evaluated before its save) and, if asked, step 0
            if not (cfg.resume and step == start_step) and (step or cfg.eval_first):
                ev, rewards = held_out(step == cfg.max_iters)  # the last keeps its rewards
                log(dict(step=step, split="eval", **ev))
                say(f"step {step}: eval loss {ev['loss']:.4f} acc {ev['acc']:.4f}", end="")
                say(f" margin {ev['margin']:.3f}")
                if step > start_step:  # under FSDP all ranks gather the state, rank 0 writes
                    full = full_state(rm, optimizer) if cfg.fsdp else {}
                    if proc.master:
                        save_checkpoint(ckpt_path, rm, meta, optimizer, step, cfg, **full)
        if step == cfg.max_iters:
            break
        lr = get_lr(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        # forward backward update, with gradient accumulation to simulate a larger batch.
        # tokens_computed is for MFU: with --pack each prompt is computed once, not twice
        metrics = dict(objective=0.0, loss=0.0, acc=0.0, tokens=0, tokens_computed=0)
        for micro in range(cfg.grad_accum):
            idx = batch_indices(step, micro, proc.rank, proc.world, cfg, train)
            b = make_batch(train, idx, meta["pad_id"], cfg.pack, caches[0]).to(proc.device)
            # sync gradients across ranks only on the last micro-step: once per optimizer step
            last_micro = micro == cfg.grad_accum - 1
            sync = nullcontext()
            if proc.ddp and not last_micro:  # DDP's no_sync, or FSDP's (fsdp.py)
                sync = no_sync(rm) if cfg.fsdp else trainer.no_sync()
            with sync, proc.ctx:
                out = trainer(b)
                # each micro-step's loss is a mean over its pairs; dividing by grad_accum makes
                # the summed gradient the mean over the whole batch, as one big step would give
                (out["objective"] / cfg.grad_accum).backward()
            metrics["objective"] += out["objective"].item() / cfg.grad_accum
            metrics["loss"] += out["rm_loss"].item() / cfg.grad_accum
            metrics["acc"] += accuracy(out["r_chosen"], out["r_rejected"]).item() / cfg.grad_accum
            metrics["tokens"] += b.n_tokens
            metrics["tokens_computed"] += b.n_packed if cfg.pack else b.n_tokens
        metrics = all_reduce_sum(metrics, proc.world, proc.device)  # one call for all of them
        objective = metrics["objective"] / proc.world
        if not math.isfinite(objective):
            kept = f"the last good checkpoint stays at {ckpt_path}"
            kept = kept if os.path.exists(ckpt_path) else "no checkpoint was written yet"
            raise FloatingPointError(f"loss is {objective} at step {step}: stopping; {kept}")
        # the norm before clipping is logged: it shows instabilities, and it is what the tests use
        # to check that accumulation scales the gradient right (Adam alone would hide a 4x error)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or math.inf).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        speed.add(metrics["tokens"], metrics["tokens_computed"])
        if step % cfg.log_interval == 0 or step == cfg.max_iters:
            row = dict(step=step, split="train", objective=objective, lr=lr, grad_norm=grad_norm)
            row.update(loss=metrics["loss"] / proc.world, acc=metrics["acc"] / proc.world)
            row["tok_per_s"], line = speed.report(rm, proc, step - start_step, cfg.max_iters - step)
            log(row)
            say(
                f"step {step}/{cfg.max_iters} | loss {row['loss']:.4f} | acc {row['acc']:.3f} | "
                f"objective {objective:.4f} | lr {lr:.2e} | {line}"
            )

    if rewards is None:  # resumed at the end: the checkpoint's evaluation was not kept
        ev, rewards = held_out(True)
    if proc.master:  # curves.png, and eval_rm's report: eval.json and the reward plots
        plot(cfg.out_dir)
        write_report(cfg.out_dir, subsets_of(val, meta, rewards, os.path.basename(cfg.dataset)))
        print(
            f"done in {speed.total():.0f}s: held-out accuracy {ev['acc']:.4f}; 'longer response"
            f" wins' {meta.get('length_baseline_val', float('nan')):.3f}; wrote {ckpt_path}, "
            f"{log_path}, curves.png, eval.json and the reward plots"
        )
    if proc.ddp:
        dist.barrier()
        dist.destroy_process_group()
    return ev if proc.master else None


if __name__ == "__main__":
    run(main)
