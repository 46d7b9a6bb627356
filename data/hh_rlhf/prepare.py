"""
Anthropic HH-RLHF preference pairs, tokenized for train_rm.py.

    # all four shared test splits (8,552 pairs) in SmolLM2's vocabulary and chat layout
    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf \\
        --tokenizer ../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out_dir data/hh_rlhf/smollm2
    # one subset, a 2,048-piece vocabulary trained on its training part -> data/hh_rlhf/helpful-base
    python data/hh_rlhf/prepare.py --src ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz
    # online, for real users: download a split (e.g. the 160k-pair train splits)
    python data/hh_rlhf/prepare.py --subset helpful-base --split train --tokenizer tok.gguf

data/prepare.py does the work (any preference file; this script adds HH's download and names).
--src takes files or folders (a folder: every <subset>/*.jsonl.gz under it). Each subset keeps a
fixed, seeded --val_frac of its rows as held-out pairs (the same rows for any tokenizer; at least
one when it has two or more), and the training set is the union of the rest; a pair given twice is
kept once (data/prepare.py). Writes <out_dir>/{train.npz, val.npz, meta.json} (and
tok.model when it trains a vocabulary); each pair's subset is stored with it, so train_rm.py and
eval_rm.py report accuracy per subset. meta.json records the tokenizer's identity (a hash of its
vocabulary, not its path), the chat layout and each subset's length heuristics.

Nothing is lost by accident: an existing dataset is replaced only with --overwrite, and then
whole (written aside, then renamed). Bad rows are reported by file and line and counted;
--strict stops at the first.
"""

import argparse
import os
import shutil
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the project root

from data.prepare import add_arguments, check_arguments, find_sources, prepare
from nanorm.base.command import ArgumentParser, UsageError, atomic_write, run

SUBSETS = ("helpful-base", "harmless-base", "helpful-online", "helpful-rejection-sampled")
URL = "https://huggingface.co/datasets/Anthropic/hh-rlhf/resolve/main/{subset}/{split}.jsonl.gz"


def download(subset, split):
    """The public split, cached beside the datasets (kept for the next run)."""
    path = os.path.join(HERE, "downloads", subset, f"{split}.jsonl.gz")
    if not os.path.exists(path):
        url = URL.format(subset=subset, split=split)
        print(f"downloading {url}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with urllib.request.urlopen(url) as r, atomic_write(path) as f:
            shutil.copyfileobj(r, f)  # a cut download never passes for a whole one
    return path


def main(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--src", nargs="+", help="local .jsonl(.gz) files or folders of them")
    p.add_argument("--subset", default=None, help=f"download this subset ({', '.join(SUBSETS)})")
    p.add_argument("--split", default="train", choices=("train", "test"))
    p.add_argument("--out_dir", default=None, help="default data/hh_rlhf/<subset>")
    add_arguments(p)
    args = p.parse_args(argv)
    check_arguments(p, args)
    if not args.src and args.subset not in SUBSETS:
        p.error(f"give --src, or --subset (one of {', '.join(SUBSETS)}) to download")

    sources = find_sources(args.src) if args.src else None
    name = args.subset
    if name is None and all(n in SUBSETS for n, _ in sources):  # the shared / published layout
        name = sources[0][0] if len(sources) == 1 else "hh"
    if args.out_dir is None and name is None:  # never a folder named after a temporary path
        raise UsageError(
            "name the output folder: --out_dir DIR (or --subset NAME for data/hh_rlhf/NAME)"
        )
    out = args.out_dir or os.path.join(HERE, name)
    if sources is None:
        sources = [(args.subset, download(args.subset, args.split))]
    return prepare(args, sources, out)


if __name__ == "__main__":
    run(main)
