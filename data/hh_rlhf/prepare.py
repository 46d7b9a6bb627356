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

import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the project root

from data.prepare import PrepareOptions, find_sources, prepare
from nanorm.base.command import UsageError, atomic_write, one_of, opt, parse_config, run

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


@dataclass(kw_only=True)
class HHConfig(PrepareOptions):
    src: list[str] | None = opt(None, "local .jsonl(.gz) files or folders of them")
    subset: str | None = opt(None, f"download this subset ({', '.join(SUBSETS)})")
    split: str = opt("train", "the split to download", one_of("train", "test"))
    out_dir: str | None = opt(None, "default data/hh_rlhf/<subset>")


def main(argv=None):
    args = parse_config(HHConfig, argv, description=__doc__)
    if not args.src and args.subset not in SUBSETS:
        raise UsageError(f"give --src, or --subset (one of {', '.join(SUBSETS)}) to download")

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
