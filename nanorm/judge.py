"""
A generative judge: the SFT policy asked "Is the answer correct?", its probability of "Yes" read
as the reward (Zhang et al. 2024, generative verifiers; reward.GenerativeJudge); and a pairwise
judge shown two answers, asked which is correct, measured for position bias.

    python -m nanorm.judge                                   # the Yes/No judge, ~40 s + the SFT
    python -m nanorm.judge --judge a_b --seed 1              # the pairwise A/B judge
    python -m nanorm.judge --steps 150 --batch_size 32 --pairs 5000 --lr 1e-3 --out_dir out/j
    bash bench/judge/run.sh                                  # the runs of bench/judge/README.md

The pieces, in the order a run meets them:
  0. once, cached in --cache_dir: the SFT policy nanorm/rl.py trains (the file nanorm.dpo and
     nanorm.rl share).
  1. the rows. The built-in tokenizer has no "Yes" piece: " Yes" is '▁' 'Y' 'e' 's' and " No" is
     '▁' 'N' 'o'. So a row ends with the '▁' token and the judge reads the next token: 'Y' says
     yes, 'N' says no (JudgeText finds the ids in the tokenizer).
       yes_no: prompt + response + " Is the answer correct?" + '▁'          label 1: the right one
       a_b:    prompt + " Answer A:" + first + " Answer B:" + second + " Which is correct?" + '▁'
               read as p('A') against p('B'): reward.GenerativeJudge with yes = 'A', no = 'B',
               label 1: the right answer is A.
  2. the judge before training (zero-shot) scored on the held-out pairs (evaluate).
  3. each step: --batch_size pairs of the first --pairs training pairs (an epoch in a random
     order, then the next). yes_no: 2 rows a pair, right -> Yes, wrong -> No. a_b: 1 row a pair,
     the right answer first or second by a coin (seeded), the label its position.
     GenerativeJudge.loss: cross-entropy of the label's token at the row's last position.
  4. the trained judge scored again. yes_no: pairwise accuracy (p(Yes | right) > p(Yes | wrong))
     and pointwise accuracy (Yes to the right row, No to the wrong one). a_b: every pair shown in
     both orders: the accuracy in each, consistency (the same answer picked in both) and the
     first-position rate (the share of all judgments that pick A; 0.5 is no bias).
Output in --out_dir: judge.jsonl (a row per --log_interval steps, then the held-out scores before
and after) and judge_policy.pt (the trained LM, a ckpt.pt of kind Transformer). They are checked
before any work and listed in --out_dir's record (.nanorm) before they are written (command.Outputs).

Simplified on purpose: one process on the CPU, float32; the whole LM is trained (no LoRA); the
response's end token is dropped from a row, so the question continues the answer's text; no
chain of thought before the verdict (the paper's GenRM-CoT).
"""

import json
import os
import time
from dataclasses import dataclass

import torch

from data.pairs import right_pad
from nanorm.base.command import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    Outputs,
    UsageError,
    append_text,
    atomic_write,
    one_of,
    opt,
    parse_config,
    run,
    run_folders,
)
from nanorm.base.runtime import check_finite
from nanorm.ckpt import save_checkpoint
from nanorm.dpo import policy_config
from nanorm.rl import arith, sft_policy
from reward import GenerativeJudge

JUDGES = ("yes_no", "a_b")


@dataclass
class JudgeConfig:
    judge: str = opt("yes_no", "yes_no (one answer) or a_b (two, which is right)", one_of(*JUDGES))
    steps: int = opt(150, "optimizer steps", AT_LEAST_1)
    batch_size: int = opt(32, "pairs per step (yes_no: 2 rows each, a_b: 1)", AT_LEAST_1)
    pairs: int = opt(5000, "train on the first this many training pairs (0: all)", NON_NEGATIVE)
    lr: float = opt(1e-3, "peak learning rate (AdamW)", POSITIVE)
    warmup: int = opt(20, "linear warmup steps", NON_NEGATIVE)
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)", NON_NEGATIVE)
    eval_pairs: int = opt(1000, "held-out pairs scored before and after (at most)", AT_LEAST_1)
    log_interval: int = opt(25, "log the loss every this many steps", AT_LEAST_1)
    seed: int = opt(0, "seeds the order of the pairs and the a_b coin (not the SFT)", NON_NEGATIVE)
    out_dir: str = opt("out/judge", "where judge.jsonl and judge_policy.pt go")
    cache_dir: str = opt("", "where the SFT policy is kept (default out_dir)")
    sft_steps: int = opt(400, "steps of SFT on the right answers (cached)", AT_LEAST_1)


def parse_args(argv=None) -> JudgeConfig:
    """The options (each checked by its field), then the checks across options."""
    cfg = parse_config(JudgeConfig, argv, description=__doc__.split("\n")[1])
    return run_folders(cfg)


# ----------------------------------------------------------------------------- 1. the rows
@dataclass
class JudgeText:
    """The token ids a judge row is built from, found in the tokenizer, never written here."""

    ask: list  # " Is the answer correct?"
    answer_a: list  # " Answer A:"
    answer_b: list  # " Answer B:"
    which: list  # " Which is correct?"
    space: int  # '▁': the row's last token; the verdict is the token after it
    yes: int  # 'Y', the first piece of "Yes" after the space
    no: int  # 'N'
    a: int  # 'A'
    b: int  # 'B'
    end_id: int  # a response's end token, dropped from the row

    @classmethod
    def from_tokenizer(cls, tok, end_id):
        def after_space(word):  # " Yes" -> '▁' 'Y' ...: the id after the lone '▁'
            ids = tok.encode(" " + word)
            return ids[0], ids[1]

        (space, yes), (s_no, no) = after_space("Yes"), after_space("No")
        (s_a, a), (s_b, b) = after_space("A"), after_space("B")
        if len({space, s_no, s_a, s_b}) != 1 or len({yes, no}) != 2 or len({a, b}) != 2:
            raise UsageError("the tokenizer does not split ' Yes'/' No'/' A'/' B' as '▁' + letter")
        text = cls(*(tok.encode(s) for s in (" Is the answer correct?", " Answer A:")),
                   *(tok.encode(s) for s in (" Answer B:", " Which is correct?")),
                   space, yes, no, a, b, end_id)  # fmt: skip
        # the row must be how the tokenizer writes the question followed by its answer
        for q, word, v in ((text.ask, "Yes", yes), (text.which, "A", a)):
            full = tok.encode(tok.decode(q) + " " + word)
            if full[: len(q) + 2] != q + [space, v]:
                raise UsageError(f"the tokenizer writes the question + {word!r} as {full}")
        return text

    def answer(self, response):
        """The response without its end token: the question continues its text."""
        response = list(response)
        return response[:-1] if response and response[-1] == self.end_id else response

    def yes_no_row(self, prompt, response):
        return list(prompt) + self.answer(response) + self.ask + [self.space]

    def a_b_row(self, prompt, first, second):
        ab = self.answer_a + self.answer(first) + self.answer_b + self.answer(second)
        return list(prompt) + ab + self.which + [self.space]


def padded(rows, pad_id):
    """(tokens, mask), each (B, T), right-padded."""
    mask = right_pad([torch.ones(len(r), dtype=torch.long) for r in rows])
    return right_pad([torch.tensor(r) for r in rows], pad_id), mask


def yes_no_batch(data, indices, text, pad_id):
    """2B rows, the right answers then the wrong ones, with labels 1 then 0."""
    items = [data[i] for i in indices]
    rows = [text.yes_no_row(p, c) for p, c, _ in items]
    rows += [text.yes_no_row(p, r) for p, _, r in items]
    labels = torch.tensor([1] * len(items) + [0] * len(items))
    return (*padded(rows, pad_id), labels)


def a_b_batch(data, indices, text, pad_id, swap):
    """B rows, the right answer first where swap (B,) is False; label 1: the right one is A."""
    rows = []
    for i, s in zip(indices, swap.tolist(), strict=True):
        p, c, r = data[i]
        rows.append(text.a_b_row(p, r, c) if s else text.a_b_row(p, c, r))
    return (*padded(rows, pad_id), (~swap).long())


def make_judge(policy, text, kind):
    """reward.GenerativeJudge reading 'Y' against 'N', or 'A' against 'B' (the same two-token
    read-out: label 1 is 'A')."""
    yes, no = (text.yes, text.no) if kind == "yes_no" else (text.a, text.b)
    return GenerativeJudge(policy, yes, no)


# ----------------------------------------------------------------------------- the scores
def position_stats(picks_a_right_first, picks_a_right_second):
    """The A/B judge's scores from its picks (N,) bool, True where it said A: with the right
    answer shown first, then the same pairs swapped."""
    first, second = picks_a_right_first.float(), picks_a_right_second.float()
    return {
        "acc_right_first": first.mean().item(),  # right when it picks A
        "acc_right_second": (1 - second).mean().item(),  # right when it picks B
        "acc": ((first + 1 - second) / 2).mean().item(),  # both orders, each counted once
        # the same answer both times: A then B (the right one) or B then A (the wrong one)
        "consistency": (picks_a_right_first != picks_a_right_second).float().mean().item(),
        "first_rate": ((first + second) / 2).mean().item(),  # 0.5: no preference for A
    }


@torch.no_grad()
def verdicts(judge, tokens, mask):
    """(p(yes token), says yes: its logit above the no token's), each (B,)."""
    logits = judge.next_logits(tokens, mask)
    return logits.softmax(-1)[:, judge.yes_id], logits[:, judge.yes_id] > logits[:, judge.no_id]


@torch.no_grad()
def evaluate(judge, kind, data, text, pad_id, n_pairs, batch_size=100):
    """The held-out scores of a judge on the first n_pairs pairs of data (see the docstring's 4;
    a tie in p(Yes) is wrong)."""
    was_training, n = judge.training, min(n_pairs, len(data))
    judge.eval()
    parts = []  # per batch: yes_no (p_right, p_wrong, yes_right, yes_wrong); a_b (picks, picks)
    for i in range(0, n, batch_size):
        idx = list(range(i, min(n, i + batch_size)))
        if kind == "yes_no":
            tokens, mask, _ = yes_no_batch(data, idx, text, pad_id)
            p, yes = verdicts(judge, tokens, mask)
            B = len(idx)
            parts.append((p[:B], p[B:], yes[:B], yes[B:]))
        else:
            no_swap = torch.zeros(len(idx), dtype=torch.bool)
            first = verdicts(judge, *a_b_batch(data, idx, text, pad_id, no_swap)[:2])[1]
            second = verdicts(judge, *a_b_batch(data, idx, text, pad_id, ~no_swap)[:2])[1]
            parts.append((first, second))
    judge.train(was_training)
    cat = [torch.cat(x) for x in zip(*parts, strict=True)]
    if kind == "a_b":
        return position_stats(*cat)
    p_right, p_wrong, yes_right, yes_wrong = cat
    return {
        "acc": (p_right > p_wrong).float().mean().item(),  # pairwise, as a reward model's
        "pointwise": ((yes_right.float() + (~yes_wrong).float()) / 2).mean().item(),
        "yes_rate": ((yes_right.float() + yes_wrong.float()) / 2).mean().item(),
        "p_yes_right": p_right.mean().item(),
        "p_yes_wrong": p_wrong.mean().item(),
    }


# ----------------------------------------------------------------------------- the loop
JUDGE = "nanorm.judge"  # the command that writes a run's files, in --out_dir's record
JUDGE_FILES = ("judge.jsonl", "judge_policy.pt")


def judge_outputs(out_dir):
    return Outputs(out_dir, JUDGE, JUDGE_FILES, "--out_dir")


def main(argv=None):
    args = parse_args(argv)
    outputs = judge_outputs(args.out_dir)
    outputs.check()  # a file there that is not ours: refused now, before the SFT
    # a 0.2M-parameter model: one thread is as fast as two, and never waits on a busy core
    torch.set_num_threads(1)
    _, train, val, meta, tok = arith()
    pad_id = meta["pad_id"]
    n_pairs = args.pairs or len(train)
    if n_pairs > len(train) or n_pairs < args.batch_size:
        raise UsageError(
            f"--pairs {args.pairs}: give from --batch_size {args.batch_size} to the "
            f"{len(train)} training pairs (0: all)"
        )
    text = JudgeText.from_tokenizer(tok, meta["end_id"])
    policy = sft_policy(train, meta, policy_config(meta), args)  # cached in --cache_dir
    judge = make_judge(policy, text, args.judge).train()
    zero_shot = evaluate(judge, args.judge, val, text, pad_id, args.eval_pairs)
    print("zero-shot: " + ", ".join(f"{k} {v:.3f}" for k, v in zero_shot.items()))

    torch.manual_seed(args.seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)  # the order of the pairs, and the a_b coin
    order = []  # the pairs still to visit in this epoch
    log_path = os.path.join(args.out_dir, "judge.jsonl")
    outputs.claim()  # judge.jsonl and judge_policy.pt in the record, before they are written
    with atomic_write(log_path, "w"):  # a new, empty log
        pass
    t0 = time.time()
    for step in range(args.steps):
        # the batch: the next batch_size pairs of a random order of the first n_pairs
        if len(order) < args.batch_size:
            order = torch.randperm(n_pairs, generator=g).tolist()
        idx, order = order[: args.batch_size], order[args.batch_size :]
        if args.judge == "yes_no":
            batch = yes_no_batch(train, idx, text, pad_id)
        else:  # the right answer's position by a coin: a judge that always says A learns nothing
            batch = a_b_batch(train, idx, text, pad_id, torch.rand(len(idx), generator=g) < 0.5)
        lr = args.lr * min(1.0, (step + 1) / max(1, args.warmup))
        for group in opt.param_groups:
            group["lr"] = lr

        # forward, backward, update
        loss, stats = judge.loss(*batch)
        check_finite(loss.item(), step, None)  # a NaN loss: one line, nothing saved
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), args.grad_clip)
        opt.step()

        if step % args.log_interval == 0 or step == args.steps - 1:
            row = dict(step=step, loss=loss.item(), accuracy=stats["accuracy"].item(), lr=lr)
            row["time"] = round(time.time() - t0, 2)
            append_text(log_path, json.dumps(row) + "\n")
            print(
                f"step {step}: loss {row['loss']:.4f} | acc {row['accuracy']:.2f} | {row['time']}s"
            )

    if not all(torch.isfinite(p).all() for p in policy.parameters()):  # never on disk
        raise UsageError(f"the weights are not finite after {args.steps} steps: lower --lr")
    tuned = evaluate(judge, args.judge, val, text, pad_id, args.eval_pairs)
    row = dict(step=args.steps, judge=args.judge, zero_shot=zero_shot, fine_tuned=tuned)
    append_text(log_path, json.dumps(row) + "\n")
    save_checkpoint(os.path.join(args.out_dir, "judge_policy.pt"), policy.eval(), meta)
    print(
        f"done in {time.time() - t0:.0f}s: held-out "
        + ", ".join(f"{k} {v:.3f}" for k, v in tuned.items())
        + f"; wrote {log_path}, judge_policy.pt"
    )
    return zero_shot, tuned


if __name__ == "__main__":
    run(main)
