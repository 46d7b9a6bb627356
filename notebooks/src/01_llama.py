# %% [markdown]
# # 01 · The LLaMA of `model.py`, piece by piece
#
# Every nanoRM head (the reward model, the critic) sits on one small LLaMA, written out in
# [`model.py`](../model.py). This notebook takes it apart:
#
# 1. **RMSNorm**, the normalisation;
# 2. **RoPE**, how attention learns where tokens are;
# 3. **grouped-query attention**, fewer key/value heads than query heads;
# 4. **SwiGLU**, the gated feed-forward layer;
# 5. the real **stories260K** checkpoint (a 260k-parameter LLaMA trained by llama2.c on
#    TinyStories), loaded from `../shared/data` and telling a story;
# 6. **padding**: the attention mask of a left-padded batch, and why positions must come from
#    the mask. This last one is the detail a reward model depends on.
#
# Everything is imported from the project's files; nothing is re-implemented here. It runs in
# seconds on a laptop CPU.
#
# **The printed outputs** stored with this notebook are one machine's run: a 2-core AMD EPYC
# without AVX-512 (PyTorch's AVX2 kernels). On another CPU the digits differ (PyTorch and MKL
# pick other kernels there, which add floats in another order, and a training run drifts from
# that), while the claims the text makes hold: `tests/test_notebooks.py` checks each of them on
# a fresh run.

# %% tags=["shared-data"]
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the project root: model.py, reward.py, data/, ...

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from nanorm.base.checkpoints import load_transformer
from data.tokenizer import load_tokenizer
from model import padding_mask
from model import (
    Attention,
    FeedForward,
    ModelConfig,
    RMSNorm,
    Transformer,
    apply_rope,
    rope_frequencies,
)

plt.rcParams.update({"figure.dpi": 72, "savefig.dpi": 72, "font.size": 9})
torch.manual_seed(0)
torch.set_num_threads(1)  # these models are tiny: one thread is as fast, and kind to a shared CPU

# ../shared/data holds the real data sets; NANORM_DATA=none runs the small fallbacks instead
DATA = os.environ.get("NANORM_DATA", os.path.join("..", "..", "shared", "data"))
STORIES = os.path.join(DATA, "llama2c", "stories260K")
HAVE_STORIES = os.path.exists(os.path.join(STORIES, "stories260K.bin"))
print("stories260K:", STORIES if HAVE_STORIES else "not found; sections 5 and 6 use a random model")

# %% [markdown]
# ## 1. RMSNorm
#
# LayerNorm subtracts the mean of a vector and divides by its standard deviation. LLaMA's
# RMSNorm skips the mean: it divides by the root mean square and multiplies by a learned gain
# $w$ (no bias):
#
# $$\mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\tfrac{1}{d}\sum_i x_i^2 + \epsilon}} \odot w$$
#
# One statistic instead of two. `model.RMSNorm` computes it in float32 even when the model runs
# in bfloat16, because a mean of squares in 8 mantissa bits loses too much.

# %%
x = 3 * torch.randn(4, 16) + 1.0  # 4 vectors of width 16: mean about 1, scale about 3
norm = RMSNorm(16, eps=1e-5)  # its weight starts at ones
with torch.no_grad():
    y = norm(x)
rms = lambda t: t.pow(2).mean(-1).sqrt()
print("RMS before:      ", rms(x).numpy().round(2))
print("RMS after:       ", rms(y).numpy().round(3))
print("mean after:      ", y.mean(-1).numpy().round(2), " <- RMSNorm does not center")
print("LayerNorm's mean:", F.layer_norm(x, (16,)).mean(-1).numpy().round(3))

# %% [markdown]
# ## 2. RoPE: rotary position embeddings
#
# Attention on its own is blind to order. LLaMA rotates every query and key: the feature pair
# $(x_{2i}, x_{2i+1})$ of the token at position $p$ is turned by the angle $p\,\theta_i$, with
# $\theta_i = 10000^{-2i/d}$. The first pairs spin fast (fine position), the last ones slowly
# (coarse position). Rotations compose, so the score of a query at $m$ and a key at $n$ depends
# only on $m - n$: attention sees **relative** positions. `rope_frequencies` gives the
# $\theta_i$, `apply_rope` does the rotation (exercise 3 asks you to write it).

# %%
cfg = ModelConfig(dim=64, n_heads=4)  # head_dim 16: 8 rotating pairs
inv_freq = rope_frequencies(cfg)
print(f"head_dim {cfg.head_dim} -> theta_i = {inv_freq.numpy().round(4)}")


def rotate(x, p):
    """x (1, 1, 1, head_dim) as a token at position p, rotated by the model's apply_rope."""
    angles = (p * inv_freq).view(1, 1, -1)  # (B, T, head_dim/2)
    return apply_rope(x, angles.cos(), angles.sin())


q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
score = lambda m, n: (rotate(q, m) * rotate(k, n)).sum().item()
d = range(40)
fig, ax = plt.subplots(1, 2, figsize=(10, 3))
angles = torch.arange(64)[:, None] * inv_freq  # (position, pair)
ax[0].imshow(angles.cos().T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
ax[0].set(xlabel="position p", ylabel="pair i", title=r"cos(p $\theta_i$): fast pairs on top")
for start, style in ((0, "-"), (10, "--"), (50, ":")):
    ax[1].plot(d, [score(start + j, start) for j in d], style, lw=2, label=f"key at {start}")
ax[1].set(xlabel="distance m - n", ylabel="q . k after RoPE", title="the score depends on m - n only")
ax[1].legend()
fig.tight_layout()

# %% [markdown]
# The three curves are one: moving both tokens by 10 or 50 positions changes nothing.
#
# ## 3. Grouped-query attention
#
# In multi-head attention every query head has its own key and value head. Grouped-query
# attention (Llama 2 70B, Llama 3, and stories260K) lets a group of query heads share one
# key/value head: `n_kv_heads < n_heads`. The KV cache that generation keeps shrinks by the
# group size, at almost no cost in quality. Query head `h` reads key/value head
# `h // (n_heads // n_kv_heads)`.

# %%
cfg = ModelConfig(dim=64, n_heads=8, n_kv_heads=4)  # stories260K's shape
attn = Attention(cfg, layer_id=0)
for name in ("wq", "wk", "wv", "wo"):
    print(f"{name}: {tuple(getattr(attn, name).weight.shape)}  (out, in)")
group = cfg.n_heads // cfg.n_kv_heads
print("query head -> key/value head:", {h: h // group for h in range(cfg.n_heads)})

# GQA is plain attention with each key/value head repeated for its group of query heads;
# model.py asks SDPA for enable_gqa=True, which gives the same result without the copies
B, T = 1, 6
x = torch.randn(B, T, cfg.dim)
with torch.no_grad():
    q = attn.wq(x).view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
    k = attn.wk(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    v = attn.wv(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    gqa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = lambda t: t.repeat_interleave(group, dim=1)
    mha = F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)
print("enable_gqa == repeated key/value heads:", torch.allclose(gqa, mha, atol=1e-6))
cache_kib = lambda n_kv: 2 * 5 * n_kv * cfg.head_dim * 512 * 4 / 1024  # K and V, 5 layers, fp32
print(f"KV cache for 512 tokens: {cache_kib(8):.0f} KiB with 8 kv heads, {cache_kib(4):.0f} KiB with 4")

# %% [markdown]
# ## 4. SwiGLU feed-forward
#
# LLaMA's feed-forward layer has three matrices: $w_2\,(\mathrm{silu}(w_1 x) \odot w_3 x)$. The
# gate $\mathrm{silu}(w_1 x)$ decides, per hidden unit, how much of the "up" projection
# $w_3 x$ passes. To keep the parameter count of a plain two-matrix MLP of width $4d$, Meta
# shrinks the width to $\tfrac23 \cdot 4d$ and rounds it up to `multiple_of`.

# %%
ff = FeedForward(cfg)
print(f"dim {cfg.dim}: 2/3 * 4 * {cfg.dim} = {2 * 4 * cfg.dim // 3}, "
      f"rounded up to a multiple of {cfg.multiple_of}: hidden_dim = {cfg.hidden_dim}")
x = torch.randn(3, cfg.dim)
with torch.no_grad():
    print("FeedForward(x) == w2(silu(w1 x) * w3 x):",
          torch.allclose(ff(x), ff.w2(F.silu(ff.w1(x)) * ff.w3(x))))
z = torch.linspace(-5, 5, 200)
fig, ax = plt.subplots(figsize=(4.5, 2.5))
ax.plot(z, F.relu(z), label="ReLU")
ax.plot(z, F.silu(z), label="SiLU(z) = z sigmoid(z)")
ax.set(title="the gate's nonlinearity: smooth, slightly negative")
ax.legend()
ax.grid(alpha=0.3)

# %% [markdown]
# ## 5. The real thing: stories260K
#
# [llama2.c](https://github.com/karpathy/llama2.c)'s smallest model: 5 layers, `dim` 64,
# 8 query heads sharing 4 key/value heads, a 512-token vocabulary. `load_transformer`
# (checkpoints.py) reads its `.bin` file (the weights are views into the file, not copies) and
# `load_tokenizer` reads `tok512.bin`.

# %% tags=["shared-data"]
if HAVE_STORIES:
    model = load_transformer(os.path.join(STORIES, "stories260K.bin"))
    tok = load_tokenizer(os.path.join(STORIES, "tok512.bin"))
    encode, decode, PAD = tok.encode, tok.decode, tok.pad_id
else:  # same shape, random weights; byte tokens 3..258 stand in for the vocabulary
    print("stories260K not found: a random model of the same shape (it will babble)")
    model = Transformer(ModelConfig(dim=64, n_layers=5, n_heads=8, n_kv_heads=4, vocab_size=512,
                                    hidden_dim=172, max_seq_len=512, tie_embeddings=True)).eval()
    encode = lambda s, bos=False: [1] * bos + [3 + b for b in s.encode()]
    decode = lambda ids: "".join(chr(i - 3) if 3 <= i < 259 else "" for i in ids)
    PAD = 2
print(model.config)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")

# %% tags=["shared-data"]
prompt = "Once upon a time, there was a little dog"
ids = torch.tensor([encode(prompt, bos=True)])
greedy = model.generate(ids, max_new_tokens=80, temperature=0.0)  # KV cache, argmax
print("greedy:\n", decode(greedy[0].tolist()))
torch.manual_seed(42)
sampled = model.generate(ids, max_new_tokens=80, temperature=0.8, top_k=40)
print("\nsampled (temperature 0.8, top_k 40):\n", decode(sampled[0].tolist()))

# %% [markdown]
# ## 6. Padding, the attention mask, and positions
#
# A batch must be rectangular, so shorter sequences are padded. Generation pads on the
# **left** (new tokens are appended on the right); reward-model training batches pad on the
# right. A padded sequence is computed exactly as it would be alone when
#
# 1. no real token attends to padding: the attention mask hides padding keys, on top of the
#    causal mask; and
# 2. RoPE positions count **real tokens**, not columns. With left padding the first real token
#    may sit in column 10, yet it is at position 0 (below we see when this matters).
#
# `Transformer.hidden_states` derives both from `attention_mask`:
# `positions = cumsum(mask) - 1`, and query `t` may read key `s` when `s <= t` and `s` is
# real. A padding query may read only itself, so that no row of the softmax is empty (an empty
# row gives NaN); its output is never used. Here is that mask for a left-padded batch:

# %% tags=["shared-data"]
prompts = ["The cat sat", "Tim and his sister Lily went to the park"]
seqs = [encode(p, bos=True) for p in prompts]
T = max(len(s) for s in seqs)
tokens = torch.tensor([[PAD] * (T - len(s)) + s for s in seqs])  # left padding
mask = torch.tensor([[0] * (T - len(s)) + [1] * len(s) for s in seqs])
positions = (mask.cumsum(-1) - 1).clamp(min=0)  # real tokens before this one
t = torch.arange(T)
allowed = (t[None, :] <= t[:, None]) & mask[:, None, :].bool()  # (B, query, key)
allowed |= torch.eye(T, dtype=torch.bool)  # a padding query sees itself
print("mask:\n", mask, "\npositions from the mask:\n", positions, "\ncolumn index:", t.tolist())

label = lambda i, m: (decode([i]).strip() or "<s>") if m else "pad"
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for b, ax in enumerate(axes):
    ax.imshow(allowed[b], cmap="Blues", vmin=0, vmax=1.3)
    names = [label(i, m) for i, m in zip(tokens[b].tolist(), mask[b].tolist())]
    ax.set_xticks(range(T), names, rotation=90)
    ax.set_yticks(range(T), [f"{n}  p={p}" if m else n for n, p, m in
                             zip(names, positions[b].tolist(), mask[b].tolist())])
    ax.set(xlabel="key", ylabel="query (with its RoPE position)", title=f"row {b}: {prompts[b]!r}")
fig.suptitle("blue: query may attend to key (causal, real keys only)")
fig.tight_layout()

# the model builds exactly this mask: handing it over explicitly changes nothing
with torch.no_grad():
    logits = model(tokens, mask)
    given = model.output(model.hidden_states(tokens, mask, positions=positions, visible=allowed))
    print("model(tokens, mask) == the same forward given positions and mask explicitly:",
          torch.allclose(logits, given, atol=1e-5))

# %% [markdown]
# Now the test that matters: is each prompt computed inside the padded batch exactly as it is
# alone? We let the batch generate 20 tokens, then score the whole text (prompt and new tokens)
# three ways against the same text run alone, without padding. `hidden_states` takes explicit
# `positions` (by default it derives them from the mask), so we can try other numberings:
#
# * **from the mask**, what `model.py` does;
# * **column index** (0, 1, 2, ... in every row), the naive default;
# * **mixed**: the prompt numbered from the mask, the new tokens by column. This is what a
#   KV cache that numbers each new token by its own length does after a prefill that used the
#   mask: the two conventions meet in one sequence.

# %% tags=["shared-data"]
N = 20
out = model.generate(tokens, N, attention_mask=mask)  # (B, T + N), left-padded batch generation
full = torch.cat([mask, torch.ones(len(seqs), N, dtype=mask.dtype)], dim=1)
cols = torch.arange(T + N).expand(len(seqs), -1)
from_mask = (full.cumsum(-1) - 1).clamp(min=0)
numberings = {
    "from the mask": from_mask,
    "column index": cols,
    "mixed": torch.where(cols < T, from_mask, cols),
}
diffs = {}
with torch.no_grad():
    for name, pos in numberings.items():
        allowed = padding_mask(full, T + N)
        batched = model.output(model.hidden_states(out, positions=pos, visible=allowed))
        for b, s in enumerate(seqs):
            real = out[b, T - len(s):]  # row b without its padding
            alone = model(real[None])[0]  # positions 0, 1, 2, ...: no padding at all
            diffs[name, b] = (batched[b, T - len(s):] - alone).abs().amax(-1)  # per token
# below 1e-3 is float rounding (its size depends on the CPU's kernels)
size = lambda d: f"{d:.1e}" if d >= 1e-3 else "< 1e-3 (rounding)"
for b, s in enumerate(seqs):
    print(f"row {b} ({T - len(s)} padding), max |logit difference| vs. alone: " + ", ".join(
        f"{name} {size(diffs[name, b].max())}" for name in numberings))
    print(f"   generated: {decode(out[b, T:].tolist())!r}; the same as generating it alone: "
          f"{torch.equal(out[b, T:], model.generate(torch.tensor([s]), N)[0, len(s):])}")

fig, ax = plt.subplots(figsize=(7, 2.8))
b = 0  # the padded row
for (name, style) in zip(numberings, ("o-", "s--", "^-")):
    ax.semilogy(diffs[name, b].clamp(min=1e-9), style, ms=3, label=name)
ax.axvline(len(seqs[b]) - 0.5, color="gray", lw=0.8)
ax.text(len(seqs[b]), 1e-2, " generated tokens", color="gray")
ax.set(xlabel=f"token of row {b}", ylabel="max |logit difference|",
       title=f"row {b} in the padded batch vs. alone")
ax.legend(loc="center left")
fig.tight_layout()

# %% [markdown]
# What the picture says:
#
# * **From the mask**, the padded row matches the unpadded run to float rounding (below 1e-3;
#   its size depends on the CPU's kernels), prompt and generated tokens alike, and batched
#   generation picks the same tokens.
# * **Column index** is just as good *here*: it shifts every position of the row by the same
#   amount, and RoPE scores depend only on distances (section 2). The shift is invisible up to
#   rounding, which grows with the offset and with low precision (bf16). With learned absolute
#   positions (GPT-2) it would not be invisible at all.
# * **Mixed** numbering breaks the generated tokens: the distance from each new token back to
#   its prompt is off by the amount of padding, so the model reads its own prompt "too far
#   away". The prompt's tokens are unaffected, because they never look forward.
#
# So the rule that matters is *one* numbering, derived from the mask, everywhere: in the
# prefill, in every cached decode step, and when the reward model or critic later scores the
# same text in a differently padded batch. Then a reward depends on the text alone, never on
# what else was in the batch.
#
# **Next:** [02_reward_model.ipynb](02_reward_model.ipynb) puts a scalar head on this backbone.
# **Exercise:** `exercises/ex3_rope.py` (write `apply_rope`).
