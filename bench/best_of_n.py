"""
Best-of-N with a learned reward model, judged by a verifiable one: GSM8K questions, K answers
to each sampled from SmolLM2-135M-Instruct, every answer scored by a proxy reward model (one
trained on HH-RLHF preferences, bench/recipes/hh_smollm2.sh) and by verifiable.gsm8k_reward (the
gold reward: 1 if the final answer is right). Writes the scores to a JSON file that notebook 06
reads to draw best-of-N against N for both rewards.

    python bench/best_of_n.py --proxy out/hh-smollm2/ckpt.pt               # 40 questions x 16
    python bench/best_of_n.py --proxy out/hh-smollm2/ckpt.pt --questions 4 --k 4 --out /tmp/b.json

SmolLM2-135M gets almost no GSM8K question right (0 of 160 answers to the first 10 test
questions), and a gold reward that is always 0 ranks nothing; so the questions are the test
set's easiest, those whose reference solution makes at most --max_steps calculations (83 of
1,319 make at most one), and each asks for the final answer in a form the verifier reads.
The answers are sampled once, K per question, and best-of-N for every N <= K is computed from
them without sampling again (notebook 06 shows the estimator). Data: ../shared/data (GSM8K's
test.jsonl from https://github.com/openai/grade-school-math, and any SmolLM2-135M-Instruct
.gguf or Hugging Face directory as --policy).
"""

import json
import os
import sys
import time
from contextlib import nullcontext

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the root
from data.chat import chat_format
from data.tokenizer import load_tokenizer
from nanorm.base.checkpoints import load_transformer
from nanorm.base.command import ArgumentParser, UsageError, atomic_write, run
from nanorm.base.runtime import auto_dtype
from nanorm.ckpt import load_reward_model
from verifiable import gsm8k_reward

ASK = "\nEnd with: The answer is <number>."  # a final answer the verifier can find
HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "shared", "data")


def answers(policy, tok, fmt, question, k, max_new_tokens, temperature, ctx):
    """k sampled answers to one question: (prompt ids, [response ids, each ending with the
    end-of-turn token], [whether the model ended it itself])."""
    prompt = fmt.prompt_ids(tok, question + ASK)
    x = torch.tensor([prompt] * k)
    end, responses, finished = fmt.end_id(tok), [], []
    with ctx, torch.no_grad():
        out = policy.generate(x, max_new_tokens, temperature=temperature, eos_id=end)
    out = out[:, len(prompt) :]
    for row in out.tolist():
        done = end in row
        responses.append(row[: row.index(end) + 1] if done else row + [end])
        finished.append(done)
    return prompt, responses, finished


def proxy_rewards(rm, prompt, responses, pad_id, ctx):
    """The reward model's score of each [prompt | response], read at the response's end token;
    a DPO policy's implicit reward (its ckpt.pt as --proxy) reads the response's tokens, which
    response_mask marks (a reward model ignores it)."""
    rows = [prompt + r for r in responses]
    T = max(map(len, rows))
    ids = torch.tensor([r + [pad_id] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    response = torch.tensor([[0] * len(prompt) + [1] * (len(r) - len(prompt)) + [0] * (T - len(r))
                             for r in rows])  # fmt: skip
    with ctx, torch.no_grad():
        return rm(ids, mask, response_mask=response).float().tolist()


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--proxy", required=True, help="a reward model ckpt.pt (train_rm.py's)")
    policy_file = os.path.join(SHARED, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--policy", default=policy_file, help="the model that answers")
    p.add_argument("--gsm8k", default=os.path.join(SHARED, "gsm8k", "test.jsonl"))
    p.add_argument("--questions", type=int, default=40, help="the first this many questions")
    p.add_argument("--max_steps", type=int, default=1, help="calculations in the reference")
    p.add_argument("--k", type=int, default=16, help="answers sampled per question")
    p.add_argument("--max_new_tokens", type=int, default=192)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", default=os.path.join(HERE, "best_of_n.json"))
    args = p.parse_args(argv)
    for path in (args.proxy, args.policy, args.gsm8k):
        if not os.path.exists(path):
            raise UsageError(f"{path} not found")
    torch.manual_seed(args.seed)
    dtype = auto_dtype("cpu")  # bf16 autocast where the CPU multiplies it natively
    ctx = torch.autocast("cpu", torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    policy, tok = load_transformer(args.policy), load_tokenizer(args.policy)
    rm, ckpt = load_reward_model(args.proxy)
    if ckpt is None:
        raise UsageError(f"{args.proxy} is a backbone without a trained head: give a ckpt.pt")
    meta = ckpt.get("data_meta") or {}
    if meta.get("vocab_size") not in (None, tok.vocab_size):
        raise UsageError(f"{args.proxy} was trained on another vocabulary than {args.policy}'s")
    fmt = chat_format(tok, meta.get("chat_format", "auto"))
    with open(args.gsm8k) as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if r["answer"].count("<<") <= args.max_steps][: args.questions]
    results, start = [], time.time()
    for i, row in enumerate(rows):
        prompt, responses, finished = answers(
            policy, tok, fmt, row["question"], args.k, args.max_new_tokens, args.temperature, ctx
        )
        gold = [gsm8k_reward(tok.decode(r[:-1]), row["answer"]) for r in responses]
        proxy = proxy_rewards(rm, prompt, responses, meta.get("pad_id", 0), ctx)
        results.append(
            dict(index=i, gold=gold, proxy=[round(r, 5) for r in proxy], finished=finished)
        )
        results[-1]["tokens"] = [len(r) for r in responses]
        print(
            f"question {i + 1}/{len(rows)}: {int(sum(gold))}/{args.k} right, proxy "
            f"{min(proxy):+.2f}..{max(proxy):+.2f}, {time.time() - start:.0f}s"
        )
    info = {k: v for k, v in vars(args).items() if k not in ("out",)}
    info.update(dtype=dtype, seconds=round(time.time() - start), gold="verifiable.gsm8k_reward")
    info["proxy_trained_on"] = meta.get("source") or meta.get("groups")
    with atomic_write(args.out, "w") as f:  # one line per question: a readable diff
        rows = ",\n".join(json.dumps(q) for q in results)
        f.write(f'{{"info": {json.dumps(info)},\n"questions": [\n{rows}\n]}}\n')
    right = sum(sum(q["gold"]) for q in results)
    print(f"wrote {args.out}: {right:.0f} of {len(results) * args.k} answers right")


if __name__ == "__main__":
    run(main)
