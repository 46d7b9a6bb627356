"""
Who this process is and how it computes, kept out of train_rm.py's way: the processes under
torchrun, the device and dtype, the sums across ranks, what is printed at start, the speed line
and MFU. (The run's folder, its log and pictures: nanorm/run_dir.py.)

    proc = setup_processes(cfg)        # RANK, LOCAL_RANK, WORLD_SIZE from torchrun, or one process
    speed = Speedometer(); speed.add(tokens, computed); tok_s, line = speed.report(...)

A first reading can skip this file.
"""

import math
import os
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from nanorm.base.command import UsageError, check_device


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


BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}  # x86 instructions that multiply bf16 natively


def cpu_flags():
    """The CPU's feature flags as Linux names them (/proc/cpuinfo), empty where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16():
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16, through oneDNN),
    where a bf16 matmul runs faster than fp32 (bench/README.md measures how much). Without them
    PyTorch converts bf16 to fp32 around every product, which is slower than fp32 alone. Asks
    PyTorch's own probe (cpuinfo), else the kernel's flags; oneDNN must be built in, since bf16
    matmul on CPU goes through it."""
    if not torch.backends.mkldnn.is_available():
        return False
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if probe is not None and (probe() or (amx is not None and amx())):
        return True
    return bool(BF16_CPU_FLAGS & cpu_flags())


BF16_MIN_DIM = 512  # CPU: the narrowest model width where bf16 autocast trains faster than fp32


def bf16_pays_on_cpu(config):
    """Whether bf16 autocast makes a training step of a model of ModelConfig config faster than
    fp32 on a CPU that multiplies bf16 natively. Autocast converts each fp32 weight and
    activation to bf16 before every product (and back for the norms, softmax and loss), a cost
    that grows with the matrices' size while the products grow with its cube: at small widths
    the conversions and oneDNN's per-call overhead outweigh the faster products. The width
    decides; the bar sits where the CPUs measured in bench/README.md (bench/bench_dtype.py's
    training-step table) all gain, so the small models (the default run, the notebooks') train
    in fp32 everywhere."""
    return config.dim >= BF16_MIN_DIM and config.hidden_dim >= BF16_MIN_DIM


def auto_dtype(device, config=None):
    """--dtype auto: bf16 where it makes the model's step faster, fp32 elsewhere. On a GPU that
    supports bf16, always. On a CPU, only where the hardware multiplies bf16 natively (AVX512-BF16
    or AMX) and the model is wide enough for it to pay (bf16_pays_on_cpu); the default model
    (dim 64) is slower in bf16, so it trains in fp32. Without a config (before the model exists) the hardware alone answers. Under bf16 the
    weights, the head, the loss and the reward differences stay fp32 (autocast;
    reward.apply_head). Exactness checks pass --dtype float32."""
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device == "cpu":
        native = cpu_has_native_bf16()
        return "bfloat16" if native and (config is None or bf16_pays_on_cpu(config)) else "float32"
    return "float32"  # mps: its bf16 autocast is not measured here


def dtype_context(device, dtype):
    """bf16 autocast on device's type for dtype "bfloat16", else nothing."""
    if dtype == "bfloat16":
        return torch.autocast(device.split(":")[0], dtype=torch.bfloat16)
    return nullcontext()


def with_dtype(proc, option, config):
    """proc with dtype and ctx set by the --dtype option once the model exists: "auto" applies
    auto_dtype's rule to the model's ModelConfig config, "float32" and "bfloat16" are taken as
    given."""
    dtype = auto_dtype(proc.device, config) if option == "auto" else option
    return replace(proc, dtype=dtype, ctx=dtype_context(proc.device, dtype))


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
    # the hardware's guess: with_dtype decides again from the model's shapes once it is built
    dtype = auto_dtype(device) if cfg.dtype == "auto" else cfg.dtype
    return Processes(ddp, rank, local_rank, world, device, dtype, dtype_context(device, dtype))


class Diverged(UsageError, FloatingPointError):
    """A run whose loss or weights stopped being finite: one line (run prints it), as
    every expected failure."""


def check_finite(objective, step, kept):
    """Stop at a NaN or infinite loss, saying what is kept: kept, the last checkpoint this run
    wrote or resumed from (never overwritten by the diverged weights), or None."""
    if not math.isfinite(objective):
        kept = (
            f"the last good checkpoint stays at {kept}" if kept else "no checkpoint was written yet"
        )
        raise Diverged(f"loss is {objective} at step {step}: stopping; {kept}")


def end_processes(proc):
    """Every rank waits for the others, then leaves the process group (torchrun)."""
    if proc.ddp:
        dist.barrier()
        dist.destroy_process_group()


def single_process(model):
    """The Processes of a trainer built in Python without torchrun: one, on the model's
    device, in the model's dtype (no autocast)."""
    device = str(next(model.parameters()).device)
    return Processes(False, 0, 0, 1, device, "float32", nullcontext())


def mean_over_ranks(metrics, counts, proc):
    """A step's metrics (tensors on the device, each its micro-steps' mean) averaged over the
    ranks, and counts (numbers) summed over them: one all_reduce and one copy to the host."""
    n, values = len(metrics), torch.stack(list(metrics.values())).tolist() + list(counts)
    summed = list(all_reduce_sum(dict(enumerate(values)), proc.world, proc.device).values())
    return {k: v / proc.world for k, v in zip(metrics, summed[:n], strict=True)}, summed[n:]


def all_reduce_sum(metrics, world, device):
    """A dict of numbers summed over the ranks, in one all_reduce."""
    if world == 1:
        return metrics
    t = torch.tensor(list(metrics.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(metrics, t.tolist(), strict=True))


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


def estimate_mfu(cfg, n_params, tokens_per_second, peak_flops=989e12, seq_len=None):
    """Model FLOPs utilisation: the FLOP/s that training at tokens_per_second needs, as a
    fraction of the accelerator's peak (default: an H100 SXM's dense bf16), for a model of
    ModelConfig cfg. As nanoGPT, after PaLM's appendix B, a trained token costs
    6 N + 12 L H Q T FLOPs: each of the N weights does a multiply-add forward and two
    backward; per layer the scores q.k and their sum
    over v are H*Q*T multiply-adds each, forward, and twice that backward. N: the weights a
    token multiplies by (no embedding table, and for a reward model no LM head). T: the
    length attended over (default max_seq_len; the mean row length is fairer). Count
    useful tokens only: padding computed is not progress."""
    T = seq_len or cfg.max_seq_len
    flops_per_token = 6 * n_params + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * T
    return flops_per_token * tokens_per_second / peak_flops


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
            line += f" | mfu {estimate_mfu(rm.backbone.config, matmul_weights(rm), self.computed / dt / proc.world):.1%}"
        line += f" | eta {(time.time() - self.start) / steps_done * steps_left:.0f}s"
        self.t0, self.tokens, self.computed = time.time(), 0, 0
        return tok_s, line

    def total(self):
        return time.time() - self.start
