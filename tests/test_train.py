"""train_rm.py: accumulation, DDP, exact resume, kill safety, NaN stop, and that it learns."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_model
from launcher import python

import data.pairs
import nanorm.build
import nanorm.ckpt
import train_rm
from data.arith.prepare import main as prepare_arith
from data.pairs import PairDataset, open_dataset
from nanorm.ckpt import load_reward_model


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    d = tmp_path_factory.mktemp("arith")
    prepare_arith(["--out_dir", str(d), "--n_train", "3000", "--n_val", "300"])
    return str(d)


def run(arith, out, *args):
    # fp32: the exactness checks compare runs to 1e-6 (--dtype auto is bf16 on a CPU with bf16)
    argv = ["--dataset", arith, "--out_dir", str(out), "--eval_pairs", "64", "--log_interval", "1"]
    argv += ["--dtype", "float32"]
    return train_rm.main(argv + [str(a) for a in args])


def weights(out):
    return torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["model"]


def max_diff(a, b):
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_lr_schedule_is_warmup_then_cosine():
    cfg = train_rm.TrainConfig(lr=1.0, min_lr=0.1, warmup=10, max_iters=110)
    lrs = [train_rm.get_lr(s, cfg) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.1 + 0.5 * 0.9)  # half way down the cosine
    assert lrs[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        train_rm.parse_args(["--help"])
    text = capsys.readouterr().out
    for f in dataclasses.fields(train_rm.TrainConfig):
        assert f"--{f.name}" in text


# Adam divides by sqrt(v) + 1e-8, so an fp32 rounding difference of 1e-10 in a gradient element
# near zero becomes a step of lr * 1e-2. At a reward-model learning rate (Llama 2 used 1e-5) that
# stays below 1e-6; the gradient norms, which Adam's scale invariance would hide, are compared too.
EXACT = ["--lr", 1e-5, "--min_lr", 1e-6, "--warmup", 1, "--eval_interval", 100]


def grad_norms(out):
    rows = [json.loads(r) for r in open(os.path.join(out, "log.jsonl"))]
    return [r["grad_norm"] for r in rows if r["split"] == "train"]


@pytest.mark.slow
def test_grad_accum_equals_one_big_batch(arith, tmp_path):
    run(arith, tmp_path / "big", *EXACT, "--max_iters", 5, "--batch_size", 16, "--grad_accum", 1)
    run(arith, tmp_path / "acc", *EXACT, "--max_iters", 5, "--batch_size", 4, "--grad_accum", 4)
    assert max_diff(weights(tmp_path / "big"), weights(tmp_path / "acc")) < 1e-6
    assert grad_norms(tmp_path / "big") == pytest.approx(grad_norms(tmp_path / "acc"), rel=1e-5)


def test_plain_reward_model_trains(arith, tmp_path):
    res = run(arith, tmp_path, "--max_iters", 3, "--eval_interval", 100, "--lm_coef", 0)
    assert math.isfinite(res["loss"])
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["kind"] == "RewardModel"


@pytest.mark.slow
def test_ddp_two_processes_equal_one(arith, tmp_path):
    common = ["--dataset", arith, "--max_iters", "4", "--eval_pairs", "64", "--device", "cpu"]
    common += ["--log_interval", "1", "--lm_coef", "0", "--dtype", "float32"]  # as run()'s
    common += [str(a) for a in EXACT]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    ddp = [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "train_rm.py"),
        *common,
        "--out_dir",
        str(tmp_path / "ddp"),
        "--batch_size",
        "4",
    ]
    p = python(ddp, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "x 2 ranks = 8 pairs/step" in p.stdout
    run(
        arith,
        tmp_path / "one",
        *EXACT,
        "--max_iters",
        4,
        "--batch_size",
        4,
        "--grad_accum",
        2,
        "--lm_coef",
        0,
    )
    assert max_diff(weights(tmp_path / "ddp"), weights(tmp_path / "one")) < 1e-6
    assert grad_norms(tmp_path / "ddp") == pytest.approx(grad_norms(tmp_path / "one"), rel=1e-5)


@pytest.mark.slow
def test_resume_is_bitwise_exact(arith, tmp_path, monkeypatch):
    common = ["--max_iters", 8, "--eval_interval", 4, "--dropout", 0.1]  # dropout: RNG state too
    run(arith, tmp_path / "full", *common)
    save = nanorm.ckpt.save_checkpoint

    def save_then_stop(path, rm, meta, optimizer, step, *a, **kw):
        save(path, rm, meta, optimizer, step, *a, **kw)
        if step == 4:
            raise KeyboardInterrupt  # the run is stopped right after its step-4 checkpoint

    monkeypatch.setattr(nanorm.ckpt, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run(arith, tmp_path / "cut", *common)
    monkeypatch.setattr(nanorm.ckpt, "save_checkpoint", save)
    assert torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["step"] == 4
    run(arith, tmp_path / "cut", *common, "--resume")
    a, b = weights(tmp_path / "full"), weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(r)["step"] for r in open(tmp_path / "cut" / "log.jsonl")]
    assert steps == sorted(steps)  # the resumed log continues, without duplicated rows


@pytest.mark.slow
def test_sigkill_leaves_a_readable_checkpoint(arith, tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "train_rm.py"),
        "--dataset",
        arith,
        "--out_dir",
        str(tmp_path),
        "--max_iters",
        "100000",
        "--eval_interval",
        "1",
        "--eval_pairs",
        "8",
        "--batch_size",
        "8",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for delay in (0.0, 0.7, 1.9):  # seconds after a checkpoint first exists
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t0 = time.time()
        while not (tmp_path / "ckpt.pt").exists() and time.time() - t0 < 300:
            time.sleep(0.05)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        assert ckpt["step"] >= 1 and set(ckpt) >= {"model", "optimizer", "config", "rng"}
        cmd.append("--resume")  # later runs continue from the surviving checkpoint


def test_nan_loss_stops_and_keeps_last_checkpoint(arith, tmp_path, monkeypatch):
    real, calls = train_rm.PairObjective.forward, []

    def flaky(self, *batch):
        calls.append(1)
        out = real(self, *batch)
        if len(calls) > 3:  # step 3 blows up
            out["objective"] = out["objective"] * float("nan")
        return out

    monkeypatch.setattr(train_rm.PairObjective, "forward", flaky)
    with pytest.raises(FloatingPointError, match="loss is nan at step 3: stopping.*ckpt.pt"):
        run(arith, tmp_path, "--max_iters", 10, "--eval_interval", 2)
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 2


@pytest.mark.slow
def test_short_run_learns(arith, tmp_path):
    res = run(arith, tmp_path, "--max_iters", 200, "--warmup", 10, "--eval_interval", 200,
              "--eval_pairs", 300)  # fmt: skip
    # held out: the loss starts at log 2 = 0.693 (its standard error on 300 pairs about 0.01)
    # and chance's accuracy is 0.5 +- 0.03, the length baseline 0.48; measured after 200 steps:
    # loss 0.534 (AVX2) and 0.575 (scalar kernels), accuracy 0.653 and 0.660
    assert res["loss"] < 0.62 and res["acc"] > 0.58, res
    for f in ("ckpt.pt", "log.jsonl", "curves.png", "reward_hist.png"):
        assert (tmp_path / f).stat().st_size > 0
    rows = [json.loads(r) for r in open(tmp_path / "log.jsonl")]
    assert {"step", "split", "loss", "acc"} <= set(rows[0]) and {r["split"] for r in rows} == {
        "train",
        "eval",
    }


@pytest.mark.slow
def test_pack_and_bucket_flags(arith, tmp_path):
    """--pack computes each prompt once and must train the same weights as the plain forward;
    --bucket changes which pairs share a batch, so it is checked for running and learning only."""
    plain = ["--lm_coef", 0, "--max_iters", 4, "--batch_size", 8, *EXACT]
    run(arith, tmp_path / "plain", *plain)
    run(arith, tmp_path / "packed", *plain, "--pack")
    assert max_diff(weights(tmp_path / "plain"), weights(tmp_path / "packed")) < 1e-6
    assert grad_norms(tmp_path / "plain") == pytest.approx(
        grad_norms(tmp_path / "packed"), rel=1e-5
    )
    res = run(arith, tmp_path / "bucket", "--max_iters", 4, "--bucket", "--grad_ckpt")
    assert math.isfinite(res["loss"])
    with pytest.raises(ValueError, match="--pack.*--lm_coef 0"):
        run(arith, tmp_path / "bad", "--pack", "--max_iters", 1)


def test_balance_flag_draws_balanced_epochs(arith, tmp_path):
    """--balance length: an epoch's draws hold as many chosen-longer as chosen-shorter pairs (to
    the sampling noise), bucketed or not, and the run trains on them."""
    res = run(arith, tmp_path / "bal", "--max_iters", 3, "--balance", "subset+length", "--bucket")
    assert math.isfinite(res["loss"])
    _, _, (train,) = open_dataset(arith, "train")
    _, c, r = np.diff(train.offsets, axis=1).T
    side = np.sign(c - r)
    assert (side[side != 0] > 0).mean() < 0.4  # the data itself is not balanced
    for bucket in (False, True):
        order = data.pairs.epoch_order(train, 5, 32, bucket, False, "length").numpy()
        assert len(order) == len(train)
        drawn = side[order][side[order] != 0]
        n = len(drawn)
        assert abs((drawn > 0).mean() - 0.5) < 5 * (0.25 / n) ** 0.5, (drawn > 0).mean()


def test_evaluate_once_per_eval_and_rewards_in_pair_order(arith, tmp_path, monkeypatch):
    """The final metrics and the histogram come from the loop's last evaluation (no second
    one), and evaluate's per-pair rewards are forward_pair's, in the data's order."""
    real, calls = train_rm.evaluate, []
    monkeypatch.setattr(train_rm, "evaluate", lambda *a, **k: calls.append(k) or real(*a, **k))
    res = run(arith, tmp_path, "--max_iters", 3, "--eval_interval", 100)
    assert [k["return_rewards"] for k in calls] == [False, True]  # steps 0 and 3
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["data_meta"] == json.load(open(os.path.join(arith, "meta.json")))
    assert ckpt["tokenizer"] == ckpt["data_meta"]["tokenizer"] and "data_position" not in ckpt

    rm, val = (
        load_reward_model(tmp_path / "ckpt.pt")[0],
        PairDataset(os.path.join(arith, "val.npz")),
    )
    cfg = train_rm.TrainConfig(**ckpt["train_config"])
    pad_id = ckpt["data_meta"]["pad_id"]
    metrics, rewards = real(rm, val, pad_id, cfg.batch_size, cfg.eval_pairs, return_rewards=True)
    assert metrics == pytest.approx(res) and rewards.shape == (64, 2)
    assert metrics["acc"] == pytest.approx((rewards[:, 0] > rewards[:, 1]).float().mean().item())
    b = val.collate([5, 6, 7], ckpt["data_meta"]["pad_id"])
    with torch.no_grad():
        r_c, r_r = rm.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask)
    assert torch.allclose(rewards[5:8], torch.stack([r_c, r_r], 1), atol=1e-6)


def test_train_layers_freezes_the_bottom(arith, tmp_path, capsys):
    """--train_layers 1: only the top layer, the final norm and the head change; the embeddings
    and the bottom layers stay as they were, and the optimizer holds none of them."""
    common = ["--max_iters", 2, "--eval_interval", 100, "--lm_coef", 0, "--center_coef", 0.1]
    run(arith, tmp_path, *common, "--train_layers", 1)
    cfg = train_rm.parse_args(["--dataset", arith, *map(str, common)])
    torch.manual_seed(cfg.seed)  # the initial weights, as main() builds them
    before = nanorm.build.build_model(cfg, json.load(open(os.path.join(arith, "meta.json"))))
    before, after = before.state_dict(), weights(tmp_path)
    top = "backbone.layers.3."  # --model nano has 4 layers
    trained = {k for k in after if k.startswith((top, "backbone.norm.", "head."))}
    assert trained and all(not torch.equal(before[k], after[k]) for k in trained)
    assert all(torch.equal(before[k], after[k]) for k in after if k not in trained)
    n_train = sum(after[k].numel() for k in trained)
    assert (
        f"{n_train:,} of them train (the top 1 layers, final norm and head)"
        in capsys.readouterr().out
    )
    opt = torch.load(tmp_path / "ckpt.pt", weights_only=True)["optimizer"]
    assert sum(len(g["params"]) for g in opt["param_groups"]) == len(trained)
    with pytest.raises(ValueError, match="--train_layers 5: the model has 4 layers"):
        run(arith, tmp_path / "bad", "--train_layers", 5, "--max_iters", 1)


# llama.cpp's tensor names for Meta's
GGUF_NAMES = {"tok_embeddings": "token_embd", "norm": "output_norm", "output": "output"}
GGUF_LAYER_NAMES = {
    "attention.wq": "attn_q",
    "attention.wk": "attn_k",
    "attention.wv": "attn_v",
    "attention.wo": "attn_output",
    "feed_forward.w1": "ffn_gate",
    "feed_forward.w2": "ffn_down",
    "feed_forward.w3": "ffn_up",
    "attention_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
}


def gguf_name(meta_name):
    if meta_name.startswith("layers."):
        _, i, rest = meta_name.removesuffix(".weight").split(".", 2)
        return f"blk.{i}.{GGUF_LAYER_NAMES[rest]}.weight"
    return f"{GGUF_NAMES[meta_name.removesuffix('.weight')]}.weight"


def write_gguf(model, path):
    """A Transformer as a GGUF file written by the gguf package: F32 tensors under llama.cpp's
    names, the llama.* keys, no tokenizer (so --init checks the vocabulary by size only)."""
    gg = pytest.importorskip("gguf", reason="the gguf package writes the file")
    c, w = model.config, gg.GGUFWriter(str(path), "llama")
    w.add_embedding_length(c.dim)
    w.add_block_count(c.n_layers)
    w.add_context_length(c.max_seq_len)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_feed_forward_length(c.hidden_dim)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_rope_freq_base(c.rope_theta)
    for k, t in model.state_dict().items():
        w.add_tensor(gguf_name(k), t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_init_from_a_gguf_file(arith, tmp_path):
    """--init reads any checkpoint the one dispatch reads; here a tiny LLaMA written as GGUF by
    the gguf package (F32 tensors under llama.cpp's names)."""
    base = tiny_model(vocab_size=320, tie_embeddings=False)  # arith's vocabulary is 320
    c, path = base.config, write_gguf(base, tmp_path / "tiny.gguf")

    res = run(arith, tmp_path / "out", "--init", path, "--max_iters", 1)
    assert math.isfinite(res["loss"])
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["dim"] == c.dim and ckpt["config"]["vocab_size"] == 320
    emb = ckpt["model"]["backbone.tok_embeddings.weight"]
    assert (emb - base.tok_embeddings.weight).abs().max() < 1e-2  # one small step from the file
