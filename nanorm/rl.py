"""
The reward model in use: PPO against a learned reward, GRPO against a verifier, on the built-in
arithmetic questions, on a laptop CPU.

    python -m nanorm.rl                                      # PPO against the proxy, ~4 min
    python -m nanorm.rl --algo grpo --reward verifier        # GRPO against the verifier
    python -m nanorm.rl --algo ppo --reward proxy --kl_coef 0.1 --max_steps 150 --seed 1
    python -m nanorm.rl --proxy_pairs 1000                   # a proxy trained on fewer pairs
    python -m nanorm.rl --proxy_pairs 1000 --members 5 --rule min   # an ensemble of 5 proxies
    bash bench/rl/run.sh                                     # the runs of bench/rl/README.md

The pieces, in the order a step runs them:
  0. once, cached in --cache_dir: a policy taught to answer by SFT on the data's right answers
     (model.Transformer), and a proxy reward model trained by train_rm.py on --proxy_pairs pairs.
  1. rollout: the policy samples an answer to each question (model.generate, KV cache); a
     response ends at its first EOS.
  2. score: the proxy's reward at the response's last token (reward.RewardModel), and the gold,
     verifiable.RLVRRewardModel([gsm8k_reward]): 1 if the answer is right. --reward picks which
     one the policy is trained on; both are logged.
     --members K > 1: K proxies, member k trained on its own disjoint --proxy_pairs pairs with its
     own seed, scored as one by reward.RewardEnsemble (--rule mean, min or mean_minus_std, Coste
     et al. 2023), each member standardised on the SFT policy's answers of step 0; the critic
     starts from member 0. proxy is then the ensemble's reward (what is optimized), and
     members each member's raw mean.
  3. PPO: per-token rewards = -kl_coef * (log pi - log pi_ref) at every token, plus the score at
     the last; the critic (critic.Critic.from_reward_model(proxy)) gives values, critic.gae the
     advantages and returns; the clipped policy loss and critic.value_loss update both.
     GRPO: G answers per question; each answer's advantage is its reward less its group's mean,
     over the group's std; no critic; the KL to the reference is a loss term (k3 estimator).
Output in --out_dir: rl.jsonl (one row per step: kl to the reference in nats per sequence,
proxy, gold, ...), rl.png (proxy and gold against the step and against sqrt(KL)), policy.pt (the
trained policy as a ckpt.pt of kind Transformer: nanorm.sample --ckpt reads it). They are checked
before any work and listed in --out_dir's record (.nanorm) before they are written: a file of
the same name that nanorm.rl did not write is refused, never replaced (command.Outputs). What
--cache_dir keeps is only ever made, never replaced: a cached file is read as it is.

Over-optimization (Gao, Schulman and Hilton 2022): the proxy rises throughout, the gold first
rises and then falls as the policy moves away from the reference; bench/rl/README.md has the runs.

Simplified on purpose: one process; no entropy bonus, no reward whitening across steps, no
penalty for a response that has not ended (it is scored at its last token, as written); the
policy and reference share nothing (the reference is a frozen copy); every minibatch pass
re-runs the full forward (no cached hidden states).
"""

import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from critic import (
    Critic,
    clipped_policy_loss,
    gae,
    group_advantages,
    k3_kl,
    kl_penalty_rewards,
    masked_mean,
    response_values,
    value_loss,
    whiten,
)
from data.pairs import PairDataset, right_pad
from data.tokenizer import load_tokenizer
from model import Transformer
from nanorm.base.checkpoints import load_transformer
from nanorm.base.command import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    Outputs,
    UsageError,
    append_text,
    atomic_write,
    new_folder,
    one_of,
    opt,
    parse_config,
    run,
    run_folders,
)
from nanorm.ckpt import load_reward_model, save_checkpoint
from nanorm.run_dir import save_figure
from reward import ENSEMBLE_RULES, RewardEnsemble, conservative_reward
from verifiable import RLVRRewardModel, extract_answer, gsm8k_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
AT_LEAST_2 = (lambda v: v >= 2, ">= 2")
UNIT = (lambda v: 0 <= v <= 1, "in [0, 1]")


@dataclass
class RLConfig:
    algo: str = opt("ppo", "ppo (a critic, GAE) or grpo (group advantages)", one_of("ppo", "grpo"))
    reward: str = opt("proxy", "what the policy optimizes", one_of("proxy", "verifier"))
    kl_coef: float = opt(0.02, "weight of the KL to the reference policy", NON_NEGATIVE)
    max_steps: int = opt(100, "RL steps (one rollout batch each)", AT_LEAST_1)
    out_dir: str = opt("out/rl", "where rl.jsonl, rl.png and policy.pt go")
    seed: int = opt(0, "seeds the RL run (rollouts, order); not SFT, proxy", NON_NEGATIVE)
    cache_dir: str = opt("", "where the SFT policy and the proxy are kept (default out_dir)")
    batch_size: int = opt(128, "answers sampled per step", AT_LEAST_1)
    group: int = opt(8, "GRPO: answers per question (a group's std needs 2)", AT_LEAST_2)
    lr: float = opt(1e-4, "policy learning rate (AdamW)", POSITIVE)
    critic_lr: float = opt(1e-3, "the critic's learning rate (AdamW)", POSITIVE)
    ppo_epochs: int = opt(2, "passes over each rollout batch", AT_LEAST_1)
    minibatches: int = opt(2, "updates per pass", AT_LEAST_1)
    clip_eps: float = opt(0.2, "PPO's ratio clip (and the value clip)", POSITIVE)
    gamma: float = opt(1.0, "GAE's discount", UNIT)
    lam: float = opt(0.95, "GAE's lambda", UNIT)
    max_new_tokens: int = opt(16, "longest answer sampled", AT_LEAST_1)
    temperature: float = opt(1.0, "sampling temperature of the rollouts", POSITIVE)
    sft_steps: int = opt(400, "steps of SFT on the right answers (cached)", AT_LEAST_1)
    proxy_pairs: int = opt(5000, "training pairs the proxy sees (cached)", AT_LEAST_1)
    proxy_iters: int = opt(1000, "train_rm.py --max_iters for the proxy", AT_LEAST_1)
    members: int = opt(
        1, "proxies in the ensemble, each on its own pairs (1: one proxy)", AT_LEAST_1
    )
    rule: str = opt("mean", "how the members' rewards make one", one_of(*ENSEMBLE_RULES))
    std_coef: float = opt(1.0, "lambda of --rule mean_minus_std", NON_NEGATIVE)


def parse_args(argv=None) -> RLConfig:
    """The options (each checked by its field), then the checks across options."""
    cfg = parse_config(RLConfig, argv, description=__doc__.split("\n")[1])
    per_update = cfg.batch_size // cfg.minibatches
    if cfg.algo == "grpo" and cfg.batch_size % cfg.group:
        raise UsageError(f"--batch_size {cfg.batch_size} must be a multiple of --group {cfg.group}")
    if per_update < 1:
        raise UsageError(f"--minibatches {cfg.minibatches} exceeds --batch_size {cfg.batch_size}")
    return run_folders(cfg)


# ----------------------------------------------------------------------------- the data
def arith():
    """The built-in arithmetic pairs (data/arith, made on first use): train split, val split,
    meta, tokenizer."""
    from data.arith.prepare import built_in

    d = built_in()
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    train, val = (PairDataset(os.path.join(d, f"{s}.npz")) for s in ("train", "val"))
    return d, train, val, meta, load_tokenizer(meta["tokenizer"])


def questions(data, tok):
    """The distinct prompts of a pair split as (prompt ids, right answer): the answer is what
    the verifier extracts from the chosen response (the data's labels come from it too)."""
    seen = {}
    for i in range(len(data)):
        p, c, _ = data[i]
        seen.setdefault(tuple(p.tolist()), extract_answer(tok.decode(c.tolist())))
    return [(list(p), a) for p, a in seen.items()]


def left_pad(rows, pad_id):
    """(B, T) tokens and mask, each row ending in the last column: generate appends there."""
    tokens = right_pad([torch.tensor(r[::-1]) for r in rows], pad_id).flip(1)
    mask = right_pad([torch.ones(len(r), dtype=torch.long) for r in rows]).flip(1)
    return tokens, mask


# ----------------------------------------------------------------------------- 0. SFT and the proxy
def sft_policy(train, meta, config, args):
    """A LLaMA of the proxy's shape taught to answer: next-token cross-entropy on the chosen
    (right) responses only, the prompt read but not learned. Kept in cache_dir/sft<steps>.pt."""
    path = os.path.join(args.cache_dir, f"sft{args.sft_steps}_policy.pt")
    if os.path.exists(path):
        return load_transformer(path).train()
    torch.manual_seed(0)
    policy = Transformer(config)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    t0 = time.time()
    for step in range(args.sft_steps):
        items = [train[i] for i in torch.randint(len(train), (64,), generator=g).tolist()]
        rows = [np.concatenate([p, c]) for p, c, _ in items]
        tokens = right_pad(rows, meta["pad_id"])  # (B, T)
        t = torch.arange(tokens.size(1))
        mask = t < torch.tensor([len(r) for r in rows])[:, None]
        learn = mask & (t >= torch.tensor([len(p) for p, _, _ in items])[:, None])  # response
        logits = policy(tokens[:, :-1], mask[:, :-1])  # predicts tokens[:, 1:]
        ce = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        loss = masked_mean(ce, learn[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == args.sft_steps - 1:
            print(f"sft step {step}: loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    os.makedirs(args.cache_dir, exist_ok=True)
    save_checkpoint(path, policy)  # nanoRM's ckpt.pt layout, written aside and renamed
    return policy


def proxy_reward_model(data_dir, args, member=0):
    """The learned reward: `python train_rm.py` (its default nano shape and LM term) on
    --proxy_pairs training pairs, evaluated on all of val. Member k of an ensemble reads pairs
    k * proxy_pairs onwards with train_rm.py's seed 1337 + k: member 0 is the one proxy.
    Kept in cache_dir."""
    tag = f"_m{member}" if member else ""
    out = os.path.join(args.cache_dir, f"proxy{args.proxy_pairs}_{args.proxy_iters}{tag}")
    ckpt = os.path.join(out, "ckpt.pt")
    if not os.path.exists(ckpt):
        pairs = os.path.join(args.cache_dir, f"pairs{args.proxy_pairs}{tag}")
        if not os.path.exists(os.path.join(pairs, "meta.json")):
            subset_of(data_dir, pairs, args.proxy_pairs, start=member * args.proxy_pairs)
        cmd = [sys.executable, os.path.join(ROOT, "train_rm.py"), "--dataset", pairs]
        cmd += ["--out_dir", out, "--overwrite", "true", "--max_iters", str(args.proxy_iters)]
        cmd += ["--seed", str(1337 + member)]  # 1337: train_rm.py's default
        cmd += ["--eval_interval", str(args.proxy_iters), "--eval_first", "false"]
        cmd += ["--warmup", "20", "--dtype", "float32", "--device", "cpu"]
        print("python train_rm.py " + " ".join(cmd[2:]))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode == 2:  # refused in one line (e.g. a file of the user's in its out_dir)
            raise UsageError(f"the proxy's {done.stderr.strip().splitlines()[-1]}")
        if done.returncode:
            raise RuntimeError(f"train_rm.py failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        print(done.stdout.strip().splitlines()[-1])  # "done in ...: held-out accuracy ..."
    return load_reward_model(ckpt)[0].eval()


def subset_of(data_dir, out, n, start=0):
    """A dataset directory holding n training pairs of data_dir from `start` and all its val,
    written aside and renamed whole: a folder already at out (without its meta.json) is not
    ours to fill, and is refused."""
    from data.pairs import write_pairs

    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UsageError(
            f"{out} is in the way of the proxy's pairs: move it, or another --cache_dir"
        )
    train = PairDataset(os.path.join(data_dir, "train.npz"))
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    with new_folder(out) as tmp:
        write_pairs(
            os.path.join(tmp, "train.npz"),
            [train[i] for i in range(start, start + n)],
            meta["vocab_size"],
        )
        shutil.copy(os.path.join(data_dir, "val.npz"), os.path.join(tmp, "val.npz"))
        shutil.copy(os.path.join(data_dir, "meta.json"), os.path.join(tmp, "meta.json"))


def verifier(tok):
    """The gold: RLVRRewardModel with gsm8k_reward ("#### x", a box, "the answer is x").
    Called with inclusive response ends (the index of the last token), ColossalChat's contract."""
    return RLVRRewardModel([gsm8k_reward], tokenizer=tok)


# ----------------------------------------------------------------------------- 1. rollout
def rollout(policy, prompts, args, pad_id, eos_id):
    """Sample one answer per prompt. Returns seq (B, P + R), its mask, P (the prompts' common,
    left-padded width) and the response mask (B, R): 1 up to and including the first EOS."""
    tokens, mask = left_pad(prompts, pad_id)  # (B, P)
    P = tokens.size(1)
    out = policy.generate(
        tokens,
        args.max_new_tokens,
        args.temperature,
        attention_mask=mask,
        eos_id=eos_id,
        pad_id=pad_id,
    )
    response = out[:, P:]  # (B, R)
    eos = (response == eos_id).long()
    resp_mask = (eos.cumsum(1) - eos) == 0  # not past the first EOS
    response = response.masked_fill(~resp_mask, pad_id)
    seq = torch.cat([tokens, response], 1)
    return seq, torch.cat([mask.bool(), resp_mask], 1), P, resp_mask


def token_logprobs(model, seq, mask, P):
    """(B, R) log pi(a_t | s_t) of each response token: the logits at the token before it."""
    logits = model(seq, mask)[:, P - 1 : -1].float()  # (B, R, vocab)
    return torch.log_softmax(logits, -1).gather(-1, seq[:, P:, None]).squeeze(-1)


# ----------------------------------------------------------------------------- the loop
RL = "nanorm.rl"  # the command that writes a run's files, in --out_dir's record
RL_FILES = ("rl.jsonl", "rl.png", "policy.pt")


def rl_outputs(out_dir):
    """What a run writes in --out_dir, as command.Outputs (earlier_rl: an older nanoRM's run)."""
    return Outputs(out_dir, RL, RL_FILES, "--out_dir", earlier=earlier_rl)


def earlier_rl(folder):
    """Whether a folder without a record holds a run of an older nanoRM (which kept none): its
    rl.jsonl starts with a row of this loop's (step, kl, proxy, gold)."""
    path = os.path.join(folder, "rl.jsonl")
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        with open(path) as f:
            row = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and {"step", "kl", "proxy", "gold"} <= row.keys()


def main(argv=None):
    args = parse_args(argv)
    outputs = rl_outputs(args.out_dir)
    outputs.check()  # a file there that is not ours: refused now, before the SFT and the proxy
    # a 0.2M-parameter model: one thread is as fast as two, and never waits on a busy core
    torch.set_num_threads(1)
    data_dir, train, _, meta, tok = arith()
    pad_id, eos_id = meta["pad_id"], meta["eos_id"]
    if args.members * args.proxy_pairs > len(train):
        raise UsageError(
            f"--members {args.members} x --proxy_pairs {args.proxy_pairs} exceeds the "
            f"{len(train)} training pairs: fewer of either"
        )
    t_setup = time.time()
    proxies = [proxy_reward_model(data_dir, args, k) for k in range(args.members)]
    policy = sft_policy(train, meta, copy.deepcopy(proxies[0].backbone.config), args)
    for p in proxies:
        p.requires_grad_(False)
    # K = 1 is the one proxy as it scores; an ensemble is standardised at step 0 (below)
    proxy = proxies[0] if args.members == 1 else RewardEnsemble(proxies, args.rule, args.std_coef)
    gold_rm = verifier(tok)
    print(f"SFT policy and proxy ready in {time.time() - t_setup:.0f}s")

    torch.manual_seed(args.seed)
    reference = copy.deepcopy(policy).eval()  # frozen: the KL is measured against it
    for p in reference.parameters():
        p.requires_grad_(False)
    critic = Critic.from_reward_model(proxies[0]) if args.algo == "ppo" else None
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    if critic is not None:
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=args.critic_lr)
    qs = questions(train, tok)
    g = torch.Generator().manual_seed(args.seed)
    n_q = args.batch_size // args.group if args.algo == "grpo" else args.batch_size
    log_path = os.path.join(args.out_dir, "rl.jsonl")
    outputs.claim()  # rl.jsonl, rl.png, policy.pt in the record, before they are written
    with atomic_write(log_path, "w"):  # a new, empty log
        pass
    rows, t0 = [], time.time()
    for step in range(args.max_steps + 1):
        # 1. rollout: sample answers (GRPO: `group` answers to each of batch_size / group questions)
        pick = torch.randperm(len(qs), generator=g)[:n_q].tolist()
        if args.algo == "grpo":
            pick = [i for i in pick for _ in range(args.group)]
        prompts, answers = [qs[i][0] for i in pick], [qs[i][1] for i in pick]
        policy.eval()
        seq, mask, P, resp_mask = rollout(policy, prompts, args, pad_id, eos_id)
        last = P + resp_mask.long().sum(1) - 1  # (B,) index of each response's last token

        # 2. score: the proxy at the last token, the gold by the verifier; old log-probs
        with torch.no_grad():
            if args.members == 1:
                proxy_score = proxy(seq, mask)
            else:
                if step == 0:  # each member's mean 0, std 1 on the SFT policy's answers
                    proxy.standardise(seq, mask)
                member_r = proxy.member_rewards(seq, mask)  # (K, B) standardised
                proxy_score = conservative_reward(member_r, proxy.rule, proxy.lam)
            first = torch.full_like(last, P)  # (B,) ColossalChat's contract: values per row
            gold = gold_rm(seq, mask, response_start=first, response_end=last, gt_answer=answers)
            old_logp = token_logprobs(policy, seq, mask, P)
            ref_logp = token_logprobs(reference, seq, mask, P)
        score = proxy_score if args.reward == "proxy" else gold
        kl = ((old_logp - ref_logp) * resp_mask).sum(1)  # (B,) nats per sequence
        row = dict(step=step, kl=kl.mean().item(), proxy=proxy_score.mean().item())
        row.update(gold=gold.mean().item(), length=resp_mask.sum(1).float().mean().item())
        if args.members > 1:  # each member's raw mean: which one the policy exploits
            raw = member_r * proxy.scale[:, None] + proxy.shift[:, None]
            row["members"] = raw.mean(1).tolist()
        if step == args.max_steps:  # the last row measures the final policy; no update
            row["time"] = time.time() - t0
            rows.append(row), log_row(log_path, row)
            break

        # 3. advantages: GAE on the critic's values (PPO), or the group's statistics (GRPO)
        if args.algo == "ppo":
            with torch.no_grad():
                old_values = response_values(critic(seq, mask), P, resp_mask.size(1))  # (B, R)
            rewards = kl_penalty_rewards(old_logp, ref_logp, resp_mask, score, args.kl_coef)
            advantages, returns = gae(rewards, old_values, resp_mask, args.gamma, args.lam)
            advantages = whiten(advantages, resp_mask)
        else:
            advantages = group_advantages(score, args.group)[:, None].expand_as(old_logp)

        # 4. update: a few passes of minibatches over this rollout batch
        policy.train()
        stats = {"policy_loss": 0.0, "value_loss": 0.0, "clipfrac": 0.0}
        n_updates = args.ppo_epochs * args.minibatches
        for _ in range(args.ppo_epochs):
            for mb in torch.randperm(seq.size(0), generator=g).chunk(args.minibatches):
                m = resp_mask[mb]
                logp = token_logprobs(policy, seq[mb], mask[mb], P)
                loss = clipped_policy_loss(logp, old_logp[mb], advantages[mb], m, args.clip_eps)
                if args.algo == "grpo":  # the KL to the reference, in the loss
                    loss = loss + args.kl_coef * masked_mean(k3_kl(logp, ref_logp[mb]), m)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
                opt.step()
                ratio = (logp.detach() - old_logp[mb]).exp()
                clipped = ((ratio - 1).abs() > args.clip_eps).float()
                stats["clipfrac"] += masked_mean(clipped, m).item() / n_updates
                stats["policy_loss"] += loss.item() / n_updates
                if critic is not None:
                    values = response_values(critic(seq[mb], mask[mb]), P, m.size(1))
                    vl = value_loss(values, old_values[mb], returns[mb], m, args.clip_eps)
                    critic_opt.zero_grad(set_to_none=True)
                    vl.backward()
                    torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
                    critic_opt.step()
                    stats["value_loss"] += vl.item() / n_updates
        row.update(stats, time=time.time() - t0)
        rows.append(row), log_row(log_path, row)
        print(
            f"step {step}: kl {row['kl']:.3f} | proxy {row['proxy']:.3f} | gold {row['gold']:.3f}"
            f" | len {row['length']:.1f} | clipfrac {row['clipfrac']:.2f} | {row['time']:.0f}s"
        )
    save_checkpoint(os.path.join(args.out_dir, "policy.pt"), policy)
    title = " ".join(sys.argv[1:] if argv is None else argv) or "defaults"
    plot(rows, os.path.join(args.out_dir, "rl.png"), title=title)
    print(f"done in {time.time() - t0:.0f}s; wrote {log_path}, rl.png, policy.pt")
    return rows


def log_row(path, row):
    append_text(path, json.dumps(row) + "\n")  # never through a link


def plot(rows, path, title=""):
    """Proxy and gold against the step, and against sqrt(KL) (Gao et al.'s axis). matplotlib's
    object API: no pyplot, so a notebook's plotting backend is left as it was."""
    from matplotlib.figure import Figure

    step = [r["step"] for r in rows]
    sqrt_kl = [math.sqrt(max(r["kl"], 0.0)) for r in rows]
    fig = Figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    for ax, x, label in (
        (axes[0], step, "step"),
        (axes[1], sqrt_kl, "sqrt(KL to reference), nats"),
    ):
        ax.plot(x, [r["gold"] for r in rows], color="C2", label="gold (verifier accuracy)")
        ax.set_xlabel(label)
        ax.set_ylabel("gold", color="C2")
        twin = ax.twinx()
        twin.plot(x, [r["proxy"] for r in rows], color="C0", label="proxy reward")
        twin.set_ylabel("proxy", color="C0")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, right=0.75, top=0.5, gap=1.4)  # the twin axes' labels on the right


# ----------------------------------------------------------------------------- best-of-N
# The other way to optimize against a reward: sample n answers, keep the top-scored. Its gold is
# computed exactly over every subset of the samples, not estimated from a few random ones
# (nanorm/ensemble.py and nanorm/prm.py draw their curves with it).
def bon_weights(n, n_max=None):
    """(n_max, n) W[N - 1, i]: the probability that the i-th lowest-scored of n answers is the
    highest-scored of N drawn without replacement, C(i, N - 1) / C(n, N)."""
    n_max = n_max or n
    W = np.zeros((n_max, n))
    for N in range(1, n_max + 1):
        W[N - 1] = [math.comb(i, N - 1) / math.comb(n, N) for i in range(n)]
    return W


def best_of_n_gold(scores, gold, n_max=None):
    """(n_max,) the expected gold of best-of-N for N = 1..n_max, averaged over questions:
    scores and gold (Q, n), n answers to each of Q questions. Answers of equal score share
    their mean gold: a tie is broken at random."""
    scores, gold = np.atleast_2d(scores).astype(float), np.atleast_2d(gold).astype(float)
    order = np.argsort(scores, axis=1, kind="stable")
    ranked = np.take_along_axis(gold, order, axis=1)  # (Q, n), lowest score first
    for q, row in enumerate(np.take_along_axis(scores, order, axis=1)):
        _, tie = np.unique(row, return_inverse=True)
        ranked[q] = (np.bincount(tie, ranked[q]) / np.bincount(tie))[tie]
    return (ranked @ bon_weights(scores.shape[1], n_max).T).mean(0)


def best_of_n_kl(N):
    """KL(best-of-N || policy) <= log N - (N - 1) / N, in nats (0 at N = 1)."""
    N = np.asarray(N, dtype=float)
    return np.log(N) - (N - 1) / N


if __name__ == "__main__":
    run(main)
