"""
Solution to exercise 3: rotary position embeddings (RoPE).

LLaMA gives attention a sense of order by rotating queries and keys: the feature pair
(x[2i], x[2i+1]) of a token at position p is rotated by the angle p * freq_i. A query at
position m and a key at position n then have a dot product that depends only on m - n.

model.py computes the angles from positions it derives from the attention mask, and passes
their cosines and sines to `apply_rope`; you write `apply_rope`.

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex3
nanoRM's version is model.apply_rope, for comparison.
"""

import torch


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair of features of x by its angle.

    x: (B, T, H, D) queries or keys, H heads of even size D.
    cos, sin: (B, T, D // 2), cos[b, t, i] = cos(angle of pair i at token t); the same for all
    heads (broadcast them over H).
    Returns a tensor shaped and typed like x, where for every pair i = 0 .. D/2 - 1

        out[..., 2i]     = x[..., 2i] * cos_i - x[..., 2i + 1] * sin_i
        out[..., 2i + 1] = x[..., 2i] * sin_i + x[..., 2i + 1] * cos_i

    (the pairs are ADJACENT features, as in Meta's reference code and llama2.c).
    Hint: x[..., 0::2] and x[..., 1::2] are the even and odd features; torch.stack(..., dim=-1)
    followed by .flatten(-2) interleaves two tensors again.
    """
    x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()  # (B, T, H, D/2) even, odd features
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (B, T, 1, D/2): the same for every head
    out0 = x0 * cos - x1 * sin
    out1 = x0 * sin + x1 * cos
    return torch.stack((out0, out1), dim=-1).flatten(-2).type_as(x)  # interleave again
