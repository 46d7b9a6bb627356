"""
fp32 against bf16 on this machine's CPU: where `--dtype auto` should switch, and what bf16 buys.

    python bench/bench_dtype.py --steps_only --repeats 15 --pairs 16   # the rule's table (~2 min)
    python bench/bench_dtype.py --widths '' --skip_train --rows 8 --seq 256   # SmolLM2's parts
    python bench/bench_dtype.py --out section.md                      # everything

Each measurement times fp32 and bf16 in turns (fp32, bf16, fp32, bf16, ...), repeated, the
median kept, so that another job sharing the CPU slows both alike; the ratio within a run is the
figure to trust, the absolute rates move with the load:
  1. a square matmul's GFLOP/s, fp32 tensors against bf16 tensors: the limit bf16 can reach;
  2. a training step (forward and backward of RewardModel's pairwise loss, no optimizer) at
     each of --widths (train_rm's nano, tiny, small and medium shapes, SmolLM2's) and --threads:
     the table runtime.auto_dtype's rule (BF16_MIN_DIM) is read from, with what it picks;
  3. SmolLM2-135M-Instruct's forward (`hidden_states`, 30 layers, no gradient), rows/s;
  4. the frozen layers' cache build (nanorm/cache.build, SmolLM2's bottom 26 layers, packed
     helpful-base pairs): fp32, bf16 autocast casting fp32 weights at every batch, and bf16 with
     the weights held in bf16 (cache.bf16_weights), in GFLOP/s against the bf16 matmul rate;
  5. the trained step from the cache, as the HH recipe runs it (bench/recipes): SmolLM2's top 4
     layers and the head over the frozen layers' stored states, 8 packed helpful-base pairs,
     forward, backward and AdamW: fp32, bf16 autocast (attention in fp32 on a CPU without AMX,
     model._sdpa), and bf16 with the bf16 attention kernel, in GFLOP/s (torch's flop counter:
     every matmul and attention product, forward and backward) against the bf16 matmul rate;
  6. train_rm.py on SmolLM2, the top 2 layers trained, no cache, packed pairs of one HH subset:
     training tokens per second of `--dtype float32` against `--dtype bfloat16`.
The CPU is named (lscpu's model name, and the bf16 flags it has) with torch's version and threads.
Reads ../shared/data/smollm2/*.gguf and ../shared/data/hh-rlhf/helpful-base (prepared once into
--work); says so and skips a part whose files are absent.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanorm.base.runtime import BF16_CPU_FLAGS, auto_dtype, cpu_flags  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


def cpu_name():
    """lscpu's model name (the kernel's where lscpu is absent)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")


def interleaved(fns, repeats):
    """Median seconds of each fn, timed in turns (a, b, a, b, ...) after one untimed call each."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for t, fn in zip(times, fns, strict=True):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def bench_matmul(n, repeats):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a16, b16 = a.bfloat16(), b.bfloat16()
    t32, t16 = interleaved([lambda: a @ b, lambda: a16 @ b16], repeats)
    return 2 * n**3 / t32 / 1e9, 2 * n**3 / t16 / 1e9


def bench_forward(gguf, rows, seq, repeats):
    from nanorm.base.checkpoints import load_transformer

    model = load_transformer(gguf).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (rows, seq), generator=g)

    def run(ctx):
        with torch.no_grad(), ctx:
            return model.hidden_states(tokens)

    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    t32, t16 = interleaved([lambda: run(nullcontext()), lambda: run(bf16)], repeats)
    with torch.no_grad():
        h32, h16 = run(nullcontext()).float(), run(bf16).float()
    rel = ((h16 - h32).norm() / h32.norm()).item()  # how far bf16's states are from fp32's
    return rows / t32, rows / t16, rel


WIDTHS = {  # dim: (n_heads, n_kv_heads, hidden_dim); train_rm's MODELS (hidden rounded to 32), SmolLM2
    64: (4, 2, 192),  # nano, the default run's
    128: (4, 2, 352),  # tiny
    288: (6, 6, 768),  # small (stories15M)
    512: (8, 8, 1376),  # medium
    576: (9, 3, 1536),  # SmolLM2-135M
}


def step_config(dim, layers, seq):
    from model import ModelConfig

    heads, kv, hidden = WIDTHS[dim]
    return ModelConfig(
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv,
        hidden_dim=hidden,
        vocab_size=512,
        max_seq_len=seq,
    )


def bench_step(dim, layers, pairs, seq, repeats):
    """A training step's forward and backward (no optimizer) of a RewardModel of width dim on
    `pairs` random pairs of seq tokens at most (right-padded, lengths seq/2 to seq), fp32 against
    bf16 autocast, in turns: tokens/s of each."""
    from reward import RewardModel

    torch.manual_seed(0)
    rm = RewardModel.from_config(step_config(dim, layers, seq)).train()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 512, (2, pairs, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (2, pairs), generator=g)
    mask = (torch.arange(seq) < lengths[..., None]).long()
    n_tokens = int(mask.sum())

    def step(ctx):
        with ctx:
            loss, _ = rm.loss(tokens[0], mask[0], tokens[1], mask[1])
        loss.backward()
        rm.zero_grad(set_to_none=True)

    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    t32, t16 = interleaved([lambda: step(nullcontext()), lambda: step(bf16)], repeats)
    return n_tokens / t32, n_tokens / t16


def prepare_subset(gguf, work, max_train=64):
    d = os.path.join(work, f"hb{max_train}")
    if not os.path.exists(os.path.join(d, "meta.json")):
        src = os.path.join(SHARED, "hh-rlhf", "helpful-base", "test.jsonl.gz")
        cmd = [sys.executable, os.path.join(ROOT, "data", "hh_rlhf", "prepare.py"), "--src", src]
        cmd += ["--tokenizer", gguf, "--max_len", "288", "--max_train", str(max_train)]
        cmd += ["--out_dir", d]
        subprocess.run(cmd, check=True, capture_output=True)
    return d


def bench_cache_build(gguf, work, pairs, train_layers, repeats):
    """nanorm/cache.build of SmolLM2's frozen layers (all but the top train_layers) over `pairs`
    helpful-base pairs, packed: fp32, bf16 autocast casting the fp32 weights at every batch
    (cache.py before bf16_weights), and bf16 with the weights held in bf16 (cache.py now).
    Returns (packed tokens, GFLOP of the weight matmuls, [seconds of each])."""
    from torch import nn

    from data.pairs import PairDataset
    from nanorm import cache
    from nanorm.base.checkpoints import load_transformer

    model = load_transformer(gguf).eval()
    data = PairDataset(os.path.join(prepare_subset(gguf, work, pairs), "train.npz"))
    first = model.config.n_layers - train_layers
    bf16, quiet, hold = torch.autocast("cpu", dtype=torch.bfloat16), (lambda *a: None), []

    def run(ctx, held):
        folder = tempfile.mkdtemp(dir=work)
        hold.append(cache.bf16_weights)
        if not held:  # autocast alone, as before
            cache.bf16_weights = lambda layers, ctx: nullcontext()
        try:
            cache.build(model, data, "train", first, folder, 0, torch.float16, quiet, ctx)
        finally:
            cache.bf16_weights = hold.pop()
            shutil.rmtree(folder)

    fns = [lambda: run(None, False), lambda: run(bf16, False), lambda: run(bf16, True)]
    times = interleaved(fns, repeats)
    tokens = int(data.lengths(packed=True).sum())
    linear = sum(
        m.weight.numel() for m in model.layers[:first].modules() if isinstance(m, nn.Linear)
    )
    return tokens, 2 * tokens * linear / 1e9, times


def bench_cached_step(gguf, work, pairs, train_layers, repeats):
    """One training step of SmolLM2's top train_layers layers and head from the frozen layers'
    states (computed here once in fp32 and rounded to float16, as cache.py stores them), over
    `pairs` packed helpful-base pairs with AdamW: fp32, bf16 autocast as model.py runs it, and
    bf16 autocast with the bf16 attention kernel forced. Returns (real tokens, GFLOP of one
    step, [seconds of each])."""
    from torch.utils.flop_counter import FlopCounterMode

    import model as model_py
    import nanorm.build
    from data.pairs import PairDataset, packed_attention_mask
    from reward import RewardModel

    rm = RewardModel(gguf)
    nanorm.build.train_top_layers(rm, train_layers)
    first = len(rm.backbone.layers) - train_layers
    data = PairDataset(os.path.join(prepare_subset(gguf, work, max(64, pairs)), "train.npz"))
    b = data.collate_packed(list(range(pairs)), 0)
    with torch.no_grad():
        x = rm.backbone.hidden_states(
            b.tokens,
            b.segments >= 0,
            positions=b.positions,
            visible=packed_attention_mask(b.segments),
            layers=(0, first),
        )
    states = (first, x.half().float())  # what the cache gives the step
    row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
    opt = torch.optim.AdamW([p for p in rm.parameters() if p.requires_grad], lr=1e-12)
    bf16, fp32_attention = torch.autocast("cpu", dtype=torch.bfloat16), model_py._CPU_ATTENTION_FP32

    def step(ctx, attention_fp32=fp32_attention):
        model_py._CPU_ATTENTION_FP32 = attention_fp32
        try:
            with ctx:
                loss, _ = rm.loss_packed(*row, states=states)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        finally:
            model_py._CPU_ATTENTION_FP32 = fp32_attention

    with FlopCounterMode(display=False) as counter:
        step(nullcontext())
    fns = [lambda: step(nullcontext()), lambda: step(bf16), lambda: step(bf16, False)]
    times = interleaved(fns, repeats)
    return int((b.segments >= 0).sum()), counter.get_total_flops() / 1e9, times


def train_tok_s(gguf, data, dtype, steps, work):
    """Training tokens/s over the second half of a short train_rm.py run (the first half warms
    up), from its log; a fresh process each time, as a user runs it."""
    out = os.path.join(work, f"run-{dtype}")
    cmd = [sys.executable, os.path.join(ROOT, "train_rm.py"), "--init", gguf, "--dataset", data]
    cmd += ["--out_dir", out, "--overwrite", "--dtype", dtype, "--lm_coef", "0", "--pack"]
    cmd += ["--train_layers", "2", "--cache", "false", "--batch_size", "4"]
    cmd += ["--max_iters", str(2 * steps), "--log_interval", str(steps), "--warmup", "0"]
    cmd += ["--eval_first", "false", "--eval_pairs", "4", "--calibrate_length", "false"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    with open(os.path.join(out, "log.jsonl")) as f:
        rows = [json.loads(r) for r in f]
    return [r["tok_per_s"] for r in rows if r["split"] == "train"][-1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="timed turns of each dtype")
    p.add_argument("--n", type=int, default=1024, help="matmul size (n x n times n x n)")
    p.add_argument("--rows", type=int, default=4, help="rows per forward")
    p.add_argument("--seq", type=int, default=288, help="tokens per row")
    p.add_argument("--steps", type=int, default=4, help="timed train_rm steps per run")
    p.add_argument("--train_repeats", type=int, default=2, help="train_rm runs of each dtype")
    p.add_argument("--skip_train", action="store_true")
    p.add_argument(
        "--widths", default=",".join(map(str, WIDTHS)), help="training-step widths ('' skips)"
    )
    p.add_argument("--threads", default="1,2", help="thread counts of the training-step table")
    p.add_argument("--layers", type=int, default=2, help="layers of the training-step models")
    p.add_argument("--pairs", type=int, default=8, help="pairs per training step")
    p.add_argument("--step_seq", type=int, default=96, help="longest row of the training step")
    p.add_argument("--steps_only", action="store_true", help="matmul and training steps alone")
    p.add_argument("--cache_pairs", type=int, default=16, help="pairs of the cache build")
    p.add_argument("--step_pairs", type=int, default=8, help="pairs of the cached trained step")
    p.add_argument("--work", default=None, help="where the prepared pairs and runs go (a temp dir)")
    p.add_argument("--out", default=None, help="also write the markdown here")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench_dtype_")

    flags = sorted(BF16_CPU_FLAGS & cpu_flags()) or ["none of " + ", ".join(sorted(BF16_CPU_FLAGS))]
    head = (
        f"CPU: {cpu_name()} (bf16 flags: {', '.join(flags)}; torch capability "
        f"{torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; the hardware multiplies bf16 natively: "
        f"{'yes' if auto_dtype('cpu') == 'bfloat16' else 'no'}."
    )
    print(head, flush=True)
    lines = ["| measurement | fp32 | bf16 | bf16 / fp32 |", "|---|---|---|---|"]

    def row(name, a, b, unit):
        lines.append(f"| {name} | {a:.3g} {unit} | {b:.3g} {unit} | {b / a:.2f}x |")
        print(lines[-1], flush=True)

    g32, g16 = bench_matmul(args.n, args.repeats)
    row(f"matmul {args.n}x{args.n}", g32, g16, "GFLOP/s")
    if args.widths:
        step_table(args, lines)
    if args.steps_only:
        return finish(args, head, lines)
    gguf = sorted(glob.glob(os.path.join(SHARED, "smollm2", "*.gguf")))
    if not gguf:
        print(f"no SmolLM2 .gguf under {SHARED}/smollm2: the model parts are skipped")
    else:
        r32, r16, rel = bench_forward(gguf[0], args.rows, args.seq, args.repeats)
        row(f"SmolLM2-135M forward, rows of {args.seq} tokens (30 layers)", r32, r16, "rows/s")
        print(f"bf16 autocast's final states differ from fp32's by {rel:.2%} (relative norm)")
        if os.path.exists(os.path.join(SHARED, "hh-rlhf", "helpful-base")):
            cache_table(gguf[0], work, args, g16, lines)
            cached_step_table(gguf[0], work, args, g16, lines)
        have_hh = os.path.exists(os.path.join(SHARED, "hh-rlhf", "helpful-base"))
        if args.skip_train or not have_hh:
            print("train_rm.py part skipped" + ("" if have_hh else ": no HH-RLHF data"))
        else:
            data = prepare_subset(gguf[0], work)
            tok = {"float32": [], "bfloat16": []}
            for _ in range(args.train_repeats):  # interleaved, a fresh process each
                for dtype in tok:
                    tok[dtype].append(train_tok_s(gguf[0], data, dtype, args.steps, work))
            t32, t16 = (statistics.median(tok[d]) for d in tok)
            name = "train_rm.py, top 2 layers, no cache, 4 packed pairs/step"
            row(name, t32, t16, "tokens/s")
    finish(args, head, lines)


def step_table(args, lines):
    """The training step at each width and thread count: the table `--dtype auto`'s rule is
    read from, with what the rule picks for that shape."""
    threads0 = torch.get_num_threads()
    table = [
        "",
        f"Training step (forward + backward, no optimizer) of a {args.layers}-layer RewardModel, "
        f"{args.pairs} pairs of {args.step_seq // 2}-{args.step_seq} tokens, tokens/s:",
        "",
        "| dim | hidden | threads | fp32 | bf16 autocast | bf16 / fp32 | auto picks |",
        "|---|---|---|---|---|---|---|",
    ]
    print("\n".join(table), flush=True)
    for dim in [int(d) for d in args.widths.split(",")]:
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            a, b = bench_step(dim, args.layers, args.pairs, args.step_seq, args.repeats)
            pick = auto_dtype("cpu", step_config(dim, args.layers, args.step_seq))
            hidden = WIDTHS[dim][2]
            table.append(
                f"| {dim} | {hidden} | {threads} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x | {pick} |"
            )
            print(table[-1], flush=True)
    torch.set_num_threads(threads0)
    lines += table


def rate_table(title, kind, pairs, gflop, matmul16, timed):
    """Markdown rows of timed variants [(name, seconds)], fp32 first: seconds, pairs/s, GFLOP/s,
    their share of the bf16 matmul rate and the speed-up over fp32; printed, and returned."""
    t32 = timed[0][1]
    table = [
        "",
        title,
        "",
        f"| {kind} | seconds | pairs/s | GFLOP/s | of the bf16 matmul | vs fp32 |",
    ]
    table.append("|---|---|---|---|---|---|")
    for name, t in timed:
        rate = gflop / t
        table.append(
            f"| {name} | {t:.2f} | {pairs / t:.2f} | {rate:.0f} | {rate / matmul16:.0%} | "
            f"{t32 / t:.2f}x |"
        )
    print("\n".join(table), flush=True)
    return table


def cache_table(gguf, work, args, matmul16, lines):
    """The frozen layers' cache build three ways, with GFLOP/s against the bf16 matmul rate."""
    tokens, gflop, (t32, tcast, theld) = bench_cache_build(
        gguf, work, args.cache_pairs, 4, args.repeats
    )
    title = (
        f"Cache build (nanorm/cache.build), SmolLM2-135M's bottom 26 layers over {args.cache_pairs} "
        f"packed helpful-base pairs ({tokens:,} tokens, {gflop:.0f} GFLOP of weight matmuls), "
        f"median of {args.repeats}; GFLOP/s against this CPU's bf16 matmul ({matmul16:.0f} GFLOP/s, "
        f"{args.n}x{args.n}):"
    )
    timed = [
        ("fp32", t32),
        ("bf16 autocast, fp32 weights cast at every batch", tcast),
        ("bf16 autocast, weights held in bf16 (bf16_weights)", theld),
    ]
    lines += rate_table(title, "cache build", args.cache_pairs, gflop, matmul16, timed)


def cached_step_table(gguf, work, args, matmul16, lines):
    """The trained step from the cache three ways, with GFLOP/s against the bf16 matmul rate."""
    k, pairs = 4, args.step_pairs
    tokens, gflop, (t32, t16, t16_attn) = bench_cached_step(gguf, work, pairs, k, args.repeats)
    title = (
        f"Trained step from the cache (the HH recipe's): SmolLM2-135M's top {k} layers and the "
        f"head, {pairs} packed helpful-base pairs ({tokens:,} tokens, {gflop:.0f} GFLOP forward "
        f"and backward), AdamW, median of {args.repeats}; GFLOP/s against this CPU's bf16 "
        f"matmul ({matmul16:.0f} GFLOP/s):"
    )
    timed = [
        ("fp32", t32),
        ("bf16 autocast (model.py: attention in fp32 without AMX)", t16),
        ("bf16 autocast, attention in bf16", t16_attn),
    ]
    lines += rate_table(title, "trained step", pairs, gflop, matmul16, timed)


def finish(args, head, lines):
    text = head + "\n\n" + "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
