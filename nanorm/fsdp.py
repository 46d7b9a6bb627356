"""
Fully sharded data parallel (FSDP2) for train_rm.py --fsdp: each of N ranks keeps 1/N of the
weights, of their gradients and of AdamW's moments, where DDP keeps a whole copy of all three.

    torchrun --standalone --nproc_per_node=2 train_rm.py --fsdp --device cpu    # gloo, CPU
    torchrun --standalone --nproc_per_node=8 train_rm.py --fsdp --init DIR --dataset DIR
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 \\
        train_rm.py --fsdp --init DIR --dataset DIR
    torchrun --standalone --nproc_per_node=4 train_rm.py --fsdp --resume   # any world size

How: `fully_shard` (torch.distributed.fsdp) on every transformer block, then on the reward heads
(one unit), then on the reward model (the root: embeddings, final norm, LM head). A block's
weights are all-gathered just before its forward and freed after it, again for its backward,
and its gradients are reduce-scattered, so a rank holds one whole block at a time plus its
shards. On CUDA in bf16 the gathered weights are bf16 (the reward heads' fp32) and the gradients
are reduced in fp32; the shards AdamW updates stay fp32 (master weights).

Checkpoints hold the full, unsharded state, gathered to rank 0 (full_state below): ckpt.pt is
the file a 1-process run writes, which reward.py, eval_rm.py, export and --resume read
unchanged, and which a run of any world size, sharded or not, resumes from (load_full_state).

Simplified on purpose: one flat mesh over all ranks (no hybrid sharding within a node and
replication across nodes), no CPU offload, no prefetch tuning; evaluation gathers the whole
weights once (gathered() says why).
"""

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)

from nanorm.base.command import UsageError


def shard(rm, proc):
    """Shard rm in place over all ranks (before the optimizer is made: it must hold the shards)
    and print how many parameters this rank keeps."""
    if not dist.is_initialized():
        raise UsageError("--fsdp shards over the processes torchrun starts: run it under torchrun")
    if any(n.endswith(".lora_A") for n, _ in rm.named_parameters()):
        # the checkpoint would hold the adapters unmerged; and a frozen base fits DDP anyway
        raise UsageError("--fsdp with --lora_rank is not supported: use DDP (drop --fsdp)")
    mp = MixedPrecisionPolicy()  # fp32 in, fp32 out: what a CPU, or --dtype float32, computes
    if proc.cuda and proc.dtype == "bfloat16":  # bf16 compute and all-gathers, fp32 reduction
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in rm.backbone.layers:  # one all-gather per block: the unit of memory
        fully_shard(layer, mp_policy=mp)
    # the heads (rm's children beside the backbone) keep fp32 weights, as reward.apply_head keeps
    # them under autocast: from bf16 weights a reward holds 8 bits and close pairs tie. One unit
    # for all of them, left gathered after forward: ODIN's loss also reads two heads' weights
    heads = [m for m in rm.children() if m is not rm.backbone]
    fully_shard(heads, mp_policy=MixedPrecisionPolicy(), reshard_after_forward=False)
    # the root keeps its weights gathered between forward and backward (the default for a root:
    # the embedding is needed again at once for its gradient)
    fully_shard(rm, mp_policy=mp)
    # train_rm's PairObjective calls rm.loss or rm.loss_packed, which reach the backbone without
    # going through rm's forward: FSDP gathers the root's weights in a forward hook, so they
    # are hooked too (named from the methods themselves: a renamed one fails here, loudly)
    for method in (rm.loss, rm.loss_packed):
        register_fsdp_forward_method(rm, method.__name__)
    local = sum(p.to_local().numel() for p in rm.parameters())
    total = sum(p.numel() for p in rm.parameters())
    print(f"fsdp: rank {proc.rank} holds {local:,} of {total:,} parameters", flush=True)
    return rm


@contextmanager
def no_sync(rm):
    """Accumulate this micro-step's gradients without reduce-scattering them (DDP's no_sync).
    The price: until the last micro-step each rank holds whole, unsharded gradients; syncing on
    every micro-step instead keeps them sharded for grad_accum times the communication."""
    rm.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        rm.set_requires_gradient_sync(True)


@contextmanager
def gathered(rm):
    """The whole weights on every rank, gathered once, for evaluation. Each rank scores its own
    pairs in its own number of batches (one more on some ranks when the pairs do not divide
    evenly), so the per-block all-gathers of a sharded forward would not pair up across ranks;
    forwards on gathered weights need no communication. Costs the unsharded weights (bf16 under
    mixed precision) for the duration; gradients and optimizer state stay sharded."""
    modules = [m for m in rm.modules() if isinstance(m, FSDPModule)]
    for m in modules:  # every rank, in the same order: the all-gathers pair up
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(m is not rm, recurse=False)  # as fully_shard set them


# full_state_dict: whole tensors, not shards; cpu_offload: gathered to rank 0's CPU only, one
# tensor at a time, so no GPU ever holds the whole model's state
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(rm, optimizer):
    """{model_state, optimizer_state} for ckpt.save_checkpoint: rm.state_dict() and
    optimizer.state_dict() as one process would have them, on rank 0 (empty dicts elsewhere).
    Every rank must call it: each tensor is gathered from all of them."""
    model = get_model_state_dict(rm, options=FULL)
    optim = get_optimizer_state_dict(rm, optimizer, options=FULL)
    if dist.get_rank() != 0:
        return dict(model_state={}, optimizer_state={})
    # torch's own layout numbers the parameters by their place in the param groups where
    # get_optimizer_state_dict names them: renumber, so that a 1-process run resumes it too
    names = [n for g in optim["param_groups"] for n in g["params"]]
    index = {n: i for i, n in enumerate(names)}
    optim = {
        "state": {index[n]: s for n, s in optim["state"].items()},
        "param_groups": [
            dict(g, params=[index[n] for n in g["params"]]) for g in optim["param_groups"]
        ],
    }
    return dict(model_state=model, optimizer_state=optim)


def load_full_state(rm, optimizer, model_state, optimizer_state):
    """Put a full state (a ckpt.pt's, of a run of any world size) into the sharded rm and its
    optimizer: every rank has read the file and keeps its own shard of each tensor."""
    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(rm, model_state, options=full)
    name = {p: n for n, p in rm.named_parameters()}
    names = [name[p] for g in optimizer.param_groups for p in g["params"]]
    optim = {  # torch's numbered layout (full_state's) back to names
        "state": {names[i]: s for i, s in optimizer_state["state"].items()},
        "param_groups": [
            dict(g, params=[names[i] for i in g["params"]]) for g in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(rm, optimizer, optim, options=full)
