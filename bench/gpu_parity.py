"""
The device's reward-model paths against the fp32 CPU reference: same weights, same pairs.

    python bench/gpu_parity.py                   # on a CUDA machine (bench/gpu_check.sh runs it)
    python bench/gpu_parity.py --device cpu      # the same checks on the CPU (gpu_check.sh --dry-run)

The reference is the model in fp32 on the CPU, each pair as two right-padded rows
(RewardModel.forward_pair). On --device the same weights score the same pairs four ways:
fp32 and bf16 autocast, each as padded rows and as packed rows [prompt | chosen | rejected]
(forward_pair_packed; on CUDA in bf16 through FlexAttention, compiled, elsewhere through the dense
mask: reward.flex_pays).
Each is within a tolerance that scales with the rewards, |r - r_ref| <= tol * max |r_ref|: fp32
1e-4 (the order of the summation differs between kernels, nothing else), bf16 0.03 (8 bits
of mantissa, rounded at every product of a few layers), and every pair whose reward difference
is clear of that tolerance keeps its sign. The gradient of the pairwise loss in fp32 must equal the
reference's to 1e-3 (relative norm), and bf16's to 0.1. A line per check and PASS/FAIL; exit 1
if any fails.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.pairs import pack_pairs, right_pad  # noqa: I001
from model import ModelConfig
from reward import RewardModel, flex_pays, pairwise_loss

TOL = {"float32": 1e-4, "bfloat16": 0.03}  # of max |reward|
GRAD_TOL = {"float32": 1e-3, "bfloat16": 0.1}  # relative norm of the gradient's difference


def make_pairs(n, vocab, seed):
    """n (prompt, chosen, rejected) of random ids and lengths: prompts 4-48 tokens, responses
    2-40, each response ending in EOS (id 2)."""
    g = torch.Generator().manual_seed(seed)

    def ids(lo, hi):
        k = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return torch.randint(3, vocab, (k,), generator=g).numpy()

    end = lambda r: torch.cat([torch.as_tensor(r[:-1]), torch.tensor([2])]).numpy()
    return [(ids(4, 48), end(ids(2, 40)), end(ids(2, 40))) for _ in range(n)]


def plain_batch(items):
    """(chosen, chosen_mask, rejected, rejected_mask), each (B, T): right-padded rows."""
    chosen = [torch.cat([torch.as_tensor(p), torch.as_tensor(c)]) for p, c, _ in items]
    rejected = [torch.cat([torch.as_tensor(p), torch.as_tensor(r)]) for p, _, r in items]
    out = []
    for rows in (chosen, rejected):
        tokens = right_pad([r.numpy() for r in rows])
        mask = torch.arange(tokens.size(1)) < torch.tensor([len(r) for r in rows])[:, None]
        out += [tokens, mask.long()]
    return out


def rewards(rm, items, device, dtype, packed):
    """(r_chosen, r_rejected) on device, fp32 tensors on the CPU, and the gradient of the
    pairwise loss (flattened, fp32, on the CPU)."""
    rm.zero_grad(set_to_none=True)
    ctx = torch.autocast(device.split(":")[0], torch.bfloat16, enabled=dtype == "bfloat16")
    with ctx:
        if packed:
            b = pack_pairs(items, pad_id=0).to(device)
            flex = flex_pays(b.tokens)  # FlexAttention on CUDA in bf16, the dense mask elsewhere
            r_c, r_r = rm.forward_pair_packed(
                b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end, flex=flex
            )
        else:
            r_c, r_r = rm.forward_pair(*(t.to(device) for t in plain_batch(items)))
        loss = pairwise_loss("logsig", r_c, r_r)
    loss.backward()
    grad = [p.grad.float().flatten().cpu() for p in rm.parameters() if p.grad is not None]
    grad = torch.cat(grad)  # the LM head (output) reads no token here: no gradient
    return r_c.float().detach().cpu(), r_r.float().detach().cpu(), grad


def compare(name, got, ref, dtype):
    """PASS/FAIL line of one path against the reference; True if it passed."""
    (g_c, g_r, g_grad), (c, r, grad) = got, ref
    scale = torch.cat([c, r]).abs().max()
    err = max((g_c - c).abs().max(), (g_r - r).abs().max()) / scale
    d, g_d = c - r, g_c - g_r
    clear = d.abs() > 2 * TOL[dtype] * scale  # differences no rounding within tol can flip
    signs = torch.equal(d[clear].sign(), g_d[clear].sign())
    grad_err = ((g_grad - grad).norm() / grad.norm()).item()
    ok = err <= TOL[dtype] and signs and grad_err <= GRAD_TOL[dtype]
    print(
        f"{'PASS' if ok else 'FAIL'} {name}: max |r - r_ref| = {err:.2e} of max |r_ref| "
        f"(tol {TOL[dtype]:g}), {int(clear.sum())} clear pair signs "
        f"{'kept' if signs else 'FLIPPED'}, gradient {grad_err:.2e} (tol {GRAD_TOL[dtype]:g})",
        flush=True,
    )
    return ok


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", help="the device checked against the CPU's fp32")
    p.add_argument("--pairs", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here (--device cpu checks the CPU's own paths)")
    vocab = 512
    cfg = ModelConfig(
        dim=args.dim, n_layers=args.layers, n_heads=4, n_kv_heads=2, vocab_size=vocab,
        multiple_of=32, max_seq_len=256,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    rm = RewardModel.from_config(cfg)
    with torch.no_grad():
        rm.head.weight.normal_()  # unit-scale rewards: an error hides in neither noise nor zero
    items = make_pairs(args.pairs, vocab, args.seed)
    ref = rewards(rm, items, "cpu", "float32", packed=False)
    print(
        f"reference: fp32 on the CPU, {args.pairs} pairs, dim {args.dim}, {args.layers} layers; "
        f"rewards {ref[0].min():.3f} to {ref[0].max():.3f}; checking {args.device}",
        flush=True,
    )
    rm.to(args.device)
    ok = True
    for dtype in ("float32", "bfloat16"):
        for packed in (False, True):
            with torch.autocast(args.device.split(":")[0], enabled=dtype == "bfloat16"):
                flex = flex_pays(torch.zeros(1, device=args.device))  # what rewards() takes
            how = "packed, FlexAttention" if packed and flex else ""
            how = how or ("packed, dense mask" if packed else "padded rows")
            got = rewards(rm, items, args.device, dtype, packed)
            ok &= compare(f"{args.device} {dtype} {how}", got, ref, dtype)
    print(f"{'PASS' if ok else 'FAIL'}: {args.device} against the fp32 CPU reference")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
