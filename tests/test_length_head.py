"""--length_head (ODIN): on pairs where length is a spurious cue, the quality head correlates
less with length than a plain reward model trained the same way, and still ranks by quality;
train_rm runs it with --train_layers and --init x.gguf; checkpoints record the tokenizer."""

import random

import pytest
import torch
from conftest import pad, shared_path, tiny_config

import train_rm
from nanorm.ckpt import checkpoint_tokenizer, load_reward_model, save_checkpoint
from nanorm.length_head import LengthDebiasedRewardModel
from reward import RewardModel, pearson

GOOD, BAD, EOS = 3, 4, 2  # the one token that decides quality, and the end of each response


def response(rng, n, quality):
    """n filler tokens with GOOD or BAD at a random place, then EOS."""
    ids = [rng.randrange(10, 32) for _ in range(n)]
    ids.insert(rng.randrange(n + 1), quality)
    return ids + [EOS]


def pairs(rng, n, p_longer, p_good):
    """Pairs whose chosen response is the longer one with probability p_longer and holds GOOD
    (the rejected BAD) with probability p_good, independently: two imperfect cues of the label,
    as an annotator who mostly prefers quality and, separately, length."""
    out = []
    for _ in range(n):
        long, short = rng.randint(9, 14), rng.randint(2, 7)
        n_c, n_r = (long, short) if rng.random() < p_longer else (short, long)
        q_c, q_r = (GOOD, BAD) if rng.random() < p_good else (BAD, GOOD)
        out.append(([1, rng.randrange(10, 32)], response(rng, n_c, q_c), response(rng, n_r, q_r)))
    return out


def batch(items):
    T = max(len(p) + max(len(c), len(r)) for p, c, r in items)  # both halves one width
    chosen, cmask = pad([p + c for p, c, _ in items], T=T)
    rejected, rmask = pad([p + r for p, _, r in items], T=T)
    resp = torch.zeros_like(chosen)
    for i, (p, c, _) in enumerate(items):
        resp[i, len(p) : len(p) + len(c)] = 1
    return chosen, cmask, rejected, rmask, resp


def train(cls, data, steps=150, bs=16):
    torch.manual_seed(0)
    model = cls.from_config(tiny_config(vocab_size=32)).train()
    model.head.bias.requires_grad_(False)  # as train_rm does without centering
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for step in range(steps):
        b = batch(data[(step * bs) % len(data) :][:bs])
        if cls is LengthDebiasedRewardModel:
            loss, _ = model.loss(*b, length_coef=1.0)  # the weight this check was written at
        else:
            r_c, r_r = model.forward_pair(*b[:4])
            loss = -torch.nn.functional.logsigmoid(r_c - r_r).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def length_correlation_and_accuracy(model, rng):
    """On fresh responses whose length and quality are independent: corr(reward, length), and
    the accuracy on pairs where the chosen (GOOD) response is the shorter one."""
    seqs = [
        [1, 11] + response(rng, rng.randint(2, 14), rng.choice([GOOD, BAD])) for _ in range(300)
    ]
    r = model(*pad(seqs))
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.float)
    c, cm, rj, rm, _ = batch(pairs(rng, 200, p_longer=0.0, p_good=1.0))
    r_c, r_r = model.forward_pair(c, cm, rj, rm)
    return pearson(r, lengths).item(), (r_c > r_r).float().mean().item()


@pytest.mark.slow
def test_quality_head_is_less_correlated_with_length_than_a_plain_model():
    torch.set_num_threads(1)
    data = pairs(random.Random(0), 2400, p_longer=0.8, p_good=0.8)
    plain = train(RewardModel, data)
    odin = train(LengthDebiasedRewardModel, data)
    rho_plain, acc_plain = length_correlation_and_accuracy(plain, random.Random(1))
    rho_odin, acc_odin = length_correlation_and_accuracy(odin, random.Random(1))
    print(
        f"corr with length: plain {rho_plain:.3f}, quality head {rho_odin:.3f}; "
        f"accuracy when the chosen is shorter: plain {acc_plain:.3f}, ODIN {acc_odin:.3f}"
    )
    assert abs(rho_odin) < abs(rho_plain) - 0.1
    assert acc_odin >= acc_plain


def test_checkpoint_round_trip_keeps_both_heads(tmp_path):
    model = LengthDebiasedRewardModel.from_config(tiny_config())
    with torch.no_grad():
        model.length_head.weight.normal_()
    save_checkpoint(tmp_path / "rm.pt", model)
    back = LengthDebiasedRewardModel(pretrained=tmp_path / "rm.pt")  # both heads, e.g. to train on
    assert type(back) is LengthDebiasedRewardModel
    assert torch.equal(back.length_head.weight, model.length_head.weight)
    assert torch.equal(back.head.weight, model.head.weight)
    scorer, _ = load_reward_model(tmp_path / "rm.pt")  # scoring reads the quality head alone
    assert type(scorer) is RewardModel and torch.equal(scorer.head.weight, model.head.weight)
    x = torch.randint(1, 61, (2, 7))
    with torch.no_grad():
        assert torch.equal(scorer(x), back(x))


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    from data.arith.prepare import main as prepare_arith

    d = tmp_path_factory.mktemp("arith")
    prepare_arith(["--out_dir", str(d), "--n_train", "600", "--n_val", "64"])
    return str(d)


def test_train_rm_length_head_with_train_layers_and_gguf_init(arith, tmp_path):
    from test_train import tiny_model, write_gguf

    base = tiny_model(vocab_size=320, tie_embeddings=False)  # arith's vocabulary is 320
    path = write_gguf(base, tmp_path / "tiny.gguf")  # no tokenizer: a size check only

    out = tmp_path / "out"
    argv = [
        "--dataset",
        arith,
        "--out_dir",
        out,
        "--init",
        path,
        "--length_head",
        "--lm_coef",
        0,
        "--train_layers",
        1,
        "--max_iters",
        2,
        "--batch_size",
        8,
        "--eval_pairs",
        16,
    ]
    train_rm.main([str(a) for a in argv])
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["kind"] == "LengthDebiasedRewardModel"
    assert "length_head.weight" in ckpt["model"]
    rm, wq = load_reward_model(out / "ckpt.pt")[0], lambda m, i: m.layers[i].attention.wq.weight
    assert torch.equal(wq(rm.backbone, 0), wq(base, 0))  # frozen by --train_layers 1
    assert not torch.equal(wq(rm.backbone, 1), wq(base, 1))  # the top layer trained
    assert checkpoint_tokenizer(str(out / "ckpt.pt")).vocab_size == 320  # carried in the file

    with pytest.raises(ValueError, match="--lm_coef 0"):
        train_rm.main(["--dataset", arith, "--out_dir", str(tmp_path / "o2"), "--length_head"])


def test_init_refuses_data_of_another_vocabulary(arith, tmp_path):
    """SmolLM2's .gguf carries a BPE tokenizer; arith's data is SentencePiece: refused, naming both."""
    gguf = shared_path("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    argv = [
        "--dataset",
        arith,
        "--out_dir",
        str(tmp_path / "o"),
        "--init",
        str(gguf),
        "--lm_coef",
        "0",
    ]
    with pytest.raises(ValueError, match="tokenized with") as e:
        train_rm.main(argv)
    assert str(gguf) in str(e.value) and "tok.model" in str(e.value)


def close(a, b, rtol=1e-5):
    """a == b up to rtol of the larger magnitude in them (fp32 sums in another order differ by
    a few ulps of the largest term, whatever the size of the smallest)."""
    return (a - b).abs().max() <= rtol * max(1.0, a.abs().max().item())


def test_packed_loss_equals_the_plain_one():
    """--pack with --length_head: the packed rows give the same loss, rewards and gradients."""
    from data.pairs import pack_pairs

    torch.manual_seed(0)
    rm = LengthDebiasedRewardModel.from_config(tiny_config())
    with torch.no_grad():
        rm.length_head.weight.normal_()
    items = [tuple(torch.tensor(x) for x in p) for p in pairs(random.Random(3), 5, 0.8, 0.8)]
    chosen, cmask = pad([torch.cat([p, c]).tolist() for p, c, _ in items])
    rejected, rmask = pad([torch.cat([p, r]).tolist() for p, _, r in items])
    response = torch.zeros_like(chosen)
    for i, (p, c, _) in enumerate(items):
        response[i, len(p) : len(p) + len(c)] = 1
    plain, stats = rm.loss(chosen, cmask, rejected, rmask, response, length_coef=0.7)
    grads = torch.autograd.grad(plain, list(rm.parameters()), allow_unused=True)
    b = pack_pairs([tuple(x.numpy() for x in it) for it in items], pad_id=0)
    row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
    packed, pstats = rm.loss_packed(*row, length_coef=0.7)
    pgrads = torch.autograd.grad(packed, list(rm.parameters()), allow_unused=True)
    assert torch.allclose(packed, plain, atol=1e-6)
    for k in ("r_chosen", "r_rejected", "rho_quality", "rho_length"):
        assert torch.allclose(pstats[k], stats[k], atol=1e-5), k
    for g, pg in zip(grads, pgrads, strict=True):
        # relative to the gradient's size: both sum the same terms in another order
        assert (g is None) == (pg is None) and (g is None or close(g, pg))
