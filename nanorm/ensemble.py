"""
Reward-model ensembles against over-optimization (Coste et al. 2023), measured with best-of-N
and PPO on the built-in arithmetic questions, and the gold's curves fitted with the functional
forms of Gao, Schulman and Hilton 2022.

    python -m nanorm.ensemble --task prepare --member 0     # member 0, then the SFT policy
    python -m nanorm.ensemble --task prepare --member 3     # member 3 (its own 1,000 pairs)
    python -m nanorm.ensemble --task best_of_n --seed 0     # best-of-N from the SFT policy
    python -m nanorm.rl --proxy_pairs 1000 --members 5 --rule min   # PPO against an ensemble
    bash bench/ensemble/run.sh                              # everything, three seeds

The members are nanorm.rl's proxies (rl.proxy_reward_model): member k is train_rm.py on
training pairs k * proxy_pairs onwards, seed 1337 + k, kept in --cache_dir, so K = 1 is
nanorm.rl's one proxy.

Best-of-N: --samples answers to each held-out question (the val split's distinct prompts) from
the SFT policy, each scored by every member and by the verifier (the gold). A selector scores
an answer by one member, or by the K members (reward.RewardEnsemble, each member standardised
to mean 0, std 1 on one answer to each question) under a rule of conservative_reward. The
gold of best-of-N is the expectation over every N-subset of the samples, not a few random ones:
sorted by score, the i-th lowest of n answers is the best of a random N-subset with
probability C(i, N-1) / C(n, N) (rl.bon_weights). Its KL to the policy is taken as
log N - (N - 1) / N, the analytic bound that Gao et al. plot against (rl.best_of_n_kl).

The fits: with d = sqrt(KL) and R the gold's gain over its value at d = 0, best-of-N follows
R(d) = d (alpha - beta d) and RL R(d) = d (alpha - beta log d) in Gao et al.; both are linear
in (alpha, beta), so ordinary least squares (gao_fit).

Simplified on purpose: the arithmetic questions are few (about 200 distinct prompts), so the
val split's questions are also asked in training; the members were trained on pairs, not on
the policy's answers, and that is the shift an ensemble has to survive.
"""

import copy
import json
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from nanorm import rl
from nanorm.base.command import (
    AT_LEAST_1,
    NON_NEGATIVE,
    Outputs,
    UsageError,
    atomic_write,
    one_of,
    opt,
    parse_config,
    run,
)
from nanorm.rl import best_of_n_gold, best_of_n_kl
from reward import RewardEnsemble, conservative_reward

# best-of-N's selectors: (name, rule, lambda); "one" is member 0 alone
SELECTORS = (
    ("one", None, 0.0),
    ("mean", "mean", 0.0),
    ("min", "min", 0.0),
    ("mean_minus_std", "mean_minus_std", 1.0),
    ("mean_minus_2std", "mean_minus_std", 2.0),
)


@dataclass
class EnsembleConfig:
    task: str = opt(
        "best_of_n", "prepare (one member) or best_of_n", one_of("prepare", "best_of_n")
    )
    member: int = opt(0, "prepare: which member (0 also trains the SFT policy)", NON_NEGATIVE)
    members: int = opt(5, "K, the ensemble's size", AT_LEAST_1)
    cache_dir: str = opt("out/ensemble_cache", "the SFT policy and the members, as nanorm.rl's")
    out_dir: str = opt("out/ensemble", "where best_of_n.json goes")
    proxy_pairs: int = opt(1000, "training pairs per member, disjoint", AT_LEAST_1)
    proxy_iters: int = opt(300, "train_rm.py --max_iters per member", AT_LEAST_1)
    sft_steps: int = opt(400, "the SFT policy's steps (nanorm.rl's)", AT_LEAST_1)
    samples: int = opt(64, "answers sampled per question (the largest N)", AT_LEAST_1)
    questions: int = opt(100, "held-out questions (at most the val split's)", AT_LEAST_1)
    seed: int = opt(0, "seeds the sampling", NON_NEGATIVE)


def rl_args(cfg):
    """nanorm.rl's options for the same cache, members and SFT policy."""
    return rl.parse_args(
        ["--cache_dir", cfg.cache_dir, "--proxy_pairs", str(cfg.proxy_pairs)]
        + ["--proxy_iters", str(cfg.proxy_iters), "--sft_steps", str(cfg.sft_steps)]
        + ["--members", str(cfg.members), "--out_dir", cfg.out_dir]
    )


# ----------------------------------------------------------------------------- Gao's fits
def gao_fit(d, r, form):
    """(alpha, beta, rmse): least squares of R(d) = d (alpha - beta d) (form "bon") or
    d (alpha - beta log d) (form "rl") to the points (d, r), d = sqrt(KL) >= 0."""
    d, r = np.asarray(d, dtype=float), np.asarray(r, dtype=float)
    if form == "bon":
        X = np.stack([d, -d * d], 1)
    elif form == "rl":
        d_log_d = np.where(d > 0, d * np.log(np.where(d > 0, d, 1.0)), 0.0)  # -> 0 as d -> 0
        X = np.stack([d, -d_log_d], 1)
    else:
        raise ValueError(f"form must be 'bon' or 'rl', got {form!r}")
    (alpha, beta), *_ = np.linalg.lstsq(X, r, rcond=None)
    rmse = float(np.sqrt(np.mean((X @ np.array([alpha, beta]) - r) ** 2)))
    return float(alpha), float(beta), rmse


# ----------------------------------------------------------------------------- the tasks
def prepare(cfg):
    """Train member cfg.member (cached); after member 0, the SFT policy, which takes its shape."""
    args = rl_args(cfg)
    data_dir, train, _, meta, _ = rl.arith()
    if (cfg.member + 1) * cfg.proxy_pairs > len(train):
        raise UsageError(f"--member {cfg.member} needs pairs past the {len(train)} there are")
    proxy = rl.proxy_reward_model(data_dir, args, cfg.member)
    if cfg.member == 0:
        rl.sft_policy(train, meta, copy.deepcopy(proxy.backbone.config), args)


def sample_and_score(cfg):
    """The SFT policy's answers to the held-out questions, scored: raw (K, Q, n) members'
    rewards, standardised (K, Q, n), gold (Q, n)."""
    args = rl_args(cfg)
    data_dir, train, val, meta, tok = rl.arith()
    members = [rl.proxy_reward_model(data_dir, args, k) for k in range(cfg.members)]
    shape = copy.deepcopy(members[0].backbone.config)
    policy = rl.sft_policy(train, meta, shape, args).eval()  # trained once, then cached
    qs = rl.questions(val, tok)[: cfg.questions]
    Q, n = len(qs), cfg.samples
    prompts = [p for p, _ in qs for _ in range(n)]
    answers = [a for _, a in qs for _ in range(n)]
    torch.manual_seed(cfg.seed)
    ensemble = RewardEnsemble(members).eval()
    with torch.no_grad():
        seq, mask, P, resp_mask = rl.rollout(policy, prompts, args, meta["pad_id"], meta["eos_id"])
        last = P + resp_mask.long().sum(1) - 1
        first = torch.full_like(last, P)
        gold = rl.verifier(tok)(
            seq, mask, response_start=first, response_end=last, gt_answer=answers
        )
        # on one answer to each question: the SFT policy's answers, as nanorm.rl's step 0
        ensemble.standardise(seq[::n], mask[::n])
        z = ensemble.member_rewards(seq, mask)  # (K, Q * n)
    raw = z * ensemble.scale[:, None] + ensemble.shift[:, None]
    return raw.view(-1, Q, n), z.view(-1, Q, n), gold.view(Q, n), Q


def best_of_n(cfg):
    """best_of_n.json: the gold of best-of-N for N = 1..samples under each selector, each
    member alone, and K = 1..members under every rule at N = samples."""
    outputs = Outputs(cfg.out_dir, "nanorm.ensemble", ("best_of_n.json",), "--out_dir")
    outputs.check()
    torch.set_num_threads(1)
    t0 = time.time()
    raw, z, gold, Q = sample_and_score(cfg)
    n = cfg.samples
    N = np.arange(1, n + 1)
    res = dict(questions=Q, samples=n, seed=cfg.seed, N=N.tolist(), kl=best_of_n_kl(N).tolist())
    res["sft_gold"] = gold.mean().item()
    res["gold"] = {}
    for name, rule, lam in SELECTORS:
        score = z[0] if rule is None else conservative_reward(z, rule, lam)
        res["gold"][name] = best_of_n_gold(score, gold).tolist()
    res["member_alone"] = [best_of_n_gold(z[k], gold).tolist() for k in range(len(z))]
    res["by_k"] = {  # gold at N = n with the first K members
        name: [
            float(best_of_n_gold(conservative_reward(z[:K], rule, lam), gold)[-1])
            for K in range(1, len(z) + 1)
        ]
        for name, rule, lam in SELECTORS[1:]
    }
    # each member's pairwise accuracy on the val split, as train_rm.py measured it
    res["member_val_accuracy"] = [member_accuracy(cfg, k) for k in range(len(z))]
    res["member_raw_mean"] = raw.mean((1, 2)).tolist()
    res["seconds"] = time.time() - t0
    outputs.claim()
    with atomic_write(os.path.join(cfg.out_dir, "best_of_n.json"), "w") as f:
        json.dump(res, f)
    best = {k: round(v[-1], 3) for k, v in res["gold"].items()}
    print(f"best-of-{n} gold over {Q} questions (N = 1: {res['gold']['one'][0]:.3f}): {best}")
    return res


def member_accuracy(cfg, k):
    tag = f"_m{k}" if k else ""
    path = os.path.join(
        cfg.cache_dir, f"proxy{cfg.proxy_pairs}_{cfg.proxy_iters}{tag}", "eval.json"
    )
    with open(path) as f:
        return json.load(f)["overall"]["accuracy"]


def main(argv=None):
    cfg = parse_config(EnsembleConfig, argv, description=__doc__.split("\n")[1])
    if cfg.task == "prepare":
        return prepare(cfg)
    return best_of_n(cfg)


if __name__ == "__main__":
    run(main)
