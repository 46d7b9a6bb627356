"""
Speed of a reward-model training step: nanoRM against Hugging Face transformers, and nanoRM's
own speed paths (shared-prompt packing, length bucketing), on HH-RLHF pairs.

    python bench/bench_train.py --threads 1          # CPU, everything (~15 minutes, see bench/README.md)
    python bench/bench_train.py --quick --threads 1  # one small config, few steps (~1 minute)
    python bench/bench_train.py --only hf,memory     # any of: padding, hf, pack, readout, memory
    python bench/bench_train.py --device cuda        # bf16 autocast, fused AdamW, peak memory, MFU
    python bench/bench_train.py --only hf --dtype bfloat16 --threads 1   # CPU, both in bf16
    python bench/bench_train.py --device cuda --compile --out bench/cuda.md

What is compared, in one process, the two contenders alternating step by step (AB, BA, AB...),
so that a slow moment of a shared machine hits both; we report medians of per-step ratios:

  hf      nanoRM RewardModel.forward_pair against HF LlamaForSequenceClassification(num_labels=1)
          with TRL's RewardTrainer loss: chosen and rejected concatenated into one forward,
          loss = -logsigmoid(r_chosen - r_rejected).mean(). Same config, same weights (ours
          copied into HF's layout), same right-padded batches, same AdamW. The first-step
          losses must agree to 1e-5, or the run stops. nanoRM packed (below) races in the
          same run: the trainer's --pack against HF on the same pairs.
  pack    nanoRM plain (prompt + chosen, prompt + rejected) against nanoRM packed
          ([prompt | chosen | rejected], the prompt once); the losses must agree to 1e-5.
  readout nanoRM with the last layer at the reward token only (hidden_states' `at`, the
          default) against the same model running its last layer on every token.
  padding the padding fraction of a whole epoch, random order (train_rm's) against
          data.pairs.bucketed_order, for the plain and the packed layouts.
  memory  the peak memory a training step adds (activations, gradients, optimizer state): on
          CPU, peak RSS minus RSS before the first step, in a fresh subprocess per contender;
          on CUDA, torch.cuda.max_memory_allocated minus the memory allocated before the step.

Tokens per second count useful tokens only: the real tokens of the two plain sequences of each
pair (the prompt twice), the same unit for every contender, padding excluded. The pairs are the
helpful-base and harmless-base test splits in ../shared/data/hh-rlhf, tokenized with LLaMA-2's
32k vocabulary, each pair cut to --seq_len as data/pairs.encode_pair does. Pad id 0 (<unk>,
never in the text): HF finds the last real token by comparing with the pad id, so pad = EOS
would make it read the wrong token (we read the attention mask).
"""

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data.pairs import PairDataset, bucketed_order, encode_pair, write_pairs  # noqa: I001
from data.rows import read_pairs
from data.tokenizer import load_tokenizer
from model import ModelConfig
from reward import RewardModel, flex_pays, pad_and_concat, pairwise_loss, score_last_token
from nanorm.base.runtime import estimate_mfu

SHARED = ROOT.parent / "shared" / "data"
HH = [SHARED / "hh-rlhf" / s / "test.jsonl.gz" for s in ("helpful-base", "harmless-base")]
TOKENIZER = SHARED / "llama2c" / "tokenizer.model"
FLEX = True  # packed rows on CUDA: FlexAttention (--no_flex: SDPA with a dense mask)
PAD = 0  # <unk>: never produced by the tokenizer, so HF's pad-id pooling finds the EOS
CONFIGS = {  # llama2.c's stories15M shape, and a wider, deeper one (train_rm's small, medium)
    "288d-6L": dict(dim=288, n_layers=6, n_heads=6),
    "512d-8L": dict(dim=512, n_layers=8, n_heads=8),
}


# ----------------------------------------------------------------------------- data
def load_pairs(seq_len, cache_dir):
    """HH-RLHF test pairs tokenized and cut to seq_len, as a PairDataset (cached as .npz)."""
    path = Path(cache_dir) / f"hh_llama2_{seq_len}.npz"
    if not path.exists():
        missing = [p for p in (*HH, TOKENIZER) if not p.exists()]
        if missing:
            sys.exit(f"missing {missing[0]}: this benchmark needs the shared data in {SHARED}")
        tok = load_tokenizer(TOKENIZER)
        encoded = []
        for src in HH:
            with contextlib.redirect_stdout(io.StringIO()):  # read_pairs prints skipped rows
                pairs, _ = read_pairs(src, strict=False)
            encoded += [encode_pair(tok, pair, seq_len)[:3] for pair in pairs]
        write_pairs(path, encoded, tok.vocab_size)
    data = PairDataset(path)
    assert (data.tokens != PAD).all(), "pad id 0 occurs in the text"
    return data


def epoch_batches(data, batch_size, seed, bucket=False, packed=False):
    """Index lists of one epoch (last partial batch dropped): train_rm's random order, or
    bucketed by the length of the layout that will be used."""
    if bucket:
        order = bucketed_order(data.lengths(packed), batch_size, seed)
    else:
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    n = len(data) // batch_size * batch_size
    return [order[i : i + batch_size].tolist() for i in range(0, n, batch_size)]


def padding_fraction(batches, packed):
    """Fraction of the computed (B, T) slots that are padding."""
    if packed:
        return 1 - sum(b.n_packed for b in batches) / sum(b.tokens.numel() for b in batches)
    return 1 - sum(b.n_tokens for b in batches) / sum(2 * b.chosen.numel() for b in batches)


# ----------------------------------------------------------------------------- the contenders
def make_nanorm(config, seq_len, seed=0):
    """A RewardModel, set up for training as train_rm sets it up."""
    torch.manual_seed(seed)
    cfg = ModelConfig(**CONFIGS[config], vocab_size=32000, multiple_of=32, max_seq_len=seq_len)
    rm = RewardModel.from_config(cfg).train()
    rm.backbone.output.weight.requires_grad_(False)  # the LM head: never run by a reward model
    rm.head.bias.requires_grad_(False)  # a pairwise loss cannot train it (train_rm.py)
    return rm


def nanorm_contender(args, name, config, seq_len, data):
    """A fresh make_nanorm (seed 0: every contender starts from the same weights) that races
    as `name`: "nanoRM", "nanoRM packed" or "nanoRM full last layer"."""
    rm = make_nanorm(config, seq_len).to(args.device)
    return Contender(name, rm, data, args.device, args.ctx, args.compile)


def hf_twin(rm):
    """HF LlamaForSequenceClassification with rm's config and weights (fp32, sdpa attention)."""
    import transformers

    cfg = rm.backbone.config
    hc = transformers.LlamaConfig(
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        num_labels=1,
        use_cache=False,
        attn_implementation="sdpa",  # HF's default
    )
    hf = transformers.LlamaForSequenceClassification(hc).train()

    def to_hf_rope(w, n_heads):
        # HF's rotate-half RoPE pairs dims (i, i + Q/2) where ours pairs (2i, 2i + 1): per head,
        # put the even rows first, then the odd ones (model.py's _unpermute undoes this)
        Q = cfg.head_dim
        return w.view(n_heads, Q // 2, 2, -1).transpose(1, 2).reshape(n_heads * Q, -1)

    b = rm.backbone
    sd = {
        "model.embed_tokens.weight": b.tok_embeddings.weight,
        "model.norm.weight": b.norm.weight,
        "score.weight": rm.head.weight,  # our head's bias is 0 and frozen, HF has none
    }
    for i, layer in enumerate(b.layers):
        a, f, p = layer.attention, layer.feed_forward, f"model.layers.{i}."
        sd |= {
            p + "self_attn.q_proj.weight": to_hf_rope(a.wq.weight, cfg.n_heads),
            p + "self_attn.k_proj.weight": to_hf_rope(a.wk.weight, cfg.n_kv_heads),
            p + "self_attn.v_proj.weight": a.wv.weight,
            p + "self_attn.o_proj.weight": a.wo.weight,
            p + "mlp.gate_proj.weight": f.w1.weight,
            p + "mlp.down_proj.weight": f.w2.weight,
            p + "mlp.up_proj.weight": f.w3.weight,
            p + "input_layernorm.weight": layer.attention_norm.weight,
            p + "post_attention_layernorm.weight": layer.ffn_norm.weight,
        }
    hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=True)
    return hf


def adamw(model):
    """The optimizer of both contenders: train_rm's AdamW, fused (one kernel for all tensors;
    CPU and CUDA), as HF's Trainer defaults to with recent torch."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=True)


class Contender:
    """A model, its optimizer, and how it turns the indices of a batch into a loss."""

    def __init__(self, name, model, data, device, ctx, compile=False):
        self.name, self.model, self.data, self.device, self.ctx = name, model, data, device, ctx
        self.optimizer = adamw(model)
        self.rewards = {
            "nanoRM": self.plain,
            "HF": self.hf,
            "nanoRM packed": self.packed,
            "nanoRM full last layer": self.full_last_layer,
        }[name]
        if compile:
            self.rewards = torch.compile(self.rewards)
        self.times, self.tokens, self.losses, self.peaks = [], [], [], []

    def batch(self, indices):
        if self.name == "nanoRM packed":
            return self.data.collate_packed(indices, PAD).to(self.device)
        return self.data.collate(indices, PAD).to(self.device)

    def plain(self, b):
        return self.model.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)

    def packed(self, b):
        flex = flex_pays(b.tokens) and FLEX  # FlexAttention skips masked blocks
        args = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
        return self.model.forward_pair_packed(*args, flex=flex)

    def full_last_layer(self, b):
        """forward_pair without hidden_states' `at`: the last layer runs on every token."""
        tokens, mask = pad_and_concat(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
        r = score_last_token(self.model.head, self.model.backbone.hidden_states(tokens, mask), mask)
        return r[: len(b.chosen)], r[len(b.chosen) :]

    def hf(self, b):
        # TRL's RewardTrainer: one forward on the chosen rows followed by the rejected rows
        ids = torch.cat([b.chosen, b.rejected])  # (2B, T)
        mask = torch.cat([b.chosen_mask, b.rejected_mask])
        r = self.model(input_ids=ids, attention_mask=mask).logits.squeeze(-1)  # (2B,)
        return r[: len(b.chosen)], r[len(b.chosen) :]

    def step(self, b):
        """One training step; returns the loss."""
        with self.ctx:
            r_c, r_r = self.rewards(b)
        loss = pairwise_loss("logsig", r_c.float(), r_r.float())  # -logsigmoid(r_c - r_r).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()  # .item() waits for the device


def race(contenders, index_batches, warmup=1):
    """Alternate the contenders step by step on the same pairs; keep times after warmup."""
    cuda = contenders[0].device.startswith("cuda")
    for k, indices in enumerate(index_batches):
        for c in contenders if k % 2 == 0 else contenders[::-1]:  # AB, BA, AB, ...
            b = c.batch(indices)  # collation is data loading: not timed
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            loss = c.step(b)
            dt = time.perf_counter() - t0
            c.losses.append(loss)
            if cuda:
                c.peaks.append((torch.cuda.max_memory_allocated() - before) / 2**20)
            if k >= warmup:
                c.times.append(dt)
                c.tokens.append(b.n_tokens)
        if k == 0:  # the same weights, the same pairs: the same loss, or the race is void
            diff = max(abs(c.losses[0] - contenders[0].losses[0]) for c in contenders)
            # fp32: summation order alone; bf16 autocast rounds each product to 8 bits, and two
            # implementations round in different places: a few per cent of the loss
            bf16 = isinstance(contenders[0].ctx, torch.autocast)
            bound = 0.03 * abs(contenders[0].losses[0]) if bf16 else 1e-5
            if diff > bound:
                raise RuntimeError(f"first-step losses differ by {diff:.2e}: not the same model")


def work_ratio(cfg, batches):
    """HF's matmul work over nanoRM's on these right-padded batches: the most that skipping
    padding and unread tokens can give at equal kernels. HF runs every layer on all 2B x T
    slots; nanoRM runs the layers on the N real tokens, and the last layer's queries, attention
    output and FFN at the 2B reward tokens alone (its keys and values at all N). Counted in
    multiply-adds of the weight matrices per token; attention scores, norms and the optimizer
    are left out (they are 20-30% of a CPU step, and the first two shrink in about the same
    proportion)."""
    d, kv, L = cfg.dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_layers
    layer = 2 * d * d + 2 * d * kv + 3 * d * cfg.hidden_dim  # wq, wo; wk, wv; w1, w2, w3
    hf = ours = 0
    for b in batches:
        slots, N, M = 2 * b.chosen.numel(), b.n_tokens, 2 * len(b.chosen)
        hf += L * slots * layer
        ours += (L - 1) * N * layer + N * 2 * d * kv + M * (layer - 2 * d * kv)
    return hf / ours


def summary(base, other):
    """tokens/s of both, median per-step speedup of base over other, max loss difference."""
    tps = lambda c: sum(c.tokens) / sum(c.times)
    speedup = statistics.median(o / b for b, o in zip(base.times, other.times, strict=True))
    loss_diff = max(abs(a - b) for a, b in zip(base.losses, other.losses, strict=True))
    return tps(base), tps(other), speedup, loss_diff


# ----------------------------------------------------------------------------- the comparisons
def run_padding(args, out):
    out.append(f"\n### Padding fraction, one epoch (batch {args.batch_size} pairs)\n")
    out.append("| seq_len | layout | random order | bucketed | slots computed, bucketed/random |")
    out.append("|---|---|---|---|---|")
    for T in sorted({T for _, T in args.runs}):
        data = load_pairs(T, args.cache)
        for packed in (False, True):
            fracs, slots = [], []
            for bucket in (False, True):
                idx = epoch_batches(data, args.batch_size, 0, bucket, packed)
                batches = [
                    data.collate_packed(i, PAD) if packed else data.collate(i, PAD) for i in idx
                ]
                fracs.append(padding_fraction(batches, packed))
                slots.append(
                    sum(b.tokens.numel() if packed else 2 * b.chosen.numel() for b in batches)
                )
            layout = "packed [p,c,r]" if packed else "plain [p+c; p+r]"
            out.append(
                f"| {T} | {layout} | {fracs[0]:.1%} | {fracs[1]:.1%} | {slots[1] / slots[0]:.2f} |"
            )
        print("\n".join(out[-2:]))


def run_hf(args, out):
    out.append(f"\n### nanoRM vs HF LlamaForSequenceClassification ({args.device}, {args.dtype})\n")
    out.append(
        "| config | seq_len | order | padding | HF tok/s | nanoRM tok/s | nanoRM packed tok/s "
        "| nanoRM / HF (median) | work bound | packed / HF (median) | max loss diff |"
        + (" peak MiB nanoRM / HF | MFU nanoRM / HF |" if args.cuda else "")
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.cuda else ""))
    for config, T in args.runs:
        data = load_pairs(T, args.cache)
        for bucket in (False, True) if (config, T) in args.bucket_runs else (False,):
            ours = nanorm_contender(args, "nanoRM", config, T, data)
            packed = nanorm_contender(args, "nanoRM packed", config, T, data)
            rm, hf = ours.model, hf_twin(ours.model).to(args.device)
            peer = Contender("HF", hf, data, args.device, args.ctx, args.compile)
            idx = epoch_batches(data, args.batch_size, 0, bucket)[: args.steps + 1]
            race([ours, packed, peer], idx)
            a, b, speedup, loss_diff = summary(ours, peer)
            p, _, speedup_p, loss_diff_p = summary(packed, peer)
            timed = [data.collate(i, PAD) for i in idx[1:]]
            pad, bound = padding_fraction(timed, False), work_ratio(rm.backbone.config, timed)
            row = (
                f"| {config} | {T} | {'bucketed' if bucket else 'random'} | {pad:.0%} | "
                f"{b:,.0f} | {a:,.0f} | {p:,.0f} | **{speedup:.2f}x** | {bound:.2f}x | "
                f"**{speedup_p:.2f}x** | "
                f"{max(loss_diff, loss_diff_p):.1e} |"
            )
            if args.cuda:
                mfu = [
                    estimate_mfu(rm.backbone.config, matmul_params(rm), x, seq_len=T)
                    for x in (a, b)
                ]
                row += (
                    f" {max(ours.peaks):,.0f} / {max(peer.peaks):,.0f} | "
                    f"{mfu[0]:.1%} / {mfu[1]:.1%} |"
                )
            out.append(row)
            print(row, flush=True)


def run_pack(args, out):
    out.append(f"\n### Shared-prompt packing: nanoRM plain vs packed ({args.device})\n")
    out.append(
        "| config | seq_len | order | plain tok/s | packed tok/s | speedup (median) | "
        "max loss diff | max reward diff, first batch |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    config, T = args.pack_run
    data = load_pairs(T, args.cache)
    for bucket in (False, True):
        plain = nanorm_contender(args, "nanoRM", config, T, data)
        packed = nanorm_contender(args, "nanoRM packed", config, T, data)
        idx = epoch_batches(data, args.batch_size, 1, bucket)[: args.steps + 1]
        with torch.no_grad():  # rewards before training: the strictest check, per pair
            r_plain = torch.cat(plain.rewards(plain.batch(idx[0])))
            r_packed = torch.cat(packed.rewards(packed.batch(idx[0])))
        reward_diff = (r_plain - r_packed).abs().max().item()
        race([packed, plain], idx)
        a, b, speedup, loss_diff = summary(packed, plain)
        row = (
            f"| {config} | {T} | {'bucketed' if bucket else 'random'} | {b:,.0f} | {a:,.0f} | "
            f"**{speedup:.2f}x** | {loss_diff:.1e} | {reward_diff:.1e} |"
        )
        out.append(row)
        print(row, flush=True)


def run_readout(args, out):
    out.append(f"\n### The last layer at the reward token only ({args.device}, bucketed)\n")
    out.append(
        "| config | seq_len | full last layer tok/s | at the reward token tok/s | "
        "speedup (median) | max loss diff |"
    )
    out.append("|---|---|---|---|---|---|")
    for config, T in args.readout_runs:
        data = load_pairs(T, args.cache)
        at = nanorm_contender(args, "nanoRM", config, T, data)
        full = nanorm_contender(args, "nanoRM full last layer", config, T, data)
        race([at, full], epoch_batches(data, args.batch_size, 2, True)[: args.steps + 1])
        a, b, speedup, loss_diff = summary(at, full)
        row = f"| {config} | {T} | {b:,.0f} | {a:,.0f} | **{speedup:.2f}x** | {loss_diff:.1e} |"
        out.append(row)
        print(row, flush=True)


def matmul_params(rm):
    """The weights a token multiplies by (estimate_mfu's N): no embedding table, no LM head."""
    b = rm.backbone
    skip = {id(b.tok_embeddings.weight), id(b.output.weight)}
    return sum(p.numel() for p in rm.parameters() if id(p) not in skip)


def run_memory(args, out):
    """CPU: one subprocess per contender and config, so each peak RSS is its own."""
    out.append("\n### Peak memory added by a training step (CPU, RSS)\n")
    out.append("| config | seq_len | nanoRM MiB | HF MiB | nanoRM / HF |")
    out.append("|---|---|---|---|---|")
    for config, T in args.memory_runs:
        load_pairs(T, args.cache)  # tokenize once, before the subprocesses
        peaks = []
        for name in ("nanoRM", "HF"):
            cmd = [
                sys.executable,
                __file__,
                "--_memory",
                name,
                "--cache",
                args.cache,
                "--_run",
                f"{config}:{T}",
                "--batch_size",
                str(args.batch_size),
                "--steps",
                str(args.memory_steps),
                "--threads",
                str(args.threads),
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            peaks.append(json.loads(res.stdout.strip().splitlines()[-1])["peak_mib"])
        row = f"| {config} | {T} | {peaks[0]:,.0f} | {peaks[1]:,.0f} | {peaks[0] / peaks[1]:.2f} |"
        out.append(row)
        print(row, flush=True)


def rss_mib(field):
    """VmRSS (now) or VmHWM (peak since start or the last reset) of this process, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(args):
    """Run a few steps of one contender; print the peak RSS they added, as JSON."""
    config, T = args._run.split(":")
    T = int(T)
    data = load_pairs(T, args.cache)
    rm = make_nanorm(config, T)
    model = hf_twin(rm) if args._memory == "HF" else rm
    if args._memory == "HF":
        del rm
    c = Contender(args._memory, model, data, "cpu", nullcontext())
    batches = [c.batch(i) for i in epoch_batches(data, args.batch_size, 0)[: args.steps]]
    with contextlib.suppress(OSError):  # reset the peak to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    before = rss_mib("VmRSS")
    for b in batches:
        c.step(b)
    print(json.dumps({"peak_mib": rss_mib("VmHWM") - before}))


# ----------------------------------------------------------------------------- main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--only", default="padding,hf,pack,readout,memory", help="comma-separated subset"
    )
    p.add_argument("--quick", action="store_true", help="one config, 4 pairs per batch, 3 steps")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16"], help="default: bf16 on CUDA"
    )
    p.add_argument("--compile", action="store_true", help="torch.compile both contenders")
    p.add_argument("--no_flex", action="store_true", help="CUDA packing: SDPA, not FlexAttention")
    p.add_argument("--batch_size", type=int, default=8, help="pairs per step")
    p.add_argument("--steps", type=int, default=4, help="timed steps per comparison (+1 warmup)")
    p.add_argument("--memory_steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "nanorm_bench"))
    p.add_argument("--out", default=None, help="also write the markdown tables to this file")
    p.add_argument("--_memory", default=None, help=argparse.SUPPRESS)  # child process
    p.add_argument("--_run", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.makedirs(args.cache, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args._memory:
        return memory_child(args)

    global FLEX
    FLEX = not args.no_flex
    args.cuda = args.device.startswith("cuda")
    if args.cuda and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    bf16 = args.dtype == "bfloat16" or (args.cuda and args.dtype is None)  # both contenders
    args.dtype = "bf16 autocast" if bf16 else "fp32"
    args.ctx = torch.autocast(args.device.split(":")[0], torch.bfloat16) if bf16 else nullcontext()
    # (config, seq_len) of each HF comparison; bucketed too for some; packing; memory
    args.runs = [("288d-6L", 256), ("288d-6L", 512), ("512d-8L", 256), ("512d-8L", 512)]
    args.bucket_runs = list(args.runs)
    args.pack_run = ("288d-6L", 512)
    args.readout_runs = [("288d-6L", 512), ("512d-8L", 512)]
    args.memory_runs = [("288d-6L", 512), ("512d-8L", 512)]
    if args.quick:
        args.runs = args.bucket_runs = args.memory_runs = args.readout_runs = [("288d-6L", 256)]
        args.pack_run = ("288d-6L", 256)
        args.batch_size, args.steps, args.memory_steps = 4, 3, 2
    if args.cuda:  # GPU-sized batches and a longer sequence
        args.batch_size = max(args.batch_size, 32)
        args.runs += [("512d-8L", 1024)]

    out = [
        f"## {platform.node() if args.cuda else 'CPU'}: {_device_name(args)}, "
        f"torch {torch.__version__}, {date.today()}",
        f"\n`python bench/bench_train.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f" ({args.batch_size} pairs per step, {args.steps} timed steps after 1 warm-up)",
    ]
    print("\n".join(out))
    only = set(args.only.split(","))
    for name, fn in (
        ("padding", run_padding),
        ("hf", run_hf),
        ("pack", run_pack),
        ("readout", run_readout),
        ("memory", run_memory),
    ):
        if name in only and not (name == "memory" and args.cuda):  # CUDA: peaks are in "hf"
            fn(args, out)
    if args.out:
        Path(args.out).write_text("\n".join(out) + "\n")
        print(f"wrote {args.out}")


def _device_name(args):
    if args.cuda:
        return torch.cuda.get_device_name()
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    return f"{cpu}, {torch.get_num_threads()} threads"


if __name__ == "__main__":
    main()
