"""
Train a reward model on preference pairs: one readable loop, CPU or GPUs.

    python train_rm.py                                   # built-in arithmetic pairs, laptop CPU, minutes
    python train_rm.py --help                            # every option with its default
    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz --tokenizer ../shared/data/llama2c/stories260K/tok512.bin --out_dir data/hh_rlhf/helpful-tok512
    python train_rm.py --dataset hh_rlhf/helpful-tok512 --init ../shared/data/llama2c/stories260K/stories260K.bin
    python train_rm.py --dataset DIR --init model.gguf --train_layers 4 --epochs 2   # top 4 layers, cached bottom
    python train_rm.py --dataset DIR --init model.gguf --lora_rank 8       # LoRA adapters on every layer
    torchrun --standalone --nproc_per_node=8 train_rm.py --model small --batch_size 16
    torchrun --standalone --nproc_per_node=8 train_rm.py --fsdp --init DIR --dataset DIR   # sharded
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train_rm.py

One optimizer step sees batch_size * grad_accum * world_size pairs. Under torchrun each rank takes
its own slice of that global batch (NCCL on CUDA, gloo on CPU), gradients are averaged by DDP,
and only rank 0 writes. Output in --out_dir: ckpt.pt (written atomically; it also holds the
dataset's meta.json as `data_meta`), log.jsonl, curves.png, and eval_rm.py's report of the
final evaluation: eval.json, reward_hist.png, reward_length.png, reliability.png.

From a pretrained checkpoint: --train_layers k trains the top k layers and the head, the frozen
layers' output computed once per pair and cached (nanorm/cache.py); --epochs N; --lora_rank r
(nanorm/lora.py); --fsdp shards the model over the ranks (nanorm/fsdp.py). Length
(bench/README.md, "Length under control"): --length_head trains ODIN's second head
(nanorm/length_head.py); --calibrate_length fits the reward's length dependence on the training
pairs and stores it (nanorm/calibrate.py, out_dir/calibrated/). Subsets that disagree (HH-RLHF's
harmless and helpful): --subset_experts gives each its own head, mixed by a gate that learns the
subset from the text (nanorm/subset_experts.py). The run's plumbing (processes,
out_dir, log, speed) is nanorm/runtime.py's; the held-out evaluation is eval_rm.evaluate, its
report nanorm/report.py's; ckpt.pt is nanorm/ckpt.py's.

Simplified on purpose: no mixed fp16 (bf16 needs no loss scaling); a single fixed train/val split
from the prepare script; the cache is built by rank 0 alone.
"""

import math
import os
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from data import UsageError, run
from data.pairs import (
    BALANCE,
    DATA,
    balance_weights,
    balanced_order,
    bucketed_order,
    dataset_dir,
    open_dataset,
)
from eval_rm import all_reduce_sum, evaluate, fit_calibration
from model import ModelConfig
from nanorm.ckpt import check_tokenizer, resume, save_checkpoint
from nanorm.cli import AT_LEAST_1, NON_NEGATIVE, POSITIVE, one_of, opt, parse_config
from nanorm.report import subsets_of, write_report, write_served_report
from nanorm.runtime import (
    Speedometer,
    append_row,
    check_finite,
    check_out_dir,
    describe,
    plot_log,
    setup_processes,
    start_log,
)
from reward import LOSSES, LMRegularizedRewardModel, RewardModel, accuracy

# A feature behind a flag is imported where its flag is handled, so a default run loads only
# what it runs: --fsdp (nanorm/fsdp.py), --lora_rank (nanorm/lora.py), --length_head
# (nanorm/length_head.py), --subset_experts (nanorm/subset_experts.py), --train_layers's cache
# (nanorm/cache.py), and the built-in data's labelling (data/arith/prepare.py, which uses
# verifiable.py).

EVAL_SHOWN = ("loss", "acc", "margin")  # of evaluate's metrics, printed at each evaluation

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
    lm_coef: float = opt(1.0, "> 0: LM-regularized RM with this LM weight; 0: plain", NON_NEGATIVE)
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
    weight_decay: float = opt(0.1, "AdamW decay on matrices (not norms, biases)", NON_NEGATIVE)
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)", NON_NEGATIVE)
    seed: int = opt(1337, "seeds the initial weights and the data order")
    device: str = opt("auto", "auto, cpu, cuda, cuda:1, mps (checked by cli.check_device)")
    dtype: str = opt(
        "auto",
        "auto: bf16 where the hardware multiplies it natively (CUDA, AVX512-BF16/AMX CPUs)",
        one_of("auto", "float32", "bfloat16"),
    )
    compile: bool = opt(False, "torch.compile the training step (faster on GPU, slow to start)")
    pack: bool = opt(False, "shared-prompt packing: [prompt|chosen|rejected] in one row (plain RM)")
    bucket: bool = opt(False, "length-bucketed batches: less padding, a less random order")
    balance: str = opt(
        "none",
        "sample pairs so that chosen-longer and chosen-shorter (length), subsets (subset) weigh "
        "the same (data/pairs.py balance_weights)",
        one_of(*BALANCE),
    )
    grad_ckpt: bool = opt(False, "activation checkpointing: recompute layers in backward")
    train_layers: int = opt(0, "> 0: train the top N layers, final norm, head", NON_NEGATIVE)
    length_head: bool = opt(False, "ODIN: a second head absorbs response length; the first scores")
    length_coef: float | None = opt(
        None, "--length_head: weight of ODIN's terms (default: length_head.LENGTH_COEF)"
    )
    subset_experts: bool = opt(
        False, "a reward head per subset, mixed by a gate taught the subset (subset_experts.py)"
    )
    gate_coef: float | None = opt(
        None, "--subset_experts: weight of the gate's cross-entropy (default: GATE_COEF)"
    )
    calibrate_length: bool = opt(False, "fit, store the length calibration (nanorm/calibrate.py)")
    epochs: int = opt(
        0, "> 0: passes over the pairs (sets --max_iters), eval at each end", NON_NEGATIVE
    )
    cache: bool = opt(
        True, "--train_layers: store the frozen layers' output once (nanorm/cache.py)"
    )
    cache_dir: str = opt("", "where the cache goes (default: <dataset>/cache)")
    head_lr: float = opt(0.0, "> 0: the head's peak learning rate (else --lr's)", NON_NEGATIVE)
    lora_rank: int = opt(
        0, "> 0: LoRA adapters of this rank on trained layers (nanorm/lora.py)", NON_NEGATIVE
    )
    lora_alpha: float = opt(16.0, "LoRA's scale alpha (the update is alpha / rank * B @ A)")
    fsdp: bool = opt(False, "under torchrun: shard weights, grads and AdamW state (nanorm/fsdp.py)")
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


# ----------------------------------------------------------------------------- setup
def load_data(cfg, proc):
    """(meta.json's dict, train pairs, val pairs)."""
    built = os.path.exists(os.path.join(DATA, "arith", "meta.json"))
    if proc.master and cfg.dataset == "arith" and not built:
        from data.arith.prepare import built_in  # labels pairs with verifiable.py: only if missing

        built_in()  # the default data makes itself when missing; rank 0 alone writes it
    if proc.ddp:
        dist.barrier()  # the other ranks wait for it, then everyone reads the same files
    d, meta, (train, val) = open_dataset(cfg.dataset, "train", "val")
    G = cfg.batch_size * cfg.grad_accum * proc.world
    if len(train) < G:
        raise UsageError(
            f"{d} has {len(train)} training pairs, fewer than one global batch of {G}: "
            "lower --batch_size or --grad_accum"
        )
    if cfg.epochs:  # each epoch is len(train) // G steps (the last partial batch is dropped)
        cfg.max_iters = cfg.epochs * (len(train) // G)
    return meta, train, val


def build_model(cfg, meta):
    """The reward model, on the CPU, its frozen weights marked requires_grad=False."""
    Model = LMRegularizedRewardModel if cfg.lm_coef > 0 else RewardModel
    if cfg.length_head:
        from nanorm.length_head import LengthDebiasedRewardModel  # --length_head

        if Model is not RewardModel:
            raise UsageError("--length_head is a second head of the plain RM: use --lm_coef 0")
        Model = LengthDebiasedRewardModel
    if cfg.subset_experts:
        from nanorm.subset_experts import SubsetExpertsRewardModel  # --subset_experts

        if Model is not RewardModel:
            raise UsageError("--subset_experts: a plain RM's heads, use --lm_coef 0 alone")
        if len(meta.get("groups") or []) < 2:
            raise UsageError(
                f"--subset_experts: {cfg.dataset}'s meta.json names no subsets (groups): "
                "prepare data from several sources, or leave the flag out"
            )
        Model = SubsetExpertsRewardModel
    if cfg.pack and Model is LMRegularizedRewardModel:
        raise UsageError("--pack packs the plain reward model's pair: use it with --lm_coef 0")
    if cfg.init != "scratch" and not os.path.exists(cfg.init):
        raise UsageError(f"--init {cfg.init} not found (a .bin/.pt, .gguf, HF or Meta dir)")
    # before the weights are read: data of another vocabulary fails fast
    check_tokenizer(cfg.init, meta, dataset_dir(cfg.dataset))
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
    if cfg.subset_experts:
        rm.set_experts(len(meta["groups"]))
    vocab = rm.backbone.config.vocab_size
    if vocab < meta["vocab_size"]:
        raise UsageError(
            f"{cfg.init} has vocab_size {vocab}, the data's tokenizer {meta['tokenizer']} "
            f"has {meta['vocab_size']}"
        )
    if cfg.train_layers:
        train_top_layers(rm, cfg.train_layers)
    if cfg.lora_rank:  # on the trained layers (all, without --train_layers); the head trains
        from nanorm.lora import add_lora, memory_report  # --lora_rank

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


def train_top_layers(rm, n):
    """Train only the top n layers, the final norm and the head. What is frozen gets no
    gradient, so autograd keeps no activations below the first trained layer (the bottom
    layers run as inference), and it stays out of the optimizer."""
    layers = rm.backbone.layers
    if not 0 < n <= len(layers):
        raise UsageError(f"--train_layers {n}: the model has {len(layers)} layers")
    rm.requires_grad_(False)
    for module in (*layers[len(layers) - n :], rm.backbone.norm, *heads_of(rm)):
        module.requires_grad_(True)


def heads_of(rm):
    """rm.head and the heads beside it (--length_head's, --subset_experts' experts and gate)."""
    return [
        rm.head,
        *filter(None, (getattr(rm, k, None) for k in ("length_head", "experts", "gate"))),
    ]


def make_optimizer(rm, cfg, device):
    """AdamW on the weights that train, with decay on matrices only (never norms and biases);
    --head_lr: every head at its own peak."""
    head = {id(p) for m in heads_of(rm) for p in m.parameters()} if cfg.head_lr else set()
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


def open_caches(cfg, proc, rm, train, val, say):
    """(train, val) cache.FrozenCache of the frozen layers' output, when --train_layers freezes
    some and the model reads the last layer at the reward tokens alone (the plain RM, ODIN's; the
    LM term reads every token); else (None, None). A cached run trains and evaluates on packed
    rows, an exact re-layout."""
    reads_ends = not isinstance(rm, LMRegularizedRewardModel)  # the plain RM's, ODIN's
    if not (cfg.cache and cfg.train_layers and reads_ends and cfg.init != "scratch"):
        return None, None
    from nanorm.cache import open_caches_of  # --train_layers on a pretrained model

    cfg.pack, d = True, dataset_dir(cfg.dataset)
    first = len(rm.backbone.layers) - cfg.train_layers
    return open_caches_of(rm.backbone, cfg.init, d, first, train, val, proc, cfg.cache_dir, say)


def make_trainer(rm, cfg, proc):
    """PairStep around rm: compiled if asked, wrapped in DDP under torchrun (FSDP shards rm
    itself: fsdp.shard)."""
    trainer = PairStep(rm, cfg)
    if cfg.compile:
        trainer = torch.compile(trainer)
    if proc.ddp and not cfg.fsdp:
        trainer = DDP(trainer, device_ids=[proc.local_rank] if proc.cuda else None)
    return trainer


class PairStep(nn.Module):
    """What DDP wraps: it syncs gradients only for work done inside a module's forward().
    The objective is the model's own loss() (the pairwise loss, plus the LM term of the
    LM-regularized model, or ODIN's length terms); this passes the batch and the options
    through. Returns {objective: what backward sees, rm_loss: the pairwise loss alone
    (comparable with evaluate's), r_chosen, r_rejected, accuracy, and the model's own terms}."""

    def __init__(self, rm, cfg):
        super().__init__()
        self.rm, self.pack = rm, cfg.pack
        self.options = dict(kind=cfg.loss, margin=cfg.margin, center_coef=cfg.center_coef)
        if isinstance(rm, LMRegularizedRewardModel):
            self.options["lm_coef"] = cfg.lm_coef
        if hasattr(rm, "length_head") and cfg.length_coef is not None:  # --length_head
            self.options["length_coef"] = cfg.length_coef
        self.grouped = hasattr(rm, "gate")  # --subset_experts: the gate learns each pair's subset
        if self.grouped and cfg.gate_coef is not None:
            self.options["gate_coef"] = cfg.gate_coef

    def forward(self, b):
        options = dict(self.options, groups=b.groups) if self.grouped else self.options
        if self.pack:  # one row per pair, the prompt computed once (data/pairs.py pack_pairs)
            row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
            flex = b.tokens.is_cuda  # FlexAttention's block mask on CUDA
            objective, stats = self.rm.loss_packed(*row, **options, flex=flex, states=b.states)
        else:
            pair = (b.chosen, b.chosen_mask, b.rejected, b.rejected_mask, b.chosen_response_mask)
            objective, stats = self.rm.loss(*pair, **options)
        return dict(stats, objective=objective)


MODEL_TERMS = ("lm_loss", "rho_quality", "rho_length", "gate_loss", "gate_acc")


def step_figures(out):
    """The numbers a training row logs from one micro-step's PairStep output, as 0-d tensors
    left on the device: the objective, the pairwise loss (evaluation's), accuracy, the mean
    chosen and rejected rewards and their margin, and the model's own terms (the LM term;
    ODIN's correlations)."""
    r_c, r_r = out["r_chosen"].float(), out["r_rejected"].float()
    figures = dict(objective=out["objective"].detach().float(), loss=out["rm_loss"].float())
    figures.update(acc=accuracy(r_c, r_r), margin=(r_c - r_r).mean())
    figures.update(reward_chosen=r_c.mean(), reward_rejected=r_r.mean())
    figures.update({k: out[k].float() for k in MODEL_TERMS if k in out})
    return figures


# ----------------------------------------------------------------- the schedule and the batches
def get_lr(step, cfg):
    """Linear warmup to cfg.lr, then cosine decay to cfg.min_lr at cfg.max_iters."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_iters - cfg.warmup))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def batch_indices(step, micro, rank, world, cfg, data):
    """The pairs of one micro-step. The global batch of a step is fixed by (seed, step) alone, so
    any split of it over ranks and micro-steps sees the same pairs, and resuming needs no state."""
    G, n = cfg.batch_size * cfg.grad_accum * world, len(data)  # n >= G: load_data checks
    epoch, k = divmod(step, n // G)  # drop the last partial batch of each epoch
    order = epoch_order(data, cfg.seed + epoch, G, cfg.bucket, cfg.pack, cfg.balance)
    chunk = order[k * G : (k + 1) * G]
    slot = rank * cfg.grad_accum + micro
    return chunk[slot * cfg.batch_size : (slot + 1) * cfg.batch_size].tolist()


@lru_cache(maxsize=2)
def epoch_order(data, seed, G, bucket, packed, balance="none"):
    """One epoch's order of the pairs: seeded by the epoch, so every rank computes the same.
    --balance: len(data) pairs drawn with replacement by their balance_weights, so a pair is
    seen once per epoch on average."""
    if balance != "none":
        order = balanced_order(balance_weights(data, balance), len(data), seed)
        if bucket:
            order = order[bucketed_order(data.lengths(packed)[order.numpy()], G, seed)]
        return order
    if bucket:  # each run of G pairs (one global batch) has similar lengths
        return bucketed_order(data.lengths(packed), G, seed)
    return torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- training
def main(argv=None):
    cfg = parse_args(argv)
    proc = setup_processes(cfg)
    check_out_dir(cfg, proc)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    meta, train, val = load_data(cfg, proc)
    rm = build_model(cfg, meta).to(proc.device)
    if cfg.fsdp:  # before the optimizer, which must hold the shards
        from nanorm.fsdp import full_state, gathered, load_full_state, no_sync, shard  # --fsdp

        shard(rm, proc)
    if cfg.lora_rank:
        from nanorm.lora import merged_state_dict  # --lora_rank
    optimizer, params = make_optimizer(rm, cfg, proc.device)
    ckpt_path, log_path = (os.path.join(cfg.out_dir, f) for f in ("ckpt.pt", "log.jsonl"))
    load = load_full_state if cfg.fsdp else None  # a full state, scattered into the shards
    step = resume(ckpt_path, rm, optimizer, proc.device, meta, load) if cfg.resume else 0
    say = print if proc.master else lambda *args, **kwargs: None  # rank 0 speaks and writes
    cfg.resume and say(f"resuming from step {step} of {ckpt_path}")
    proc.master and start_log(log_path, keep_until=step if cfg.resume else None)
    say(describe(rm, cfg, proc, train, val))
    caches = open_caches(cfg, proc, rm, train, val, say)
    trainer = make_trainer(rm, cfg, proc)
    log = lambda row: proc.master and append_row(log_path, row)
    # once in a while: evaluate on the held-out pairs (all ranks take part)
    scoring = dict(loss=cfg.loss, margin=cfg.margin, center_coef=cfg.center_coef, ctx=proc.ctx)
    scoring.update(n_pairs=cfg.eval_pairs, rank=proc.rank, world=proc.world, cache=caches[1])

    def held_out(last):  # under FSDP on the whole weights, gathered once (fsdp.gathered: why)
        with gathered(rm) if cfg.fsdp else nullcontext():
            return evaluate(rm, val, meta["pad_id"], cfg.batch_size, **scoring, return_rewards=last)

    speed, start_step, ev, rewards = Speedometer(), step, None, None
    interval, n_logged = {}, 0  # sums of the training figures since the last log line
    while True:
        epoch_end = cfg.epochs and step % (cfg.max_iters // cfg.epochs) == 0
        if step % cfg.eval_interval == 0 or step == cfg.max_iters or epoch_end:
            # skipped: a resumed step (evaluated before its save) and, if asked, step 0
            if not (cfg.resume and step == start_step) and (step or cfg.eval_first):
                ev, rewards = held_out(step == cfg.max_iters)  # the last keeps its rewards
                log(dict(step=step, split="eval", **ev))
                say(f"step {step}: eval " + ", ".join(f"{k} {ev[k]:.4f}" for k in EVAL_SHOWN))
                if step > start_step:  # under FSDP all ranks gather the state, rank 0 writes
                    full = full_state(rm, optimizer) if cfg.fsdp else {}
                    if cfg.lora_rank:  # the adapters folded in: the checkpoint has HF's keys
                        full = dict(model_state=merged_state_dict(rm))
                    proc.master and save_checkpoint(
                        ckpt_path, rm, meta, optimizer, step, cfg, **full
                    )
        if step == cfg.max_iters:
            break
        lr = get_lr(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        # forward backward update, with gradient accumulation to simulate a larger batch.
        # tokens_computed is for MFU: with --pack each prompt is computed once, not twice
        figures, tokens, computed = {}, 0, 0
        for micro in range(cfg.grad_accum):
            idx = batch_indices(step, micro, proc.rank, proc.world, cfg, train)
            # --pack: one row per pair; with a cache, the frozen layers' output comes along
            pad = meta["pad_id"]
            b = train.collate_packed(idx, pad, caches[0]) if cfg.pack else train.collate(idx, pad)
            b = b.to(proc.device)
            # sync gradients across ranks only on the last micro-step: once per optimizer step
            sync = nullcontext()
            if proc.ddp and micro < cfg.grad_accum - 1:  # DDP's no_sync, or FSDP's
                sync = no_sync(rm) if cfg.fsdp else trainer.no_sync()
            with sync, proc.ctx:
                out = trainer(b)
                # each micro-step's loss is a mean over its pairs; dividing by grad_accum makes
                # the summed gradient the mean over the whole batch, as one big step would give
                (out["objective"] / cfg.grad_accum).backward()
            for k, v in step_figures(out).items():  # this step's: the mean of its micro-steps
                figures[k] = figures.get(k, 0.0) + v / cfg.grad_accum  # on the device, no sync
            tokens += b.n_tokens
            computed += b.n_packed if cfg.pack else b.n_tokens
        # one device-to-host copy per step, and one all_reduce for every figure and rank
        metrics = dict(zip(figures, torch.stack(list(figures.values())).tolist(), strict=True))
        metrics = all_reduce_sum(
            metrics | dict(tokens=tokens, computed=computed), proc.world, proc.device
        )
        objective = metrics["objective"] / proc.world
        check_finite(objective, step, ckpt_path)
        # the norm before clipping is logged: it shows instabilities, and it is what the tests use
        # to check that accumulation scales the gradient right (Adam alone would hide a 4x error)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or math.inf).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        speed.add(metrics.pop("tokens"), metrics.pop("computed"))
        # the log shows means over the steps since the last log line, not one noisy batch
        for k, v in metrics.items():
            interval[k] = interval.get(k, 0.0) + v / proc.world
        interval["grad_norm"] = interval.get("grad_norm", 0.0) + grad_norm
        n_logged += 1
        if step % cfg.log_interval == 0 or step == cfg.max_iters:
            row = dict(step=step, split="train", lr=lr, steps=n_logged)
            row.update({k: v / n_logged for k, v in interval.items()})
            row["tok_per_s"], line = speed.report(rm, proc, step - start_step, cfg.max_iters - step)
            log(row)
            lm = f" | lm {row['lm_loss']:.4f}" if "lm_loss" in row else ""
            lm += f" | gate acc {row['gate_acc']:.3f}" if "gate_acc" in row else ""
            say(
                f"step {step}/{cfg.max_iters} | mean of {n_logged} steps: loss {row['loss']:.4f} | "
                f"acc {row['acc']:.3f}{lm} | margin {row['margin']:.3f} | lr {lr:.2e} | {line}"
            )
            interval, n_logged = {}, 0

    if rewards is None:  # resumed at the end: the checkpoint's evaluation was not kept
        ev, rewards = held_out(True)
    cal = None
    if cfg.calibrate_length:  # the reward's length dependence, fitted on the training pairs
        with gathered(rm) if cfg.fsdp else nullcontext():
            scoring.update(n_pairs=None, cache=caches[0])
            cal = fit_calibration(rm, train, meta["pad_id"], cfg.batch_size, **scoring)
    return finish(cfg, proc, meta, val, ev, rewards, speed, cal)


def finish(cfg, proc, meta, val, ev, rewards, speed, cal=None):
    """curves.png and eval_rm's report (eval.json and the reward plots) by rank 0; with a length
    calibration, the calibrated rewards' report in out_dir/calibrated/ and the calibration and
    their mean/std stored in ckpt.pt (as eval_rm.py --save_calibration). Every rank leaves the
    process group. Returns the last held-out metrics on rank 0."""
    if proc.master:
        plot_log(cfg.out_dir)
        subsets = subsets_of(val, meta, rewards, os.path.basename(cfg.dataset))
        write_report(cfg.out_dir, subsets)
        if cal is not None:  # the calibrated rewards' report, the calibration stored in ckpt.pt
            ckpt, calibrated = (os.path.join(cfg.out_dir, f) for f in ("ckpt.pt", "calibrated"))
            write_served_report(calibrated, subsets, cal, ckpt=ckpt)
        print(
            f"done in {speed.total():.0f}s: held-out accuracy {ev['acc']:.4f}; 'longer response"
            f" wins' {meta.get('length_baseline_val', float('nan')):.3f}; wrote {cfg.out_dir}/"
            "ckpt.pt, log.jsonl, curves.png, eval.json and the reward plots"
        )
    if proc.ddp:
        dist.barrier()
        dist.destroy_process_group()
    return ev if proc.master else None


if __name__ == "__main__":
    run(main)
