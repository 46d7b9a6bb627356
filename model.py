"""
The LLaMA that every nanoRM head sits on: RMSNorm, RoPE, grouped-query attention, SwiGLU.

    python model.py                                   # greedy story from llama2.c's stories260K
    python model.py --prompt "Once upon a time" --temperature 0.8 --top_k 40
    python model.py --ckpt path/to/hf_llama_dir --tokenizer path/to/tokenizer.model

Module names are Meta's (tok_embeddings, layers[i].attention.wq, feed_forward.w1, ...), so
Meta and llama2.c checkpoints map one to one; Hugging Face checkpoints are renamed and their
wq/wk rows un-permuted in `from_pretrained`.

Padding. A reward model reads one scalar at the last real token of each sequence, so a
sequence's hidden states must not depend on how it was padded. Two things make that true here:
  1. the attention mask hides padding keys from every query, and
  2. RoPE positions come from the mask (position = number of real tokens before this one),
     not from the column index. With left padding, the first real token is at position 0.
RoPE only sees position differences, so numbering a left-padded row by column shifts it
uniformly and changes nothing but rounding; what breaks is mixing the two numberings, e.g. a
prompt numbered by column and cached tokens numbered by count, or a model with absolute position
embeddings. Deriving positions from the mask everywhere (forward, cache, packing) keeps every path
on one numbering. Padding is where reward-model bugs cluster in the field (the pooled token, the
positions, the pad id: huggingface/transformers#35352, OpenRLHF#217); `tests/test_model.py`
checks left, right, no and mixed padding to 1e-5.

Speed: when a batch has padding, hidden_states computes only its real tokens (unpadding; on CPU
attention then runs row by row over each row's real tokens) and returns 0 at padding positions.
Given `at`, the columns a head will read, the last layer runs its queries and FFN there alone.

Simplifications: one GPU or CPU process (DDP lives in train_rm.py), no tensor parallelism,
no sliding windows, no biases (LLaMA has none). Only torch and the standard library are
imported at module level; safetensors is imported inside the loader that needs it.
"""

import functools
import json
import math
import os
import struct
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention


@dataclass
class ModelConfig:
    dim: int = 288
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int | None = None  # grouped-query attention; None means n_heads (plain MHA)
    vocab_size: int = 32000
    hidden_dim: int | None = None  # FFN width; None derives it the way Meta does, below
    multiple_of: int = 256  # FFN width is rounded up to a multiple of this (GPU-friendly)
    ffn_dim_multiplier: float | None = None  # Llama 2 70B / Llama 3 scale the FFN with this
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # Llama 2: 1e4, Llama 3: 5e5
    # Llama 3.1+ RoPE scaling, e.g. {"rope_type": "llama3", "factor": 8.0,
    # "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    rope_scaling: dict | None = None
    max_seq_len: int = 2048
    dropout: float = 0.0
    tie_embeddings: bool = False  # output shares tok_embeddings' weight (llama2.c, Llama 3.2 1B)

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.hidden_dim is None:
            # SwiGLU has three matrices instead of two, so Meta shrinks 4*dim by 2/3 to keep
            # the parameter count of a plain 4*dim MLP, then rounds up to multiple_of.
            hidden = int(2 * (4 * self.dim) / 3)
            if self.ffn_dim_multiplier is not None:
                hidden = int(self.ffn_dim_multiplier * hidden)
            self.hidden_dim = self.multiple_of * (
                (hidden + self.multiple_of - 1) // self.multiple_of
            )
        assert self.dim % self.n_heads == 0, (
            f"dim {self.dim} not divisible by n_heads {self.n_heads}"
        )
        assert self.n_heads % self.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads"

    @property
    def head_dim(self):
        return self.dim // self.n_heads


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d) of RoPE, (head_dim/2,), with Llama 3's scaling if set."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    rs = cfg.rope_scaling
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        # Llama 3.1 stretches only the long wavelengths: those longer than the original context
        # / low_freq_factor are divided by `factor`, short ones are kept, and the band between
        # is interpolated smoothly. This is what lets an 8k-trained model read 128k tokens.
        factor, old_ctx = rs["factor"], rs["original_max_position_embeddings"]
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_ctx / wavelen - lo) / (hi - lo)).clamp(0.0, 1.0)
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    elif rs and rs.get("rope_type", rs.get("type")) not in (None, "default"):
        raise ValueError(f"rope_scaling type {rs!r} is not supported (only 'llama3')")
    return inv_freq


def apply_rope(x, cos, sin):
    """Rotate adjacent pairs (x[2i], x[2i+1]) by angle pos*freq_i, as Meta's reference does.
    x: (B, T, H, head_dim), cos/sin: (B, T, head_dim/2); or unpadded, x (N, H, head_dim) and
    cos/sin (N, head_dim/2)."""
    xr = x.float().unflatten(-1, (-1, 2))  # (..., H, head_dim/2, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in fp32 even under bf16: the mean of squares loses too much in 8 mantissa bits
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


class KVCache:
    """Keys and values of every layer, preallocated for `max_len` positions."""

    def __init__(self, cfg, batch_size, max_len, device, dtype):
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.len = 0  # positions filled so far; advanced by Transformer after all layers

    def update(self, layer, k, v):  # k, v: (B, n_kv_heads, t, head_dim)
        end = self.len + k.size(2)
        self.k[layer, :, :, self.len : end] = k
        self.v[layer, :, :, self.len : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


@dataclass
class Unpadded:
    """Where the N real tokens of a padded (B, T) batch are, for layers that skip the padding."""

    index: torch.Tensor  # (N,) each real token's flat position b * T + t, row after row
    B: int
    T: int
    lengths: list | None  # real tokens per row, when attention runs row by row (CPU)
    masks: list | None  # per row, its (1, 1, l, l) part of a caller's mask; None: causal


def unpad_batch(attention_mask, attn_mask, per_row):
    """Unpadded for attention_mask (B, T). attn_mask: a caller's (B, T, T) mask, or None
    when it is derived from attention_mask: among a row's real tokens that one is causal."""
    B, T = attention_mask.shape
    index = attention_mask.flatten().nonzero().squeeze(1)  # (N,)
    if not per_row:
        return Unpadded(index, B, T, None, None)
    lengths = attention_mask.sum(1).tolist()
    if attn_mask is None:
        return Unpadded(index, B, T, lengths, [None] * B)
    masks = [m[r][:, r][None, None] for m, r in zip(attn_mask, attention_mask, strict=True)]
    return Unpadded(index, B, T, lengths, masks)


@dataclass
class Readout:
    """The M tokens whose final states are wanted (a reward head reads one per row or two per
    packed row): where they are and which keys each one may see."""

    index: torch.Tensor  # (M,) flat position in the layer input: unpadded (N) or b * T + t
    row: torch.Tensor  # (M,) batch row b
    key_mask: torch.Tensor  # (M, T) bool, over the columns of the padded row


def scatter_rows(x, unpad):
    """(N, ...) real tokens -> (B, T, ...) rows, zeros in the padding slots. Differentiable:
    the gradient is a gather."""
    out = x.new_zeros(unpad.B * unpad.T, *x.shape[1:])
    return out.index_copy(0, unpad.index, x).unflatten(0, (unpad.B, unpad.T))


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention)  # dynamic shapes after the first new length


def _flex(q, k, v, block_mask, enable_gqa):
    """flex_attention, compiled on CUDA. Eager, it is a slow reference (forward only on CPU),
    which the CPU tests use to check the mask."""
    fn = _compiled_flex_attention() if q.is_cuda else flex_attention
    return fn(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id, self.n_heads, self.n_kv_heads = layer_id, cfg.n_heads, cfg.n_kv_heads
        self.head_dim, self.dropout = cfg.head_dim, cfg.dropout
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, attn_mask, cache=None, unpad=None):
        # x: (B, T, dim); or (N, dim), the real tokens of every row one after the other, unpadded
        rows = x.shape[:-1]  # (B, T) or (N,)
        q = self.wq(x).view(*rows, self.n_heads, self.head_dim)
        k = self.wk(x).view(*rows, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(*rows, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if unpad is None:
            return self.wo(self.attend(q, k, v, attn_mask, cache))
        if unpad.lengths is not None:  # CPU: row by row, each over its l real tokens: l^2, not T^2
            split = lambda t: t.split(unpad.lengths)  # (l, H, head_dim) views, no copies
            per_row = zip(split(q), split(k), split(v), unpad.masks, strict=True)
            y = torch.cat([self.attend(a[None], b[None], c[None], m)[0] for a, b, c, m in per_row])
        else:  # GPU: back into (B, T) rows for one batched call, padding slots 0
            q, k, v = (scatter_rows(t, unpad) for t in (q, k, v))
            y = self.attend(q, k, v, attn_mask).flatten(0, 1)[unpad.index]  # (N, dim)
        return self.wo(y)

    def read_at(self, x, cos, sin, readout, unpad):
        """forward() at the readout tokens only: their queries attend over every key -> (M, dim).
        x: (B, T, dim) or unpadded (N, dim); cos/sin in the same layout."""
        at = lambda t: t.flatten(0, -2)[readout.index]  # (M, ...) the readout tokens' rows
        q = self.wq(at(x)).view(-1, self.n_heads, self.head_dim)  # (M, H, head_dim)
        q = apply_rope(q, at(cos), at(sin))
        rows = x.shape[:-1]
        k = apply_rope(self.wk(x).view(*rows, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).view(*rows, self.n_kv_heads, self.head_dim)
        if unpad is not None:
            k, v = scatter_rows(k, unpad), scatter_rows(v, unpad)  # (B, T, n_kv_heads, head_dim)
        k, v = k[readout.row], v[readout.row]  # (M, T, n_kv_heads, head_dim): each query's row
        mask = readout.key_mask[:, None, None, :]  # (M, 1, 1, T)
        return self.wo(self.attend(q[:, None], k, v, mask)[:, 0])  # (M, dim)

    def attend(self, q, k, v, attn_mask, cache=None):
        """q (B, T, H, head_dim) attends over k, v (B, T, n_kv_heads, head_dim) -> (B, T, dim)."""
        B, T = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, head_dim)
        if cache is not None:
            k, v = cache.update(self.layer_id, k, v)  # (B, n_kv_heads, S, head_dim), S >= T
        # enable_gqa: query head h reads kv head h // (n_heads // n_kv_heads), without copying
        if isinstance(attn_mask, BlockMask):  # FlexAttention: fully masked blocks are skipped
            assert not (self.training and self.dropout), "FlexAttention has no attention dropout"
            y = _flex(q, k, v, attn_mask, self.n_kv_heads != self.n_heads)
        else:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                is_causal=attn_mask is None,
                dropout_p=self.dropout if self.training else 0.0,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )
        return y.transpose(1, 2).reshape(B, T, -1)  # (B, T, dim)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # gate
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)  # down
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # up

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.attention = Attention(cfg, layer_id)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, attn_mask, cache=None, unpad=None):
        x = x + self.drop(self.attention(self.attention_norm(x), cos, sin, attn_mask, cache, unpad))
        return x + self.drop(self.feed_forward(self.ffn_norm(x)))

    def read_at(self, x, cos, sin, readout, unpad):
        """forward() at the readout tokens only -> (M, dim). Every token still gives its key and
        value; only the M readout tokens get queries, the output projection and the FFN."""
        h = x.flatten(0, -2)[readout.index]  # (M, dim)
        h = h + self.drop(self.attention.read_at(self.attention_norm(x), cos, sin, readout, unpad))
        return h + self.drop(self.feed_forward(self.ffn_norm(h)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # recomputed, never saved: checkpoints hold only learned weights
        self.register_buffer("inv_freq", rope_frequencies(cfg), persistent=False)
        self.gradient_checkpointing = False  # trade compute for memory on long sequences
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("wo.weight", "w2.weight")):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def hidden_states(
        self, tokens, attention_mask=None, *, positions=None, attn_mask=None, cache=None, at=None
    ):
        """Final normalised hidden states (B, T, dim), the input of every head.

        tokens: (B, T) ids. attention_mask: (B, T), 1 for real tokens, any padding side
        (with a cache: (B, S) covering the cached positions too). positions / attn_mask
        (B, T) and (B, T, S) bool override what is derived from the mask; they serve packed
        sequences where several segments share one row.
        at: (B, k) columns of real tokens. Only their states are returned, (B, k, dim), and the
        last layer runs its queries, output projection and FFN there alone: a reward head reads
        one token per row, and no other token's last-layer output can reach it. This saves
        most of a layer (about 1/n_layers of the work); the states at `at` are the same.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, time), got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        cfg, start = self.config, cache.len if cache is not None else 0
        if positions is None and start + T > cfg.max_seq_len:
            raise ValueError(f"sequence length {start + T} exceeds max_seq_len {cfg.max_seq_len}")
        if positions is not None and positions.numel() and positions.max() >= cfg.max_seq_len:
            # a packed row may be longer than max_seq_len; the positions in it may not
            raise ValueError(
                f"position {int(positions.max())} exceeds max_seq_len {cfg.max_seq_len}"
            )
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
            bad = tokens[(tokens < 0) | (tokens >= cfg.vocab_size)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {cfg.vocab_size})")
        if attention_mask is not None:
            attention_mask = attention_mask.to(tokens.device).bool()
            if cache is None and attention_mask.all():  # no padding: plain causal attention,
                attention_mask = None  # without a (B, T, T) mask (is_causal's faster kernels)
        if positions is None:
            if attention_mask is None:
                positions = torch.arange(start, start + T, device=tokens.device).expand(B, T)
            else:  # position = number of real tokens before this one
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
        unpad = None
        if attention_mask is not None and cache is None:  # (there is padding: see above)
            # Unpadding. No real token ever sees a padding token, so padding need not be
            # computed: embeddings, norms, projections and the FFN run on the N real tokens
            # alone, and attention on CPU row by row over each row's real tokens (on GPU, one
            # batched call on the padded rows is faster). The real tokens' states are the same;
            # the padding positions of the output are 0.
            per_row = not tokens.is_cuda and not isinstance(attn_mask, BlockMask)
            unpad = unpad_batch(attention_mask, attn_mask, per_row)
        row_by_row = unpad is not None and unpad.lengths is not None  # needs no (B, T, S) mask
        if attn_mask is None and not row_by_row and (attention_mask is not None or start > 0):
            S = start + T  # keys: everything cached plus this chunk
            q_idx = torch.arange(start, S, device=tokens.device)[:, None]
            k_idx = torch.arange(S, device=tokens.device)[None, :]
            real = attention_mask if attention_mask is not None else torch.ones_like(k_idx).bool()
            attn_mask = (k_idx <= q_idx) & real[:, None, :]  # (B, T, S): causal and not padding
            # a padding query still sees itself, so no row is fully masked (that gives NaN)
            attn_mask = attn_mask | (k_idx == q_idx)
        if isinstance(attn_mask, torch.Tensor):  # (a FlexAttention BlockMask is used as is)
            attn_mask = attn_mask.unsqueeze(1)  # (B, 1, T, S), broadcast over heads
        angles = positions[..., None].float() * self.inv_freq  # (B, T, head_dim/2)
        cos, sin = angles.cos(), angles.sin()
        if at is not None and cache is not None:
            raise ValueError("at (read a few tokens) is for scoring, not for cached generation")
        readout = None if at is None else self._readout(at, attention_mask, attn_mask, unpad, T)
        if unpad is not None:
            tokens, cos, sin = (t.flatten(0, 1)[unpad.index] for t in (tokens, cos, sin))
        h = self.tok_embeddings(tokens)  # (B, T, dim), or (N, dim) unpadded
        for layer in self.layers if at is None else self.layers[:-1]:
            if self.gradient_checkpointing and self.training:
                h = torch.utils.checkpoint.checkpoint(
                    layer, h, cos, sin, attn_mask, cache, unpad, use_reentrant=False
                )
            else:
                h = layer(h, cos, sin, attn_mask, cache, unpad)
        if cache is not None:
            cache.len += T
        if at is not None:
            h = self.layers[-1].read_at(h, cos, sin, readout, unpad)  # (M, dim), M = B * k
            return self.norm(h).view(*at.shape, -1)  # (B, k, dim)
        h = self.norm(h)
        return h if unpad is None else scatter_rows(h, unpad)  # (B, T, dim)

    @staticmethod
    def _readout(at, attention_mask, attn_mask, unpad, T):
        """Readout for the columns at (B, k): flat positions, rows, and each one's key mask."""
        B, dev = at.size(0), at.device
        if at.numel() and (at.min() < 0 or at.max() >= T):
            raise ValueError(f"at must name columns in [0, {T}), got {at.tolist()}")
        if attention_mask is not None and not attention_mask.gather(1, at).all():
            raise ValueError("at selects a padding position; it must name real tokens")
        row = torch.arange(B, device=dev)[:, None].expand_as(at).flatten()  # (M,)
        col = at.flatten()  # (M,)
        keys = torch.arange(T, device=dev)[None, :]  # (1, T)
        if isinstance(attn_mask, BlockMask):  # evaluate its mask_mod on the readout's rows
            key_mask = attn_mask.mask_mod(row[:, None], 0, col[:, None], keys)
        elif attn_mask is not None:  # (B, 1, T, T)
            key_mask = attn_mask[row, 0, col]
        else:  # causal, padding hidden
            key_mask = keys <= col[:, None]
            if attention_mask is not None:
                key_mask = key_mask & attention_mask[row]
        flat = row * T + col  # (M,) position in the padded (B * T) layout
        if unpad is not None:  # -> position among the N real tokens
            where = torch.full((B * T,), -1, dtype=torch.long, device=dev)
            where[unpad.index] = torch.arange(unpad.index.numel(), device=dev)
            flat = where[flat]
        return Readout(flat, row, key_mask.expand(row.numel(), T))

    def forward(self, tokens, attention_mask=None, **kwargs):
        """Logits (B, T, vocab_size)."""
        return self.output(self.hidden_states(tokens, attention_mask, **kwargs))

    @torch.no_grad()
    def generate(
        self,
        tokens,
        max_new_tokens,
        temperature=0.0,
        top_k=None,
        attention_mask=None,
        use_cache=True,
    ):
        """Append max_new_tokens sampled tokens to tokens (B, T); temperature 0 is greedy.
        Batched prompts must be left-padded (new tokens go at the right end)."""
        B, T = tokens.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens, dtype=torch.bool)
        if not attention_mask[:, -1].all():
            raise ValueError("generate needs left-padded prompts: the last column must be real")
        if T + max_new_tokens > self.config.max_seq_len:
            raise ValueError(
                f"prompt {T} + max_new_tokens {max_new_tokens} exceeds "
                f"max_seq_len {self.config.max_seq_len}"
            )
        mask = attention_mask.bool()
        dtype = next(self.parameters()).dtype
        cache = (
            KVCache(self.config, B, T + max_new_tokens, tokens.device, dtype) if use_cache else None
        )
        step_in = tokens
        for _ in range(max_new_tokens):
            if use_cache:  # feed only what the cache has not seen; the mask covers all of it
                logits = self(step_in, mask, cache=cache)[:, -1, :]
            else:
                logits = self(tokens, mask)[:, -1, :]
            if temperature == 0.0:
                next_tok = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                next_tok = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            tokens = torch.cat((tokens, next_tok), dim=1)
            mask = torch.cat((mask, torch.ones_like(next_tok, dtype=torch.bool)), dim=1)
            step_in = next_tok
        return tokens

    # ---------------------------------------------------------------- loaders
    @classmethod
    def _from_state_dict(cls, cfg, sd, source):
        """Build on the meta device and adopt sd's tensors (assign=True): no second copy."""
        with torch.device("meta"):
            model = cls(cfg)
        if cfg.tie_embeddings:
            sd.pop("output.weight", None)
        expected = set(model.state_dict().keys()) - (
            {"output.weight"} if cfg.tie_embeddings else set()
        )
        missing, unexpected = sorted(expected - sd.keys()), sorted(sd.keys() - expected)
        if missing or unexpected:
            raise ValueError(
                f"{source}: checkpoint does not match the config: missing keys "
                f"{missing[:5]}, unexpected keys {unexpected[:5]}"
            )
        for k, t in model.state_dict().items():
            if k in sd and tuple(sd[k].shape) != tuple(t.shape):
                raise ValueError(
                    f"{source}: {k} has shape {tuple(sd[k].shape)}, "
                    f"the config expects {tuple(t.shape)}"
                )
        model.load_state_dict(sd, strict=False, assign=True)
        if cfg.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        model.inv_freq = rope_frequencies(cfg)  # buffers on meta are empty: compute them
        return model.eval()

    @classmethod
    def from_llama2c(cls, path):
        """llama2.c checkpoints: the legacy v0 `.bin` (run.c's format) or train.py's `.pt`."""
        if str(path).endswith(".pt"):
            ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            if "model" not in ckpt or "model_args" not in ckpt:
                raise ValueError(
                    f"{path}: expected keys 'model' and 'model_args', found {list(ckpt)}"
                )
            args = {
                k: v for k, v in ckpt["model_args"].items() if k in ModelConfig.__dataclass_fields__
            }
            sd = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
            sd = {k: v for k, v in sd.items() if k not in ("freqs_cos", "freqs_sin")}
            cfg = ModelConfig(**args, tie_embeddings=True)  # llama2.c always ties
            return cls._from_state_dict(cfg, sd, path)
        size = os.path.getsize(path)
        if size < 28:
            raise ValueError(f"{path}: {size} bytes is too short for the 28-byte llama2.c header")
        with open(path, "rb") as f:
            header = struct.unpack("7i", f.read(28))
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = header
        shared = vocab > 0  # a negative vocab_size means an untied classifier follows
        cfg = ModelConfig(
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            vocab_size=abs(vocab),
            hidden_dim=hidden,
            max_seq_len=seq_len,
            tie_embeddings=shared,
        )
        L, V, kv_dim, hd = n_layers, abs(vocab), n_kv * cfg.head_dim, cfg.head_dim
        shapes = [
            ("tok_embeddings", (V, dim)),
            ("attention_norm", (L, dim)),
            ("wq", (L, dim, dim)),
            ("wk", (L, kv_dim, dim)),
            ("wv", (L, kv_dim, dim)),
            ("wo", (L, dim, dim)),
            ("ffn_norm", (L, dim)),
            ("w1", (L, hidden, dim)),
            ("w2", (L, dim, hidden)),
            ("w3", (L, hidden, dim)),
            ("norm", (dim,)),
            ("freq_cis_real", (seq_len, hd // 2)),
            ("freq_cis_imag", (seq_len, hd // 2)),
        ]
        if not shared:
            shapes.append(("output", (V, dim)))
        n_floats = sum(math.prod(s) for _, s in shapes)
        if size != 28 + 4 * n_floats:
            raise ValueError(
                f"{path}: {size} bytes, but its header {header} "
                f"implies {28 + 4 * n_floats} bytes (truncated or not a llama2.c v0 file)"
            )
        data = torch.from_file(str(path), shared=False, size=size // 4, dtype=torch.float32)[7:]
        w, off = {}, 0
        for name, shape in shapes:  # one read of the file; every weight is a view into it
            n = math.prod(shape)
            w[name], off = data[off : off + n].view(shape), off + n
        sd = {"tok_embeddings.weight": w["tok_embeddings"], "norm.weight": w["norm"]}
        if not shared:
            sd["output.weight"] = w["output"]
        for i in range(L):
            for name in ("wq", "wk", "wv", "wo"):
                sd[f"layers.{i}.attention.{name}.weight"] = w[name][i]
            for name in ("w1", "w2", "w3"):
                sd[f"layers.{i}.feed_forward.{name}.weight"] = w[name][i]
            sd[f"layers.{i}.attention_norm.weight"] = w["attention_norm"][i]
            sd[f"layers.{i}.ffn_norm.weight"] = w["ffn_norm"][i]
        return cls._from_state_dict(cfg, sd, path)

    @classmethod
    def from_meta(cls, directory, max_seq_len=2048):
        """Meta's original release: params.json + consolidated.00.pth (one shard)."""
        params = _read_json(os.path.join(directory, "params.json"))
        ckpt_path = os.path.join(directory, "consolidated.00.pth")
        if not os.path.exists(ckpt_path):
            raise FileNotFoundError(
                f"{ckpt_path} not found (only single-shard checkpoints are supported)"
            )
        sd = torch.load(ckpt_path, map_location="cpu", mmap=True, weights_only=True)
        sd.pop("rope.freqs", None)  # Llama 2 ships a precomputed table; we derive it
        rope_scaling = None
        if params.get("use_scaled_rope"):  # Llama 3.1's published scaling constants
            rope_scaling = {
                "rope_type": "llama3",
                "factor": params.get("rope_scaling_factor", 8.0),
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            }
        cfg = ModelConfig(
            dim=params["dim"],
            n_layers=params["n_layers"],
            n_heads=params["n_heads"],
            n_kv_heads=params.get("n_kv_heads"),
            vocab_size=sd["tok_embeddings.weight"].shape[0],  # params says -1 in Llama 2
            multiple_of=params.get("multiple_of", 256),
            ffn_dim_multiplier=params.get("ffn_dim_multiplier"),
            norm_eps=params.get("norm_eps", 1e-5),
            rope_theta=params.get("rope_theta", 1e4),
            rope_scaling=rope_scaling,
            max_seq_len=max_seq_len,
            tie_embeddings="output.weight" not in sd,
        )
        return cls._from_state_dict(cfg, sd, ckpt_path)

    @classmethod
    def from_pretrained(cls, directory, dtype=torch.float32):
        """A local Hugging Face Llama directory: config.json + safetensors or pytorch_model*.bin."""
        cfg, hf = config_from_hf(_read_json(os.path.join(directory, "config.json")))
        sd, has_score = {}, False
        for name, tensor in _iter_hf_tensors(directory):
            key = _hf_to_meta_name(name)
            has_score |= name == "score.weight"
            if key is None:  # e.g. rotary_emb.inv_freq in old checkpoints, or a score head
                continue
            tensor = tensor.to(dtype)
            # HF's conversion script permuted the rows of wq and wk so that its rotate-half RoPE
            # (pairs i and i + d/2) equals Meta's interleaved RoPE (pairs 2i and 2i+1). Undo it:
            # per head, rows [first half | second half] go back to interleaved order.
            if key.endswith("attention.wq.weight"):
                tensor = _unpermute(tensor, cfg.n_heads, cfg.head_dim)
            elif key.endswith("attention.wk.weight"):
                tensor = _unpermute(tensor, cfg.n_kv_heads, cfg.head_dim)
            sd[key] = tensor
        if has_score and not cfg.tie_embeddings and "output.weight" not in sd:
            # a *ForSequenceClassification checkpoint has a score head and no lm_head: load its
            # backbone with a zero LM head, which reward heads never read
            sd["output.weight"] = torch.zeros(cfg.vocab_size, cfg.dim, dtype=dtype)
        model = cls._from_state_dict(cfg, sd, directory)
        model.hf_config = hf  # heads (e.g. a sequence classifier's score) may need more of it
        return model


def estimate_mfu(cfg, n_params, tokens_per_second, peak_flops=989e12, seq_len=None):
    """Model FLOPs utilisation: the FLOP/s that training at tokens_per_second needs, as a
    fraction of the accelerator's peak (989e12: H100 SXM, bf16, dense). As nanoGPT, after
    PaLM's appendix B, a trained token costs

        6 N + 12 L H Q T   FLOPs

    6 N: each of the N weights does one multiply-add (2 FLOPs) forward and two backward (the
    gradients of the input and of the weight). 12 L H Q T: per layer, the scores q.k and their
    weighted sum of v are H*Q*T multiply-adds each, forward, and twice that backward.
    N: the weights a token multiplies by, i.e. without the embedding table (a lookup) and,
    for a reward model, without the LM head it never runs. L layers, H heads, Q head_dim,
    T the length attended over (default cfg.max_seq_len; the mean row length is fairer).
    Count useful tokens only: padding computed is not progress."""
    T = seq_len or cfg.max_seq_len
    flops_per_token = 6 * n_params + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * T
    return flops_per_token * tokens_per_second / peak_flops


def _read_json(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None


def config_from_hf(hf):
    """ModelConfig from a Hugging Face LlamaConfig dict (transformers 4.x or 5.x keys)."""
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError("config.json: attention_bias / mlp_bias are not LLaMA; not supported")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})  # 5.x nests theta here
    theta = hf.get("rope_theta", rope.pop("rope_theta", 10000.0))
    dim, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim", dim // n_heads) != dim // n_heads:
        raise ValueError(f"config.json: head_dim {hf['head_dim']} != hidden_size / num_heads")
    cfg = ModelConfig(
        dim=dim,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads", n_heads),
        vocab_size=hf["vocab_size"],
        hidden_dim=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=rope or None,
        max_seq_len=hf.get("max_position_embeddings", 2048),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    return cfg, hf


def _unpermute(w, n_heads, head_dim):
    # (n_heads * head_dim, dim): per head, rows are [x_0, x_2, ..., x_1, x_3, ...] in HF;
    # view as (heads, 2, head_dim/2) and swap the last two axes to interleave again
    return w.view(n_heads, 2, head_dim // 2, -1).transpose(1, 2).reshape(n_heads * head_dim, -1)


_HF_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _hf_to_meta_name(name):
    if name == "model.embed_tokens.weight":
        return "tok_embeddings.weight"
    if name == "model.norm.weight":
        return "norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    if name.startswith("model.layers.") and "rotary_emb" not in name:
        i, rest = name.removeprefix("model.layers.").split(".", 1)
        module, suffix = rest.rsplit(".", 1)
        if module in _HF_NAMES:
            return f"layers.{i}.{_HF_NAMES[module]}.{suffix}"
    return None


def _iter_hf_tensors(directory):
    """Yield (name, tensor) one at a time from every weight file, so a conversion (dtype, the
    wq/wk permutation) never holds a second copy of the whole model."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if files:
        try:
            from safetensors import safe_open
        except ImportError:
            raise ImportError(
                "loading .safetensors needs the safetensors package: pip install safetensors"
            ) from None
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index):  # sharded: the index names the shards
            files = sorted(set(_read_json(index)["weight_map"].values()))
        for fname in files:
            path = os.path.join(directory, fname)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} is named in the index but missing")
            try:
                with safe_open(path, framework="pt") as f:
                    for name in f.keys():
                        yield name, f.get_tensor(name)
            except Exception as e:  # safetensors raises its own error types for bad headers
                if isinstance(e, (FileNotFoundError, ImportError)):
                    raise
                raise ValueError(f"{path}: unreadable safetensors file ({e})") from None
        return
    files = sorted(
        f for f in os.listdir(directory) if f.startswith("pytorch_model") and f.endswith(".bin")
    )
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors or pytorch_model*.bin weights")
    for fname in files:
        path = os.path.join(directory, fname)
        try:
            sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except RuntimeError as e:
            raise ValueError(f"{path}: unreadable torch checkpoint ({e})") from None
        yield from sd.items()


def main():
    import argparse

    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "shared", "data", "llama2c", "stories260K")
    p = argparse.ArgumentParser(description="Generate text with a LLaMA checkpoint.")
    p.add_argument(
        "--ckpt",
        default=os.path.join(default, "stories260K.bin"),
        help="llama2.c .bin/.pt, an HF directory, or a Meta directory (params.json)",
    )
    p.add_argument(
        "--tokenizer",
        default=os.path.join(default, "tok512.bin"),
        help="a llama2.c .bin vocabulary or a sentencepiece .model",
    )
    p.add_argument("--prompt", default="")
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()

    from data.tokenizer import load_tokenizer  # the only non-torch import, and only here

    torch.manual_seed(args.seed)
    if os.path.isdir(args.ckpt):
        is_meta = os.path.exists(os.path.join(args.ckpt, "params.json"))
        model = (
            Transformer.from_meta(args.ckpt) if is_meta else Transformer.from_pretrained(args.ckpt)
        )
    else:
        model = Transformer.from_llama2c(args.ckpt)
    tok = load_tokenizer(args.tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params:,} parameters; config {asdict(model.config)}")
    ids = torch.tensor([tok.encode(args.prompt, bos=True)])
    out = model.generate(ids, args.max_new_tokens, args.temperature, args.top_k)
    print(tok.decode(out[0].tolist()))


if __name__ == "__main__":
    main()
