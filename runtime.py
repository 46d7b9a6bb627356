"""
A run's plumbing, kept out of train_rm.py's way: who this process is under torchrun and where it
computes, the output folder (never another run's by accident), the log, and the speed line.

    proc = setup_processes(cfg)        # RANK, LOCAL_RANK, WORLD_SIZE from torchrun, or one process
    check_out_dir(cfg, proc)           # refuse an out_dir holding a run unless --resume/--overwrite
    speed = Speedometer(); speed.add(tokens, computed); tok_s, line = speed.report(...)

train_rm.py is the only user; a first reading can skip this file.
"""

import json
import os
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cli import UsageError, check_device


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
