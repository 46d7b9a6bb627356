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
import socket
from contextlib import nullcontext
from dataclasses import asdict, dataclass, is_dataclass, replace
from functools import lru_cache

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import LambdaLR

import nanorm.calibrate as calibrate
from data import UsageError, run
from data.pairs import (
    BALANCE,
    DATA,
    as_batch,
    balance_weights,
    balanced_order,
    bucketed_order,
    dataset_dir,
    open_dataset,
)
from eval_rm import evaluate
from model import ModelConfig
from nanorm.ckpt import check_tokenizer, resume, save_checkpoint
from nanorm.cli import AT_LEAST_1, NON_NEGATIVE, POSITIVE, one_of, opt, parse_config
from nanorm.report import response_lengths, subsets_of, write_report, write_served_report
from nanorm.runtime import (
    Processes,
    Speedometer,
    all_reduce_sum,
    append_row,
    check_finite,
    check_out_dir,
    describe,
    plot_log,
    setup_processes,
    start_log,
    with_dtype,
)
from reward import LOSSES, LMRegularizedRewardModel, LogSigLoss, PairwiseLoss, RewardModel, accuracy

# A feature behind a flag is imported where its flag is handled, so a default run loads only
# what it runs: --fsdp (nanorm/fsdp.py), --lora_rank (nanorm/lora.py), --length_head
# (nanorm/length_head.py), --subset_experts (nanorm/subset_experts.py), --train_layers's cache
# (nanorm/cache.py), and the built-in data's labelling (data/arith/prepare.py, which uses
# verifiable.py).

EVAL_SHOWN = ("loss", "acc", "margin")  # of evaluate's metrics, printed at each evaluation
# the options that make a run what it is: --resume refuses to change them (--max_iters, the
# intervals and the device may change)
RESUME_SAME = tuple(
    "dataset init model max_seq_len dropout loss margin center_coef lm_coef lr min_lr warmup "
    "weight_decay grad_clip seed balance bucket train_layers length_head length_coef "
    "subset_experts gate_coef head_lr lora_rank lora_alpha epochs".split()
)

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
        "auto: bf16 where it pays: CUDA, or a CPU with native bf16 (AVX512-BF16/AMX) for models "
        "512 wide or more (runtime.auto_dtype); else fp32",
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
    save_interval: int = opt(
        0, "> 0: also keep out_dir/ckpt-<step>.pt every this many steps", NON_NEGATIVE
    )
    log_dir: str = opt("", "write TensorBoard events here (needs the tensorboard package)")
    wandb: bool = opt(False, "log to Weights & Biases (needs the wandb package)")
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
    if len(val) == 0:
        raise UsageError(
            f"{d} has no held-out pairs (val.npz): prepare it with a larger --val_frac"
        )
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
    else:  # any checkpoint: a foreign backbone gets a new head; our ckpt.pt gives its heads
        try:
            rm = Model(pretrained=cfg.init).train()
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
    --head_lr: every head at its own peak, on the same schedule. Each group's initial_lr is its
    peak, which the scheduler (LambdaLR) scales."""
    head = {id(p) for m in heads_of(rm) for p in m.parameters()} if cfg.head_lr else set()
    params = [p for p in rm.parameters() if p.requires_grad]
    body = [p for p in params if id(p) not in head]
    groups = [
        {"params": [p for p in body if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in body if p.dim() < 2], "weight_decay": 0.0},
    ]
    if head:
        heads = [p for p in params if id(p) in head]
        groups.append({"params": heads, "weight_decay": 0.0, "lr": cfg.head_lr})
    for g in groups:
        g["initial_lr"] = g.get("lr", cfg.lr)
    fused = device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused)


def open_caches(cfg, proc, rm, train, val, say):
    """(train, val) cache.FrozenCache of the frozen layers' output, when --train_layers freezes
    some and the model reads the last layer at the reward tokens alone (the plain RM, ODIN's; the
    LM term reads every token); else (None, None). A cached run trains and evaluates on packed
    rows, an exact re-layout (main sets --pack)."""
    reads_ends = not isinstance(rm, LMRegularizedRewardModel)  # the plain RM's, ODIN's
    if not (cfg.cache and cfg.train_layers and reads_ends and cfg.init != "scratch"):
        return None, None
    from nanorm.cache import open_caches_of  # --train_layers on a pretrained model

    d = dataset_dir(cfg.dataset)
    first = len(rm.backbone.layers) - cfg.train_layers
    return open_caches_of(rm.backbone, cfg.init, d, first, train, val, proc, cfg.cache_dir, say)


class PairStep(nn.Module):
    """What DDP wraps: it syncs gradients only for work done inside a module's forward().
    The objective is the model's own loss() (the pairwise loss loss_fn, plus the LM term of the
    LM-regularized model, or ODIN's length terms, or the gate's); options are that model's
    own (lm_coef, length_coef, gate_coef), and groups=True passes each pair's subset. Returns
    {objective: what backward sees, rm_loss: the pairwise loss alone (comparable with
    evaluate's), r_chosen, r_rejected, accuracy, and the model's own terms}."""

    def __init__(self, rm, loss_fn, options=None, pack=False, groups=False):
        super().__init__()
        self.rm, self.loss_fn, self.pack, self.groups = rm, loss_fn, pack, groups
        self.options = dict(options or {}, loss_fn=loss_fn)

    def forward(self, b):
        options = dict(self.options, groups=b.groups) if self.groups else self.options
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


# ----------------------------------------------------------------------------- the trainer
class RewardModelTrainer:
    """ColossalChat's RewardModelTrainer, and the one training loop: `python train_rm.py`
    builds a model, its data, optimizer and scheduler from the flags and calls fit().

        trainer = RewardModelTrainer(model, optimizer, lr_scheduler, tokenizer, max_epochs=1,
                                     accumulation_steps=4, save_interval=500, save_dir="out")
        trainer.fit(train_preference_dataloader=train_dl, eval_preference_dataloader=eval_dl,
                    log_dir="out/tb", use_wandb=False)

    The seed's arguments: loss_fn(chosen_reward, reject_reward), default LogSigLoss(beta); the
    scheduler steps once per optimizer step; save_interval > 0 keeps a numbered checkpoint
    save_dir/ckpt-<step>.pt every save_interval steps, beside the resumable save_dir/ckpt.pt
    written at each evaluation; every training interval and evaluation is a row of
    save_dir/log.jsonl; log_dir writes TensorBoard events, use_wandb logs to Weights & Biases.
    The dataloaders yield ColossalChat's preference dicts (chosen_input_ids,
    chosen_attention_mask, reject_input_ids, reject_attention_mask) or nanoRM's batches; the
    eval set may be a PairDataset. ColossalAI's booster, plugin and coordinator have no
    counterpart: run under torchrun (DDP, or --fsdp) and pass proc (runtime.setup_processes).

    nanoRM's keywords after those: max_steps (stop there; default every epoch), start_step (a
    resumed run's), grad_clip, log_interval, eval_interval (0: at each epoch's end), eval_first
    (evaluate the untrained model), eval_options (evaluate's pad_id, batch_size, n_pairs, cache
    for a PairDataset), options (the model's own: lm_coef, length_coef, gate_coef), groups
    (pass each pair's subset), pack (packed batches), compile, fsdp, lora, meta and
    train_config (stored in the checkpoints)."""

    def __init__(
        self,
        model,
        optimizer,
        lr_scheduler,
        tokenizer=None,
        loss_fn=None,
        max_epochs=1,
        beta=0.1,
        accumulation_steps=1,
        start_epoch=0,
        save_interval=0,
        save_dir=None,
        *,
        max_steps=None,
        start_step=0,
        grad_clip=1.0,
        log_interval=25,
        eval_interval=0,
        eval_first=False,
        eval_options=None,
        options=None,
        groups=False,
        pack=False,
        compile=False,
        fsdp=False,
        lora=False,
        proc=None,
        meta=None,
        train_config=None,
    ):
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.tokenizer = tokenizer  # the seed saves it; a checkpoint carries meta's tokenizer
        self.loss_fn = LogSigLoss(beta=beta) if loss_fn is None else loss_fn
        self.max_epochs, self.accumulation_steps = max_epochs, accumulation_steps
        self.start_epoch, self.save_interval, self.save_dir = start_epoch, save_interval, save_dir
        self.max_steps, self.step, self.grad_clip = max_steps, start_step, grad_clip
        self.log_interval, self.eval_interval, self.eval_first = (
            log_interval,
            eval_interval,
            eval_first,
        )
        self.eval_options = eval_options or {}
        self.fsdp, self.lora, self.meta, self.train_config = fsdp, lora, meta, train_config
        self.proc = proc or one_process(model)
        self.say = print if self.proc.master else lambda *args, **kwargs: None  # rank 0 speaks
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.eval_metrics, self.eval_rewards = None, None  # the last evaluation
        # compiled if asked, wrapped in DDP under torchrun (FSDP shards the model itself)
        self.step_fn = PairStep(model, self.loss_fn, options, pack, groups)
        if compile:
            self.step_fn = torch.compile(self.step_fn)
        if self.proc.ddp and not fsdp:
            device_ids = [self.proc.local_rank] if self.proc.cuda else None
            self.step_fn = DDP(self.step_fn, device_ids=device_ids)

    def path(self, name):
        return os.path.join(self.save_dir, name) if self.save_dir else None

    def fit(
        self,
        train_preference_dataloader,
        eval_preference_dataloader=None,
        log_dir=None,
        use_wandb=False,
    ):
        """Train for max_epochs (or up to max_steps), evaluating at each eval_interval and
        each epoch's end and saving there; returns the last evaluation's metrics."""
        proc, accum, train = self.proc, self.accumulation_steps, train_preference_dataloader
        self.eval_data, self.loggers = (
            eval_preference_dataloader,
            open_loggers(log_dir, use_wandb, self.train_config, proc.master),
        )
        if self.save_dir and proc.master:
            os.makedirs(self.save_dir, exist_ok=True)
        if self.step == 0 and self.eval_first:
            self.evaluate_and_save(last=self.max_steps == 0)
        self.speed, start_step = Speedometer(), self.step
        per_epoch = len(train) // accum if hasattr(train, "__len__") else None
        self.total_steps = (
            per_epoch and per_epoch * (self.max_epochs - self.start_epoch) + self.step
        )
        interval, n_logged = {}, 0  # sums of the training figures since the last log line
        for epoch in range(self.start_epoch, self.max_epochs):
            for sampler in (train, getattr(train, "sampler", None)):  # each epoch its order
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
            self.optimizer.zero_grad(set_to_none=True)  # a last incomplete step is dropped
            n_batches = len(train) if hasattr(train, "__len__") else None
            figures, tokens, computed = {}, 0, 0
            for i, b in enumerate(train):
                if self.max_steps is not None and self.step >= self.max_steps:
                    break
                # forward backward update, with gradient accumulation to simulate a larger
                # batch: accum micro-steps, then one optimizer step
                micro = i % accum
                b = as_batch(b).to(proc.device)
                # sync gradients across ranks only on the last micro-step: once per optimizer step
                sync = nullcontext()
                if proc.ddp and micro < accum - 1:  # DDP's no_sync, or FSDP's
                    sync = self.no_sync()
                with sync, proc.ctx:
                    out = self.step_fn(b)
                    # each micro-step's loss is a mean over its pairs; dividing by accum makes the
                    # summed gradient the mean over the whole batch, as one big step would give
                    (out["objective"] / accum).backward()
                for k, v in step_figures(out).items():  # this step's: the mean of its micro-steps
                    figures[k] = figures.get(k, 0.0) + v / accum  # on the device, no sync
                tokens += b.n_tokens
                computed += getattr(b, "n_packed", b.n_tokens)  # packed: each prompt once
                if micro < accum - 1:
                    continue
                lr = self.optimizer.param_groups[0]["lr"]
                metrics = self.update(figures, tokens, computed)
                figures, tokens, computed = {}, 0, 0
                # the log shows means over the steps since the last log line, not one noisy batch
                for k, v in metrics.items():
                    interval[k] = interval.get(k, 0.0) + v
                n_logged += 1
                last = self.step == self.max_steps
                if self.step % self.log_interval == 0 or last:
                    self.log_train(interval, n_logged, lr, self.step - start_step)
                    interval, n_logged = {}, 0
                epoch_end = n_batches is not None and i + 1 >= n_batches - n_batches % accum
                if (
                    (self.eval_interval and self.step % self.eval_interval == 0)
                    or epoch_end
                    or last
                ):
                    self.evaluate_and_save(last=last)
                if self.save_interval and self.step % self.save_interval == 0 and proc.master:
                    self.save(self.path(f"ckpt-{self.step}.pt"))
        for logger in self.loggers:
            logger.close()
        return self.eval_metrics

    def no_sync(self):
        if self.fsdp:
            from nanorm.fsdp import no_sync  # --fsdp

            return no_sync(self.model)
        return self.step_fn.no_sync()

    def update(self, figures, tokens, computed):
        """One optimizer step on the accumulated gradients, after the figures of every rank
        are summed (one device-to-host copy per step, one all_reduce); -> the step's figures,
        averaged over the ranks, with grad_norm."""
        proc = self.proc
        metrics = dict(zip(figures, torch.stack(list(figures.values())).tolist(), strict=True))
        metrics |= dict(tokens=tokens, computed=computed)
        metrics = all_reduce_sum(metrics, proc.world, proc.device)
        self.speed.add(metrics.pop("tokens"), metrics.pop("computed"))  # over all ranks
        metrics = {k: v / proc.world for k, v in metrics.items()}
        check_finite(metrics["objective"], self.step, self.path("ckpt.pt"))
        # the norm before clipping is logged: it shows instabilities, and it is what the tests
        # use to check that accumulation scales the gradient right (Adam would hide a 4x error)
        clip = self.grad_clip or math.inf
        metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.params, clip).item()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.step += 1
        return metrics

    def log_train(self, interval, n_logged, lr, steps_done):
        row = dict(step=self.step, split="train", lr=lr, steps=n_logged)
        row.update({k: v / n_logged for k, v in interval.items()})
        steps_left = (self.max_steps or self.total_steps or self.step) - self.step
        row["tok_per_s"], line = self.speed.report(self.model, self.proc, steps_done, steps_left)
        self.log(row)
        lm = f" | lm {row['lm_loss']:.4f}" if "lm_loss" in row else ""
        lm += f" | gate acc {row['gate_acc']:.3f}" if "gate_acc" in row else ""
        total = (
            f"/{self.max_steps or self.total_steps}" if self.max_steps or self.total_steps else ""
        )
        self.say(
            f"step {self.step}{total} | mean of {n_logged} steps: loss {row['loss']:.4f} | "
            f"acc {row['acc']:.3f}{lm} | margin {row['margin']:.3f} | lr {lr:.2e} | {line}"
        )

    def log(self, row):
        """A row of log.jsonl (rank 0), and of TensorBoard and W&B where they are on."""
        if not self.proc.master:
            return
        if self.save_dir:
            append_row(self.path("log.jsonl"), row)
        for logger in self.loggers:
            logger.log(row)

    def evaluate(self, last=False):
        """(metrics, rewards) on the eval data, every rank taking part (under FSDP on the
        whole weights, gathered once: fsdp.gathered says why); rewards only if last."""
        gathered = nullcontext()
        if self.fsdp:
            from nanorm.fsdp import gathered  # --fsdp

            gathered = gathered(self.model)
        scoring = dict(self.eval_options, loss_fn=self.loss_fn, ctx=self.proc.ctx)
        scoring.update(rank=self.proc.rank, world=self.proc.world, return_rewards=last)
        with gathered:
            return evaluate(self.model, self.eval_data, **scoring)

    def evaluate_and_save(self, last=False):
        """Once in a while: evaluate on the held-out pairs (all ranks take part), log it, and
        save the resumable save_dir/ckpt.pt (not at the step a run starts or resumes from)."""
        if self.eval_data is not None:
            self.eval_metrics, self.eval_rewards = self.evaluate(last)
            ev = self.eval_metrics
            self.log(dict(step=self.step, split="eval", **ev))
            self.say(f"step {self.step}: eval " + ", ".join(f"{k} {ev[k]:.4f}" for k in EVAL_SHOWN))
        if self.step > 0 and self.save_dir:
            self.save(self.path("ckpt.pt"))

    def save(self, path):
        """The model, optimizer, scheduler and step, written atomically by rank 0 (under FSDP
        every rank gathers the state; with LoRA the adapters are folded into the weights, so
        the checkpoint has the base model's keys). Never non-finite weights: the run stops,
        and the file keeps the last finite ones."""
        local = [getattr(p, "_local_tensor", p).detach() for p in self.model.parameters()]
        bad = sum(int(not torch.isfinite(p).all()) for p in local)
        if all_reduce_sum(dict(bad=bad), self.proc.world, self.proc.device)["bad"]:
            kept = (
                f"{path} keeps the last finite weights" if os.path.exists(path) else "nothing saved"
            )
            raise FloatingPointError(
                f"the weights are not finite at step {self.step}: stopping; {kept}"
            )
        full = {}
        if self.fsdp:
            from nanorm.fsdp import full_state  # --fsdp

            full = full_state(self.model, self.optimizer)
        if self.lora:
            from nanorm.lora import merged_state_dict  # --lora_rank

            full = dict(model_state=merged_state_dict(self.model))
        if self.proc.master:
            sched = self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None
            run = (self.model, self.meta, self.optimizer, self.step, self.train_config)
            try:
                save_checkpoint(path, *run, lr_scheduler=sched, world=self.proc.world, **full)
            except OSError as e:  # a full disk: the file written aside is gone, the old kept
                kept = "the previous one is kept" if os.path.exists(path) else "none was written"
                raise UsageError(
                    f"{path}: could not be written at step {self.step} ({e.strerror}); {kept}: "
                    "free space, then --resume"
                ) from None


def one_process(model):
    """The Processes of a trainer built in Python without torchrun: one, on the model's
    device, in the model's dtype (no autocast)."""
    device = str(next(model.parameters()).device)
    return Processes(False, 0, 0, 1, device, "float32", nullcontext())


class Logger:
    """TensorBoard (torch.utils.tensorboard, needs the tensorboard package) or Weights & Biases
    (wandb): each row of log.jsonl as scalars named split/key, at its step."""

    def __init__(self, kind, log_dir, config):
        self.kind = kind
        if kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UsageError(
                    "--log_dir writes TensorBoard events: pip install tensorboard"
                ) from None
            self.writer = SummaryWriter(log_dir)
        else:
            try:
                import wandb
            except ImportError:
                raise UsageError("--wandb logs to Weights & Biases: pip install wandb") from None
            self.run = wandb.init(project="nanorm", dir=log_dir, config=config)

    def log(self, row):
        scalars = {
            f"{row['split']}/{k}": v
            for k, v in row.items()
            if k not in ("step", "split") and isinstance(v, (int, float))
        }
        if self.kind == "tensorboard":
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, row["step"])
        else:
            self.run.log(scalars, step=row["step"])

    def close(self):
        if self.kind == "tensorboard":
            self.writer.close()
        else:
            self.run.finish()


def open_loggers(log_dir, use_wandb, train_config, master):
    """The loggers fit() writes to beside log.jsonl, on rank 0."""
    if not master:
        return []
    config = asdict(train_config) if is_dataclass(train_config) else train_config
    loggers = [Logger("tensorboard", log_dir, config)] if log_dir else []
    if use_wandb:
        loggers.append(Logger("wandb", log_dir, config))
    return loggers


class PairBatches:
    """train_rm.py's training data as fit() reads it: for each step of an epoch, grad_accum
    micro-batches, this rank's slice of the step's global batch (batch_indices), padded or
    packed (with the frozen layers' cached output when there is a cache). An epoch here is
    steps_per_epoch optimizer steps from first_step on (a resumed run's), none past max_iters."""

    def __init__(self, data, cfg, proc, pad_id, cache, steps_per_epoch, first_step):
        self.data, self.cfg, self.proc, self.pad_id, self.cache = data, cfg, proc, pad_id, cache
        self.steps_per_epoch, self.first_step, self.epoch = steps_per_epoch, first_step, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def steps(self):
        start = max(self.first_step, self.epoch * self.steps_per_epoch)
        return range(start, min((self.epoch + 1) * self.steps_per_epoch, self.cfg.max_iters))

    def __len__(self):
        return len(self.steps()) * self.cfg.grad_accum

    def __iter__(self):
        cfg, proc = self.cfg, self.proc
        for step in self.steps():
            for micro in range(cfg.grad_accum):
                idx = batch_indices(step, micro, proc.rank, proc.world, cfg, self.data)
                if cfg.pack:  # one row per pair; with a cache, the frozen layers' output too
                    yield self.data.collate_packed(idx, self.pad_id, self.cache)
                else:
                    yield self.data.collate(idx, self.pad_id)


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
    new = not os.path.exists(cfg.out_dir)
    lock = own_out_dir(cfg.out_dir) if proc.master else None
    try:
        return train(cfg, proc)
    except FloatingPointError as e:  # a diverging run: one line, as every expected failure
        raise Diverged(str(e)) from None
    finally:
        if lock is not None:
            os.remove(lock)
            if new and not os.listdir(cfg.out_dir):  # refused before writing: leave no trace
                os.rmdir(cfg.out_dir)


class Diverged(UsageError, FloatingPointError):
    """A run whose loss or weights stopped being finite: printed as one line by data.run."""


def own_out_dir(out_dir):
    """A run owns its --out_dir while it runs: out_dir/.lock holds its process id, and a second
    run into the folder is refused in one line naming the first. A lock whose process is gone
    (a run killed before it could remove it) is taken over. -> the lock's path."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out_dir {out_dir} is a file: give a folder for the run")
    os.makedirs(out_dir, exist_ok=True)
    path, me = os.path.join(out_dir, ".lock"), f"{os.getpid()} {socket.gethostname()}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            with open(path) as f:
                pid, _, host = f.read().strip().partition(" ")
            if not (host == socket.gethostname() and pid.isdigit() and not alive(int(pid))):
                raise UsageError(
                    f"{out_dir} is in use by another run (process {pid} on {host or '?'}): "
                    "wait for it to end, or choose another --out_dir"
                ) from None
            os.remove(path)  # a run that was killed: its lock is stale
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me + "\n")
        return path
    raise UsageError(f"{path}: could not take the lock of --out_dir {out_dir}")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def train(cfg, proc):
    """main's run, once the out_dir is this run's."""
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    meta, train, val = load_data(cfg, proc)
    steps_per_epoch = len(train) // (cfg.batch_size * cfg.grad_accum * proc.world)
    if cfg.epochs:  # each epoch is that many steps (the last partial batch is dropped)
        cfg = replace(cfg, max_iters=cfg.epochs * steps_per_epoch)
    rm = build_model(cfg, meta).to(proc.device)
    proc = with_dtype(proc, cfg.dtype, rm.backbone.config)  # auto: bf16 only where it pays
    load_full_state = None  # how a sharded model takes a full state (--resume)
    if cfg.fsdp:  # before the optimizer, which must hold the shards
        from nanorm.fsdp import load_full_state, shard  # --fsdp

        shard(rm, proc)
    optimizer = make_optimizer(rm, cfg, proc.device)
    ckpt_path, log_path = (os.path.join(cfg.out_dir, f) for f in ("ckpt.pt", "log.jsonl"))
    step = 0
    if cfg.resume:  # under FSDP a full state, scattered into the shards
        same = {k: getattr(cfg, k) for k in RESUME_SAME}
        same["global_batch"] = cfg.batch_size * cfg.grad_accum * proc.world  # any split of it
        step = resume(ckpt_path, rm, optimizer, proc.device, meta, load_full_state, same)
        if step > cfg.max_iters:
            raise UsageError(
                f"{ckpt_path} is at step {step}, past --max_iters {cfg.max_iters}: "
                "raise --max_iters to train further"
            )
    # the learning rate of step s is get_lr(s): the scheduler scales each group's initial_lr
    scheduler = LambdaLR(optimizer, lambda s: get_lr(s, cfg) / cfg.lr, last_epoch=step - 1)
    say = print if proc.master else lambda *args, **kwargs: None  # rank 0 speaks and writes
    if cfg.resume:
        say(f"resuming from step {step} of {ckpt_path}")
    if proc.master:
        start_log(log_path, keep_until=step if cfg.resume else None)
    say(describe(rm, cfg, proc, train, val))
    caches = open_caches(cfg, proc, rm, train, val, say)
    if caches[0] is not None:  # a cached run trains and evaluates on packed rows
        cfg = replace(cfg, pack=True)
    epochs, per_epoch = (cfg.epochs, steps_per_epoch) if cfg.epochs else (1, cfg.max_iters)
    trainer = RewardModelTrainer(
        rm,
        optimizer,
        scheduler,
        loss_fn=PairwiseLoss(cfg.loss, cfg.margin, cfg.center_coef),
        max_epochs=epochs,
        accumulation_steps=cfg.grad_accum,
        start_epoch=min(step // per_epoch, epochs - 1) if per_epoch else 0,
        save_interval=cfg.save_interval,
        save_dir=cfg.out_dir,
        max_steps=cfg.max_iters,
        start_step=step,
        grad_clip=cfg.grad_clip,
        log_interval=cfg.log_interval,
        eval_interval=cfg.eval_interval,
        eval_first=cfg.eval_first,
        eval_options=dict(
            pad_id=meta["pad_id"],
            batch_size=cfg.batch_size,
            n_pairs=cfg.eval_pairs,
            cache=caches[1],
        ),
        options=model_options(rm, cfg),
        groups=cfg.subset_experts,  # the gate learns each pair's subset
        pack=cfg.pack,
        compile=cfg.compile,
        fsdp=cfg.fsdp,
        lora=bool(cfg.lora_rank),
        proc=proc,
        meta=meta,
        train_config=cfg,
    )
    batches = PairBatches(train, cfg, proc, meta["pad_id"], caches[0], per_epoch, step)
    trainer.fit(batches, val, log_dir=cfg.log_dir or None, use_wandb=cfg.wandb)
    ev, rewards = trainer.eval_metrics, trainer.eval_rewards
    if rewards is None:  # resumed at the end: the checkpoint's evaluation was not kept
        ev, rewards = trainer.evaluate(last=True)
    cal = None
    if cfg.calibrate_length:  # the reward's length dependence, fitted on the training pairs
        trainer.eval_data = train
        trainer.eval_options.update(n_pairs=None, cache=caches[0])
        _, train_rewards = trainer.evaluate(last=True)
        cal = calibrate.fit_length(train_rewards, response_lengths(train, len(train)))
    return finish(cfg, proc, meta, val, ev, rewards, trainer.speed, cal)


def model_options(rm, cfg):
    """The options of the model's own loss() that the flags set: the LM term's weight, ODIN's,
    the gate's (None: the model's default)."""
    options = {}
    if isinstance(rm, LMRegularizedRewardModel):
        options["lm_coef"] = cfg.lm_coef
    if cfg.length_head and cfg.length_coef is not None:
        options["length_coef"] = cfg.length_coef
    if cfg.subset_experts and cfg.gate_coef is not None:
        options["gate_coef"] = cfg.gate_coef
    return options


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
