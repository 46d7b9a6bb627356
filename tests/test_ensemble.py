"""nanorm/ensemble.py and rl.py's --members: best-of-N's estimator (rl.py's) against a plain loop over
every subset, Gao et al.'s fits against curves made with known constants, the analytic KL of
best-of-N, PPO against an ensemble (members standardised at step 0), and bad options."""

import json
import math
import os
from itertools import combinations

import numpy as np
import pytest
from conftest import ROOT
from launcher import python

from nanorm import ensemble, rl

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_best_of_n_equals_a_plain_loop_over_every_subset():
    """The expected gold of the highest-scored of N answers drawn without replacement, averaged
    over questions, equals picking the argmax in each of the C(n, N) subsets."""
    rng = np.random.default_rng(0)
    Q, n = 4, 7
    scores, gold = rng.normal(size=(Q, n)), rng.random((Q, n))
    got = rl.best_of_n_gold(scores, gold)
    for N in range(1, n + 1):
        per_q = []
        for q in range(Q):
            picks = [gold[q, max(s, key=lambda i: scores[q, i])] for s in combinations(range(n), N)]
            per_q.append(sum(picks) / len(picks))
        assert math.isclose(got[N - 1], sum(per_q) / Q, rel_tol=1e-9), N
    assert math.isclose(got[0], gold.mean(), rel_tol=1e-9)  # N = 1: a random answer
    assert math.isclose(got[-1], gold[np.arange(Q), scores.argmax(1)].mean(), rel_tol=1e-9)
    # the weights of each N are a distribution over the ranks
    assert np.allclose(rl.bon_weights(n).sum(1), 1.0)


@pytest.mark.parametrize("form", ["bon", "rl"])
def test_gao_fit_recovers_known_constants(form):
    d = np.linspace(0.0, 3.0, 40)
    alpha, beta = 0.7, 0.25
    shape = d if form == "bon" else np.log(np.where(d > 0, d, 1.0))
    r = d * (alpha - beta * shape)
    a, b, rmse = ensemble.gao_fit(d, r, form)
    assert math.isclose(a, alpha, abs_tol=1e-9) and math.isclose(b, beta, abs_tol=1e-9)
    assert rmse < 1e-9
    # with noise the constants are close and the rmse is the noise's size
    noise = np.random.default_rng(1).normal(0, 0.01, d.shape)
    a, b, rmse = ensemble.gao_fit(d, r + noise, form)
    assert abs(a - alpha) < 0.03 and abs(b - beta) < 0.03 and 0.005 < rmse < 0.02
    # the other form does not fit this curve exactly
    other = "rl" if form == "bon" else "bon"
    assert ensemble.gao_fit(d, r, other)[2] > 1e-3


def test_best_of_n_kl_is_0_at_1_and_grows_as_log_n():
    assert rl.best_of_n_kl(1) == 0.0
    N = np.array([2, 8, 64, 1024])
    kl = rl.best_of_n_kl(N)
    assert np.all(np.diff(kl) > 0)
    assert np.allclose(np.log(N) - kl, 1 - 1 / N)  # log N less a gap that tends to 1


def test_one_member_is_the_one_proxy(monkeypatch):
    """--members 1 (the default) reads the one proxy's cache, as before the option existed."""
    args = rl.parse_args(["--cache_dir", "c", "--proxy_pairs", "10", "--proxy_iters", "3"])
    assert args.members == 1 and args.rule == "mean"

    class Read:  # what load_reward_model returns: (model, ...); eval() gives the path back
        def __init__(self, path):
            self.path = path

        def eval(self):
            return self.path

    monkeypatch.setattr(rl.os.path, "exists", lambda p: True)  # every member cached
    monkeypatch.setattr(rl, "load_reward_model", lambda p: (Read(p), None))
    assert rl.proxy_reward_model("data", args) == os.path.join("c", "proxy10_3", "ckpt.pt")
    want = os.path.join("c", "proxy10_3_m2", "ckpt.pt")
    assert rl.proxy_reward_model("data", args, 2) == want


@pytest.mark.slow
def test_ppo_against_an_ensemble(tmp_path):
    """Two members on disjoint pairs; at step 0 each is standardised on those very answers, so
    the mean rule's reward averages 0 there; each member's raw mean is logged."""
    args = ["--max_steps", "1", "--out_dir", str(tmp_path), "--sft_steps", "2"]
    args += ["--proxy_pairs", "64", "--proxy_iters", "2", "--batch_size", "8"]
    rows = rl.main(args + ["--members", "2", "--rule", "mean"])
    assert abs(rows[0]["proxy"]) < 1e-5
    assert len(rows[0]["members"]) == 2 and rows[0]["members"][0] != rows[0]["members"][1]
    first = rl.PairDataset(str(tmp_path / "pairs64" / "train.npz"))
    second = rl.PairDataset(str(tmp_path / "pairs64_m1" / "train.npz"))
    train = rl.arith()[1]
    for data, start in ((first, 0), (second, 64)):  # pairs 0-63 and 64-127
        assert len(data) == 64
        assert all(np.array_equal(data[i][1], train[start + i][1]) for i in range(0, 64, 9))
    logged = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
    assert logged == json.loads(json.dumps(rows))


def cli(*args):
    return python(["-m", *args], env=ENV, timeout=120)


@pytest.mark.parametrize(
    "args, word",
    [
        (["nanorm.rl", "--rule", "foo"], "--rule"),
        (["nanorm.rl", "--members", "0"], "--members"),
        (["nanorm.rl", "--members", "5", "--proxy_pairs", "5000"], "--members 5"),
        (["nanorm.ensemble", "--task", "foo"], "--task"),
    ],
)
def test_bad_options_are_one_line(tmp_path, args, word):
    done = cli(*args, "--out_dir", tmp_path / "o")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr
    assert word in lines[0], lines[0]
