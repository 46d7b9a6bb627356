"""The one forward (model.py's hidden_states) in every layout gives the numbers of a slow plain
computation written here (`reference_states`: every column, an explicit softmax, the weights
used directly), states and gradients: padding skipped with both attention kernels (row by row,
batched rows), the last-layer readout, shared-prompt packing (SDPA and FlexAttention masks),
length bucketing; and estimate_mfu by hand. No timing here: bench/ measures speed."""

import sys
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, shared_path

from data.pairs import (
    PAD_SEGMENT,
    Batch,
    PairDataset,
    bucketed_order,
    encode_pair,
    pack_pairs,
    packed_attention_mask,
    write_pairs,
)
from data.rows import read_pairs
from model import ModelConfig, Transformer, apply_rope, padding_mask
from reward import RewardModel, pairwise_loss, score_last_token

V, PAD = 97, 0


def tiny(seed=0, **kw):
    cfg = dict(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V, hidden_dim=96)
    torch.manual_seed(seed)
    rm = RewardModel.from_config(ModelConfig(**(cfg | dict(max_seq_len=128) | kw)))
    with torch.no_grad():  # a unit head makes reward errors visible (its init std is 1/dim)
        rm.head.weight.normal_()
    return rm


def random_items(lengths, seed=0):
    """(prompt, chosen, rejected) id arrays of the given lengths, no pad id inside."""
    g = np.random.default_rng(seed)
    return [tuple(g.integers(1, V, n) for n in plp) for plp in lengths]


def reference_states(net, tokens, positions, allowed):
    """The slow plain computation of the final states (B, T, dim): every column, attention as
    an explicit softmax over `allowed` (B, T, T) bool, the model's weights used directly."""
    cfg = net.config
    H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    norm = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w
    cos, sin = net.rope(positions)
    x = net.tok_embeddings.weight[tokens]
    for layer in net.layers:
        a, f = layer.attention, layer.feed_forward
        h = norm(x, layer.attention_norm.weight)
        q = apply_rope((h @ a.wq.weight.T).unflatten(-1, (H, hd)), cos, sin)
        k = apply_rope((h @ a.wk.weight.T).unflatten(-1, (KV, hd)), cos, sin)
        v = (h @ a.wv.weight.T).unflatten(-1, (KV, hd))
        k, v = k.repeat_interleave(H // KV, 2), v.repeat_interleave(H // KV, 2)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / hd**0.5
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        x = x + torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).flatten(2) @ a.wo.weight.T
        h = norm(x, layer.ffn_norm.weight)
        x = x + (F.silu(h @ f.w1.weight.T) * (h @ f.w3.weight.T)) @ f.w2.weight.T
    return norm(x, net.norm.weight)


def padded_reference(net, tokens, mask):
    """reference_states for a padded batch: positions and causal mask from the padding."""
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return reference_states(net, tokens, positions, padding_mask(mask, tokens.size(1)))


# prompts long and short, empty (a truncated pair), 1-token responses, equal lengths
LENGTHS = [(9, 3, 7), (0, 4, 2), (30, 1, 12), (1, 12, 12), (17, 8, 1), (5, 5, 5)]


def plain_rewards(rm, items):
    """The reference: the slow plain computation on right-padded prompt + chosen and prompt +
    rejected rows, read at each row's last real token."""
    seqs = [np.concatenate([p, c]) for p, c, _ in items] + [
        np.concatenate([p, r]) for p, _, r in items
    ]
    T = max(len(s) for s in seqs)
    tokens, mask = torch.full((len(seqs), T), PAD), torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)], mask[i, : len(s)] = torch.from_numpy(s), 1
    r = score_last_token(rm.head, padded_reference(rm.backbone, tokens, mask), mask)
    return r[: len(items)], r[len(items) :]


def packed_rewards(rm, items, flex=False):
    b = pack_pairs(items, PAD)
    return rm.forward_pair_packed(
        b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end, flex=flex
    )


def loss_and_grads(rm, rewards_fn, items):
    rm.zero_grad()
    r_c, r_r = rewards_fn(rm, items)
    loss = pairwise_loss("logsig", r_c, r_r)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in rm.named_parameters() if p.grad is not None}


# ---------------------------------------------------------------- packing
def test_pack_pairs_layout():
    b = pack_pairs([([1, 5, 6], [7, 8, 2], [9, 2]), ([1], [3, 2], [4, 4, 4, 2])], PAD)
    assert b.tokens.tolist() == [[1, 5, 6, 7, 8, 2, 9, 2], [1, 3, 2, 4, 4, 4, 2, PAD]]
    assert b.segments.tolist() == [[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 1, 2, 2, 2, 2, PAD_SEGMENT]]
    assert b.positions.tolist() == [[0, 1, 2, 3, 4, 5, 3, 4], [0, 1, 2, 1, 2, 3, 4, 0]]
    assert b.chosen_end.tolist() == [5, 2] and b.rejected_end.tolist() == [7, 6]
    assert (b.n_tokens, b.n_packed) == ((6 + 5) + (3 + 5), 8 + 7)


def test_packed_attention_mask_picture():
    seg = torch.tensor([[0, 0, 1, 1, 2, 2, PAD_SEGMENT]])
    expected = [
        "x......",
        "xx.....",
        "xxx....",
        "xxxx...",
        "xx..x..",  # rejected: the prompt and itself, never the chosen response
        "xx..xx.",
        "xx....x",  # padding: the prompt and itself (never read, but not an empty row)
    ]
    got = [
        "".join("x" if a else "." for a in row) for row in packed_attention_mask(seg)[0].tolist()
    ]
    assert got == expected


def test_packed_rewards_loss_and_gradients_equal_plain():
    items = random_items(LENGTHS)
    rm = tiny()
    (rc, rr), (pc, pr) = plain_rewards(rm, items), packed_rewards(rm, items)
    assert (rc - pc).abs().max() < 1e-5 and (rr - pr).abs().max() < 1e-5
    loss, grads = loss_and_grads(rm, plain_rewards, items)
    loss_p, grads_p = loss_and_grads(rm, packed_rewards, items)
    assert abs(loss - loss_p) < 1e-6
    assert grads.keys() == grads_p.keys()
    for n in grads:
        assert torch.allclose(grads[n], grads_p[n], atol=1e-5, rtol=1e-4), n


def test_packed_row_may_exceed_max_seq_len_but_positions_may_not():
    rm = tiny(max_seq_len=24)  # the rows below are 30 long, their positions at most 21
    items = random_items([(12, 10, 8), (3, 2, 20)])
    (rc, rr), (pc, pr) = plain_rewards(rm, items), packed_rewards(rm, items)
    assert (rc - pc).abs().max() < 1e-5 and (rr - pr).abs().max() < 1e-5
    with pytest.raises(ValueError, match="position 24 exceeds max_seq_len 24"):
        packed_rewards(rm, random_items([(20, 5, 1)]))


@torch.no_grad()
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_packed_flex_attention_block_mask_equals_plain():
    """FlexAttention (the CUDA path) runs eagerly on CPU, forward only: check its mask."""
    items = random_items(LENGTHS, seed=1)
    rm = tiny(seed=1)
    (rc, rr), (fc, fr) = plain_rewards(rm, items), packed_rewards(rm, items, flex=True)
    assert (rc - fc).abs().max() < 1e-5 and (rr - fr).abs().max() < 1e-5


def test_packed_equals_plain_on_hh_rlhf_with_llama_tokenizer():
    from data.tokenizer import load_tokenizer

    tok = load_tokenizer(shared_path("llama2c", "tokenizer.model"))
    pairs, _ = read_pairs(shared_path("hh-rlhf", "helpful-base", "test.jsonl.gz"), strict=False)
    items = [encode_pair(tok, pair, 128)[:3] for pair in pairs[:6]]
    items = [tuple(np.array(x, dtype=np.int64) for x in item) for item in items]
    rm = tiny(vocab_size=tok.vocab_size, dim=32, hidden_dim=64)
    (rc, rr), (pc, pr) = plain_rewards(rm, items), packed_rewards(rm, items)
    assert (rc - pc).abs().max() < 1e-5 and (rr - pr).abs().max() < 1e-5
    # HH-RLHF's prompts are most of the tokens: the packed rows are much shorter in total
    b = pack_pairs(items, PAD)
    assert b.n_packed < 0.85 * b.n_tokens


# ---------------------------------------------------------------- unpadding
def padded_batch(seqs, side):
    T = max(len(s) for s in seqs)
    tokens, mask = torch.full((len(seqs), T), PAD), torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        a = T - len(s) if side == "left" else 0
        tokens[i, a : a + len(s)], mask[i, a : a + len(s)] = torch.as_tensor(s), 1
    return tokens, mask


def test_the_cpu_runs_rows_over_padded_up_to_columns_row_by_row(monkeypatch):
    """row_attention None (the default): on a CPU a batch of rows up to model.PADDED_UP_TO
    columns takes one padded call, a longer one a call per row; a setting overrides both."""
    import model

    layouts = []
    make = model.make_layout
    monkeypatch.setattr(model, "make_layout", lambda *a: layouts.append(make(*a)) or layouts[-1])
    net = Transformer(ModelConfig(dim=16, n_layers=1, n_heads=2, vocab_size=V))
    for T in (model.PADDED_UP_TO, model.PADDED_UP_TO + 1):
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, : T // 2] = 0  # one row left-padded: padding to skip
        for setting in (None, True, False):
            net.row_attention = setting
            net.hidden_states(torch.randint(1, V, (2, T)), mask)
    row_by_row = [layout.lengths is not None for layout in layouts]
    assert row_by_row == [False, True, False, True, True, False]


@pytest.mark.parametrize("per_row", [True, False], ids=["cpu-row-by-row", "gpu-padded-rows"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_states_and_gradients_equal_one_sequence_at_a_time(per_row, side):
    """The forward skips padding; both attention kernels (row by row on CPU, padded rows on
    GPU, forced here) give each sequence's states as if it were alone, and the same gradients;
    the slow reference on the padded batch gives the same states at the real tokens."""
    torch.manual_seed(0)
    net = Transformer(ModelConfig(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V))
    net.row_attention = per_row
    seqs = [torch.randint(1, V, (n,)).tolist() for n in (7, 19, 1, 12)]
    w = torch.randn(48)  # a loss that reads every real token

    net.zero_grad()
    alone = [net.hidden_states(torch.tensor([s]))[0] for s in seqs]
    sum((h @ w).square().sum() for h in alone).backward()  # gradients of size ~100
    ref = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}

    net.zero_grad()
    tokens, mask = padded_batch(seqs, side)
    h = net.hidden_states(tokens, mask)  # (B, T, dim)
    real = mask.bool()
    assert (h[~real] == 0).all()  # padding positions come out as 0
    assert (h[real] - torch.cat(alone)).abs().max() < 1e-5
    with torch.no_grad():
        assert (padded_reference(net, tokens, mask)[real] - h[real]).abs().max() < 1e-5
    ((h @ w).square() * real).sum().backward()
    for n, g in ref.items():
        err = (g - dict(net.named_parameters())[n].grad).abs().max()
        assert err <= 1e-5 * g.abs().max(), n  # fp32 sums in another order


@pytest.mark.parametrize("per_row", [True, False], ids=["cpu-row-by-row", "gpu-padded-rows"])
@pytest.mark.parametrize("layout", ["no-padding", "right", "left", "packed"])
def test_last_layer_at_readout_tokens_equals_full_states(per_row, layout):
    """hidden_states(..., at=cols), plain or packed, runs the last layer's queries and FFN at
    cols only: the states there, and the gradients of anything read from them, equal the slow
    reference's (every column computed, padding too)."""
    torch.manual_seed(0)
    net = Transformer(ModelConfig(dim=48, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=V))
    net.row_attention = per_row
    if layout == "packed":  # two readout tokens per row, each seeing its own segment
        b = pack_pairs(random_items(LENGTHS, seed=4), PAD)
        tokens, mask, attn = b.tokens, b.segments >= 0, packed_attention_mask(b.segments)
        at = torch.stack([b.chosen_end, b.rejected_end], 1)  # (B, 2)
        fast = lambda: net.hidden_states(tokens, mask, positions=b.positions, visible=attn, at=at)
        plain = lambda: reference_states(net, tokens, b.positions, attn)
    else:
        seqs = [torch.randint(1, V, (n,)).tolist() for n in (7, 19, 1, 12)]
        if layout == "no-padding":
            seqs = [s[:1] + seqs[1][:18] for s in seqs]  # all 19 long
        tokens, mask = padded_batch(seqs, "right" if layout == "no-padding" else layout)
        t = torch.arange(tokens.size(1))
        at = torch.stack([(t * mask).max(1).values, mask.argmax(1)], 1)  # last and first real
        fast = lambda: net.hidden_states(tokens, mask, at=at)
        plain = lambda: padded_reference(net, tokens, mask)
    w = torch.randn(48)

    def states_and_grads(use_at):
        net.zero_grad()
        if use_at:
            h = fast()  # (B, k, dim)
        else:
            h = plain()[torch.arange(len(at))[:, None], at]
        (h @ w).square().sum().backward()
        return h.detach(), {
            n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None
        }

    (h_full, g_full), (h_at, g_at) = states_and_grads(False), states_and_grads(True)
    assert h_at.shape == (len(at), at.size(1), 48)
    assert (h_at - h_full).abs().max() < 1e-5
    assert g_full.keys() == g_at.keys()
    for n, g in g_full.items():
        assert (g - g_at[n]).abs().max() <= 1e-5 * g.abs().max(), n


@pytest.mark.parametrize("lead", [0, 5, 10], ids=["no-causal-lead", "causal-lead", "all-causal"])
def test_row_by_row_attention_with_a_caller_mask_equals_padded_rows(lead):
    """Row-by-row attention (CPU) cuts each row's part out of a caller's mask; any mask (here
    random after `lead` causal rows) gives the padded-rows (GPU) result and gradients, and the
    slow reference's states at the real tokens."""
    g = torch.Generator().manual_seed(lead)
    B, T = 3, 10
    tokens = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 7:], mask[2, 4:] = 0, 0
    attn = torch.ones(T, T, dtype=torch.bool).tril().repeat(B, 1, 1)
    attn[:, lead:] = torch.rand(B, T - lead, T, generator=g) > 0.5
    attn = attn & mask.bool()[:, None, :] | torch.eye(T, dtype=torch.bool)  # real keys only
    torch.manual_seed(0)
    net = Transformer(ModelConfig(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V))
    # in float64: the two layouts are the same algorithm, so they agree to 1e-12 of the values;
    # in fp32 their gradients differ by sums in another order, up to 1e-5 of the largest on
    # some kernel paths (AVX2, MKL's reproducible branch), which would hide nothing but noise
    net = net.double()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = {}
    for per_row in (True, False):
        net.row_attention = per_row
        net.zero_grad()
        h = net.hidden_states(tokens, mask, positions=positions, visible=attn)
        h.square().sum().backward()
        out[per_row] = (
            h.detach(),
            {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None},
        )
    h = out[False][0]
    assert (out[True][0] - h).abs().max() <= 1e-12 * h.abs().max()
    with torch.no_grad():
        plain = reference_states(net, tokens, positions, attn)
    assert (plain - out[True][0])[mask.bool()].abs().max() < 1e-5  # its rotary tables: fp32
    for n, grad in out[False][1].items():
        assert (grad - out[True][1][n]).abs().max() <= 1e-12 * grad.abs().max(), n


def test_readout_columns_must_be_real_tokens():
    net = Transformer(ModelConfig(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V))
    tokens, mask = padded_batch([[5, 6, 7], [8]], "right")
    with pytest.raises(ValueError, match="padding position"):
        net.hidden_states(tokens, mask, at=torch.tensor([[2], [2]]))
    with pytest.raises(ValueError, match=r"columns in \[0, 3\)"):
        net.hidden_states(tokens, mask, at=torch.tensor([[2], [3]]))


def test_gradient_checkpointing_same_gradients():
    rm = tiny().train()
    items = random_items(LENGTHS, seed=2)
    loss, grads = loss_and_grads(rm, plain_rewards, items)
    rm.backbone.gradient_checkpointing = True
    loss_ckpt, grads_ckpt = loss_and_grads(rm, plain_rewards, items)
    assert loss == loss_ckpt
    for n in grads:
        assert torch.allclose(grads[n], grads_ckpt[n], atol=1e-6), n


# ---------------------------------------------------------------- bucketing
@pytest.fixture
def dataset(tmp_path):
    g = np.random.default_rng(0)
    lengths = [
        (int(g.integers(1, 40)), int(g.integers(1, 20)), int(g.integers(1, 20))) for _ in range(37)
    ]
    write_pairs(tmp_path / "d.npz", random_items(lengths, seed=3), V)
    return PairDataset(tmp_path / "d.npz")


def test_bucketed_order_is_a_permutation_that_cuts_padding(dataset):
    B, n = 4, len(dataset)
    lengths = dataset.lengths()
    assert lengths.tolist() == [
        len(p) + max(len(c), len(r)) for p, c, r in (dataset[i] for i in range(n))
    ]
    pad_slots = lambda order: sum(
        2 * dataset.collate(order[i : i + B].tolist(), PAD).chosen.numel()
        - dataset.collate(order[i : i + B].tolist(), PAD).n_tokens
        for i in range(0, n // B * B, B)
    )
    for seed in range(3):
        order = bucketed_order(lengths, B, seed, window=4)
        assert sorted(order.tolist()) == list(range(n))  # every pair once per epoch
        assert torch.equal(order, bucketed_order(lengths, B, seed, window=4))  # reproducible
        # the partial batch stays last (37 = 9 * 4 + 1): dropping it drops one pair
        assert len(order[n // B * B :]) == 1
        random = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        assert pad_slots(order) < 0.7 * pad_slots(random)
    assert not torch.equal(bucketed_order(lengths, B, 0), bucketed_order(lengths, B, 1))


def test_bucketed_batches_give_the_unbucketed_losses(dataset):
    """A pair's rewards depend neither on the pairs that share its batch nor on the padding:
    bucketed batches, plain or packed, give the rewards and loss of random-order batches."""
    rm, B = tiny(), 4

    def rewards(order, packed=False):  # {pair index: (r_chosen, r_rejected)}
        out = {}
        for i in range(0, len(order) // B * B, B):  # (the last partial batch is dropped)
            idx = order[i : i + B].tolist()
            if packed:
                b = dataset.collate_packed(idx, PAD)
                args = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
                r = rm.forward_pair_packed(*args)
            else:
                b = dataset.collate(idx, PAD)
                r = rm.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
            out |= dict(zip(idx, torch.stack(r, 1), strict=True))
        return out

    with torch.no_grad():
        ref = rewards(torch.randperm(len(dataset), generator=torch.Generator().manual_seed(5)))
        for packed in (False, True):
            got = rewards(bucketed_order(dataset.lengths(packed), B, 0, window=4), packed)
            common = sorted(ref.keys() & got.keys())
            assert len(common) >= len(dataset) - 2  # each order dropped one pair
            a, b = (torch.stack([d[j] for j in common]) for d in (ref, got))  # (n, 2)
            assert (a - b).abs().max() < 1e-5
            assert abs(pairwise_loss("logsig", *a.T) - pairwise_loss("logsig", *b.T)) < 1e-6


# ---------------------------------------------------------------- MFU and the benchmark's peer
def test_estimate_mfu_by_hand():
    from nanorm.base.runtime import estimate_mfu

    cfg = ModelConfig(dim=288, n_layers=6, n_heads=6, max_seq_len=256)  # head_dim 48
    N = 7_000_000
    flops_per_token = 6 * N + 12 * 6 * 6 * 48 * 256  # = 42e6 + 5,308,416
    assert flops_per_token == 47_308_416
    assert estimate_mfu(cfg, N, 1e6, peak_flops=1e14) == pytest.approx(0.47308416)
    assert estimate_mfu(cfg, N, 1e6, peak_flops=1e14, seq_len=128) == pytest.approx(
        (42e6 + 12 * 6 * 6 * 48 * 128) * 1e6 / 1e14
    )
    assert estimate_mfu(cfg, N, 1e6) == pytest.approx(47_308_416e6 / 989e12)  # H100 bf16


def test_benchmark_hf_peer_is_the_same_model():
    """bench/bench_train.py copies our weights into HF's LlamaForSequenceClassification: the
    rewards, and the loss and its gradient norm after one AdamW step, must match."""
    pytest.importorskip("transformers", reason="the HF peer needs transformers")
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_train import Contender, hf_twin

    rm = tiny()
    rm.backbone.output.weight.requires_grad_(False)
    rm.head.bias.requires_grad_(False)
    hf = hf_twin(rm)
    items = random_items(LENGTHS)
    seqs = [np.concatenate([p, c]) for p, c, _ in items] + [
        np.concatenate([p, r]) for p, _, r in items
    ]
    tokens, mask = padded_batch([s.tolist() for s in seqs], "right")
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=mask).logits.squeeze(-1)
        assert (rm(tokens, mask) - ref).abs().max() < 1e-5

    B = len(items)
    batch = Batch(tokens[:B], mask[:B], tokens[B:], mask[B:], mask[:B], int(mask.sum()))
    ours = Contender("nanoRM", rm, None, "cpu", nullcontext())
    peer = Contender("HF", hf, None, "cpu", nullcontext())
    for _ in range(2):  # the second loss is after one AdamW step on each side
        assert abs(ours.step(batch) - peer.step(batch)) < 1e-5
