"""
Where the tokens of a batch sit when model.py's forward runs: the layers see a flat (N, dim)
stream of the real tokens only (padding is never computed), and a Layout puts that stream back
into rows for attention. A first reading of model.py can take this file as given: its one job
is speed without a second copy of the layers.

    layout = make_layout(tokens, real, attn_mask, cache, per_row)   # once per forward
    x = layout.tokens(y)      # (B, T, ...) -> (N, ...): the computed tokens only
    y = layout.rows(x)        # (N, ...) -> (B, T, ...), zeros where nothing was computed
    readout = make_readout(at, real, layout)   # the M tokens the last layer computes alone

Why row by row on CPU: attention over a row of l real tokens costs l^2, over its padded row
T^2; one SDPA call per row is what variable-length attention kernels (FlashAttention's varlen)
do in one launch on a GPU. On CUDA, and with a KV cache (generation), one batched call on
padded rows is faster: the padding keys are masked, its queries' outputs never used.
tests/test_forward.py checks every layout against a slow plain computation.
"""

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask


@dataclass
class Layout:
    """Where the computed tokens of a (B, T) batch sit, and how attention runs over them."""

    B: int
    T: int
    index: torch.Tensor | None  # (N,) flat position b * T + t of each computed token; None: all
    lengths: list | None  # tokens per row when attention runs row by row (CPU), else None
    row_masks: list | None  # with lengths: each row's (1, 1, l, l) part of the mask; None causal
    mask: torch.Tensor | BlockMask | None  # (B, 1, T, S) bool or a BlockMask; None: causal
    cache: object = None  # model.KVCache when generating

    def rows(self, x):  # (N, ...) -> (B, T, ...), zeros at the tokens not computed
        if self.index is None:
            return x.unflatten(0, (self.B, self.T))
        out = x.new_zeros(self.B * self.T, *x.shape[1:])  # differentiable: its gradient a gather
        return out.index_copy(0, self.index, x).unflatten(0, (self.B, self.T))

    def tokens(self, y):  # (B, T, ...) -> (N, ...)
        y = y.flatten(0, 1)
        return y if self.index is None else y[self.index]


@dataclass
class Readout:
    """The M tokens whose final states are wanted (`at`): where they are in the stream, their
    rows, and the keys each one may read. The last layer computes queries, the attention
    output and the FFN at these alone (no other token's last-layer output reaches a head)."""

    index: torch.Tensor  # (M,) position in the (N,) stream
    row: torch.Tensor  # (M,) batch row
    key_mask: torch.Tensor  # (M, T) bool over the columns of its row


def padding_mask(attention_mask, T):
    """(B, T, S) bool attention mask for the last T of S columns, attention_mask (B, S): query
    t may read key s when s <= t and s is a real token. A padding query reads itself too, so no
    row is fully masked (that gives NaN); its output is never used."""
    S = attention_mask.size(1)
    q = torch.arange(S - T, S, device=attention_mask.device)[:, None]  # (T, 1)
    k = torch.arange(S, device=attention_mask.device)[None, :]  # (1, S)
    return (k <= q) & attention_mask.bool()[:, None, :] | (k == q)


def make_layout(tokens, real, attn_mask, cache, per_row):
    """The Layout of a batch: padding (real False) leaves the stream; attention runs row by
    row over the real tokens when per_row (one SDPA call per row) and as one batched call on
    padded rows otherwise or with a cache. real: (B, T) bool or None (no padding); attn_mask:
    the caller's (B, T, T) bool or BlockMask, or None (causal)."""
    B, T = tokens.shape
    if cache is not None:  # generation: every column computed, keys cached before it
        S = cache.len + T
        real = torch.ones(B, S, dtype=torch.bool, device=tokens.device) if real is None else real
        return Layout(B, T, None, None, None, padding_mask(real, T)[:, None], cache)
    if real is not None and real.all():
        real = None  # nothing to skip
    index = None if real is None else real.flatten().nonzero().squeeze(1)  # (N,)
    if real is not None and per_row and not isinstance(attn_mask, BlockMask):
        masks = [None] * B if attn_mask is None else attn_mask
        masks = [
            None if m is None else m[r][:, r][None, None] for m, r in zip(masks, real, strict=True)
        ]
        full = None if attn_mask is None else attn_mask[:, None]  # for a readout's keys
        return Layout(B, T, index, real.sum(1).tolist(), masks, full)
    if attn_mask is None and real is not None:
        attn_mask = padding_mask(real, T)
    if isinstance(attn_mask, torch.Tensor):
        attn_mask = attn_mask[:, None]  # (B, 1, T, T), broadcast over heads
    return Layout(B, T, index, None, None, attn_mask)


def make_readout(at, real, layout):
    """The Readout of the columns at (B, k): their stream positions and key masks."""
    B, T, dev = layout.B, layout.T, at.device
    if layout.cache is not None:
        raise ValueError("at is for scoring, not for cached generation")
    if at.numel() and (at.min() < 0 or at.max() >= T):
        raise ValueError(f"at must name columns in [0, {T}), got {at.tolist()}")
    if real is not None and not real.gather(1, at).all():
        raise ValueError("at selects a padding position; it must name real tokens")
    row, col = torch.arange(B, device=dev)[:, None].expand_as(at).flatten(), at.flatten()
    keys = torch.arange(T, device=dev)[None, :]  # (1, T)
    if isinstance(layout.mask, BlockMask):  # its mask_mod, evaluated at the readout's rows
        key_mask = layout.mask.mask_mod(row[:, None], 0, col[:, None], keys)
    elif layout.mask is not None:
        key_mask = layout.mask[row, 0, col]  # (M, T)
    else:  # causal among the row's real tokens
        key_mask = keys <= col[:, None]
        key_mask = key_mask if real is None else key_mask & real[row]
    flat = row * T + col  # (M,) in the (B * T) layout; -> in the stream of computed tokens
    if layout.index is not None:
        where = torch.full((B * T,), -1, dtype=torch.long, device=dev)
        where[layout.index] = torch.arange(layout.index.numel(), device=dev)
        flat = where[flat]
    return Readout(flat, row, key_mask.expand(row.numel(), T))
