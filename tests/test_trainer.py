"""RewardModelTrainer as ColossalChat's users call it (a model, optimizer, scheduler and loss
module built in Python, DataLoaders of ColossalChat's preference dicts), against a plain loop
written out here; the loss modules against their formulas; train_rm.py's own flags for it
(--save_interval, --log_dir, --wandb) and --init from its own ckpt.pt."""

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model
from torch.utils.data import DataLoader

import train_rm
from data.arith.prepare import main as prepare_arith
from data.pairs import PairDataset, as_batch
from nanorm.base.command import UsageError
from reward import LMRegularizedRewardModel, LogExpLoss, LogSigLoss, PairwiseLoss, RewardModel
from train_rm import RewardModelTrainer


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    d = tmp_path_factory.mktemp("arith")
    prepare_arith(["--out_dir", str(d), "--n_train", "256", "--n_val", "64"])
    return str(d)


def colossal_dicts(split, vocab):
    """A split's pairs as ColossalChat's collator yields them: one dict per batch of 8, with
    chosen_input_ids, chosen_attention_mask, reject_input_ids, reject_attention_mask
    (right-padded), the token ids folded into the tiny model's vocabulary."""
    data = PairDataset(split)

    def collate(indices):
        b = data.collate(indices, 0)
        return dict(
            chosen_input_ids=b.chosen % vocab,
            chosen_attention_mask=b.chosen_mask,
            reject_input_ids=b.rejected % vocab,
            reject_attention_mask=b.rejected_mask,
        )

    return DataLoader(range(len(data)), batch_size=8, shuffle=False, collate_fn=collate)


def colossal_setup(seed=0):
    """ColossalChat's usage: the model, AdamW, a cosine schedule over the optimizer steps."""
    model = tiny_model(RewardModel, seed=seed).train()
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=16, eta_min=3e-4)
    return model, optim, lr_scheduler


def test_colossalchat_usage_example(arith, tmp_path):
    """ColossalChat's example, its ColossalAI-only arguments (booster, plugin, coordinator) left
    out: the scheduler steps once per optimizer step, numbered checkpoints every save_interval
    steps beside the resumable ckpt.pt, each evaluation a row of log.jsonl, and it learns."""
    train_dl = colossal_dicts(os.path.join(arith, "train.npz"), 61)
    eval_dl = colossal_dicts(os.path.join(arith, "val.npz"), 61)
    model, optim, lr_scheduler = colossal_setup()
    booster = plugin = coordinator = None  # ColossalAI's; torchrun stands in for them here
    trainer = RewardModelTrainer(
        model,
        booster,
        optim,
        plugin,
        lr_scheduler,
        None,
        loss_fn=LogSigLoss(beta=0.1),
        max_epochs=2,
        accumulation_steps=2,
        start_epoch=0,
        save_interval=8,
        save_dir=str(tmp_path),
        coordinator=coordinator,
    )
    trainer.fit(
        train_preference_dataloader=train_dl,
        eval_preference_dataloader=eval_dl,
        log_dir=None,
        use_wandb=False,
    )
    steps = 2 * len(train_dl) // 2  # 32 batches an epoch, 2 micro-batches a step
    assert trainer.step == steps and lr_scheduler.last_epoch == steps
    assert sorted(os.listdir(tmp_path)) == ["ckpt-16.pt", "ckpt-24.pt", "ckpt-32.pt", "ckpt-8.pt",
                                            "ckpt.pt", "eval_result_epoch0.txt",
                                            "eval_result_epoch1.txt", "log.jsonl"]  # fmt: skip
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    evals = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [16, 32]  # each epoch's end
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 32 and ckpt["lr_scheduler"]["last_epoch"] == 32
    assert torch.equal(ckpt["model"]["head.weight"], model.head.weight.detach())
    first = next(r for r in rows if r["split"] == "train")
    assert evals[-1]["loss"] < first["loss"]


def test_fit_equals_a_plain_loop(arith):
    """The weights after fit equal those of the loop written out here: concatenate chosen and
    rejected for one forward, the loss over accumulation_steps micro-batches, the global norm
    clipped to 1, AdamW's step, the scheduler's step."""
    train_dl = colossal_dicts(os.path.join(arith, "train.npz"), 61)
    model, optim, sched = colossal_setup(seed=3)
    trainer = RewardModelTrainer(model, optimizer=optim, lr_scheduler=sched, loss_fn=LogExpLoss(),
                                 accumulation_steps=4)  # fmt: skip
    trainer.fit(train_dl)

    ref, optim, sched = colossal_setup(seed=3)
    batches = list(train_dl)
    for k in range(0, len(batches) - len(batches) % 4, 4):
        for b in batches[k : k + 4]:
            ids = torch.cat([b["chosen_input_ids"], b["reject_input_ids"]])
            mask = torch.cat([b["chosen_attention_mask"], b["reject_attention_mask"]])
            r = ref(ids, mask)
            c, j = r.chunk(2)
            # log(1 + e^(j - c)) as logaddexp (the formula is checked below): Adam turns the
            # last bit of a near-zero gradient into a whole step, so the same sum is asked for
            (torch.logaddexp(torch.zeros_like(c), j - c).mean() / 4).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        optim.step()
        optim.zero_grad()
        sched.step()
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        assert torch.equal(a, b), (name, (a - b).abs().max())


def test_a_loss_module_of_the_users_own_is_what_trains(arith):
    """Any loss_fn(chosen_reward, reject_reward) is the pairwise loss fit logs and trains."""

    class Hinge(torch.nn.Module):
        def forward(self, chosen_reward, reject_reward):
            return F.relu(1 - (chosen_reward - reject_reward)).mean()

    train_dl = colossal_dicts(os.path.join(arith, "train.npz"), 61)
    model, optim, sched = colossal_setup()
    trainer = RewardModelTrainer(model, optimizer=optim, lr_scheduler=sched, loss_fn=Hinge())
    model.eval()
    b = next(iter(train_dl))
    with torch.no_grad():
        c = model(b["chosen_input_ids"], b["chosen_attention_mask"])
        r = model(b["reject_input_ids"], b["reject_attention_mask"])
    model.train()
    out = trainer.step_fn(as_batch(b))
    torch.testing.assert_close(out["rm_loss"], F.relu(1 - (c - r)).mean(), rtol=1e-5, atol=1e-6)


def test_loss_modules_are_the_formulas():
    c, r = torch.randn(64) * 3, torch.randn(64) * 3
    torch.testing.assert_close(LogSigLoss()(c, r), -F.logsigmoid(c - r).mean())
    torch.testing.assert_close(LogExpLoss()(c, r), torch.log(1 + torch.exp(r - c)).mean())
    assert LogSigLoss(beta=0.5).beta == 0.5  # ColossalChat's argument, kept
    # where the literal formula overflows, the module stays finite and exact: d = -1e4
    c, r = torch.tensor([0.0]), torch.tensor([1e4])
    assert torch.isinf(torch.log(1 + torch.exp(r - c))).all()
    assert LogExpLoss()(c, r).item() == pytest.approx(1e4)
    assert LogSigLoss(margin=2.0)(torch.tensor([2.0]), torch.tensor([0.0])).item() == pytest.approx(
        F.softplus(torch.tensor(0.0)).item()
    )
    with pytest.raises(ValueError, match="unknown loss"):
        PairwiseLoss("hinge")


def test_loggers_name_their_package(arith, tmp_path):
    """--log_dir (TensorBoard) and --wandb: the events are written where the package is
    installed; where it is not, one line naming the pip package."""
    model, optim, sched = colossal_setup()
    dl = colossal_dicts(os.path.join(arith, "val.npz"), 61)
    trainer = RewardModelTrainer(model, optimizer=optim, lr_scheduler=sched, log_interval=1)
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match="pip install tensorboard"):
            trainer.fit(dl, log_dir=str(tmp_path / "tb"))
    else:
        trainer.fit(dl, log_dir=str(tmp_path / "tb"))
        assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tb"))
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match="pip install wandb"):
            trainer.fit(dl, use_wandb=True)


@pytest.mark.slow
def test_script_keeps_numbered_checkpoints_and_trains_on_from_its_own(arith, tmp_path):
    """train_rm.py --save_interval keeps ckpt-<step>.pt; --init out/ckpt.pt starts a new run
    from the trained reward model, head included: its step-0 evaluation is the first run's
    last."""
    common = ["--dataset", arith, "--eval_pairs", "64", "--dtype", "float32", "--lm_coef", "0"]
    first = train_rm.main(
        [
            *common,
            "--out_dir",
            str(tmp_path / "a"),
            "--max_iters",
            "12",
            "--save_interval",
            "4",
            "--eval_interval",
            "12",
        ]  # fmt: skip
    )
    names = sorted(os.listdir(tmp_path / "a"))
    assert {"ckpt-4.pt", "ckpt-8.pt", "ckpt-12.pt", "ckpt.pt"} <= set(names)
    train_rm.main(
        [
            *common,
            "--out_dir",
            str(tmp_path / "b"),
            "--max_iters",
            "2",
            "--init",
            str(tmp_path / "a" / "ckpt.pt"),
        ]  # fmt: skip
    )
    rows = [json.loads(line) for line in open(tmp_path / "b" / "log.jsonl")]
    start = next(r for r in rows if r["split"] == "eval" and r["step"] == 0)
    assert start["acc"] == first["acc"] and start["loss"] == pytest.approx(first["loss"], rel=1e-6)


# ----------------------------------------------------------------------------- ColossalChat's calls
def test_colossalchat_keywords_and_positional_order(arith, tmp_path):
    """ColossalChat's signature: (model, booster, optimizer, plugin, lr_scheduler, tokenizer,
    loss_fn, max_epochs, beta, accumulation_steps, start_epoch, save_interval, save_dir,
    coordinator), by keyword and by position; the same weights either way."""
    train_dl = colossal_dicts(os.path.join(arith, "val.npz"), 61)
    model, optim, sched = colossal_setup(seed=1)
    RewardModelTrainer(
        model=model, booster=None, optimizer=optim, plugin=None, lr_scheduler=sched,
        tokenizer=None, loss_fn=LogSigLoss(), max_epochs=1, beta=0.1, accumulation_steps=2,
        start_epoch=0, save_interval=0, save_dir=None, coordinator=None,
    ).fit(train_preference_dataloader=train_dl)  # fmt: skip
    other, optim, sched = colossal_setup(seed=1)
    RewardModelTrainer(other, None, optim, None, sched, None, LogSigLoss(), 1, 0.1, 2).fit(train_dl)
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_fit_trains_in_train_mode_and_evaluates_in_eval_mode(arith):
    """A model loaded in eval mode (as pretrained= loads it) trains with dropout on: fit puts it
    in train mode, and each evaluation in eval mode."""
    model, optim, sched = colossal_setup()
    model.eval()
    modes = []
    model.register_forward_pre_hook(lambda m, args: modes.append(m.training))
    train_dl = colossal_dicts(os.path.join(arith, "val.npz"), 61)
    RewardModelTrainer(model, optimizer=optim, lr_scheduler=sched, accumulation_steps=8).fit(
        train_dl, eval_preference_dataloader=train_dl
    )
    n = len(train_dl)  # 8 training forwards (one per micro-batch), then 8 evaluation ones
    assert modes[:n] == [True] * n and modes[n:] and not any(modes[n:])


def test_a_loss_of_one_value_per_pair_trains_on_its_mean(arith):
    """ColossalChat takes loss_fn(chosen_reward, reject_reward).mean(): a loss_fn returning one
    loss per pair trains as its mean would."""

    def per_pair(chosen_reward, reject_reward):
        return -F.logsigmoid(chosen_reward - reject_reward)  # (B,)

    train_dl = colossal_dicts(os.path.join(arith, "val.npz"), 61)
    weights = []
    for loss_fn in (per_pair, LogSigLoss()):
        model, optim, sched = colossal_setup(seed=2)
        RewardModelTrainer(model, optimizer=optim, lr_scheduler=sched, loss_fn=loss_fn).fit(
            train_dl
        )
        weights.append(model.state_dict())
    for a, b in zip(weights[0].values(), weights[1].values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_lm_regularized_model_trains_without_options(arith, tmp_path):
    """LLMBook's model in ColossalChat's trainer: its loss is rm_loss + lm_loss (lm_coef 1), no
    options needed; the LM term is logged."""
    model = tiny_model(LMRegularizedRewardModel, seed=0).train()
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_dl = colossal_dicts(os.path.join(arith, "val.npz"), 61)
    trainer = RewardModelTrainer(model, optimizer=optim, save_dir=str(tmp_path))
    trainer.fit(train_dl)
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert rows and all("lm_loss" in r and math.isfinite(r["lm_loss"]) for r in rows)


def test_save_interval_without_save_dir_is_refused_at_once():
    model, optim, sched = colossal_setup()
    with pytest.raises(UsageError, match="save_dir"):
        RewardModelTrainer(model, optimizer=optim, save_interval=5)


def test_a_short_fit_logs_its_training_rows_and_writes_colossalchat_eval_files(arith, tmp_path):
    """A fit logs every step by default, as ColossalChat does; with a log_interval longer than
    the fit, a row at each epoch's end: to log.jsonl and TensorBoard. Each epoch's evaluation
    is written to save_dir/eval_result_epoch<N>.txt, where ColossalChat writes it."""
    pytest.importorskip("tensorboard", reason="TensorBoard's events need the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dl = colossal_dicts(os.path.join(arith, "val.npz"), 61)  # 8 batches: 4 steps an epoch
    model, optim, sched = colossal_setup()
    every = RewardModelTrainer(
        model, optimizer=optim, accumulation_steps=2, save_dir=str(tmp_path / "e")
    )
    every.fit(dl)
    rows = [json.loads(line) for line in open(tmp_path / "e" / "log.jsonl")]
    assert [(r["step"], r["steps"]) for r in rows if r["split"] == "train"] == [
        (s, 1) for s in range(1, 5)
    ]
    model, optim, sched = colossal_setup()
    options = dict(max_epochs=2, accumulation_steps=2, save_dir=str(tmp_path), log_interval=25)
    trainer = RewardModelTrainer(model, optimizer=optim, lr_scheduler=sched, **options)
    trainer.fit(dl, eval_preference_dataloader=dl, log_dir=str(tmp_path / "tb"))
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    train = [r for r in rows if r["split"] == "train"]
    assert [(r["step"], r["steps"]) for r in train] == [(4, 4), (8, 4)]
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [4, 8]
    assert [e.step for e in events.Scalars("eval/acc")] == [4, 8]
    for epoch, row in enumerate(r for r in rows if r["split"] == "eval"):
        text = (tmp_path / f"eval_result_epoch{epoch}.txt").read_text().splitlines()
        assert text[0] == "Evaluation Result:"
        assert float(text[1].removeprefix("loss: ")) == pytest.approx(row["loss"])
        distance = float(text[4].removeprefix("distance: "))
        assert distance == pytest.approx(row["chosen"] - row["rejected"])
