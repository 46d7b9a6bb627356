"""cache.py: the frozen layers' stored output gives the rewards, loss and gradients of computing
them again (to the rounding of float16), is reused by a later run and rebuilt when the data
changes; under bf16 it is built from bf16-held weights to the bit of autocast's own casts, and
the fp32 weights come back; train_rm.py's --epochs evaluates at each epoch's end; --head_lr and
--lora_rank train."""

import json
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from conftest import shared_path, stories_arith

import nanorm.build
import train_rm
from data.pairs import PairDataset, packed_attention_mask, write_pairs
from model import ModelConfig
from nanorm import cache as cache_py
from nanorm.cache import FrozenCache, build, cache_key
from reward import RewardModel, pairwise_loss

V = 97


@pytest.fixture
def data(tmp_path):
    g = np.random.default_rng(0)
    items = [tuple(g.integers(1, V, int(n)) for n in g.integers(1, 30, 3)) for _ in range(21)]
    write_pairs(tmp_path / "d.npz", items, V)
    return PairDataset(tmp_path / "d.npz")


def tiny(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(dim=48, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=V, hidden_dim=96)
    rm = RewardModel.from_config(cfg)
    with torch.no_grad():
        rm.head.weight.normal_()  # a unit head makes reward errors visible
    nanorm.build.train_top_layers(rm, 1)
    return rm


def loss_and_grads(rm, b, states=None):
    rm.zero_grad()
    ends = (b.chosen_end, b.rejected_end)
    r_c, r_r = rm.forward_pair_packed(b.tokens, b.segments, b.positions, *ends, states=states)
    loss = pairwise_loss("logsig", r_c, r_r)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in rm.named_parameters() if p.grad is not None}
    return torch.stack([r_c, r_r], 1).detach(), loss.item(), grads


def test_cached_states_give_the_loss_and_gradients_of_recomputing(data, tmp_path):
    rm = tiny()
    build(rm.backbone, data, "train", 2, tmp_path / "c", 0, torch.float16, say=lambda *a: None)
    cache = FrozenCache(tmp_path / "c", "train", 2)
    assert cache.states.dtype == torch.float16 and len(cache.offsets) == len(data) + 1
    idx = [3, 0, 17, 9, 20]
    b = data.collate_packed(idx, 0)
    r, loss, grads = loss_and_grads(rm, b)
    r2, loss2, grads2 = loss_and_grads(rm, b, (cache.first, cache.rows(idx, b.tokens.size(1))))
    assert set(grads) == set(grads2) and all(
        "layers.2" in n or "head" in n or n == "backbone.norm.weight" for n in grads
    )
    # float16 keeps 11 bits: relative errors of a few 1e-4, far below what training moves
    assert (r - r2).abs().max() < 2e-3 * r.abs().max()
    assert abs(loss - loss2) < 1e-3
    for n, g in grads.items():
        assert (g - grads2[n]).abs().max() <= 5e-3 * g.abs().max(), n
    # and a float32 copy of the same states (no rounding) gives them to float32's precision
    with torch.no_grad():
        exact = rm.backbone.hidden_states(
            b.tokens,
            b.segments >= 0,
            positions=b.positions,
            visible=packed_attention_mask(b.segments),
            layers=(0, 2),
        )
    r3, loss3, grads3 = loss_and_grads(rm, b, (2, exact))
    assert (r - r3).abs().max() < 1e-5 and abs(loss - loss3) < 1e-6
    for n, g in grads.items():
        assert (g - grads3[n]).abs().max() <= 1e-5 * g.abs().max(), n


def test_bf16_weights_build_autocasts_states_and_give_the_fp32_weights_back(
    data, tmp_path, monkeypatch
):
    rm = tiny()
    before = {n: (p.data_ptr(), p.dtype, p.clone()) for n, p in rm.named_parameters()}
    quiet, bf16 = (lambda *a: None), torch.autocast("cpu", dtype=torch.bfloat16)
    build(rm.backbone, data, "train", 2, tmp_path / "held", 0, torch.float16, say=quiet, ctx=bf16)
    for n, p in rm.named_parameters():  # the very fp32 tensors, unchanged, and no grad left on
        ptr, dtype, value = before[n]
        assert (p.data_ptr(), p.dtype) == (ptr, dtype) and torch.equal(p, value) and p.grad is None
    with cache_py.bf16_weights(rm.backbone.layers[:2], bf16):  # held: the matrices, not norms
        assert rm.backbone.layers[1].feed_forward.w2.weight.dtype == torch.bfloat16
        assert rm.backbone.layers[1].ffn_norm.weight.dtype == torch.float32
        assert rm.backbone.layers[2].attention.wq.weight.dtype == torch.float32  # trained
    off = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)  # an autocast that is off
    for fp32_ctx in (nullcontext(), off):  # fp32 runs: untouched
        with cache_py.bf16_weights(rm.backbone.layers[:2], fp32_ctx):
            assert rm.backbone.layers[0].attention.wq.weight.dtype == torch.float32
    # autocast casting the fp32 weights at every batch, as before bf16_weights
    monkeypatch.setattr(cache_py, "bf16_weights", lambda layers, ctx: nullcontext())
    build(rm.backbone, data, "train", 2, tmp_path / "cast", 0, torch.float16, say=quiet, ctx=bf16)
    held = FrozenCache(tmp_path / "held", "train", 2).states
    cast = FrozenCache(tmp_path / "cast", "train", 2).states
    assert torch.equal(held, cast)  # the same bf16 products
    fp32 = tmp_path / "fp32"
    build(rm.backbone, data, "train", 2, fp32, 0, torch.float16, say=quiet)
    assert not torch.equal(FrozenCache(fp32, "train", 2).states, held)  # bf16 did compute


def test_key_changes_with_the_data_and_the_layer(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x"), b.write_text("y")
    k = cache_key(a, b, first=2)
    assert k == cache_key(a, b, first=2) and k != cache_key(a, b, first=3)
    b.write_text("yy")  # the data changed: another cache
    assert k != cache_key(a, b, first=2)


def test_key_follows_the_content_not_the_path_or_time(tmp_path):
    big = bytes(range(256)) * (4 * 2**20 // 256 + 7)  # over 3 MiB: sampled at 3 windows
    for name, content in (("ckpt", big), ("data.npz", b"small")):
        (tmp_path / name).write_bytes(content)
    k = cache_key(tmp_path / "ckpt", tmp_path / "data.npz", first=2)
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    for name in ("ckpt", "data.npz"):  # a copy has another path and modification time
        (copy / name).write_bytes((tmp_path / name).read_bytes())
        os.utime(copy / name, (1, 1))
    assert cache_key(copy / "ckpt", copy / "data.npz", first=2) == k
    # a byte changed in any of the three windows of the big file: another cache
    for at in (10, len(big) // 2 + 10, len(big) - 10):
        changed = bytearray(big)
        changed[at] ^= 1
        (copy / "ckpt").write_bytes(bytes(changed))
        assert cache_key(copy / "ckpt", copy / "data.npz", first=2) != k


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    # arithmetic pairs in stories260K's vocabulary, the checkpoint every run here starts from
    return stories_arith(tmp_path_factory.mktemp("arith"), 200, 32)


def run(arith, out, *args):
    init = shared_path("llama2c", "stories260K", "stories260K.bin")
    argv = ["--dataset", arith, "--out_dir", out, "--init", init, "--lm_coef", 0, "--batch_size", 8]
    argv += ["--eval_pairs", 32, "--log_interval", 1, "--train_layers", 2, *args]
    return train_rm.main([str(a) for a in argv])


@pytest.mark.slow
def test_train_rm_epochs_cache_reuse_and_rebuild(arith, tmp_path, capsys):
    res = run(arith, tmp_path / "a", "--epochs", 2, "--eval_interval", 1000)
    out = capsys.readouterr().out
    # about 200 and 32 pairs: prepare keeps one copy of a pair drawn twice
    n, n_val = (len(PairDataset(os.path.join(arith, f"{s}.npz"))) for s in ("train", "val"))
    assert f"cache train: {n}/{n} pairs" in out and f"cache val: {n_val}/{n_val} pairs" in out
    rows = [json.loads(line) for line in open(tmp_path / "a" / "log.jsonl")]
    per_epoch = n // 8  # full batches of 8
    assert [r["step"] for r in rows if r["split"] == "eval"] == [0, per_epoch, 2 * per_epoch]
    (folder,) = os.listdir(os.path.join(arith, "cache"))
    built = os.path.getmtime(os.path.join(arith, "cache", folder, "train.bin"))
    # a second run reuses it, and computing the frozen layers again gives the same run
    again = run(arith, tmp_path / "b", "--epochs", 2, "--eval_interval", 1000)
    assert "cache train:" not in capsys.readouterr().out
    assert os.path.getmtime(os.path.join(arith, "cache", folder, "train.bin")) == built
    assert again == res
    fresh = run(arith, tmp_path / "c", "--epochs", 2, "--eval_interval", 1000, "--cache", "false")
    assert abs(fresh["loss"] - res["loss"]) < 0.02  # float16 inputs to the top 2 layers, ~50 steps


def test_head_lr_and_lora_train(arith, tmp_path):
    res = run(arith, tmp_path / "a", "--max_iters", 3, "--head_lr", 1e-2, "--lora_rank", 4)
    ckpt = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)
    assert not any("lora" in k for k in ckpt["model"])  # merged: the original keys
    assert any("lora_A" in k for k in ckpt["trainable"]) and "head.weight" in ckpt["trainable"]
    assert res["acc"] >= 0


def test_length_head_trains_from_the_cache(data, tmp_path):
    """ODIN's packed loss reads the last layer at the reward tokens only, so it starts from the
    cached states too: the loss and gradients of computing the frozen layers again (to the
    rounding of float16)."""
    from nanorm.length_head import LengthDebiasedRewardModel

    torch.manual_seed(0)
    cfg = ModelConfig(dim=48, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=V, hidden_dim=96)
    rm = LengthDebiasedRewardModel.from_config(cfg)
    with torch.no_grad():
        rm.head.weight.normal_(), rm.length_head.weight.normal_()
    nanorm.build.train_top_layers(rm, 1)
    build(rm.backbone, data, "train", 2, tmp_path / "c", 0, torch.float16, say=lambda *a: None)
    cache = FrozenCache(tmp_path / "c", "train", 2)
    idx = [3, 0, 17, 9, 20]
    b = data.collate_packed(idx, 0)
    row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
    results = []
    for states in (None, (cache.first, cache.rows(idx, b.tokens.size(1)))):
        rm.zero_grad()
        loss, stats = rm.loss_packed(*row, length_coef=0.5, states=states)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in rm.named_parameters() if p.grad is not None}
        results.append((loss.item(), stats["rho_quality"].item(), grads))
    (loss, rho, grads), (loss2, rho2, grads2) = results
    assert "length_head.weight" in grads and set(grads) == set(grads2)
    # float16 states, as in the test above: errors of a few 1e-4. The head's bias has a zero
    # gradient up to float noise (a constant cancels in r_c - r_r and in the correlation): 1e-6
    assert abs(loss - loss2) < 1e-3 and abs(rho - rho2) < 1e-3
    for n, g in grads.items():
        assert (g - grads2[n]).abs().max() <= 5e-3 * g.abs().max() + 1e-6, n


def test_train_rm_calibrate_length_fits_on_the_training_pairs(arith, tmp_path):
    """--calibrate_length: the line of reward on log length over the TRAINING pairs' rewards
    (scored from the cache), stored in ckpt.pt with the held-out mean/std, and the calibrated
    report in out/calibrated/ equals eval_rm.py's on the same checkpoint."""
    import eval_rm
    import nanorm.calibrate as calibrate
    import nanorm.report as report
    from nanorm.ckpt import load_reward_model

    out = tmp_path / "a"
    run(arith, out, "--max_iters", 4, "--calibrate_length", "--eval_interval", 1000)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    cal, norm = ckpt["length_calibration"], ckpt["reward_normalization"]
    rm, _ = load_reward_model(str(out / "ckpt.pt"))
    train = PairDataset(os.path.join(arith, "train.npz"))
    _, r = eval_rm.evaluate(rm, train, 0, 16, return_rewards=True)  # recomputed, no cache
    want = calibrate.fit_length(r, report.response_lengths(train, len(train)))
    assert cal["n"] == 2 * len(train)
    assert cal["coef"] == pytest.approx(want["coef"], rel=0.02, abs=1e-3)  # float16 cache
    raw = json.loads((out / "eval.json").read_text())
    fixed = json.loads((out / "calibrated" / "eval.json").read_text())
    assert fixed["length_calibration"] == cal and norm["calibrated"] is True
    n_val = len(PairDataset(os.path.join(arith, "val.npz")))
    assert fixed["overall"]["n"] == raw["overall"]["n"] == min(32, n_val)
    # eval_rm.py applies the stored calibration by default: its report is the same
    ev = eval_rm.main(
        ["--ckpt", str(out / "ckpt.pt"), "--data", arith, "--out", str(tmp_path / "e")]
    )
    assert ev["overall"]["accuracy"] == fixed["overall"]["accuracy"]
    assert ev["overall"]["length_corr"] == pytest.approx(fixed["overall"]["length_corr"], abs=0.02)
    assert ev["reward_normalization"]["mean"] == pytest.approx(norm["mean"], abs=0.02)
