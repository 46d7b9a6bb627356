"""--subset_experts (nanorm/subset_experts.py): one model learns two subsets whose preferences
conflict, where one head cannot; its gate names the subset from the text alone; its rewards are
the same whichever way a pair is laid out; checkpoints keep the number of experts; train_rm runs
it on data prepared from several sources and refuses data without subsets in one line."""

import json
import random

import pytest
import torch
from conftest import pad, tiny_config

import train_rm
from data.pairs import pack_pairs
from nanorm.base.command import UsageError
from nanorm.ckpt import load_reward_model, save_checkpoint
from nanorm.subset_experts import SubsetExpertsRewardModel
from reward import RewardModel, new_head

GOOD, BAD, EOS = 3, 4, 2
TOPIC = (5, 6)  # the prompt token that tells the subsets apart


def subset_pairs(rng, n):
    """(pairs, groups): subset 0 prefers the response holding GOOD, subset 1 the one holding
    BAD (HH-RLHF's helpful and harmless subsets in miniature: the same contrast, opposite
    tastes); a prompt says its subset by one token among fillers."""
    out, groups = [], []
    for _ in range(n):
        g = rng.randrange(2)
        prompt = [1, *(rng.randrange(10, 32) for _ in range(rng.randint(0, 3))), TOPIC[g]]
        good, bad = ([rng.randrange(10, 32) for _ in range(rng.randint(1, 5))] for _ in "gb")
        good.insert(rng.randrange(len(good) + 1), GOOD)
        bad.insert(rng.randrange(len(bad) + 1), BAD)
        c, r = (good, bad) if g == 0 else (bad, good)
        out.append((prompt, c + [EOS], r + [EOS]))
        groups.append(g)
    return out, torch.tensor(groups)


def packed(items, groups):
    b = pack_pairs([[torch.tensor(x).numpy() for x in item] for item in items], pad_id=0)
    b.groups = groups
    return b


def fit_heads(model, items, groups, steps=300, bs=32):
    """Train the heads alone on the frozen backbone (what the heads can do with fixed features)."""
    model.requires_grad_(False)
    heads = [model.head, *(getattr(model, k) for k in ("experts", "gate") if hasattr(model, k))]
    params = [p for h in heads for p in h.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=1e-2)
    for step in range(steps):
        i = (step * bs) % len(items)
        b = packed(items[i : i + bs], groups[i : i + bs])
        row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
        if isinstance(model, SubsetExpertsRewardModel):
            loss, _ = model.loss_packed(*row, groups=b.groups)
        else:
            loss, _ = model.loss_packed(*row)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def accuracy_per_subset(model, items, groups):
    b = packed(items, groups)
    r_c, r_r = model.forward_pair_packed(
        b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end
    )
    right = (r_c > r_r).float()
    return [right[groups == g].mean().item() for g in (0, 1)]


@pytest.mark.slow
def test_experts_learn_conflicting_subsets_where_one_head_cannot():
    rng = random.Random(0)
    train, g_train = subset_pairs(rng, 1600)
    val, g_val = subset_pairs(rng, 400)
    torch.manual_seed(0)
    backbone = SubsetExpertsRewardModel.from_config(tiny_config(vocab_size=32)).backbone
    experts = fit_heads(SubsetExpertsRewardModel(backbone, n_experts=2), train, g_train)
    plain = fit_heads(RewardModel(backbone), train, g_train)
    acc_experts = accuracy_per_subset(experts, val, g_val)
    acc_plain = accuracy_per_subset(plain, val, g_val)
    # measured: experts 0.90 / 0.84, one head 0.55 / 0.41 (a blur of both tastes)
    assert min(acc_experts) > 0.8, acc_experts
    assert max(acc_plain) < 0.65, acc_plain
    # the gate reads the subset from the text: the label is not an input at scoring time
    b = packed(val, g_val)
    ends = torch.stack([b.chosen_end, b.rejected_end], 1)
    with torch.no_grad():
        h = experts.packed_end_states(b.tokens, b.segments, b.positions, *ends.T, False, None)
        _, logits = experts.reward_and_gate(h)
    assert (logits.argmax(-1) == g_val[:, None]).float().mean() > 0.85  # measured 0.91, chance 0.5


def test_rewards_equal_across_layouts_and_start_as_the_plain_head():
    torch.manual_seed(0)
    model = SubsetExpertsRewardModel.from_config(tiny_config(vocab_size=32)).eval()
    with torch.no_grad():
        model.head.weight.normal_()
    items, groups = subset_pairs(random.Random(1), 6)
    plain = RewardModel(model.backbone).eval()
    plain.head = model.head
    chosen = [p + c for p, c, _ in items]
    # new experts are 0: the model is the plain reward model it was built on
    for side in ("right", "left"):
        torch.testing.assert_close(model(*pad(chosen, side)), plain(*pad(chosen, side)))
    with torch.no_grad():  # trained-looking experts and gate
        for layer in (model.experts, model.gate):
            layer.weight.normal_()
            layer.bias.normal_()
    b = packed(items, groups)
    r_c, r_r = model.forward_pair_packed(
        b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end
    )
    rejected = [p + r for p, _, r in items]
    for side in ("right", "left"):
        torch.testing.assert_close(r_c, model(*pad(chosen, side)), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r_r, model(*pad(rejected, side)), rtol=1e-5, atol=1e-5)
    # the packed and the padded losses are one objective
    c, cm = pad(chosen)
    rj, rm = pad(rejected)
    loss_plain, stats = model.loss(c, cm, rj, rm, groups=groups)
    row = (b.tokens, b.segments, b.positions, b.chosen_end, b.rejected_end)
    loss_packed, stats_packed = model.loss_packed(*row, groups=groups)
    torch.testing.assert_close(loss_plain, loss_packed, rtol=1e-5, atol=1e-6)
    assert stats["gate_acc"] == stats_packed["gate_acc"]
    with pytest.raises(ValueError, match="subset"):
        model.loss_packed(*row)


def test_checkpoint_keeps_its_number_of_experts(tmp_path):
    torch.manual_seed(0)
    model = SubsetExpertsRewardModel.from_config(tiny_config(vocab_size=32))
    model.set_experts(3)
    with torch.no_grad():
        for layer in (model.experts, model.gate):
            layer.weight.normal_()
    save_checkpoint(tmp_path / "ckpt.pt", model)
    loaded, _ = load_reward_model(tmp_path / "ckpt.pt")
    assert type(loaded) is SubsetExpertsRewardModel and loaded.experts.out_features == 3
    tokens, mask = pad([[1, 5, 11, 2], [1, 6, 12, 13, 2]])
    torch.testing.assert_close(loaded(tokens, mask), model.eval()(tokens, mask))
    assert new_head(32).weight.shape == (1, 32)  # the shared head is the plain one's
    from nanorm.export_hf import hf_state_dict

    with pytest.raises(ValueError, match="one linear score"):  # export would drop the experts
        hf_state_dict(loaded)


def write_source(path, rng, n, topic):
    """A preference file whose prompts carry `topic`; one file is one subset of the data."""
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append(
            dict(
                prompt=f"{topic}: {a} plus {b}?",
                chosen=f" {a + b}.",
                rejected=f" {a + b + rng.randint(1, 3)}.",
            )
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_train_rm_runs_subset_experts_and_refuses_data_without_subsets(tmp_path):
    from data.prepare import main as prepare

    rng = random.Random(0)
    srcs = [write_source(tmp_path / f"{t}.jsonl", rng, 60, t) for t in ("sum", "add")]
    tok = str(tmp_path / "tok")
    two = ["--src", *srcs, "--out_dir", tok + "-two", "--val_frac", "0.25", "--vocab_size", "290"]
    prepare(two)  # trains a small vocabulary
    tok_file = ["--tokenizer", tok + "-two/tok.model", "--val_frac", "0.25"]
    prepare(["--src", srcs[0], "--out_dir", tok + "-one", *tok_file])
    args = ["--lm_coef", "0", "--pack", "--subset_experts", "--max_iters", "4", "--batch_size", "4"]
    args += ["--eval_interval", "4", "--dtype", "float32", "--overwrite"]
    ev = train_rm.main(["--dataset", tok + "-two", "--out_dir", str(tmp_path / "a"), *args])
    assert 0 <= ev["acc"] <= 1
    loaded, _ = load_reward_model(tmp_path / "a" / "ckpt.pt")
    assert type(loaded) is SubsetExpertsRewardModel and loaded.experts.out_features == 2
    log = [json.loads(x) for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert any("gate_acc" in row for row in log if row["split"] == "train")
    with pytest.raises(UsageError, match="names no subsets"):
        train_rm.main(["--dataset", tok + "-one", "--out_dir", str(tmp_path / "b"), *args])
