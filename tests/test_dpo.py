"""DPO's implicit reward against a plain token-by-token loop, its loss against the closed form and
the pairwise loss, its start (the policy is the reference: rewards 0, loss log 2), a few steps
that learn, and its checkpoint read back by the one reader and by eval_rm.py."""

import contextlib
import copy
import json
import math
import sys

import pytest
import torch
from conftest import CHOSEN, PROMPTS, REJECTED, ROOT, pad, tiny_model

import eval_rm
from data.pairs import open_dataset
from nanorm import dpo
from nanorm.base.command import UsageError, run
from nanorm.ckpt import load_reward_model, save_checkpoint
from reward import SCORINGS, ImplicitReward, RewardModel, dpo_loss, pairwise_loss

BETA = 0.3


def moved(model, seed=1, scale=0.05):
    """A copy of model with every weight moved a little: a policy that is not its reference."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return other


def plain_reward(policy, reference, prompt, response, scoring):
    """The implicit reward of one unpadded row, one response token at a time, in float64."""
    ids = torch.tensor([prompt + response])

    def logp(model):
        logits = model(ids)[0].double()  # (T, vocab)
        return sum(
            torch.log_softmax(logits[t - 1], -1)[ids[0, t]].item()
            for t in range(len(prompt), len(prompt) + len(response))
        )

    if scoring == "ref_free":
        return BETA * logp(policy)
    ratio = logp(policy) - logp(reference)
    return BETA * (ratio if scoring == "sum" else ratio / len(response))


def rows(side):
    """The fixture pairs' chosen rows then rejected rows, padded on side, with their response
    masks: (tokens, mask, response_mask), each (4, T)."""
    responses = CHOSEN + REJECTED
    prompts = PROMPTS + PROMPTS
    tokens, mask = pad([p + r for p, r in zip(prompts, responses, strict=True)], side)
    flags = [[0] * len(p) + [1] * len(r) for p, r in zip(prompts, responses, strict=True)]
    response, _ = pad(flags, side)
    return tokens, mask, response


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("scoring", SCORINGS)
def test_implicit_reward_is_a_plain_loop(side, scoring):
    reference = tiny_model()
    policy = moved(reference)
    ir = ImplicitReward(policy, copy.deepcopy(reference), BETA, scoring)
    got = ir(*rows(side))
    rows_ = zip(PROMPTS + PROMPTS, CHOSEN + REJECTED, strict=True)
    want = [plain_reward(policy, reference, p, r, scoring) for p, r in rows_]
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=1e-5)
    # the pair call is the same numbers, its halves in order
    r_c, r_r = ir.forward_pair(*pair(*rows("right")))
    assert torch.allclose(torch.cat([r_c, r_r]), got, atol=1e-5)


def pair(tokens, mask, response):
    """The 4 rows of rows() as forward_pair's six arguments (2 pairs)."""
    return tokens[:2], mask[:2], tokens[2:], mask[2:], response[:2], response[2:]


def test_dpo_loss_is_the_closed_form_and_the_pairwise_loss():
    c, r = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    ref_c, ref_r = torch.tensor([-1.5, -2.0]), torch.tensor([-2.0, -1.5])
    # margins 0.5 * ((0.5) - (-1)) = 0.75 and 0.5 * (0 - 0.5) = -0.25
    want = (math.log1p(math.exp(-0.75)) + math.log1p(math.exp(0.25))) / 2
    assert dpo_loss(c, r, ref_c, ref_r, beta=0.5).item() == pytest.approx(want, rel=1e-6)
    as_rewards = pairwise_loss("logsig", 0.5 * (c - ref_c), 0.5 * (r - ref_r))
    assert torch.equal(dpo_loss(c, r, ref_c, ref_r, beta=0.5), as_rewards)
    # ImplicitReward.loss is pairwise_loss on its own sum rewards
    reference = tiny_model()
    ir = ImplicitReward(moved(reference), reference, BETA)
    loss, stats = ir.loss(*pair(*rows("right")))
    r_c, r_r = ir.forward_pair(*pair(*rows("right")))
    assert loss.item() == pytest.approx(pairwise_loss("logsig", r_c, r_r).item(), rel=1e-6)
    assert torch.allclose(stats["r_chosen"], r_c.detach())


def test_at_the_start_every_reward_is_zero_and_the_loss_log_2():
    policy = tiny_model()
    ir = ImplicitReward(policy, copy.deepcopy(policy), BETA)
    for side in ("right", "left"):
        scores = ir.scores(*rows(side))
        assert torch.equal(scores["sum"], torch.zeros(4))  # exactly: the same computation
        assert torch.equal(scores["mean"], torch.zeros(4))
        assert (scores["ref_free"] < 0).all()  # the policy alone: a log-probability
    loss, stats = ir.loss(*pair(*rows("right")))
    assert loss.item() == pytest.approx(math.log(2), rel=1e-7)
    assert stats["accuracy"] == 0  # a tie is not a right ranking


def test_a_few_dpo_steps_raise_the_margin():
    policy = tiny_model()
    ir = ImplicitReward(policy, copy.deepcopy(policy), BETA).train()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    batch = pair(*rows("right"))
    losses, margins = [], []
    for _ in range(8):
        loss, stats = ir.loss(*batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        margins.append((stats["r_chosen"] - stats["r_rejected"]).mean().item())
    assert margins[0] == 0 and margins[-1] > 0.1, margins
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(not p.requires_grad for p in ir.reference.parameters())


def test_eval_rm_reads_a_dpo_checkpoint(tmp_path):
    """The ckpt.pt nanorm.dpo writes: the one reader gives back its implicit reward (policy,
    reference, beta, scoring), eval_rm.py reports its accuracy, and a reward model may start
    from its policy."""
    d, meta, (val,) = open_dataset("arith", "val")
    reference = tiny_model(vocab_size=meta["vocab_size"])
    ir = ImplicitReward(moved(reference, scale=0.2), reference, BETA, "mean").eval()
    path = tmp_path / "dpo.pt"
    save_checkpoint(path, ir, meta)
    back, record = load_reward_model(path)
    assert isinstance(back, ImplicitReward) and (back.beta, back.scoring) == (BETA, "mean")
    assert record["kind"] == "ImplicitReward"
    n = 40
    direct = dpo.held_out_accuracy(ir, val, meta["pad_id"], n)
    assert direct == dpo.held_out_accuracy(back, val, meta["pad_id"], n)
    res = eval_rm.main(["--ckpt", str(path), "--data", d, "--out", str(tmp_path / "eval"),
                        "--max_pairs", str(n), "--batch_size", "16"])  # fmt: skip
    assert res["overall"]["n"] == n and res["overall"]["accuracy"] == direct["mean"]
    with torch.no_grad():  # and the same as forward_pair on the batch, counted by hand
        b = val.collate(range(n), meta["pad_id"])
        r_c, r_r = ir.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask,
                                   b.chosen_response_mask, b.rejected_response_mask)  # fmt: skip
    assert (r_c > r_r).sum().item() / n == direct["mean"]
    rm = RewardModel(pretrained=str(path))  # the policy as a backbone; the reference left out
    assert torch.equal(rm.backbone.output.weight, ir.backbone.output.weight)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--beta", "0"], ["--beta", "> 0"]),
        (["--scoring", "max"], ["--scoring", "sum, mean, ref_free"]),
        (["--pairs", "10", "--batch_size", "32"], ["--pairs 10", "--batch_size"]),
    ],
)
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, args, words):
    with pytest.raises(SystemExit) as e:
        run(dpo.main, [*args, "--out_dir", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_a_tiny_run_writes_its_log_and_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = ["--out_dir", str(out), "--sft_steps", "2", "--max_steps", "3", "--batch_size", "4"]
    acc = dpo.main([*args, "--pairs", "16", "--eval_pairs", "8", "--log_interval", "1"])
    logged = [json.loads(line) for line in (out / "dpo.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1, 2, 3] and logged[-1]["held_out"] == acc
    assert logged[0]["loss"] == pytest.approx(math.log(2), rel=1e-6)  # policy == reference
    assert load_reward_model(out / "dpo.pt")[1]["train_config"]["max_steps"] == 3
    # a file of the user's where the log goes: refused in one line, the file kept
    user = tmp_path / "user"
    user.mkdir()
    (user / "dpo.jsonl").write_text("mine")
    with pytest.raises(UsageError, match="not a file nanoRM wrote"):
        dpo.main([*args, "--out_dir", str(user), "--cache_dir", str(out)])
    assert (user / "dpo.jsonl").read_text() == "mine"


def test_best_of_n_ranks_answers_by_an_implicit_reward():
    """bench/best_of_n.py's scoring takes a DPO policy's implicit reward as its proxy: each
    answer in the padded batch gets the reward it gets alone."""
    sys.path.insert(0, str(ROOT / "bench"))
    import best_of_n

    reference = tiny_model()
    ir = ImplicitReward(moved(reference), reference, BETA)
    prompt, answers = [1, 5, 9], [[7, 8, 2], [7, 2], [3, 4, 5, 6, 2]]
    batched = best_of_n.proxy_rewards(ir, prompt, answers, 0, contextlib.nullcontext())
    for a, r in zip(answers, batched, strict=True):
        alone = ir(torch.tensor([prompt + a]), None, torch.tensor([[0] * 3 + [1] * len(a)]))
        assert alone.item() == pytest.approx(r, abs=1e-5)
