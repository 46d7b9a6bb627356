"""
Preference pairs: tokenizing them, storing them compactly, batching them (data/rows.py reads
them from files).

Tokenization (data/chat.py): plain text is BOS + prompt tokens and response tokens + EOS; a chat
checkpoint's pairs are rendered in its chat layout and each response ends with its end-of-turn
token. Either way the reward head reads a real end token. When prompt + response is longer than
max_len we cut the prompt from the LEFT first (its end, nearest the response, matters most),
because the reward is read at the end of the response and must never be cut away. If a response
alone is longer than max_len, we keep its last max_len tokens (the EOS stays) and drop the
prompt; those pairs are counted and printed as "response truncated".

Batches: right-padded (chosen, rejected) rows (collate), or one packed row per pair
[prompt | chosen | rejected] with its positions and mask (collate_packed), optionally in
length-bucketed order; the forward skips the padding either way.
"""

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.utils.rnn import pad_sequence

from nanorm.base.command import UsageError, atomic_write, json_object


def encode_pair(tok, pair, max_len, fmt=None):
    """-> (prompt_ids, chosen_ids, rejected_ids, response_truncated: bool).
    fmt: a data.chat.ChatFormat (None: plain text, BOS + prompt, response + EOS)."""
    if fmt is None:
        from data.chat import ChatFormat  # the layout is chosen when pairs are encoded, not read

        fmt = ChatFormat("plain")
    p = fmt.prompt_ids(tok, pair["prompt"])
    c, r = fmt.response_ids(tok, pair["chosen"]), fmt.response_ids(tok, pair["rejected"])
    longest = max(len(c), len(r))
    truncated = longest > max_len
    if truncated:  # keep the end, where the reward is read
        c, r, p = c[-max_len:], r[-max_len:], []
    elif len(p) + longest > max_len:
        p = p[len(p) + longest - max_len :]  # cut the prompt from the left
    return p, c, r, truncated


def write_pairs(path, encoded, vocab_size, groups=None):
    """Store pairs as one flat token array plus offsets (N, 4): prompt, chosen, rejected, end;
    groups (N,) ints: each pair's subset (e.g. HH-RLHF's helpful-base = 0, ...), if any."""
    dtype = np.uint16 if vocab_size <= 65536 else np.uint32
    offsets, flat, pos = [], [], 0
    for p, c, r in encoded:
        offsets.append((pos, pos + len(p), pos + len(p) + len(c), pos + len(p) + len(c) + len(r)))
        flat.extend(p), flat.extend(c), flat.extend(r)
        pos = offsets[-1][3]
    arrays = {"tokens": np.array(flat, dtype=dtype), "offsets": np.array(offsets, dtype=np.int64)}
    if groups is not None:
        arrays["group"] = np.asarray(groups, dtype=np.int64)
    with atomic_write(path) as f:
        np.savez(f, **arrays)


def right_pad(rows, value=0, T=None):
    """Rows of different lengths (1-D arrays or tensors of one dtype) as one (B, T) tensor, each
    row from column 0 and `value` after it; T: the longest row's length unless given. The one
    place a batch is padded: collate, pack_pairs and reward.pad_and_concat call it."""
    rows = [torch.as_tensor(r) for r in rows]
    out = pad_sequence(rows, batch_first=True, padding_value=value)  # (B, longest)
    return out if T is None else F.pad(out, (0, T - out.size(1)), value=value)


@dataclass
class Batch:
    chosen: torch.Tensor  # (B, T) prompt + chosen response, right-padded
    chosen_mask: torch.Tensor  # (B, T) 1 on real tokens
    rejected: torch.Tensor
    rejected_mask: torch.Tensor
    chosen_response_mask: torch.Tensor  # (B, T) 1 on the chosen response's tokens (LM term)
    n_tokens: int  # real (non-padding) tokens in the batch
    groups: torch.Tensor | None = None  # (B,) each pair's subset, where the data has subsets
    rejected_response_mask: torch.Tensor | None = None  # (B, T) the rejected's (DPO reads both)

    def to(self, device):
        for k in ("chosen", "chosen_mask", "rejected", "rejected_mask", "chosen_response_mask"):
            setattr(self, k, getattr(self, k).to(device, non_blocking=True))
        for k in ("groups", "rejected_response_mask"):
            if getattr(self, k) is not None:
                setattr(self, k, getattr(self, k).to(device, non_blocking=True))
        return self


def as_batch(batch):
    """A Batch from ColossalChat's preference batch, the dict its collator makes
    ({chosen,reject}_input_ids, {chosen,reject}_attention_mask, and chosen_loss_mask, 1 on the
    chosen response, which the LM term reads; reject_loss_mask, the rejected's, which DPO's
    implicit reward reads, where given); nanoRM's Batch and PackedBatch are returned as
    they are. A dict or Batch is checked first (check_pairs): a batch the model cannot read is
    one line naming its key and the fix, not an error from deep inside torch."""
    if isinstance(batch, Batch):
        pairs = dict(chosen=batch.chosen, rejected=batch.rejected)
        masks = dict(chosen_mask="chosen", rejected_mask="rejected")
        masks["chosen_response_mask"] = "chosen"
        check_pairs(pairs, {k: (getattr(batch, k), of) for k, of in masks.items()}, "Batch.")
        return batch
    if not isinstance(batch, dict):
        return batch
    keys = (
        "chosen_input_ids",
        "chosen_attention_mask",
        "reject_input_ids",
        "reject_attention_mask",
    )
    if not isinstance(batch, dict) or not set(keys) <= batch.keys():
        raise UsageError(f"a preference batch is a Batch or a dict with keys {keys}")
    chosen, c_mask, rejected, r_mask = (batch[k] for k in keys)
    response = batch.get("chosen_loss_mask", c_mask)
    masks = dict(chosen_attention_mask=(c_mask, "chosen_input_ids"))
    masks.update(reject_attention_mask=(r_mask, "reject_input_ids"))
    masks.update(chosen_loss_mask=(response, "chosen_input_ids"))
    rejected_response = batch.get("reject_loss_mask")  # ColossalChat's DPO batches have it
    if rejected_response is not None:
        masks.update(reject_loss_mask=(rejected_response, "reject_input_ids"))
    check_pairs(dict(chosen_input_ids=chosen, reject_input_ids=rejected), masks, "the batch's ")
    n_tokens = int(c_mask.sum()) + int(r_mask.sum())
    pair = (chosen, c_mask, rejected, r_mask, response, n_tokens, batch.get("groups"))
    return Batch(*pair, rejected_response_mask=rejected_response)


def check_pairs(tokens, masks, where):
    """Refuse, in one line naming the key, what the model cannot read as a batch of pairs:
    tokens {key: token ids}, each an integer tensor (pairs, tokens) with as many rows as the
    others; masks {key: (mask, the key of its tokens)}, each a tensor of its tokens' shape.
    where: how the message names the batch ("the batch's ", "Batch.")."""
    first = None
    for key, t in tokens.items():
        if not isinstance(t, torch.Tensor):
            raise UsageError(f"{where}{key} is a {type(t).__name__}: give a tensor of token ids")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise UsageError(
                f"{where}{key} holds {t.dtype} values, not token ids: give an integer tensor "
                "(.long())"
            )
        if t.dim() != 2:
            raise UsageError(
                f"{where}{key} has shape {tuple(t.shape)}: give (pairs, tokens), one row per "
                "pair (one pair: ids[None])"
            )
        if first is not None and len(t) != len(tokens[first]):
            raise UsageError(
                f"{where}{key} has {len(t)} rows, {first} {len(tokens[first])}: give one row "
                "per pair in each"
            )
        first = first or key
    for key, (mask, of) in masks.items():
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        if shape != tuple(tokens[of].shape):
            raise UsageError(
                f"{where}{key} has shape {shape}, {of} {tuple(tokens[of].shape)}: give a mask "
                "of its tokens' shape (1 on each token, 0 on padding)"
            )


class PairDataset:
    """Tokenized pairs written by a data/<name>/prepare.py script."""

    def __init__(self, path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: run the dataset's prepare.py first")
        with np.load(path) as f:
            self.tokens = f["tokens"].astype(np.int64)
            self.offsets = f["offsets"]
            self.groups = f["group"] if "group" in f else None  # (N,) subset of each pair

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, i):
        a, b, c, d = self.offsets[i]
        t = self.tokens
        return t[a:b], t[b:c], t[c:d]

    def collate(self, indices, pad_id):
        items = [self[i] for i in indices]
        B = len(items)
        seqs = [np.concatenate([p, c]) for p, c, _ in items]
        seqs += [np.concatenate([p, r]) for p, _, r in items]  # (2B,): chosen rows, rejected rows
        tokens = right_pad(seqs, pad_id)  # (2B, T)
        t = torch.arange(tokens.size(1))
        ends = torch.tensor([len(s) for s in seqs])[:, None]  # (2B, 1)
        starts = torch.tensor([len(p) for p, _, _ in items] * 2)[:, None]  # (2B, 1) responses'
        mask = (t < ends).long()
        resp = ((t >= starts) & (t < ends)).long()  # (2B, T) 1 on each response
        pair = (tokens[:B], mask[:B], tokens[B:], mask[B:], resp[:B], int(ends.sum()))
        return Batch(*pair, groups=self.groups_of(indices), rejected_response_mask=resp[B:])

    def groups_of(self, indices):
        """(B,) the subsets of the pairs at indices, or None for data without subsets."""
        return None if self.groups is None else torch.as_tensor(self.groups[list(indices)])

    def lengths(self, packed=False):
        """(N,) length of each pair's row: prompt + the longer response (plain), or prompt +
        both responses (packed). What bucketed_order sorts by."""
        p, c, r = np.diff(self.offsets, axis=1).T  # (N,) each
        return p + c + r if packed else p + np.maximum(c, r)

    def collate_packed(self, indices, pad_id, cache=None):
        """The pairs at indices as one PackedBatch, each prompt once (see pack_pairs below);
        with a cache.FrozenCache of this data, the frozen layers' stored output too."""
        b = pack_pairs([self[i] for i in indices], pad_id)
        b.groups = self.groups_of(indices)
        if cache is not None:
            b.states = (cache.first, cache.rows(indices, b.tokens.size(1)))
        return b


class LengthHeuristics(NamedTuple):
    longer_wins: float  # accuracy of "the longer response is the chosen one"
    shorter_wins: float  # ... of "the shorter one is"; longer_wins + shorter_wins == 1
    ties: int  # pairs whose responses are equally long: each counted half to both


def length_heuristics(lengths):
    """The two length heuristics a reward model must beat, from (chosen, rejected) response
    lengths in tokens, e.g. [(len(c), len(r)) for _, c, r in encoded_pairs], or eval_rm's
    (n, 2) lengths. A tie is a coin flip, so it counts half to each heuristic and ties says how
    many there were (a 0.5 from all ties reads differently from a 0.5 from a split). No pairs:
    NaN, not a made-up 0 or 1."""
    lengths = [(int(c), int(r)) for c, r in lengths]
    n = len(lengths)
    longer = sum(c > r for c, r in lengths)
    ties = sum(c == r for c, r in lengths)
    if n == 0:
        return LengthHeuristics(float("nan"), float("nan"), 0)
    return LengthHeuristics((longer + ties / 2) / n, (n - longer - ties / 2) / n, ties)


# ----------------------------------------------------------------------------- datasets
DATA = os.path.dirname(os.path.abspath(__file__))


def dataset_dir(name):
    """The folder of a prepared dataset: a path, or a name under data/ (arith, hh_rlhf/x).
    Without its meta.json, one line naming the folder and the command that makes it."""
    d = name if os.path.isdir(name) else os.path.join(DATA, name)
    if not os.path.exists(os.path.join(d, "meta.json")):
        script = os.path.join("data", name.split("/")[0], "prepare.py")
        if not os.path.exists(os.path.join(DATA, "..", script)):
            script = "data/prepare.py --src FILE --tokenizer TOK"
        raise UsageError(
            f"no dataset in {d} (no meta.json): make it with python {script} --out_dir {d}"
        )
    return d


def open_dataset(name, *splits):
    """(folder, meta.json's dict, a PairDataset per split) of a prepared dataset, e.g.
    open_dataset("arith", "train", "val"). meta.json holds pad_id, vocab_size, the tokenizer's
    fingerprint, the chat format and the subset names (groups) the .npz files refer to."""
    d = dataset_dir(name)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    return d, meta, [PairDataset(os.path.join(d, f"{split}.npz")) for split in splits]


# ----------------------------------------------------------------------------- speed: bucketing
def bucketed_order(lengths, batch_size, seed, window=50):
    """One epoch's order of the pairs (a permutation, like torch.randperm) in which each run of
    batch_size consecutive pairs has similar lengths, so a batch is padded to little more than
    its own pairs. As Hugging Face's LengthGroupedSampler: shuffle, sort each window of
    `window` batches by length, cut it into batches, shuffle the batches. The window keeps the
    order random at the scale of the epoch (long pairs are not all at the end).

    lengths (N,): each pair's padded length, e.g. PairDataset.lengths(). Every pair appears once.
    A last partial batch stays last, so a caller that drops it (train_rm) drops the same pairs
    as with an unbucketed order of that size."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.long)
    order = torch.randperm(len(lengths), generator=g)
    w = batch_size * window
    windows = [order[i : i + w] for i in range(0, len(order), w)]
    order = torch.cat([o[lengths[o].argsort(descending=True, stable=True)] for o in windows])
    batches = list(order.split(batch_size))
    tail = [batches.pop()] if len(batches[-1]) < batch_size else []
    shuffled = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
    return torch.cat(shuffled + tail)


# ----------------------------------------------------------------------------- balanced sampling
# A mixture of preference datasets can teach a shortcut. In HH-RLHF the longer response is the
# chosen one in 61% of helpful-base's pairs and the shorter in 57% of harmless-base's, so a model
# trained on the union first learns "longer is better", which wins three subsets and loses the
# fourth. Sampling the pairs so that, within each subset, pairs whose chosen response is longer
# and pairs whose chosen response is shorter weigh the same ("length") leaves response length no
# signal to learn; giving each subset the same mass ("subset") keeps a small subset from being
# outvoted. Drawn with replacement, as torch.utils.data.WeightedRandomSampler does.
BALANCE = ("none", "length", "subset", "subset+length")


def balance_weights(data, how):
    """(N,) float64 sampling weights of a PairDataset's pairs, summing to 1, for `how` in BALANCE.
    "length": in each subset, the pairs whose chosen response is longer get together the same mass
    as those whose chosen response is shorter; ties keep their share. "subset": every subset the
    same mass. A dataset without subsets (groups) is one subset."""
    if how not in BALANCE:
        raise UsageError(f"balance {how!r}: one of {', '.join(BALANCE)}")
    _, c, r = np.diff(data.offsets, axis=1).T.astype(np.int64)
    groups = data.groups if data.groups is not None else np.zeros(len(c), dtype=np.int64)
    side = np.sign(c - r)  # +1 chosen longer, -1 chosen shorter, 0 a tie
    w = np.ones(len(c))
    for g in np.unique(groups):
        in_g = groups == g
        if "length" in how:
            ties, n = (in_g & (side == 0)).sum(), in_g.sum()
            for s in (1, -1):
                cell = in_g & (side == s)
                if cell.any():  # the untied pairs' mass, split evenly between the two sides
                    k = 2 if (in_g & (side == -s)).any() else 1
                    w[cell] = (n - ties) / (k * cell.sum())
        if "subset" in how:
            w[in_g] /= w[in_g].sum()
    return w / w.sum()


def balanced_order(weights, n, seed):
    """n pair indices drawn with replacement in proportion to weights (balance_weights'), seeded."""
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(torch.as_tensor(weights), n, replacement=True, generator=g)


# ----------------------------------------------------------------------------- speed: packing
# Shared-prompt packing. The two plain sequences of a pair, prompt + chosen and prompt + rejected,
# repeat the prompt (in HH-RLHF, 70% of the tokens). A packed row holds it once:
#
#     tokens     BOS  p1  p2 | c1  c2  EOS | r1  EOS | pad pad
#     segments     0   0   0 |  1   1   1  |  2   2  |  -1  -1
#     positions    0   1   2 |  3   4   5  |  3   4  |   0   0    (rejected restarts after prompt)
#
# and the attention mask (data.pairs.packed_attention_mask) lets the rejected response see the prompt
# and itself but never the chosen response. Every token then sees exactly what it sees in its
# plain sequence, at the same positions, so its hidden state and both rewards are unchanged.
PAD_SEGMENT = -1


@dataclass
class PackedBatch:
    tokens: torch.Tensor  # (B, T) [prompt | chosen | rejected | padding]
    segments: torch.Tensor  # (B, T) 0 prompt, 1 chosen, 2 rejected, -1 padding
    positions: torch.Tensor  # (B, T) RoPE positions, as in each token's plain sequence
    chosen_end: torch.Tensor  # (B,) column of the chosen response's last token (its EOS)
    rejected_end: torch.Tensor  # (B,) column of the rejected response's last token
    n_tokens: int  # tokens of the two plain sequences (the prompt twice): comparable with Batch
    n_packed: int  # real tokens in the packed rows (the prompt once): what is computed
    states: tuple | None = None  # (first, (B, T, dim)): frozen layers' output, from nanorm/cache.py
    groups: torch.Tensor | None = None  # (B,) each pair's subset, where the data has subsets

    def to(self, device):
        for k in ("tokens", "segments", "positions", "chosen_end", "rejected_end"):
            setattr(self, k, getattr(self, k).to(device, non_blocking=True))
        if self.groups is not None:
            self.groups = self.groups.to(device, non_blocking=True)
        if self.states is not None:
            self.states = (self.states[0], self.states[1].to(device, non_blocking=True))
        return self


def pack_pairs(items, pad_id):
    """[(prompt ids, chosen ids, rejected ids), ...] -> PackedBatch, right-padded rows."""
    rows, segments, positions = [], [], []
    for p, c, r in items:
        P, C, R = len(p), len(c), len(r)
        rows.append(np.concatenate([p, c, r]))
        segments.append(np.repeat([0, 1, 2], [P, C, R]))
        positions.append(np.r_[np.arange(P + C), np.arange(P, P + R)])  # rejected follows P
    P, C, R = (torch.tensor([len(x[k]) for x in items]) for k in range(3))  # (B,) each
    n_tokens = int((2 * P + C + R).sum())  # useful tokens: the prompt counted twice, as plain
    tokens, segments = right_pad(rows, pad_id), right_pad(segments, PAD_SEGMENT)  # (B, T)
    n_packed = int((segments != PAD_SEGMENT).sum())
    ends = P + C - 1, P + C + R - 1  # (B,) each: the last token of each response
    return PackedBatch(tokens, segments, right_pad(positions), *ends, n_tokens, n_packed)


def packed_attention_mask(segments):
    """(B, T, T) bool, True where a query may attend to a key, for rows packed by
    data/pairs.pack_pairs; segments (B, T): 0 prompt, 1 chosen, 2 rejected, -1 padding.

               keys:  P P P C C R R .
        queries:  P   x
                  P   x x
                  P   x x x
                  C   x x x x
                  C   x x x x x
                  R   x x x     x            the rejected response sees the prompt and
                  R   x x x     x x          itself, never the chosen response
                  .   x x x         x        padding sees itself: no row is empty (NaN)

    Causal, and a key outside the prompt only for queries of its own segment. Padding comes
    last in a row, so real queries never see it; its outputs are never read."""
    T = segments.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()  # (T, T)
    q, k = segments[:, :, None], segments[:, None, :]  # (B, T, 1), (B, 1, T)
    return causal & ((k == 0) | (k == q))  # (B, T, T)


def packed_block_mask(segments):
    """packed_attention_mask as a FlexAttention BlockMask (for CUDA): blocks that no query may
    see, the upper triangle and rejected x chosen, are skipped instead of computed and masked."""

    def mask_mod(b, h, q, k):
        return (k <= q) & ((segments[b, k] == 0) | (segments[b, k] == segments[b, q]))

    B, T = segments.shape
    return create_block_mask(mask_mod, B, None, T, T, device=segments.device)


# ----------------------------------------------------------------------------- optimizer steps
# The loop reads its data as optimizer steps: each item is the micro-batches of one step, so the
# sampler says where a step begins and ends and nothing infers it from a counter.
class Step:
    """One optimizer step's micro-batches, made one at a time as the loop asks for them."""

    def __init__(self, n, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __iter__(self):
        return (self.make(micro) for micro in range(self.n))


class OptimizerSteps:
    """A loader of micro-batches (a DataLoader of ColossalChat's preference dicts, or of Batch)
    read as optimizer steps of accum micro-batches each; an epoch's last incomplete step is
    dropped. set_epoch reaches the loader's sampler (DistributedSampler's shuffle)."""

    def __init__(self, loader, accum):
        self.loader, self.accum = loader, accum

    def set_epoch(self, epoch):
        for s in (self.loader, getattr(self.loader, "sampler", None)):
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    def __len__(self):
        return len(self.loader) // self.accum

    def __iter__(self):
        step = []
        for b in self.loader:
            step.append(b)
            if len(step) == self.accum:
                yield step
                step = []


class PairSteps(OptimizerSteps):
    """train_rm.py's sampler of a PairDataset: for each optimizer step of an epoch, its
    grad_accum micro-batches, this rank's slice of the step's global batch (batch_indices),
    padded or packed (with the frozen layers' cached output when there is a cache). An epoch is
    steps_per_epoch steps from first_step on (a resumed run's), none at or past max_iters."""

    def __init__(self, data, cfg, rank, world, pad_id, cache, steps_per_epoch, first_step):
        self.data, self.cfg, self.rank, self.world = data, cfg, rank, world
        self.pad_id, self.cache, self.accum = pad_id, cache, cfg.grad_accum
        self.steps_per_epoch, self.first_step, self.epoch = steps_per_epoch, first_step, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def steps(self):
        start = max(self.first_step, self.epoch * self.steps_per_epoch)
        return range(start, min((self.epoch + 1) * self.steps_per_epoch, self.cfg.max_iters))

    def __len__(self):
        return len(self.steps())

    def __iter__(self):
        return (
            Step(self.accum, lambda micro, s=step: self.micro_batch(s, micro))
            for step in self.steps()
        )

    def micro_batch(self, step, micro):
        idx = batch_indices(step, micro, self.rank, self.world, self.cfg, self.data)
        if self.cfg.pack:  # one row per pair; with a cache, the frozen layers' output too
            return self.data.collate_packed(idx, self.pad_id, self.cache)
        return self.data.collate(idx, self.pad_id)


def batch_indices(step, micro, rank, world, cfg, data):
    """The pairs of one micro-step. The global batch of a step is fixed by (seed, step) alone, so
    any split of it over ranks and micro-steps sees the same pairs, and resuming needs no state."""
    G, n = cfg.batch_size * cfg.grad_accum * world, len(data)  # n >= G: train_rm checks
    epoch, k = divmod(step, n // G)  # drop the last partial batch of each epoch
    order = epoch_order(data, cfg.seed + epoch, G, cfg.bucket, cfg.pack, cfg.balance)
    chunk = order[k * G : (k + 1) * G]
    slot = rank * cfg.grad_accum + micro
    return chunk[slot * cfg.batch_size : (slot + 1) * cfg.batch_size].tolist()


@lru_cache(maxsize=2)
def epoch_order(data, seed, G, bucket, packed, balance="none"):
    """One epoch's order of the pairs: seeded by the epoch, so every rank computes the same.
    balance: len(data) pairs drawn with replacement by their balance_weights, so a pair is seen
    once per epoch on average; bucket: each run of G pairs (one global batch) has similar
    lengths."""
    if balance != "none":
        order = balanced_order(balance_weights(data, balance), len(data), seed)
        if bucket:
            order = order[bucketed_order(data.lengths(packed)[order.numpy()], G, seed)]
        return order
    if bucket:
        return bucketed_order(data.lengths(packed), G, seed)
    return torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))


def looks_like_dataset(folder):
    """Whether folder holds a dataset's meta.json, as the prepare scripts write it (the keys
    train_rm.py reads): how a folder that an older nanoRM wrote, with no record, is told."""
    meta = json_object(os.path.join(folder, "meta.json"))
    return meta is not None and {"tokenizer_fingerprint", "vocab_size", "end_id"} <= set(meta)
