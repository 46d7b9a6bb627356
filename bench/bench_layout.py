"""
Row by row or padded: which attention layout the CPU forward should take, by row length.

    python bench/bench_layout.py                 # the table in bench/README.md (~3 min)
    python bench/bench_layout.py --low 0.75      # rows of more even lengths

`Transformer.hidden_states` (model.py) computes only the real tokens of a batch and, for
attention, either puts them back into padded (B, T) rows for one batched SDPA call, or runs one
SDPA call per row over its own l tokens (l^2 work, not T^2, but a call per row in the forward
and the backward). model.PADDED_UP_TO is the row length up to which a CPU takes padded rows.
For each model shape and T, B rows of lengths drawn from low * T to T (one of them T), forward
and backward of the hidden states in both layouts, in turns, the median of --repeats kept; the
figure is padded time over row-by-row time: below 1, padded is faster. One thread by default,
as the notebooks and tests train; the CPU is named.
"""

import argparse

import torch
from bench_dtype import cpu_name, interleaved  # bench/ is the script's folder; it adds the root

from model import PADDED_UP_TO, ModelConfig, Transformer

SHAPES = {  # train_rm's nano; a 288-wide model (stories15M's width); SmolLM2-135M's layer shape
    "nano 64d-4L": dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2),
    "288d-2L": dict(dim=288, n_layers=2, n_heads=6),
    "576d-2L": dict(dim=576, n_layers=2, n_heads=9, n_kv_heads=3, hidden_dim=1536),
}
LENGTHS = (16, 32, 64, 128, 256, 512)


def step(model, tokens, mask, per_row):
    model.row_attention = per_row
    model.hidden_states(tokens, mask).square().mean().backward()


def ratio(shape, T, low, repeats):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=512, max_seq_len=1024, **shape))
    B = max(4, min(64, 4096 // T))
    lengths = torch.randint(int(T * low), T + 1, (B,))
    lengths[0] = T
    mask = torch.arange(T)[None] < lengths[:, None]
    tokens = torch.randint(512, (B, T))
    row_by_row, padded = interleaved(
        [lambda: step(model, tokens, mask, True), lambda: step(model, tokens, mask, False)], repeats
    )
    return padded / row_by_row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--low", type=float, default=0.25, help="shortest row, a fraction of T")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{cpu_name()}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{torch.backends.cpu.get_cpu_capability()} kernels; rows of {args.low:g}T..T; "
          f"padded time / row-by-row time (model.PADDED_UP_TO = {PADDED_UP_TO})\n")  # fmt: skip
    print("| model | " + " | ".join(f"T = {T}" for T in LENGTHS) + " |")
    print("|---|" + "---|" * len(LENGTHS))
    for name, shape in SHAPES.items():
        cells = [f"{ratio(shape, T, args.low, args.repeats):.2f}" for T in LENGTHS]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
