"""
Build the real-output corpus bench_verifiable.py grades: completions that SmolLM2-135M-Instruct
writes for GSM8K and MATH-500 problems in several prompt styles, generated here on the CPU
through nanoRM's own model.py. Labels are added afterwards by reading each completion (see
bench/CORPUS.md); this script only generates and splits.

    OMP_NUM_THREADS=1 python bench/make_corpus.py generate --out bench/corpus_raw.jsonl
    OMP_NUM_THREADS=1 python bench/make_corpus.py generate --quick    # rate on one batch
    python bench/make_corpus.py split bench/corpus_smollm2.jsonl   # (re)write the split field

The split is fixed by a hash of the row's id, not by its content or its label, so it was chosen
before any grader was changed and cannot drift when a label is corrected.
"""

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
GGUF = DATA / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
sys.path.insert(0, str(ROOT))

# Chain-of-thought exemplars in the two "Q: ... A: ..." layouts people use with GSM8K:
# Wei et al.'s "The answer is N." and a worked solution that ends on a line "A: N".
EXEMPLARS = [
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. "
        "After they are done, there will be 21 trees. How many trees did the workers plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were planted. "
        "So there must have been 21 - 15 = 6.",
        "6",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. "
        "So she has 23 - 15 dollars left. 23 - 15 is 8.",
        "8",
    ),
]

STYLES = {  # name: (dataset, how the prompt is written)
    "gsm8k_plain": ("gsm8k", "chat"),
    "gsm8k_fewshot_cot": ("gsm8k", "fewshot_cot"),
    "gsm8k_fewshot_aline": ("gsm8k", "fewshot_aline"),
    "gsm8k_tags": ("gsm8k", "chat_tags"),
    "math_plain": ("math500", "chat"),
    "math_boxed": ("math500", "chat_boxed"),
    "math_tags": ("math500", "chat_tags"),
}
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
TAGS = (
    "\nThink step by step, then write the final answer inside <answer></answer> tags, "
    "e.g. <answer>42</answer>."
)


def problems(dataset):
    rows = [json.loads(line) for line in open(DATA / dataset / "test.jsonl")]
    if dataset == "gsm8k":
        return [(f"gsm8k/{i}", r["question"], r["answer"].rsplit("####", 1)[1].strip())
                for i, r in enumerate(rows)]  # fmt: skip
    # MATH levels 1-2 only: a 135M model gets a few of those right, and almost none above
    return [(r["unique_id"], r["problem"], r["answer"]) for r in rows if r["level"] <= 2]


def prompt_text(layout, question):
    if layout == "fewshot_cot":
        shots = "".join(f"Q: {q}\nA: {s} The answer is {a}.\n\n" for q, s, a in EXEMPLARS)
        return shots + f"Q: {question}\nA:"
    if layout == "fewshot_aline":
        shots = "".join(f"Q: {q}\n{s}\nA: {a}\n\n" for q, s, a in EXEMPLARS)
        return shots + f"Q: {question}\n"
    return question + {"chat": "", "chat_boxed": BOXED, "chat_tags": TAGS}[layout]


def prompt_ids(tok, fmt, layout, question):
    text = prompt_text(layout, question)
    if layout.startswith("fewshot"):  # a raw continuation, as a base model is prompted
        return tok.encode(text)
    return fmt.prompt_ids(tok, text)


def cut(text, layout):
    """Where a serving stack's stop sequences would have ended the completion."""
    text = text.split("<|im_end|>", 1)[0].split("<|endoftext|>", 1)[0]
    if layout.startswith("fewshot"):
        text = text.split("\nQ:", 1)[0]
    return text.strip()


def generate(args):
    import torch

    from data.chat import chat_format
    from data.tokenizer import load_tokenizer
    from nanorm.base.checkpoints import load_transformer

    torch.set_num_threads(1)
    model = load_transformer(GGUF)
    tok = load_tokenizer(str(GGUF))
    fmt = chat_format(tok)
    rng = random.Random(args.seed)
    jobs = []  # (style, decoding, problem)
    for style, (dataset, _) in STYLES.items():
        if args.styles and style not in args.styles:
            continue
        pool = problems(dataset)
        for decoding in args.decodings:
            for p in rng.sample(pool, args.per_style):
                jobs.append((style, decoding, p))
    if args.quick:
        jobs = jobs[: args.batch]
    out = open(args.out, "a" if args.resume else "w")
    done = set()
    if args.resume:
        done = {json.loads(line)["id"] for line in open(args.out)}
    for i in range(0, len(jobs), args.batch):
        batch = [j for j in jobs[i : i + args.batch]]
        ids_of = lambda j: f"{j[0]}/{j[1]}/{j[2][0]}"  # noqa: E731
        batch = [j for j in batch if ids_of(j) not in done]
        if not batch:
            continue
        by_decoding = {}
        for j in batch:
            by_decoding.setdefault(j[1], []).append(j)
        for decoding, group in by_decoding.items():
            t0 = time.time()
            prompts = [prompt_ids(tok, fmt, STYLES[s][1], p[1]) for s, _, p in group]
            T = max(map(len, prompts))
            pad = tok.eos_id if tok.eos_id is not None else 0
            tokens = torch.tensor([[pad] * (T - len(p)) + p for p in prompts])  # left-padded
            mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts]).bool()
            torch.manual_seed(1234 + i)
            with torch.no_grad():
                outs = model.generate(
                    tokens,
                    args.max_new_tokens,
                    temperature=0.0 if decoding == "greedy" else 0.7,
                    top_k=None if decoding == "greedy" else 50,
                    attention_mask=mask,
                )
            for (style, _, (pid, question, answer)), row in zip(group, outs, strict=True):
                text = cut(tok.decode(row[T:].tolist()), STYLES[style][1])
                rec = {"id": f"{style}/{decoding}/{pid}", "source": "smollm2-135m",
                       "style": style, "decoding": decoding, "problem": question,
                       "reference": answer, "completion": text}  # fmt: skip
                out.write(json.dumps(rec) + "\n")
            out.flush()
            rate = len(group) * args.max_new_tokens / (time.time() - t0)
            print(f"{i + len(group)}/{len(jobs)} {decoding} {rate:.0f} tok/s", flush=True)


def split_of(row_id, held_out=0.5):
    """ "dev" or "heldout" from a seeded hash of the row's id."""
    h = int(hashlib.sha256(("nanoRM-corpus-v1:" + row_id).encode()).hexdigest()[:8], 16)
    return "heldout" if h / 16**8 < held_out else "dev"


def split(args):
    for path in args.paths:
        rows = [json.loads(line) for line in open(path) if line.strip()]
        for r in rows:
            r["split"] = split_of(r["id"])
        Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
        n = sum(r["split"] == "heldout" for r in rows)
        print(f"{path}: {len(rows) - n} dev, {n} held-out")


def transcribe(args):
    """Math-Verify's regression cases as data: each (gold, pred, expected) tuple of a
    pytest.mark.parametrize list in its test files, read with ast.literal_eval (never run).
    Cases that need a non-default option (strict=False, set-relation comparison) are skipped;
    a case with a custom float precision keeps it in a field (nanoRM is exact, it never rounds)."""
    import ast

    out = []
    for path in args.paths:
        tree = ast.parse(Path(path).read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            for dec in fn.decorator_list:
                if not (
                    isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"
                ):
                    continue
                names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
                if (
                    names[:2] != ["gold", "pred"]
                    or "strict" in names
                    or "allow_set_relation_comp" in names
                ):
                    continue
                for k, node in enumerate(dec.args[1].elts):
                    try:
                        case = ast.literal_eval(node)
                    except ValueError:  # an f-string or pytest.param(...): left out
                        continue
                    row = dict(zip(names, case, strict=True))
                    rid = f"{Path(path).stem}/{fn.name}/{k}"
                    rec = {"id": rid, "source": "math-verify-tests", "reference": row["gold"],
                           "completion": row["pred"], "equal": bool(row.get("expected", row.get("result"))),
                           "label_by": "Math-Verify's expected value in its test file"}  # fmt: skip
                    if "precision" in row:
                        rec["precision"] = row["precision"]
                    out.append(rec)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in out))
    print(f"{len(out)} cases -> {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", default=str(ROOT / "bench" / "corpus_raw.jsonl"))
    g.add_argument("--per_style", type=int, default=12, help="problems per style and decoding")
    g.add_argument("--batch", type=int, default=12)
    g.add_argument("--max_new_tokens", type=int, default=256)
    g.add_argument("--quick", action="store_true", help="one batch, to measure the rate")
    g.add_argument("--styles", nargs="*", default=None, help="only these prompt styles")
    g.add_argument("--decodings", nargs="*", default=["greedy", "t0.7"])
    g.add_argument("--seed", type=int, default=0, help="which problems are drawn")
    g.add_argument("--resume", action="store_true")
    s = sub.add_parser("split")
    s.add_argument("paths", nargs="+")
    t = sub.add_parser("mathverify", help="transcribe Math-Verify's test cases")
    t.add_argument("paths", nargs="+", help="Math-Verify's tests/test_*.py")
    t.add_argument("--out", default=str(ROOT / "bench" / "corpus_mathverify.jsonl"))
    args = p.parse_args()
    {"generate": generate, "split": split, "mathverify": transcribe}[args.cmd](args)


if __name__ == "__main__":
    main()
