"""
The built-in default dataset: arithmetic preference pairs, labelled by verifiable.py.

    python data/arith/prepare.py                 # writes data/arith/{tok.model,train.npz,val.npz,meta.json}
    python data/arith/prepare.py --n_train 20000 --max_operand 99
    python data/arith/prepare.py --out_dir out/mul --ops "*" --tokenizer data/arith/tok.model

Each prompt asks for a sum or difference of two one-digit numbers; the chosen response states
the right result and the rejected one a close wrong result (off by 1 or 2, or by 10, or with two
digits swapped), in the same phrasing. Val pairs never occur in train (the facts do: 200 of them). The labels come from verifiable.gsm8k_reward, never from how the
text was built, and every pair is checked: chosen scores 1, rejected 0.

--max_operand, --ops and --tokenizer (the built-in's, so a model trained on it reads the
new pairs) make held-out sets away from the training distribution: longer numbers, an
operator never seen (bench/dpo scores reward models on both).

Why this data: a reward model can only learn it by reading the numbers and doing the arithmetic.
Chosen and rejected have the same words and almost always the same length, so surface cues do not
help: the script prints the "longer response wins" baseline (in tokens, data/pairs.py's
length_heuristics), which stays near 0.5. A tiny LLaMA learns it from scratch on a laptop CPU in
a few minutes (with the LM term: see train_rm.py).
"""

import json
import os
import random
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the project root

from data.pairs import encode_pair, length_heuristics, looks_like_dataset, write_pairs
from data.tokenizer import SentencePieceTokenizer, tokenizer_fingerprint, train_sentencepiece
from nanorm.base.command import Outputs, UsageError, atomic_write, opt, parse_config, run
from verifiable import gsm8k_reward

QUESTIONS = ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?"]
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
ANSWERS = ["The answer is {x}.", "{a} {op} {b} = \\boxed{{{x}}}", "#### {x}"]


def close_wrong(x, rng):
    """A wrong result near x: the errors a weak model makes."""
    while True:
        kind = rng.choice(["plus1", "plus2", "ten", "swap"])
        if kind == "swap" and len(str(abs(x))) >= 2 and str(abs(x))[0] != str(abs(x))[-1]:
            s = str(abs(x))
            y = int(s[-1] + s[1:-1] + s[0]) * (1 if x >= 0 else -1)
        else:
            step = {"plus1": 1, "plus2": 2, "ten": 10, "swap": 1}[kind]
            y = x + rng.choice([-step, step])
        if y != x:
            return y


def make_pair(rng, max_operand, ops="+-"):
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    op = rng.choice(list(ops))
    x = OPS[op](a, b)
    q, t = rng.choice(QUESTIONS), rng.choice(ANSWERS)
    right = t.format(a=a, b=b, op=op, x=x)
    wrong = t.format(a=a, b=b, op=op, x=close_wrong(x, rng))
    # the verifier decides which is chosen; a pair it can't tell apart would be a bug
    r_right, r_wrong = gsm8k_reward(right, str(x)), gsm8k_reward(wrong, str(x))
    assert (r_right, r_wrong) == (1.0, 0.0), (right, wrong, x)
    return {"prompt": q.format(a=a, b=b, op=op), "chosen": " " + right, "rejected": " " + wrong}


def at_least(n):
    return (lambda v: v >= n, f">= {n}")


@dataclass
class ArithConfig:
    out_dir: str = opt(HERE, "the dataset folder")
    n_train: int = opt(20000, "training pairs", at_least(1))
    n_val: int = opt(1000, "held-out pairs", at_least(1))
    max_operand: int = opt(9, "operands from 0 to this", at_least(1))
    ops: str = opt(
        "+-",
        "the operators asked, from + - *",
        (lambda v: bool(v) and set(v) <= set(OPS), "one or more of + - *"),
    )
    tokenizer: str = opt("", "an existing tok.model to encode with (default: train one)")
    vocab_size: int = opt(
        320, "of the SentencePiece vocabulary (256 bytes + 3 at least)", at_least(259)
    )
    max_len: int = opt(64, "tokens per prompt + response", at_least(8))
    seed: int = opt(0, "seeds the questions and the split", at_least(0))


COMMAND, FILES = "data/arith/prepare.py", ["tok.model", "train.npz", "val.npz", "meta.json"]


def main(argv=None):
    args = parse_config(ArithConfig, argv, description=__doc__)

    if args.tokenizer and not os.path.isfile(args.tokenizer):
        raise UsageError(f"--tokenizer {args.tokenizer} not found: give a tok.model")
    rng = random.Random(args.seed)
    val = [make_pair(rng, args.max_operand, args.ops) for _ in range(args.n_val)]
    # held-out means unseen: no val pair (prompt, chosen, rejected) ever appears in train. The
    # arithmetic facts themselves do recur: the model is tested on new pairs over known facts.
    seen, train, misses = {tuple(p.values()) for p in val}, [], 0
    while len(train) < args.n_train:
        p = make_pair(rng, args.max_operand, args.ops)
        if tuple(p.values()) not in seen:
            train.append(p)
        elif (misses := misses + 1) > 100 * args.n_train:  # val holds (nearly) every pair
            raise UsageError(
                f"--n_val {args.n_val} leaves too few new pairs for training at "
                f"--max_operand {args.max_operand}: lower --n_val or raise --max_operand"
            )
    pairs = train + val
    # before anything is written: a file of these names that this script did not write (the
    # folder's record, .nanorm, says), or a link, is refused, never replaced
    names = [f for f in FILES if not (args.tokenizer and f == "tok.model")]  # an input then
    Outputs(args.out_dir, COMMAND, names, "--out_dir", earlier=looks_like_dataset).claim()
    texts = (p[k] for p in pairs for k in ("prompt", "chosen", "rejected"))
    try:
        tok_path = args.tokenizer or os.path.join(args.out_dir, "tok.model")
        if not args.tokenizer:
            tok_path = train_sentencepiece(texts, tok_path, args.vocab_size)
    except RuntimeError as e:  # e.g. "Vocabulary size is smaller than required_chars."
        raise UsageError(f"--vocab_size {args.vocab_size}: {str(e).rsplit('] ', 1)[-1]}") from None
    tok = SentencePieceTokenizer(tok_path)
    splits, longer = {"train": train, "val": val}, {}
    for split, rows in splits.items():
        encoded = [encode_pair(tok, r, args.max_len)[:3] for r in rows]
        longer[split] = length_heuristics((len(c), len(r)) for _, c, r in encoded).longer_wins
        path = os.path.join(args.out_dir, f"{split}.npz")
        write_pairs(path, encoded, tok.vocab_size)
        n_tok = sum(len(p) + len(c) + len(r) for p, c, r in encoded)
        print(f"wrote {path}: {len(rows)} pairs, {n_tok} tokens")
    meta = {
        "tokenizer": os.path.abspath(tok_path),
        "tokenizer_fingerprint": tokenizer_fingerprint(tok),
        "chat_format": "plain",
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "end_id": tok.eos_id,  # each response ends with EOS: the reward is read there
        "pad_id": tok.pad_id,
        "max_len": args.max_len,
        "length_baseline_val": round(longer["val"], 4),  # longer response wins, in tokens
    }
    with atomic_write(os.path.join(args.out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    tok_said = f"encoded with {tok_path}" if args.tokenizer else f"wrote {tok_path}"
    print(f"{tok_said} (vocab {tok.vocab_size}) and meta.json")
    print(f"example: {pairs[0]}")
    for split in splits:
        print(f"{split}: 'longer response wins' baseline accuracy {longer[split]:.3f}")
    return meta


def built_in():
    """data/arith, made with the default options the first time it is asked for: the data
    `python train_rm.py` trains on when no --dataset is given."""
    if not os.path.exists(os.path.join(HERE, "meta.json")):
        main([])
    return HERE


if __name__ == "__main__":
    run(main)
