"""
Anthropic HH-RLHF preference pairs, tokenized for train_rm.py.

    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz
    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/harmless-base/test.jsonl.gz \\
        --tokenizer ../shared/data/llama2c/tokenizer.model      # LLaMA-2's 32k vocabulary
    python data/hh_rlhf/prepare.py --subset helpful-base --split train   # online: downloads

Writes data/hh_rlhf/<subset>/{train.npz, val.npz, meta.json} (and tok.model when it trains a
vocabulary), and prints what it wrote with the length baselines. Without --tokenizer a
sentencepiece BPE vocabulary of --vocab_size pieces is trained on the training pairs only.
The val split is a seeded --val_frac of the rows (the shared data has only the test splits,
so we train on 80% of a test split and evaluate on the other 20%).
Bad rows are reported with file and line; --strict stops at the first instead of skipping.
"""

import argparse
import json
import os
import random
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the project root

from data.pairs import encode_pair, length_baseline, read_pairs, write_pairs
from data.tokenizer import load_tokenizer, train_sentencepiece

URL = "https://huggingface.co/datasets/Anthropic/hh-rlhf/resolve/main/{subset}/{split}.jsonl.gz"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--src", help="a local .jsonl(.gz); without it, download --subset/--split")
    p.add_argument("--subset", default=None, help="helpful-base, harmless-base, ...")
    p.add_argument("--split", default="train")
    p.add_argument("--out_dir", default=None, help="default data/hh_rlhf/<subset>")
    p.add_argument("--tokenizer", default=None, help="a .model or llama2.c .bin; else train one")
    p.add_argument("--vocab_size", type=int, default=2048)
    p.add_argument("--max_len", type=int, default=512)
    p.add_argument("--val_frac", type=float, default=0.2)
    p.add_argument("--strict", action="store_true", help="stop at the first bad row")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    if args.subset is None:  # from the path: .../helpful-base/test.jsonl.gz -> helpful-base
        args.subset = (
            os.path.basename(os.path.dirname(os.path.abspath(args.src)))
            if args.src
            else "helpful-base"
        )
    out = args.out_dir or os.path.join(HERE, args.subset)
    os.makedirs(out, exist_ok=True)
    src = args.src
    if src is None:
        src = os.path.join(out, f"raw_{args.split}.jsonl.gz")
        if not os.path.exists(src):
            url = URL.format(subset=args.subset, split=args.split)
            print(f"downloading {url}")
            urllib.request.urlretrieve(url, src + ".part")
            os.replace(src + ".part", src)
    pairs, skipped = read_pairs(src, strict=args.strict)
    print(f"read {len(pairs)} pairs from {src}; skipped {sum(skipped.values())} bad rows {skipped}")
    random.Random(args.seed).shuffle(pairs)
    n_val = int(len(pairs) * args.val_frac)
    splits = {"train": pairs[n_val:], "val": pairs[:n_val]}

    if args.tokenizer:
        tok_path = os.path.abspath(args.tokenizer)
    else:
        texts = (r[k] for r in splits["train"] for k in ("prompt", "chosen", "rejected"))
        tok_path = str(train_sentencepiece(texts, os.path.join(out, "tok.model"), args.vocab_size))
        print(f"trained a {args.vocab_size}-piece vocabulary: {tok_path}")
    tok = load_tokenizer(tok_path)
    for split, rows in splits.items():
        enc = [encode_pair(tok, r, args.max_len) for r in rows]
        n_trunc = sum(e[3] for e in enc)
        write_pairs(os.path.join(out, f"{split}.npz"), [e[:3] for e in enc], tok.vocab_size)
        n_tok = sum(len(a) + len(b) + len(c) for a, b, c, _ in enc)
        print(f"wrote {out}/{split}.npz: {len(rows)} pairs, {n_tok} tokens, "
              f"{n_trunc} with the response truncated to its last {args.max_len} tokens")  # fmt: skip
        lb = length_baseline(rows)
        print(f"  {split}: 'longer response wins' {lb:.3f}, 'shorter wins' {1 - lb:.3f}")
    meta = {"tokenizer": tok_path, "vocab_size": tok.vocab_size, "bos_id": tok.bos_id,
            "eos_id": tok.eos_id, "pad_id": tok.pad_id, "max_len": args.max_len, "source": src,
            "length_baseline_val": length_baseline(splits["val"]), "skipped": skipped}  # fmt: skip
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {out}/meta.json")
    return meta


if __name__ == "__main__":
    main()
