"""
Solution to exercise 1: last-real-token pooling.

A reward model turns a whole sequence into one number: the value head reads the hidden state of
the sequence's last real token (the EOS that data/pairs.py appends to every response). Batches
are padded, on the right (training batches) or on the left (prompts for generation), so "the last
real token" has to be found from the attention mask, never from the column index and never by
searching for a pad id (LLaMA pads with EOS, so a search for it finds the wrong token).

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex1
nanoRM's version is reward.last_real_index, for comparison.
"""

import torch


def last_real_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token.

    attention_mask: (B, T) tensor of 0/1 (long or bool), 1 on real tokens. Each row is padded on
    the left, on the right, or not at all, and has at least one real token.
    Returns a (B,) integer tensor: for each row b, the largest t with attention_mask[b, t] == 1.

        [[1, 1, 1, 0, 0],      right padding -> 2
         [0, 0, 1, 1, 1],      left padding  -> 4
         [1, 1, 1, 1, 1]]      no padding    -> 4

    Hint: torch.arange(T) gives every column's index; no Python loop over the batch is needed.
    """
    t = torch.arange(attention_mask.size(1), device=attention_mask.device)  # (T,) column index
    # zero out padding columns, then the largest remaining index is the last real token
    return (t * attention_mask.long()).max(dim=-1).values
