"""calibrate.py: the length fit against numpy's least squares, the normalization, and one stored
calibration served identically by eval_rm.py, score.py and an HF export's config.json."""

import json
import re
import shutil

import numpy as np
import pytest
import torch

import eval_rm
import nanorm.calibrate as calibrate
import nanorm.report as report
import train_rm
from data.arith.prepare import main as prepare_arith
from data.pairs import PairDataset
from nanorm.base.command import run as run_command
from nanorm.ckpt import load_reward_model
from nanorm.score import main as score_main


def test_fit_recovers_the_slope_and_removes_the_correlation():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 400, (2000, 2), generator=g)
    quality = torch.randn(2000, 2, generator=g, dtype=torch.float64)
    rewards = quality + 0.5 * lengths.double().log() + 3.0
    cal = calibrate.fit_length(rewards, lengths)
    b, a = np.polyfit(lengths.double().log().flatten().numpy(), rewards.flatten().numpy(), 1)
    assert cal["kind"] == "linear_log_length" and cal["n"] == 4000
    assert cal["coef"] == pytest.approx([a, b], abs=1e-10)  # the closed form is least squares
    assert cal["coef"][1] == pytest.approx(0.5, abs=0.05)  # and finds the slope put in
    fixed = calibrate.apply_length(cal, rewards, lengths)
    corr = lambda r, x: np.corrcoef(r.flatten().numpy(), x.flatten().double().numpy())[0, 1]
    assert corr(rewards, lengths.double().log()) > 0.3  # before: clearly correlated
    assert abs(corr(fixed, lengths.double().log())) < 1e-9  # least squares: residuals orthogonal
    assert abs(corr(fixed, lengths)) < 0.05  # raw lengths too, nearly
    assert abs(fixed.mean().item()) < 1e-10
    with pytest.raises(ValueError, match="two different lengths"):
        calibrate.fit_length(rewards[:3], torch.full((3, 2), 7))


def test_normalization_and_what_is_served():
    r = torch.tensor([[1.0, -1.0], [3.0, 1.0]])
    norm = calibrate.normalization(r, calibrated=False)
    assert norm["mean"] == 1.0 and norm["std"] == pytest.approx(np.std([1, -1, 3, 1], ddof=1))
    z = calibrate.normalize(norm, r)
    assert z.mean().item() == pytest.approx(0) and z.std().item() == pytest.approx(1)
    assert calibrate.normalize(dict(mean=2.0, std=0.0), 5.0).item() == 3.0  # never / 0
    cal = {"kind": "linear_log_length", "coef": [1.0, 2.0], "n": 4}
    record = {"length_calibration": cal}
    assert calibrate.served(record, 4.0, 1).item() == 3.0  # log 1 = 0: minus a
    with pytest.raises(ValueError, match="no reward normalization"):
        calibrate.served(record, 4.0, 1, normalized=True)
    record["reward_normalization"] = norm  # measured without the calibration now stored
    with pytest.raises(ValueError, match="without the length calibration"):
        calibrate.served(record, 4.0, 1, normalized=True)
    record["reward_normalization"] = dict(norm, calibrated=True)
    assert calibrate.served(record, 4.0, 1, normalized=True).item() == pytest.approx(
        (3.0 - 1.0) / norm["std"]
    )
    with pytest.raises(ValueError, match="unknown length calibration"):
        calibrate.apply_length({"kind": "lowess"}, 1.0, 1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(arith dataset, a checkpoint trained a few steps on it)."""
    d = tmp_path_factory.mktemp("arith")
    prepare_arith(["--out_dir", str(d), "--n_train", "300", "--n_val", "60"])
    out = tmp_path_factory.mktemp("run")
    train_rm.main(
        ["--dataset", str(d), "--out_dir", str(out), "--max_iters", "4", "--batch_size", "16"]
        + ["--eval_interval", "4", "--eval_pairs", "60", "--eval_first", "false"]
    )
    return str(d), str(out / "ckpt.pt")


def printed_reward(capsys, *argv):
    score_main([str(a) for a in argv])
    return float(re.search(r"reward: (\S+)", capsys.readouterr().out).group(1))


@pytest.mark.slow
def test_stored_calibration_is_served_alike_everywhere(run, tmp_path, capsys):
    data, original = run
    ckpt = str(tmp_path / "ckpt.pt")
    shutil.copy(original, ckpt)  # never the fixture's own
    raw = eval_rm.main(["--ckpt", ckpt, "--data", data, "--out", str(tmp_path / "raw")])
    assert raw["length_calibration"] is None
    fitted = eval_rm.main(
        ["--ckpt", ckpt, "--data", data, "--out", str(tmp_path / "cal"), "--calibrate_length"]
        + ["--calibration_data", data, "--save_calibration"]
    )
    # the fit is on the TRAINING pairs: the same numbers from their rewards, scored here
    rm, _ = load_reward_model(original)
    train = PairDataset(f"{data}/train.npz")
    _, r = eval_rm.evaluate(rm, train, 2, 64, return_rewards=True)
    want = calibrate.fit_length(r, report.response_lengths(train, len(train)))
    stored = torch.load(ckpt, weights_only=True)
    assert stored["length_calibration"]["coef"] == pytest.approx(want["coef"], abs=1e-6)
    assert stored["reward_normalization"] == fitted["reward_normalization"]
    assert stored["reward_normalization"]["calibrated"] is True
    assert fitted["overall"]["length_corr"] != raw["overall"]["length_corr"]
    # stored: applied by default; false: the raw report again
    again = eval_rm.main(["--ckpt", ckpt, "--data", data, "--out", str(tmp_path / "again")])
    assert again["overall"] == fitted["overall"]
    off = ["--ckpt", ckpt, "--data", data, "--out", str(tmp_path / "off")]
    assert eval_rm.main([*off, "--calibrate_length", "false"])["overall"] == raw["overall"]

    # one pair as raw text: eval_rm's mean chosen reward of 1 pair = score.py's reward
    pair = {"prompt": "What is 12 + 7?", "chosen": " The answer is 19.", "rejected": " 20"}
    with open(tmp_path / "one.jsonl", "w") as f:
        f.write(json.dumps(pair) + "\n")
    one = ["--data", str(tmp_path / "one.jsonl"), "--out", str(tmp_path / "one")]
    ev = eval_rm.main(["--ckpt", ckpt, *one])["overall"]
    score = ["--ckpt", ckpt, "--prompt", pair["prompt"], "--response", pair["chosen"]]
    assert printed_reward(capsys, *score) == pytest.approx(ev["mean_chosen"], abs=1e-5)
    norm = stored["reward_normalization"]
    z = (ev["mean_chosen"] - norm["mean"]) / norm["std"]
    assert printed_reward(capsys, *score, "--normalize") == pytest.approx(z, abs=1e-5)

    # the export records both (its raw outputs are uncalibrated); eval_rm applies them to it
    score_main(["--ckpt", ckpt, "--export_hf", str(tmp_path / "hf")])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["nanorm_reward"]["applied"] is False
    for key in ("length_calibration", "reward_normalization"):
        assert config["nanorm_reward"][key] == stored[key]
    hf = eval_rm.main(["--ckpt", str(tmp_path / "hf"), *one])["overall"]
    assert hf["mean_chosen"] == pytest.approx(ev["mean_chosen"], abs=1e-4)


def test_normalize_without_stored_stats_is_one_line(run, capsys):
    _, ckpt = run
    with pytest.raises(SystemExit):
        run_command(
            score_main, ["--ckpt", ckpt, "--prompt", "1 + 1?", "--response", " 2", "--normalize"]
        )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--save_calibration" in err
