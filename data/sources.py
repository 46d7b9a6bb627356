"""
The data eval_rm.py scores, from one --data argument: a prepared dataset's held-out pairs, raw
preference files (any format data/prepare.py reads; subsets from folder or file names),
RewardBench JSONL (its `subset` field), and GSM8K as verifier-labelled pairs for best-of-N.
Raw text is tokenized here in the checkpoint's chat layout, as data/prepare.py would.

    kind, path = data_kind("../shared/data/hh-rlhf/harmless-base/test.jsonl.gz")
    source = load_source(kind, path, args, info, tokenizer)   # pairs, subset names, pad id
"""

import glob
import itertools
import os
import re
import tempfile
from dataclasses import dataclass

from data.pairs import PairDataset, encode_pair, open_dataset, write_pairs
from data.prepare import subset_name
from data.rows import BadRowError, iter_rows, read_pairs
from verifiable import extract_gsm8k, gsm8k_reward

HERE = os.path.dirname(os.path.abspath(__file__))
GSM8K_WRONG = (1, -1, 10)  # a wrong final answer: the right one plus each of these


def data_kind(spec):
    """(kind, path) of one --data argument: kind is prepared, pairs, rewardbench or gsm8k.
    Raises ValueError naming the file when it is none of them."""
    if spec.startswith("gsm8k:"):
        return "gsm8k", spec.removeprefix("gsm8k:")
    if os.path.isdir(spec):
        if os.path.exists(os.path.join(spec, "meta.json")):
            return "prepared", spec
        if glob.glob(os.path.join(spec, "*", "*.jsonl*")):
            return "folder", spec
        raise ValueError(f"{spec}: no meta.json (a prepared dataset) nor <subset>/*.jsonl(.gz)")
    if not os.path.exists(spec):
        if spec == "arith" or os.path.isdir(os.path.join(HERE, spec)):
            return "prepared", spec  # a name under data/, as train_rm's --dataset takes
        raise ValueError(f"{spec} not found")
    if not re.search(r"\.jsonl?(\.gz)?$", spec):
        raise ValueError(
            f"{spec}: unknown data kind (expected a prepared directory, .jsonl, "
            ".jsonl.gz or gsm8k:PATH)"
        )
    row = first_row(spec)
    if "question" in row:
        return "gsm8k", spec
    if {"chosen", "rejected"} <= row.keys():
        return ("rewardbench" if "subset" in row else "pairs"), spec
    raise ValueError(
        f"{spec}: rows with keys {sorted(row)} are neither pairs "
        "(chosen, rejected), RewardBench (+ subset) nor GSM8K (question, answer)"
    )


def first_row(path):
    """The first row of a .jsonl(.gz) file, or of a .json(.gz) file's one array (read as
    data/prepare.py reads them: row by row, so a huge file costs no more than its first row)."""
    try:
        lineno, row = next(iter_rows(path, measure=False), (1, None))
    except BadRowError as e:  # the file itself: unreadable, too big
        raise ValueError(str(e)) from None
    if isinstance(row, BadRowError):
        raise ValueError(f"{path}:{lineno}: its first row is not a JSON object ({row})")
    if not isinstance(row, dict):
        raise ValueError(f"{path}: its first row is not a JSON object")
    return row


def gsm8k_pairs(path, limit=None):
    """GSM8K as pairs of a correct and an incorrect solution, labelled by verifiable.py.

    Rows {"question", "answer"}: the correct solution is the dataset's own (its calculator
    annotations <<...>> removed), the incorrect ones are the same text with the final answer
    changed by each of GSM8K_WRONG. Rows that also hold "solutions" (e.g. sampled from a policy)
    use those instead. Either way gsm8k_reward against "answer" decides which is correct, never
    how the text was made. Each correct solution is paired with each incorrect one; a question
    whose solutions are all correct or all wrong has no pair and is left out (and counted).
    -> (pairs, candidates per question for best_of_n, questions left out)."""
    pairs, candidates, left_out = [], [], 0
    try:
        rows = list(itertools.islice(iter_rows(path, measure=False), limit))
    except BadRowError as e:  # the file itself: unreadable, too big
        raise ValueError(str(e)) from None
    for lineno, row in rows:
        if isinstance(row, BadRowError):
            raise ValueError(f"{path}:{lineno}: not a GSM8K row: {row}")
        keys = ("question", "answer")
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in keys):
            raise ValueError(f"{path}:{lineno}: not a GSM8K row {{question, answer}} (strings)")
        question, answer = row["question"], row["answer"]
        if "solutions" in row:
            if not isinstance(row["solutions"], list):
                raise ValueError(f"{path}:{lineno}: 'solutions' is not a list of strings")
            sols = [s for s in row["solutions"] if isinstance(s, str) and s.strip()]
        else:
            right = re.sub(r"<<[^>]*>>", "", answer)
            final = extract_gsm8k(answer)
            try:
                value = int(final.replace(",", ""))  # every GSM8K answer is an integer
            except (AttributeError, ValueError):
                left_out += 1
                continue
            head = right[: right.rfind("####")]
            sols = [right] + [f"{head}#### {value + d}" for d in GSM8K_WRONG]
        correct = [gsm8k_reward(s, answer) == 1.0 for s in sols]
        good = [s for s, c in zip(sols, correct, strict=True) if c]
        bad = [s for s, c in zip(sols, correct, strict=True) if not c]
        if not good or not bad:
            left_out += 1
            continue
        seat = {}  # each candidate's first (pair row, side): its reward
        for i, g in enumerate(good):
            for j, b in enumerate(bad):
                seat.setdefault(("good", i), (len(pairs), 0))
                seat.setdefault(("bad", j), (len(pairs), 1))
                pairs.append({"prompt": question, "chosen": " " + g, "rejected": " " + b})
        candidates.append(
            [(*seat["good", i], True) for i in range(len(good))]
            + [(*seat["bad", j], False) for j in range(len(bad))]
        )
    return pairs, candidates, left_out


def to_dataset(pairs, tok, fmt, max_len):
    """Pairs of text -> a PairDataset tokenized as data/hh_rlhf/prepare.py does, through the
    same .npz, so train_rm.evaluate scores it as it scores a prepared dataset."""
    encoded = [encode_pair(tok, pair, max_len, fmt)[:3] for pair in pairs]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pairs.npz")
        write_pairs(path, encoded, tok.vocab_size)
        return PairDataset(path)  # read whole into memory: the folder can go


@dataclass
class Source:
    """One --data argument, tokenized: its pairs, each pair's subset name, and for GSM8K the
    candidates of each question (best-of-N)."""

    data: PairDataset
    names: list
    pad_id: int
    candidates: list | None = None


def load_source(kind, path, args, info, tokenizer):
    """A Source for one --data argument; tokenizer() loads the tokenizer the first time."""
    if kind == "prepared":
        d, meta, (data,) = open_dataset(path, "val")
        mine, theirs = info["meta"].get("tokenizer_fingerprint"), meta.get("tokenizer_fingerprint")
        if mine and theirs and mine != theirs:
            raise ValueError(
                f"{d} was tokenized with another vocabulary than the checkpoint's "
                f"({meta.get('tokenizer')}, fingerprint {theirs} != {mine})"
            )
        n = min(len(data), args.max_pairs or len(data))
        if data.groups is None:
            names = [os.path.basename(os.path.normpath(d))] * n
        else:
            names = [meta["groups"][g] for g in data.groups[:n]]
        return Source(data, names, meta["pad_id"])
    tok, fmt = tokenizer()
    max_len = args.max_len or info["max_len"]
    pad_id = tok.pad_id if tok.pad_id is not None else tok.eos_id
    if kind == "gsm8k":
        pairs, candidates, left_out = gsm8k_pairs(path, args.max_pairs)
        if not pairs:
            raise ValueError(f"{path}: no question with both a correct and a wrong solution")
        if left_out:
            print(f"{path}: {left_out} questions left out (no correct or no wrong solution)")
        name = "gsm8k" if subset_name(path) in ("test", "train") else subset_name(path)
        return Source(to_dataset(pairs, tok, fmt, max_len), [name] * len(pairs), pad_id, candidates)
    files = sorted(glob.glob(os.path.join(path, "*", "*.jsonl*"))) if kind == "folder" else [path]
    pairs, names = [], []
    for file in files:
        subset_key = "subset" if kind == "rewardbench" else None  # RewardBench names its own
        try:
            got, skipped = read_pairs(file, strict=False, subset_key=subset_key)
        except BadRowError as e:
            raise ValueError(str(e)) from None
        got = got[: args.max_pairs]
        if kind == "rewardbench":
            names += [p["subset"] for p in got]
        else:
            names += [subset_name(file)] * len(got)
        pairs += got
    return Source(to_dataset(pairs, tok, fmt, max_len), names, pad_id)
