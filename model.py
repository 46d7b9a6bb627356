"""
The LLaMA that every nanoRM head sits on: RMSNorm, RoPE, grouped-query attention, SwiGLU, and
generation with a KV cache. Text from a checkpoint: `python -m nanorm.sample` (see its docstring).

    model = checkpoints.load_transformer(path)   # llama2.c .bin/.pt, Meta or HF dir, .gguf
    h = model.hidden_states(tokens, attention_mask)            # (B, T, dim), any padding side
    out = model.generate(tokens, max_new_tokens=50, temperature=0.8, top_k=40)

Module names are Meta's (tok_embeddings, layers[i].attention.wq, feed_forward.w1, ...), so
checkpoints map one to one; nanorm/base/checkpoints.py reads every format and builds the model from it.

Padding. A reward model reads one scalar at the last real token of each sequence, so a
sequence's hidden states must not depend on how it was padded. Two things make that true here:
  1. the attention mask hides padding keys from every query, and
  2. RoPE positions come from the mask (position = number of real tokens before this one),
     not from the column index. With left padding, the first real token is at position 0.
RoPE only sees position differences, so numbering a left-padded row by column changes nothing
but rounding; what breaks is mixing two numberings (a prompt by column, cached tokens by count)
or absolute position embeddings. Positions from the mask everywhere (forward, cache, packing)
keep every path on one numbering. Padding is where reward-model bugs cluster in the field (the
pooled token, the positions, the pad id: huggingface/transformers#35352, OpenRLHF#217);
`tests/test_model.py` checks left, right, no and mixed padding to 1e-5.

One forward. Training, evaluation, scoring, the critic and generation all run `hidden_states`
below; speed comes from the layout of the tokens, never from another copy of the layers. The
layers see a flat (N, dim) stream of the tokens that matter, so padding is never computed
(variable-length attention, as FlashAttention's varlen kernels do it); a Layout (the last
section of this file) puts the stream back into rows for attention: one SDPA call per row on
CPU for rows over 64 columns (l^2 work, not T^2), else one batched call on padded rows. Packed
rows (a prompt once, then both responses: reward.py) come with their own positions and mask,
and `at` runs the last layer at the tokens a head reads only.
tests/test_forward.py checks every layout against a slow plain computation written in the test.

Simplifications: one GPU or CPU process (DDP lives in train_rm.py), no tensor parallelism, no
sliding windows, no biases (LLaMA has none). Imports torch and the standard library.
"""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.utils.checkpoint import checkpoint


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id, self.n_heads, self.n_kv_heads = layer_id, cfg.n_heads, cfg.n_kv_heads
        self.head_dim, self.dropout = cfg.head_dim, cfg.dropout
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, layout, readout=None):  # x: (N, dim) -> (N or M, dim)
        k = apply_rope(self.wk(x).unflatten(-1, (self.n_kv_heads, self.head_dim)), cos, sin)
        v = self.wv(x).unflatten(-1, (self.n_kv_heads, self.head_dim))  # (N, n_kv_heads, hd)
        if readout is not None:  # every token gives its key and value, only M ask queries
            x, cos, sin = x[readout.index], cos[readout.index], sin[readout.index]
        q = apply_rope(self.wq(x).unflatten(-1, (self.n_heads, self.head_dim)), cos, sin)
        return self.wo(self.attend(q, k, v, layout, readout))

    def attend(self, q, k, v, layout, readout):
        """q (N or M, n_heads, hd) over k, v (N, n_kv_heads, hd) -> (N or M, dim): the kernel
        is chosen by the layout, the arithmetic is one SDPA (or FlexAttention) call per rows."""
        if readout is not None:  # each of the M queries reads the keys of its own row
            k, v = layout.rows(k)[readout.row], layout.rows(v)[readout.row]  # (M, T, kv, hd)
            mask = readout.key_mask[:, None, None, :]  # (M, 1, 1, T)
            return self.sdpa(q[:, None], k, v, mask)[:, 0]
        if layout.lengths is not None:  # CPU: row by row over its l tokens, l^2 and not T^2
            split = lambda t: t.split(layout.lengths)  # (l, heads, hd) views, no copies
            rows = zip(split(q), split(k), split(v), layout.row_masks, strict=True)
            return torch.cat([self.sdpa(a[None], b[None], c[None], m)[0] for a, b, c, m in rows])
        q, k, v = layout.rows(q), layout.rows(k), layout.rows(v)  # (B, T, heads, hd)
        return layout.tokens(self.sdpa(q, k, v, layout.mask, layout.kv_cache))

    def sdpa(self, q, k, v, mask, kv_cache=None):
        """(B, T, n_heads, hd) queries over (B, S, n_kv_heads, hd) keys -> (B, T, dim).
        mask: (B, 1, T, S) bool, True where a query may read a key; a BlockMask; None: causal."""
        B, T = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_id, k, v)  # (B, n_kv_heads, S, hd), S >= T
        gqa = self.n_kv_heads != self.n_heads  # query head h reads kv head h // group, no copy
        if isinstance(mask, BlockMask):  # FlexAttention skips the fully masked blocks
            assert not (self.training and self.dropout), "FlexAttention has no dropout"
            y = _flex(q, k, v, mask, gqa)
        else:
            p = self.dropout if self.training else 0.0
            y = _sdpa(q, k, v, mask, dropout_p=p, is_causal=mask is None, enable_gqa=gqa)
        return y.transpose(1, 2).reshape(B, T, -1)  # (B, T, dim)


# PyTorch's CPU attention kernel multiplies bf16 through oneDNN's AMX tiles where the CPU has AMX;
# without AMX it is slower in bf16 than in fp32 (bench/README.md measures it), so there bf16
# attention runs in fp32.
_CPU_ATTENTION_FP32 = not getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


def _sdpa(q, k, v, mask, **kw):
    """F.scaled_dot_product_attention, bf16 on the CPU computed in fp32 where that is faster
    (above) and rounded back to bf16: the layers around it see bf16, as under autocast."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and _CPU_ATTENTION_FP32:
        with torch.autocast("cpu", enabled=False):  # autocast would cast fp32 back to bf16
            y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), mask, **kw)
        return y.to(torch.bfloat16)
    return F.scaled_dot_product_attention(q, k, v, mask, **kw)


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention)  # dynamic shapes after the first new length


def _flex(q, k, v, block_mask, enable_gqa):
    """flex_attention, compiled on CUDA. Eager it is a slow reference (forward only on CPU),
    which the CPU tests use to check the mask."""
    fn = _compiled_flex_attention() if q.is_cuda else flex_attention
    return fn(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


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

    def forward(self, x, cos, sin, layout, readout=None):  # (N, dim) -> (N, dim), or (M, dim)
        h = self.attention(self.attention_norm(x), cos, sin, layout, readout)
        x = x if readout is None else x[readout.index]
        x = x + self.drop(h)
        return x + self.drop(self.feed_forward(self.ffn_norm(x)))


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
        self.row_attention = None  # None: chosen per batch (hidden_states); True/False forces it
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("wo.weight", "w2.weight")):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens, attention_mask=None, kv_cache=None):
        """Logits (B, T, vocab_size)."""
        return self.output(self.hidden_states(tokens, attention_mask, kv_cache=kv_cache))

    def hidden_states(
        self,
        tokens,
        attention_mask=None,
        *,
        positions=None,
        visible=None,
        at=None,
        kv_cache=None,
        layers=None,
        states=None,
    ):
        """The forward: final normalised hidden states (B, T, dim), 0 at padding.

        tokens (B, T) ids. attention_mask (B, T): 1 at real tokens, padding on any side (with a
        kv_cache, (B, S) over the cached positions too). positions (B, T): RoPE positions, by
        default the number of real tokens before each one. visible (B, T, T) bool or a
        FlexAttention BlockMask: who reads whom, for packed rows; by default causal among a
        row's real tokens. at (B, k): columns whose states are wanted, returned as (B, k, dim);
        the last layer runs its queries and FFN there alone. Padding is never computed.
        layers=(first, stop) runs self.layers[first:stop] alone: with stop < n_layers the
        states come out before the final norm (what train_rm caches of frozen layers), and with
        first > 0 `states` (B, T, dim) are the input of layer `first` instead of the embeddings."""
        self.check_tokens(tokens)
        B, T = tokens.shape
        start = 0 if kv_cache is None else kv_cache.len
        first, stop = layers or (0, len(self.layers))
        real = None if attention_mask is None else attention_mask.to(tokens.device).bool()
        if positions is None:
            if start + T > self.config.max_seq_len:
                raise ValueError(
                    f"sequence length {start + T} exceeds max_seq_len {self.config.max_seq_len}"
                )
            if real is None:
                positions = torch.arange(start, start + T, device=tokens.device).expand(B, T)
            else:  # position = number of real tokens before this one
                positions = (real.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
        elif positions.numel() and positions.max() >= self.config.max_seq_len:
            # a packed row may be longer than max_seq_len; the positions in it may not
            raise ValueError(
                f"position {int(positions.max())} exceeds max_seq_len {self.config.max_seq_len}"
            )
        if (first > 0) != (states is not None) or (at is not None and stop < len(self.layers)):
            raise ValueError("states are the input of layers[first] > 0; at needs the last layer")
        per_row = self.row_attention
        if per_row is None:  # row by row on CPU where rows are long enough for it to pay
            per_row = not tokens.is_cuda and T > PADDED_UP_TO
        layout = make_layout(tokens, real, visible, kv_cache, per_row)  # below
        readout = None if at is None else make_readout(at, real, layout)
        cos, sin = self.rope(positions.flatten())  # (B * T, head_dim / 2) each
        flat = tokens.flatten()
        if layout.index is not None:  # the padding leaves the stream here, for every layer
            flat, cos, sin = flat[layout.index], cos[layout.index], sin[layout.index]
        x = self.tok_embeddings(flat) if states is None else layout.tokens(states)  # (N, dim)
        for i in range(first, stop):
            last = readout if i == len(self.layers) - 1 else None
            if self.gradient_checkpointing and self.training:
                x = checkpoint(self.layers[i], x, cos, sin, layout, last, use_reentrant=False)
            else:
                x = self.layers[i](x, cos, sin, layout, last)
        if kv_cache is not None:
            kv_cache.len += T
        if stop < len(self.layers):
            return layout.rows(x)  # (B, T, dim), not normalised: the next layer's input
        x = self.norm(x)
        return layout.rows(x) if at is None else x.view(*at.shape, -1)  # (B, T|k, dim)

    def rope(self, positions):
        """cos and sin (..., head_dim/2) of the RoPE angles position * inv_freq."""
        angles = positions[..., None].float() * self.inv_freq
        return angles.cos(), angles.sin()

    def check_tokens(self, tokens):
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, time), got shape {tuple(tokens.shape)}")
        V = self.config.vocab_size
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= V):
            bad = tokens[(tokens < 0) | (tokens >= V)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {V})")

    @torch.no_grad()
    def generate(
        self,
        tokens,
        max_new_tokens,
        temperature=0.0,
        top_k=None,
        attention_mask=None,
        use_cache=True,
        eos_id=None,
        pad_id=None,
    ):
        """Append up to max_new_tokens sampled tokens to tokens (B, T); temperature 0 is greedy.
        Batched prompts must be left-padded (new tokens go at the right end). With eos_id, a row
        stops at its first eos_id: every later column of it is pad_id (eos_id if None), and the
        loop ends once every row has stopped, as transformers' generate does; a row's answer is
        what comes before its first eos_id."""
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
        kv_cache = (
            KVCache(self.config, B, T + max_new_tokens, tokens.device, dtype) if use_cache else None
        )
        step_in = tokens
        stopped = torch.zeros(B, 1, dtype=torch.bool, device=tokens.device)
        for _ in range(max_new_tokens):
            if use_cache:  # feed only what the cache has not seen; the mask covers all of it
                logits = self(step_in, mask, kv_cache=kv_cache)[:, -1, :]
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
            if eos_id is not None:
                next_tok = next_tok.masked_fill(stopped, eos_id if pad_id is None else pad_id)
                stopped = stopped | (next_tok == eos_id)
            tokens = torch.cat((tokens, next_tok), dim=1)
            mask = torch.cat((mask, torch.ones_like(next_tok, dtype=torch.bool)), dim=1)
            step_in = next_tok
            if stopped.all():
                break
        return tokens


# ----------------------------------------------------------------------------- the layout
# Where the tokens of a batch sit when the forward above runs: the layers see a flat (N, dim)
# stream of the real tokens only (padding is never computed), and a Layout puts that stream back
# into rows for attention. A first reading can take this section as given: its one job is speed
# without a second copy of the layers.


@dataclass
class Layout:
    """Where the computed tokens of a (B, T) batch sit, and how attention runs over them."""

    B: int
    T: int
    index: torch.Tensor | None  # (N,) flat position b * T + t of each computed token; None: all
    lengths: list | None  # tokens per row when attention runs row by row, else None
    row_masks: list | None  # with lengths: each row's (1, 1, l, l) part of the mask; None causal
    mask: torch.Tensor | BlockMask | None  # (B, 1, T, S) bool or a BlockMask; None: causal
    kv_cache: object = None  # model.KVCache when generating

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


# Row by row, a row's attention costs l^2 and not T^2, but each row is an SDPA call of its own
# (and another in the backward). Up to 64 columns those calls cost a small model more than the
# padding's attention saves, and a wide one as much (bench/bench_layout.py).
PADDED_UP_TO = 64


def padding_mask(attention_mask, T):
    """(B, T, S) bool attention mask for the last T of S columns, attention_mask (B, S): query
    t may read key s when s <= t and s is a real token. A padding query reads itself too, so no
    row is fully masked (that gives NaN); its output is never used."""
    S = attention_mask.size(1)
    q = torch.arange(S - T, S, device=attention_mask.device)[:, None]  # (T, 1)
    k = torch.arange(S, device=attention_mask.device)[None, :]  # (1, S)
    return (k <= q) & attention_mask.bool()[:, None, :] | (k == q)


def make_layout(tokens, real, visible, kv_cache, per_row):
    """The Layout of a batch: padding (real False) leaves the stream; attention runs row by
    row over the real tokens when per_row (one SDPA call per row) and as one batched call on
    padded rows otherwise or with a kv_cache. real: (B, T) bool or None (no padding); visible:
    the caller's (B, T, T) bool or BlockMask, or None (causal)."""
    B, T = tokens.shape
    if kv_cache is not None:  # generation: every column computed, keys cached before it
        S = kv_cache.len + T
        real = torch.ones(B, S, dtype=torch.bool, device=tokens.device) if real is None else real
        return Layout(B, T, None, None, None, padding_mask(real, T)[:, None], kv_cache)
    if real is not None and real.all():
        real = None  # nothing to skip
    index = None if real is None else real.flatten().nonzero().squeeze(1)  # (N,)
    if real is not None and per_row and not isinstance(visible, BlockMask):
        masks = [None] * B if visible is None else visible
        masks = [
            None if m is None else m[r][:, r][None, None] for m, r in zip(masks, real, strict=True)
        ]
        full = None if visible is None else visible[:, None]  # for a readout's keys
        return Layout(B, T, index, real.sum(1).tolist(), masks, full)
    if visible is None and real is not None:
        visible = padding_mask(real, T)
    if isinstance(visible, torch.Tensor):
        visible = visible[:, None]  # (B, 1, T, T), broadcast over heads
    return Layout(B, T, index, None, None, visible)


def make_readout(at, real, layout):
    """The Readout of the columns at (B, k): their stream positions and key masks."""
    B, T, dev = layout.B, layout.T, at.device
    if layout.kv_cache is not None:
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
