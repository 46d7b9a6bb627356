"""
Train a reward model on preference pairs: one readable loop, CPU or GPUs.

    python train_rm.py                                   # built-in arithmetic pairs, laptop CPU, minutes
    python train_rm.py --help                            # every option with its default
    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz --tokenizer ../shared/data/llama2c/stories260K/tok512.bin --out_dir data/hh_rlhf/helpful-tok512
    python train_rm.py --dataset hh_rlhf/helpful-tok512 --init ../shared/data/llama2c/stories260K/stories260K.bin
    python train_rm.py --dataset DIR --init model.gguf --train_layers 4 --epochs 2   # top 4 layers, cached bottom
    torchrun --standalone --nproc_per_node=8 train_rm.py --model small --batch_size 16
    torchrun --standalone --nproc_per_node=8 train_rm.py --fsdp --init DIR --dataset DIR   # sharded
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train_rm.py

One optimizer step sees batch_size * grad_accum * world_size pairs. Under torchrun each rank takes
its own slice of that global batch (NCCL on CUDA, gloo on CPU), gradients are averaged by DDP,
and only rank 0 writes. Output in --out_dir: ckpt.pt (written atomically), log.jsonl, curves.png,
and eval_rm.py's report of the final evaluation: eval.json and the reward plots.

Here: the options, the schedule, the step DDP wraps, and the loop (RewardModelTrainer.fit,
ColossalChat's trainer). In the library: what the flags build (nanorm/build.py), each step's
micro-batches (data/pairs.py), the processes (nanorm/base/runtime.py), the run's folder, lock and
log (nanorm/run_dir.py), ckpt.pt (nanorm/ckpt.py), the evaluation (eval_rm.py) and its report.

Simplified on purpose: no mixed fp16 (bf16 needs no loss scaling); a single fixed train/val split
from the prepare script; the cache is built by rank 0 alone.
"""

import math
import os
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import LambdaLR

from data.pairs import BALANCE, OptimizerSteps, PairSteps, as_batch
from eval_rm import evaluate, fit_calibration
from nanorm import run_dir
from nanorm.base import command, runtime
from nanorm.base.command import AT_LEAST_1, NON_NEGATIVE, POSITIVE, UsageError, one_of, opt
from nanorm.base.compat import colossalai_note, mean_loss
from nanorm.build import MODELS, build_model, load_data, make_optimizer, model_options, open_caches
from nanorm.ckpt import resume_run, save_training_checkpoint
from nanorm.report import write_run_report
from reward import LOSSES, LogSigLoss, PairwiseLoss, flex_pays


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
    device: str = opt("auto", "auto, cpu, cuda, cuda:1, mps (command.check_device)")
    dtype: str = opt("auto", "auto: bf16 where it pays", one_of("auto", "float32", "bfloat16"))
    compile: bool = opt(False, "torch.compile the training step (faster on GPU, slow to start)")
    pack: bool = opt(False, "shared-prompt packing: [prompt|chosen|rejected] in one row (plain RM)")
    bucket: bool = opt(False, "length-bucketed batches: less padding, a less random order")
    balance: str = opt("none", "weigh chosen-longer/shorter or subsets alike", one_of(*BALANCE))
    grad_ckpt: bool = opt(False, "activation checkpointing: recompute layers in backward")
    train_layers: int = opt(0, "> 0: train the top N layers, final norm, head", NON_NEGATIVE)
    length_head: bool = opt(False, "ODIN: a second head absorbs response length; the first scores")
    length_coef: float | None = opt(None, "--length_head: weight of ODIN's terms (None: default)")
    subset_experts: bool = opt(False, "a reward head per subset, mixed by a gate taught the subset")
    gate_coef: float | None = opt(None, "--subset_experts: the gate's weight (None: default)")
    calibrate_length: bool = opt(False, "fit, store the length calibration (nanorm/calibrate.py)")
    epochs: int = opt(0, "> 0: passes over the pairs (sets --max_iters)", NON_NEGATIVE)
    cache: bool = opt(True, "--train_layers: store the frozen layers' output once")
    cache_dir: str = opt("", "where the cache goes (default: <dataset>/cache)")
    head_lr: float = opt(0.0, "> 0: the head's peak learning rate (else --lr's)", NON_NEGATIVE)
    lora_rank: int = opt(0, "> 0: LoRA adapters of this rank on trained layers", NON_NEGATIVE)
    lora_alpha: float = opt(16.0, "LoRA's scale alpha (the update is alpha / rank * B @ A)")
    fsdp: bool = opt(False, "under torchrun: shard weights, grads and AdamW state (nanorm/fsdp.py)")
    save_interval: int = opt(0, "> 0: keep out_dir/ckpt-<step>.pt every N steps", NON_NEGATIVE)
    log_dir: str = opt("", "write TensorBoard events here (needs the tensorboard package)")
    wandb: bool = opt(False, "log to Weights & Biases (needs the wandb package)")
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")
    overwrite: bool = opt(False, "start afresh in an out_dir that holds a run (replaces its files)")


def parse_args(argv=None) -> TrainConfig:
    """The options (each checked by its field), then the checks across options."""
    cfg = command.parse_config(TrainConfig, argv, description=__doc__.split("\n")[1])
    if cfg.min_lr > cfg.lr:
        raise UsageError(f"--min_lr {cfg.min_lr} is above --lr {cfg.lr}")
    if cfg.resume and cfg.overwrite:
        raise UsageError("--resume continues the run in --out_dir, --overwrite replaces it")
    return cfg


# ----------------------------------------------------------------------------- optimizer, schedule
def get_lr(step, cfg):
    """Linear warmup to cfg.lr, then cosine decay to cfg.min_lr at cfg.max_iters."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_iters - cfg.warmup))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


# ----------------------------------------------------------------------------- one micro-step
class PairObjective(nn.Module):
    """What DDP wraps (it syncs gradients only for work inside a module's forward()): the model's
    own loss(), loss_fn plus the LM term, ODIN's or the gate's (options); groups: each pair's
    subset. -> {objective: what backward sees, rm_loss, r_chosen, r_rejected, the terms}."""

    def __init__(self, rm, loss_fn, options=None, pack=False, groups=False):
        super().__init__()
        self.rm, self.loss_fn, self.pack, self.groups = rm, loss_fn, pack, groups
        self.options = dict(options or {}, loss_fn=loss_fn)

    def forward(self, b):
        options = dict(self.options, groups=b.groups) if self.groups else self.options
        if self.pack:  # one row per pair, the prompt computed once (data/pairs.py pack_pairs)
            row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
            flex = flex_pays(b.tokens)  # FlexAttention's block mask on CUDA in bf16
            objective, stats = self.rm.loss_packed(*row, **options, flex=flex, states=b.states)
        else:
            pair = (b.chosen, b.chosen_mask, b.rejected, b.rejected_mask, b.chosen_response_mask)
            objective, stats = self.rm.loss(*pair, **options)
        return dict(stats, objective=objective)


# ----------------------------------------------------------------------------- the trainer
class RewardModelTrainer:
    """ColossalChat's RewardModelTrainer, its signature and contract, and the one loop `python
    train_rm.py` runs: the mean of loss_fn(chosen_reward, reject_reward) (default LogSigLoss());
    the scheduler steps once per optimizer step; train mode to train, eval mode to evaluate;
    save_interval: save_dir/ckpt-<step>.pt beside the resumable ckpt.pt; each epoch's evaluation
    in save_dir/eval_result_epoch<N>.txt; every training row (the mean of log_interval steps, or
    of an epoch's last) and evaluation in log.jsonl, TensorBoard (log_dir), W&B (use_wandb).
    ColossalAI's booster, plugin and coordinator do no work here (nanorm/base/compat.py says what
    stands in for them). nanoRM's keywords: log_interval (steps a training row averages), and a
    train_rm.py run's config (its max_iters, grad_clip, log and eval intervals; without it the
    gradient norm is clipped to 1.0 and the evaluation runs at each epoch's end), proc, meta,
    start_step, val_cache."""

    def __init__(
        self,
        model,
        booster=None,
        optimizer=None,
        plugin=None,
        lr_scheduler=None,
        tokenizer=None,
        loss_fn=None,
        max_epochs=1,
        beta=0.1,
        accumulation_steps=1,
        start_epoch=0,
        save_interval=0,
        save_dir=None,
        coordinator=None,
        *,
        log_interval=1,
        config=None,
        proc=None,
        meta=None,
        start_step=0,
        val_cache=None,
    ):
        if optimizer is None:
            raise UsageError("RewardModelTrainer needs an optimizer (optimizer=...)")
        if save_interval and not save_dir:
            raise UsageError("save_interval writes save_dir/ckpt-<step>.pt: give a save_dir")
        colossalai_note(booster, plugin, coordinator)  # what stands in for them here
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.tokenizer, self.coordinator = tokenizer, coordinator  # ckpt.pt carries meta's
        self.loss_fn = mean_loss(LogSigLoss(beta=beta) if loss_fn is None else loss_fn)
        self.max_epochs, self.accumulation_steps = max_epochs, accumulation_steps
        self.start_epoch, self.save_interval, self.save_dir = start_epoch, save_interval, save_dir
        c, self.step, self.kept = config, start_step, self.path("ckpt.pt") if start_step else None
        self.max_steps, self.grad_clip = (c.max_iters, c.grad_clip) if c else (None, 1.0)
        self.log_interval = c.log_interval if c else log_interval
        self.eval_interval = c.eval_interval if c else 0  # 0: at each epoch's end
        self.config, self.meta, self.val_cache = config, meta, val_cache
        self.fsdp = bool(config and config.fsdp)
        self.proc = proc or runtime.single_process(model)
        self.say = print if self.proc.master else lambda *args, **kwargs: None  # rank 0 speaks
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.eval_metrics, self.eval_rewards, self.evaluated_at = None, None, None
        # compiled if asked, wrapped in DDP under torchrun (FSDP shards the model itself)
        pack, groups = bool(config and config.pack), bool(config and config.subset_experts)
        options = model_options(model, config)  # the LM term's weight, ODIN's, the gate's
        self.step_fn = PairObjective(model, self.loss_fn, options, pack, groups)
        if config and config.compile:
            self.step_fn = torch.compile(self.step_fn)
        if self.proc.ddp and not self.fsdp:
            device_ids = [self.proc.local_rank] if self.proc.cuda else None
            self.step_fn = DDP(self.step_fn, device_ids=device_ids)
            self.no_sync = self.step_fn.no_sync  # DDP's; FSDP's: nanorm/fsdp.py
        if self.fsdp:
            from nanorm.fsdp import no_sync  # --fsdp

            self.no_sync = lambda: no_sync(model)

    def fit(
        self,
        train_preference_dataloader,
        eval_preference_dataloader=None,
        log_dir=None,
        use_wandb=False,
    ):
        """Train max_epochs (or max_steps), evaluating and saving when due; -> the last eval."""
        proc, train = self.proc, train_preference_dataloader
        if not isinstance(train, OptimizerSteps):  # a loader of micro-batches, grouped by step
            train = OptimizerSteps(train, self.accumulation_steps)
            if len(train) == 0:  # nothing would be trained, and nothing said
                raise UsageError(
                    f"the training loader holds {len(train.loader)} batches, not one optimizer "
                    f"step of accumulation_steps={self.accumulation_steps}: give it more pairs"
                )
        self.eval_data, start = eval_preference_dataloader, self.step
        total = self.max_steps or len(train) * (self.max_epochs - self.start_epoch) + self.step
        self.speed = runtime.Speedometer()  # tokens/s, and the time left
        speed = lambda: self.speed.report(self.model, proc, self.step - start, total - self.step)
        loggers = run_dir.open_loggers(log_dir, use_wandb, self.config, proc.master)
        log_path = proc.master and self.path("log.jsonl")  # rank 0 writes
        self.log = run_dir.TrainingLog(log_path, loggers, self.say, total)
        if self.step == 0 and self.config and self.config.eval_first:  # the untrained baseline
            self.evaluate_and_save(last=self.max_steps == 0)
        for epoch in range(self.start_epoch, self.max_epochs):
            train.set_epoch(epoch)  # each epoch its order of the pairs
            self.model.train()
            first, last = self.step, False
            for micro_batches in train:  # one optimizer step: its micro-batches
                if self.max_steps is not None and self.step >= self.max_steps:
                    break
                lr = self.optimizer.param_groups[0]["lr"]
                # each micro-batch's loss divided by their number: the summed gradient is the
                # mean over the step's pairs, as one big batch's; the ranks' gradients are
                # averaged on the last micro-batch alone (no_sync: one all-reduce a step)
                n, metrics, tokens, computed = len(micro_batches), {}, 0, 0
                for micro, b in enumerate(micro_batches):
                    b = as_batch(b).to(proc.device)
                    sync = self.no_sync() if proc.ddp and micro < n - 1 else nullcontext()
                    with sync, proc.ctx:
                        out = self.step_fn(b)
                        (out["objective"] / n).backward()
                    for k, v in run_dir.micro_metrics(out).items():  # on the device: no sync
                        metrics[k] = metrics.get(k, 0.0) + v / n
                    tokens += b.n_tokens
                    computed += getattr(b, "n_packed", b.n_tokens)  # packed: each prompt once
                metrics, counts = runtime.mean_over_ranks(metrics, (tokens, computed), proc)
                self.speed.add(*counts)  # the tokens of every rank
                runtime.check_finite(metrics["objective"], self.step, self.kept)
                # clip (the norm before clipping is logged), step, zero the gradients, schedule
                clip = self.grad_clip or math.inf
                metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.params, clip).item()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
                self.step += 1
                # log, evaluate and save when due
                last = self.step == self.max_steps
                self.log.add(metrics, lr)
                if self.step % self.log_interval == 0 or last:
                    self.log.train_row(self.step, speed())
                if (self.eval_interval and self.step % self.eval_interval == 0) or last:
                    self.evaluate_and_save(last=last)
                if self.save_interval and self.step % self.save_interval == 0 and proc.master:
                    self.save(run_dir.recorded(self.path(f"ckpt-{self.step}.pt")))
            self.optimizer.zero_grad(set_to_none=True)  # an incomplete last step is dropped
            self.log.train_row(self.step, speed())  # the epoch's last steps
            if self.step > first and self.evaluated_at != self.step:  # each epoch ends evaluated
                self.evaluate_and_save(last=last, epoch=epoch)
        self.log.close()
        return self.eval_metrics

    def path(self, name):
        return os.path.join(self.save_dir, name) if self.save_dir else None

    def evaluate(self, last=False):
        """(metrics, rewards) on the eval data, every rank taking part (under FSDP on the
        whole weights, gathered once: fsdp.gathered says why); rewards only if last."""
        gathered = nullcontext()
        if self.fsdp:
            from nanorm.fsdp import gathered  # --fsdp

            gathered = gathered(self.model)
        scoring = dict(loss_fn=self.loss_fn, ctx=self.proc.ctx, cache=self.val_cache)
        if self.config:  # a PairDataset, batched by evaluate
            c, pad_id = self.config, self.meta["pad_id"]
            scoring.update(pad_id=pad_id, batch_size=c.batch_size, n_pairs=c.eval_pairs)
        scoring.update(rank=self.proc.rank, world=self.proc.world, return_rewards=last)
        with gathered:
            return evaluate(self.model, self.eval_data, **scoring)

    def evaluate_and_save(self, last=False, epoch=None):
        """Evaluate on the held-out pairs (evaluate: eval mode, then back), log it, and save
        the resumable save_dir/ckpt.pt (not at the step a run starts or resumes from)."""
        self.evaluated_at = self.step
        if self.eval_data is not None:
            self.eval_metrics, self.eval_rewards = self.evaluate(last)
            self.log.eval_row(self.step, self.eval_metrics)
            if epoch is not None and self.config is None and self.save_dir and self.proc.master:
                path = self.path(f"eval_result_epoch{epoch}.txt")  # ColossalChat's file
                run_dir.write_eval_text(path, self.eval_metrics)
        if self.step > 0 and self.save_dir:
            self.save(self.path("ckpt.pt"))

    def save(self, path):
        """ckpt.pt (or a numbered one): model, optimizer, scheduler, step, never non-finite."""
        run = (self.model, self.optimizer, self.lr_scheduler, self.step, self.proc)
        save_training_checkpoint(path, *run, meta=self.meta, config=self.config)
        self.kept = path  # the last good checkpoint, should a later step diverge


# ----------------------------------------------------------------------------- the run
def main(argv=None):
    cfg = parse_args(argv)
    proc = runtime.setup_processes(cfg)
    with run_dir.claimed(cfg, proc):  # out_dir/.lock, and out_dir/.nanorm: the files it writes
        return train(cfg, proc)


def train(cfg, proc):
    """main's run, once the out_dir is this run's."""
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    meta, train, val = load_data(cfg, proc)
    steps_per_epoch = len(train) // (cfg.batch_size * cfg.grad_accum * proc.world)
    if cfg.epochs:  # each epoch is that many steps (the last partial batch is dropped)
        cfg = replace(cfg, max_iters=cfg.epochs * steps_per_epoch)
    rm = build_model(cfg, meta, (train, val)).to(proc.device)
    proc = runtime.with_dtype(proc, cfg.dtype, rm.backbone.config)  # auto: bf16 only where it pays
    load_full_state = None  # how a sharded model takes a full state (--resume)
    if cfg.fsdp:  # before the optimizer, which must hold the shards
        from nanorm.fsdp import load_full_state, shard  # --fsdp

        shard(rm, proc)
    optimizer = make_optimizer(rm, cfg, proc.device)
    ckpt_path, log_path = (os.path.join(cfg.out_dir, f) for f in ("ckpt.pt", "log.jsonl"))
    step = 0  # --resume: the checkpoint's step, its weights, optimizer state and RNG
    if cfg.resume:  # under FSDP a full state, scattered into the shards
        step = resume_run(ckpt_path, cfg, rm, optimizer, proc, meta, load_full_state)
    # the learning rate of step s is get_lr(s): the scheduler scales each group's initial_lr
    scheduler = LambdaLR(optimizer, lambda s: get_lr(s, cfg) / cfg.lr, last_epoch=step - 1)
    say = print if proc.master else lambda *args, **kwargs: None  # rank 0 speaks and writes
    if proc.master:
        run_dir.start_log(log_path, keep_until=step if cfg.resume else None)
    say(runtime.describe(rm, cfg, proc, train, val))
    train_cache, val_cache = open_caches(cfg, proc, rm, train, val, say)
    if train_cache is not None:  # a cached run trains and evaluates on packed rows
        cfg = replace(cfg, pack=True)
    epochs, per_epoch = (cfg.epochs, steps_per_epoch) if cfg.epochs else (1, cfg.max_iters)
    loss_fn = PairwiseLoss(cfg.loss, cfg.margin, cfg.center_coef)
    start_epoch = min(step // per_epoch, epochs - 1) if per_epoch else 0
    colossal = dict(optimizer=optimizer, lr_scheduler=scheduler, loss_fn=loss_fn, max_epochs=epochs)
    colossal |= dict(accumulation_steps=cfg.grad_accum, start_epoch=start_epoch)
    colossal |= dict(save_interval=cfg.save_interval, save_dir=cfg.out_dir)
    ours = dict(config=cfg, proc=proc, meta=meta, start_step=step, val_cache=val_cache)
    trainer = RewardModelTrainer(rm, **colossal, **ours)
    # the sampler says which pairs each micro-step of each optimizer step sees
    pad_id, rank, world = meta["pad_id"], proc.rank, proc.world
    steps = PairSteps(train, cfg, rank, world, pad_id, train_cache, per_epoch, step)
    trainer.fit(steps, val, log_dir=cfg.log_dir or None, use_wandb=cfg.wandb)
    ev, rewards = trainer.eval_metrics, trainer.eval_rewards
    if rewards is None:  # resumed at the end: the checkpoint's evaluation was not kept
        ev, rewards = trainer.evaluate(last=True)
    cal = None  # --calibrate_length: the reward's length dependence, fitted on the training pairs
    if cfg.calibrate_length:
        on = dict(ctx=proc.ctx, rank=proc.rank, world=proc.world, cache=train_cache)
        cal = fit_calibration(rm, train, meta["pad_id"], cfg.batch_size, **on)
    if proc.master:  # curves.png, eval_rm's report (eval.json, plots), the calibrated report
        write_run_report(cfg.out_dir, cfg.dataset, val, meta, rewards, cal)
        print(
            f"done in {trainer.speed.total():.0f}s: held-out accuracy {ev['acc']:.4f}; 'longer "
            f"response wins' {meta.get('length_baseline_val', float('nan')):.3f}; wrote "
            f"{cfg.out_dir}/ckpt.pt, log.jsonl, curves.png, eval.json and the reward plots"
        )
    runtime.end_processes(proc)
    return ev if proc.master else None


if __name__ == "__main__":
    command.run(main)
