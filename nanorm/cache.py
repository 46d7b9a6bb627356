"""
Frozen layers computed once. With `--train_layers k` the bottom n - k layers of the backbone never
change, so neither does their output for a given pair: train_rm.py computes it once per pair,
keeps it on disk, and every step (every epoch) trains the top k layers and the head from it.

    python train_rm.py --init model.gguf --dataset DIR --train_layers 4 --epochs 3   # cache on
    python train_rm.py ... --train_layers 4 --cache false                             # recompute

    train_cache, val_cache = open_caches_of(rm.backbone, init, dataset_dir, first, train, val, ...)
    b = train.collate_packed(idx, pad_id, train_cache)   # b.states: (first, (B, T, dim))
    r_c, r_r = rm.forward_pair_packed(..., states=b.states)

What is stored: each pair's packed row [prompt | chosen | rejected] (data/pairs.pack_pairs: the
prompt once) through layers[:first], real tokens only, as float16 (bfloat16 if a value would
overflow float16), in one memory-mapped file per split with the row offsets beside it: about
2 * dim bytes per token. The forward from there is model.py's forward with
layers=(first, n_layers): the same layers and layout as recomputing, so the loss and gradients
equal recomputation up to the rounding of the stored states (tests/test_cache.py).

Where: <dataset>/cache/<key>/, key = a hash of the checkpoint's and the dataset files' contents
(sampled, see cache_key), `first` and the run's dtype. A later run with the same checkpoint and
data reuses it, also after the files were copied, moved or downloaded again; another checkpoint,
changed data, another k or another dtype builds a new one. Built under the run's autocast (bf16
where the hardware multiplies it natively, runtime.auto_dtype), by rank 0 alone (the others
wait): simple, and the build is a forward pass, cheaper than the training it saves.
"""

import hashlib
import json
import os
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from data.pairs import packed_attention_mask
from nanorm.base.command import atomic_write

BATCH = 8  # pairs per forward while building
KEY_WINDOW = 2**20  # bytes of a file that cache_key reads at its start, middle and end


def cache_key(*paths, first, dtype="float32"):
    """A short hash of `first`, the dtype the frozen layers compute in (bf16 autocast rounds
    their output: such a cache is not an fp32 run's) and each file's size and content: all of a file up to 3 MiB, else
    its first, middle and last MiB. Content, not path and modification time: a checkpoint copied
    to a new machine, or data prepared again, keep their cache (with path and mtime they cost a
    rebuild, 13 minutes for HH-RLHF on SmolLM2). Sampled, not whole: a 7B checkpoint is 14 GB.
    What a sample cannot miss: another checkpoint (fine-tuning moves every weight) and another
    .npz (a zip's last bytes hold each array's CRC-32)."""
    h = hashlib.sha256(str(first if dtype == "float32" else f"{first} {dtype}").encode())
    for p in paths:
        size = os.path.getsize(p)
        h.update(str(size).encode())
        with open(p, "rb") as f:
            if size <= 3 * KEY_WINDOW:
                h.update(f.read())
                continue
            for at in (0, size // 2, size - KEY_WINDOW):
                f.seek(at)
                h.update(f.read(KEY_WINDOW))
    return h.hexdigest()[:16]


class FrozenCache:
    """The states of layers[:first] for every pair of one split: rows(idx, T) -> (B, T, dim)."""

    def __init__(self, folder, split, first):
        with open(os.path.join(folder, f"{split}.json")) as f:
            info = json.load(f)
        self.first, self.dim = first, info["dim"]
        self.offsets = np.load(os.path.join(folder, f"{split}.offsets.npy"))  # (n + 1,) tokens
        raw = np.memmap(os.path.join(folder, f"{split}.bin"), dtype=np.uint16, mode="c")
        self.states = torch.from_numpy(raw.reshape(-1, self.dim)).view(
            getattr(torch, info["dtype"])
        )

    def rows(self, indices, T):
        """(B, T, dim) float32: each pair's stored states at the start of its packed row, zeros
        after (padding, which the forward skips)."""
        out = torch.zeros(len(indices), T, self.dim)
        for b, i in enumerate(indices):
            a, z = self.offsets[i], self.offsets[i + 1]
            out[b, : z - a] = self.states[a:z].float()
        return out

    @classmethod
    def open_or_build(cls, backbone, data, split, first, folder, pad_id, say=print, ctx=None):
        """The cache of data (a PairDataset) in folder, built first if it is not there, under
        ctx (the run's bf16 autocast, or nothing)."""
        if not os.path.exists(os.path.join(folder, f"{split}.json")):
            try:
                build(backbone, data, split, first, folder, pad_id, torch.float16, say, ctx)
            except OverflowError:  # a state float16 cannot hold: bfloat16 has float32's range
                say(f"cache {split}: a state exceeds float16's range; storing bfloat16")
                build(backbone, data, split, first, folder, pad_id, torch.bfloat16, say, ctx)
        return cls(folder, split, first)


@contextmanager
def bf16_weights(layers, ctx):
    """Under a bf16 autocast ctx, the matrices (nn.Linear weights) of layers held in bf16 for the
    block, their fp32 tensors put back after it. Autocast casts a frozen fp32 weight to bf16 at
    every product, every batch (it keeps casts only of weights that train); this casts each
    once. The products are the same bits: autocast would cast to these very values. Norms and
    embeddings stay fp32, as under autocast. Costs 2 bytes per frozen weight while it lasts
    (half the fp32 weights again). Plain tensors only (FSDP's shards are left alone)."""
    on = isinstance(ctx, torch.autocast) and ctx._enabled  # autocast(enabled=False) casts nothing
    bf16 = on and ctx.fast_dtype == torch.bfloat16
    linears = [m for m in layers.modules() if isinstance(m, nn.Linear)]
    if not bf16 or any(type(m.weight.data) is not torch.Tensor for m in linears):
        yield
        return
    kept = [(m.weight, m.weight.data) for m in linears]
    try:
        for w, data in kept:
            w.data = data.to(torch.bfloat16)
        yield
    finally:
        for w, data in kept:
            w.data = data


@torch.no_grad()
def build(backbone, data, split, first, folder, pad_id, dtype, say=print, ctx=None):
    """Run layers[:first] over every pair's packed row and store the real tokens' states. ctx:
    the run's autocast (bf16 where it pays, runtime.auto_dtype), so the stored states are what
    the same run would compute without the cache; under bf16 the frozen layers' matrices are
    held in bf16 while building (bf16_weights), not cast at every batch."""
    lengths = data.lengths(packed=True)  # (n,) real tokens of each packed row
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{split}.bin")
    out = np.memmap(
        path + ".tmp", dtype=np.uint16, mode="w+", shape=(int(offsets[-1]), backbone.config.dim)
    )
    order = np.argsort(lengths, kind="stable")  # similar lengths together: little padding
    was_training, t0 = backbone.training, time.time()
    backbone.eval()
    with bf16_weights(backbone.layers[:first], ctx):
        for k in range(0, len(order), BATCH):
            idx = order[k : k + BATCH].tolist()
            b = data.collate_packed(idx, pad_id)
            with ctx or nullcontext():
                h = backbone.hidden_states(
                    b.tokens,
                    b.segments >= 0,
                    positions=b.positions,
                    visible=packed_attention_mask(b.segments),
                    layers=(0, first),
                ).float()  # (B, T, dim), before layer `first`
            if h.abs().max() >= torch.finfo(dtype).max:
                backbone.train(was_training)
                raise OverflowError(f"a state reaches {h.abs().max():.3g}")
            for row, i in enumerate(idx):
                a, z = offsets[i], offsets[i + 1]
                out[a:z] = h[row, : z - a].to(dtype).view(torch.uint16).numpy()
            done = k + len(idx)
            if done % (BATCH * 25) < BATCH or done == len(order):
                rate = done / (time.time() - t0)
                say(
                    f"cache {split}: {done}/{len(order)} pairs, {rate:.1f} pairs/s, "
                    f"{(len(order) - done) / rate:.0f}s left"
                )
    out.flush()
    del out
    os.replace(path + ".tmp", path)
    np.save(os.path.join(folder, f"{split}.offsets.npy"), offsets)
    with atomic_write(os.path.join(folder, f"{split}.json"), "w") as f:  # written last: complete
        json.dump(
            {
                "dim": backbone.config.dim,
                "dtype": str(dtype).split(".")[1],
                "n": len(order),
                "first": first,
                "bytes": os.path.getsize(path),
            },
            f,
        )
    backbone.train(was_training)


def open_caches_of(backbone, init, data_dir, first, train, val, proc, cache_dir="", say=print):
    """The (train, val) FrozenCache of a prepared dataset in data_dir for the checkpoint init,
    layers[:first]: in cache_dir (default data_dir/cache)/<key>, built by rank 0 if missing
    while the other ranks wait, then opened by every rank. Built under the run's proc.ctx, and
    keyed by proc.dtype: a bf16 run and an fp32 run keep separate caches."""
    paths = (os.path.join(data_dir, f"{split}.npz") for split in ("train", "val"))
    folder = os.path.join(
        cache_dir or os.path.join(data_dir, "cache"),
        cache_key(init, *paths, first=first, dtype=proc.dtype),
    )
    say(f"cache of the bottom {first} layers: {folder}")
    caches = []
    for split, data in (("train", train), ("val", val)):
        if proc.master:
            FrozenCache.open_or_build(backbone, data, split, first, folder, 0, say, proc.ctx)
        if proc.ddp:
            dist.barrier()  # rank 0 built it; every rank reads it
        caches.append(FrozenCache(folder, split, first))
    return tuple(caches)
