"""
Your own preference data, tokenized for train_rm.py: one script for every file format.

    # a file of conversations in SmolLM2's vocabulary and chat layout (ChatML)
    python data/prepare.py --src prefs.jsonl \\
        --tokenizer ../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out_dir data/mine
    # a folder: each file (or each subfolder of <split>.jsonl files) is a subset; no --tokenizer:
    # a 2,048-piece vocabulary trained on the training part, plain-text layout
    python data/prepare.py --src prefs/ --out_dir data/mine
    # subsets from a field of the rows instead, e.g. UltraFeedback's "source"
    python data/prepare.py --src a.jsonl.gz b.json --subset_key source \\
        --tokenizer tok.gguf --out_dir data/mine
    python train_rm.py --dataset data/mine --init tok.gguf --lm_coef 0   # then train on it

--src takes .jsonl, .jsonl.gz and .json (one JSON array) files, or folders of them. The format of
each row is detected (data/pairs.py: string pairs {prompt, chosen, rejected}, HH dialogues
{chosen, rejected}, conversations [{role, content}, ...] with an implicit or explicit prompt) and
each file's formats are reported. Conversations are rendered in the tokenizer's chat layout
(data/chat.py: ChatML, Llama 3, or plain text), system messages and earlier turns included, and
the reward is read at the end-of-turn token of the last assistant turn.

A subset is a file's name (prefs/coding.jsonl: coding), or its folder's when the file is named
after a split (helpful-base/test.jsonl.gz: helpful-base), or the row's --subset_key field. Each
subset keeps a fixed, seeded --val_frac of its rows as held-out pairs (the same rows for any
tokenizer; at least one when it has two or more); the training set is the union of the rest. A
pair given twice (the same prompt, chosen and rejected, in any file) is kept once and the copies
are counted: a copy held out while its twin trains would make the held-out accuracy a training
one. Writes <out_dir>/{train.npz, val.npz, meta.json} (and tok.model when it trains a
vocabulary); each pair's subset is stored with it, so train_rm.py and eval_rm.py report accuracy
per subset. meta.json records the tokenizer's identity (a hash of its vocabulary, not its path),
the chat layout, each file's formats, the copies left out and each subset's length heuristics.

Nothing is lost by accident: an existing dataset is replaced only with --overwrite, and then
whole (written aside, then renamed); an --out_dir that is a file, or a folder holding anything
else, is refused with or without --overwrite. A --tokenizer is an input, never an output: the
dataset's own tok.model given as --tokenizer is copied into the dataset that replaces it. A run
killed midway leaves a folder aside, which the next run removes (and a dataset set aside, which
it puts back). Bad rows are reported by file and line and counted; --strict stops at the first.
"""

import fcntl
import glob
import json
import os
import random
import re
import secrets
import shutil
import sys
from collections import Counter
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the root

from data.chat import chat_format
from data.pairs import encode_pair, length_heuristics, looks_like_dataset, write_pairs
from data.rows import BadRowError, read_pairs
from data.tokenizer import load_tokenizer, tokenizer_fingerprint, train_sentencepiece
from nanorm.base.command import (
    MARKER,
    NON_NEGATIVE,
    REQUIRED,
    UsageError,
    one_of,
    opt,
    parse_config,
    read_record,
    run,
    write_record,
)

EXTENSIONS = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
SPLIT_NAMES = ("train", "test", "val", "valid", "validation", "dev")  # not a subset's name


def fail(msg):
    raise UsageError(msg)


def subset_name(path):
    """helpful-base/test.jsonl.gz -> helpful-base; prefs/coding.jsonl -> coding."""
    stem = os.path.basename(path).split(".")[0]
    return os.path.basename(os.path.dirname(os.path.abspath(path))) if stem in SPLIT_NAMES else stem


def find_sources(srcs):
    """[(subset name, file)] for files and folders (their files and their subfolders' files,
    in sorted order)."""
    found = []
    for src in srcs:
        if os.path.isdir(src):
            files = sorted(
                f
                for pattern in ("*", os.path.join("*", "*"))
                for f in glob.glob(os.path.join(src, pattern))
                if f.endswith(EXTENSIONS) and os.path.isfile(f)
            )
            if not files:
                fail(f"{src}: no {', '.join(EXTENSIONS)} files in this folder or its subfolders")
            found += find_sources(files)
        elif os.path.isfile(src):
            if not src.endswith(EXTENSIONS):
                fail(f"{src}: not a preference file; give {', '.join(EXTENSIONS)}")
            found.append((subset_name(src), src))
        else:
            fail(f"{src} not found")
    return found


def read_sources(sources, subset_key=None, strict=False):
    """{subset: [pairs]} in order of first appearance, the bad rows by kind, and each file's
    formats. Subsets come from the file names, or from each row's subset_key field."""
    names = [n for n, _ in sources]
    if subset_key is None and len(set(names)) != len(names):
        fail(f"two sources have the same subset name: {names} (rename them, or --subset_key)")
    subsets, skipped, formats = {}, Counter(), {}
    for name, path in sources:
        try:
            pairs, bad = read_pairs(path, strict=strict, subset_key=subset_key)
        except BadRowError as e:
            fail(str(e))
        skipped.update(bad)
        formats[path] = dict(Counter(p["format"] for p in pairs))
        kinds = ", ".join(f"{n} {f}" for f, n in formats[path].items()) or "no pairs"
        print(f"{path}: {len(pairs)} rows, format {kinds}; bad rows: {sum(bad.values())}")
        for p in pairs:
            subsets.setdefault(p["subset"] if subset_key else name, []).append(p)
    if not subsets:
        fail(f"no pairs in {', '.join(p for _, p in sources)}: see the bad rows above")
    return subsets, dict(skipped), formats


def drop_duplicates(subsets):
    """Keep the first copy of each pair (the same prompt, chosen and rejected, in any subset) and
    report the others: a copy split apart from its twin would be held out and trained on at once,
    and the held-out accuracy would be measured on training pairs. -> how many were dropped."""
    first, copies = {}, []
    for name, pairs in subsets.items():
        kept = []
        for p in pairs:
            prompt = p["prompt"] if isinstance(p["prompt"], str) else tuple(p["prompt"])
            key = (prompt, p["chosen"], p["rejected"])
            if key in first:
                copies.append((p["where"], first[key]))
            else:
                first[key] = p["where"]
                kept.append(p)
        subsets[name] = kept
    if copies:
        (where, original), n = copies[0], len(copies)
        print(
            f"{n} pairs are copies of an earlier one (same prompt, chosen and rejected), left out:"
        )
        print(f"  e.g. {where} repeats {original}")
    for name in [n for n, pairs in subsets.items() if not pairs]:
        print(f"{name}: every pair is a copy of one in an earlier subset; left out")
        del subsets[name]
    return len(copies)


def split(subsets, val_frac, seed, max_train=None):
    """{"train", "val"}: [(group, pair)], a fixed, seeded val_frac of each subset held out, and at
    least one pair of a subset of two or more (so every such subset is measured); the rest trains,
    at most max_train pairs of each subset (the held-out rows are the same)."""
    splits = {"train": [], "val": []}
    for g, (subset, pairs) in enumerate(subsets.items()):
        random.Random(f"{seed}-{subset}").shuffle(pairs)  # the same rows for any tokenizer
        n_val = int(len(pairs) * val_frac)
        if n_val == 0 and len(pairs) >= 2:
            n_val = 1
            print(f"{subset}: --val_frac {val_frac} of {len(pairs)} pairs is none; holding out 1")
        train = pairs[n_val:][:max_train]
        splits["val"] += [(g, r) for r in pairs[:n_val]]
        splits["train"] += [(g, r) for r in train]
        print(f"{subset}: {len(pairs)} pairs, {n_val} held out, {len(train)} to train on")
    if not splits["val"]:
        fail(
            f"--val_frac {val_frac} holds out no pair: each of the {len(subsets)} subsets has a "
            "single pair; give more rows per subset (fewer subsets, or no --subset_key)"
        )
    return splits


def texts(pair):
    """Every text of a pair, for training a vocabulary (a prompt may be (role, text) turns)."""
    prompt = pair["prompt"]
    yield from [prompt] if isinstance(prompt, str) else (text for _, text in prompt)
    yield pair["chosen"]
    yield pair["rejected"]


def heuristics(encoded):
    """meta.json's length heuristics of encoded pairs, in response tokens (4 digits)."""
    h = length_heuristics((len(c), len(r)) for _, c, r in encoded)
    return round(h.longer_wins, 4), round(h.shorter_wins, 4), h.ties


@dataclass(kw_only=True)
class PrepareOptions:
    """The options every prepare script shares (data/hh_rlhf/prepare.py adds its own)."""

    tokenizer: str | None = opt(None, ".gguf, tokenizer.json, HF dir, .model, .bin")
    chat: str = opt("auto", "the chat layout", one_of("auto", "plain", "chatml", "llama3"))
    subset_key: str | None = opt(None, "a row field naming each pair's subset")
    vocab_size: int = opt(2048, "when training a vocabulary", (lambda v: v >= 256, ">= 256"))
    max_len: int = opt(
        512,
        "tokens per prompt + response; the model's max_seq_len must hold it",
        (lambda v: v >= 8, ">= 8"),
    )
    val_frac: float = opt(0.2, "held-out part of each subset", (lambda v: 0 < v < 1, "in (0, 1)"))
    max_train: int | None = opt(
        None, "training pairs per subset, at most", (lambda v: v is None or v >= 1, ">= 1")
    )
    seed: int = opt(0, "seeds the split and the order", NON_NEGATIVE)
    strict: bool = opt(False, "stop at the first bad row")
    overwrite: bool = opt(False, "replace an existing dataset")


@dataclass(kw_only=True)
class PrepareConfig(PrepareOptions):
    src: list[str] = opt(REQUIRED, "preference files or folders of them")
    out_dir: str = opt(REQUIRED, "the dataset folder train_rm.py reads")


DATASET_FILES = {"meta.json", "train.npz", "val.npz", "tok.model"}  # and the record, .nanorm
COMMAND = "data/prepare.py"  # the name its record gives it
PARTIAL = {f"{f}.tmp" for f in DATASET_FILES}  # a file being written (data.atomic_write)


def check_out_dir(out, overwrite):
    """Refuse an --out_dir that holds anything but a dataset this script wrote: a file, or a
    folder with other files in it (or links, or folders, which it never writes), is the user's
    and is never replaced, --overwrite or not. What this script wrote is what the folder's
    record (.nanorm) gives it; a folder without one (an older nanoRM kept none) is a dataset
    if its meta.json is one."""
    if not os.path.lexists(out):
        return
    if not os.path.isdir(out) or os.path.islink(out):
        fail(f"--out_dir {out} is a file, not a dataset folder: choose another --out_dir")
    held = set(os.listdir(out)) - {MARKER}
    if not held:
        return  # an empty folder: nothing to lose
    odd = sorted(f for f in held if not plain_file(os.path.join(out, f)))
    if odd:
        fail(
            f"--out_dir {out} holds {odd[0]}, a link or a folder, which this script never "
            "writes (it is not a prepared dataset): choose a new or empty --out_dir"
        )
    record = read_record(out, "--out_dir")
    if record is None and not looks_like_dataset(out):
        record = {}  # no record, and no dataset's meta.json: nothing there is this script's
    if record is not None:
        theirs = sorted(f for f in held if record.get(f) != COMMAND)
        if theirs:
            why = "its record, .nanorm, does not list it" if record else "no .nanorm record"
            fail(
                f"--out_dir {out} is not a prepared dataset: it holds {theirs[0]}, which this "
                f"script did not write ({why}); choose a new or empty --out_dir"
            )
    if "meta.json" not in held or not held <= DATASET_FILES:
        fail(
            f"--out_dir {out} holds files that are not a prepared dataset "
            f"({', '.join(sorted(held - DATASET_FILES)[:3]) or 'no meta.json'}): "
            "choose a new or empty --out_dir"
        )
    if not overwrite:
        fail(f"{out} already holds a dataset: pass --overwrite to replace it, or --out_dir")


def plain_file(path):
    return os.path.isfile(path) and not os.path.islink(path)


def inside(path, folder):
    """Whether path is folder or lies under it, links followed (a link is where it points)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def tokenizer_to_keep(tokenizer, out):
    """The --tokenizer, when it lies in the --out_dir this run replaces: the dataset's own
    tok.model (e.g. to tokenize it again at another --max_len). It is an input: the new dataset
    gets a copy, at the same path, so whatever else names that path still finds it. Anything
    else in --out_dir is not a tokenizer: refused before anything is read."""
    if not tokenizer or not os.path.lexists(out) or not inside(tokenizer, out):
        return None
    real = os.path.realpath(tokenizer)
    if os.path.dirname(real) != os.path.realpath(out) or os.path.basename(real) != "tok.model":
        fail(
            f"--tokenizer {tokenizer} lies in --out_dir {out}, which this run replaces: give a "
            "tokenizer outside it, or another --out_dir"
        )
    return real


def aside(out, kind):
    """A new folder beside out, <name>.<kind>-<random>, and the open descriptor of its lock: the
    run holds an flock on the folder while it runs, and the kernel drops it when the process
    ends, however it ends, so a later run knows a folder nobody holds is stale (clean_stale).
    Made by mkdir, so its mode follows the umask, as any folder the user makes (mkdtemp's 0700
    would stay with the dataset)."""
    parent, name = os.path.split(out)
    while True:
        path = os.path.join(parent, f"{name}.{kind}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path)
            break
        except FileExistsError:
            continue
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a new folder: nobody else holds it
    return path, fd


def ours(folder, names):
    """Whether folder holds nothing but plain files named in names (what this script writes),
    or atomic_write's temporary files of them (.name.<12 hex digits>.tmp)."""
    held = {re.sub(r"^\.(.+)\.[0-9a-f]{12}\.tmp$", r"\1", f) for f in os.listdir(folder)}
    return held <= names and all(plain_file(os.path.join(folder, f)) for f in os.listdir(folder))


def clean_stale(out):
    """Remove the folders that runs killed midway (kill -9, a power cut) left beside out: named
    as aside() names them, held by no run, holding only what this script writes. A run killed
    between its two renames left no out and the old dataset aside: it is put back, so
    --overwrite still decides whether it is replaced."""
    parent, name = os.path.split(out)
    stale = re.compile(re.escape(name) + r"\.(tmp|old)-\w{8}")  # (and tempfile's, as it was)
    for entry in sorted(os.listdir(parent)):
        m, path = stale.fullmatch(entry), os.path.join(parent, entry)
        if not m or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # not ours to open: not ours to remove
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a run that is still going
            os.close(fd)
            continue
        try:
            put_away(out, path, m.group(1))
        finally:
            os.close(fd)


def put_away(out, path, kind):
    """clean_stale's work on one stale folder: a tmp- one is deleted; an old- one gives back
    the dataset it holds (d) when out is missing, else deletes it. Anything else is kept."""
    if kind == "tmp":
        if ours(path, DATASET_FILES | PARTIAL | {MARKER}):
            shutil.rmtree(path)
        return
    old = os.path.join(path, "d")  # aside: d, the dataset out held
    if os.listdir(path) == ["d"] and not os.path.islink(old) and os.path.isdir(old):
        if not ours(old, DATASET_FILES | {MARKER}):
            return
        if not os.path.lexists(out):
            os.replace(old, out)
            print(f"put back {out}, which a run killed while replacing it had set aside")
        else:
            shutil.rmtree(old)
    if not os.listdir(path):
        os.rmdir(path)


def prepare(args, sources, out):
    """Read, split, tokenize and write sources to the folder out; -> meta.json's dict."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    if os.path.isdir(parent):
        clean_stale(out)
    check_out_dir(out, args.overwrite)
    keep = tokenizer_to_keep(args.tokenizer, out)
    subsets, skipped, formats = read_sources(sources, args.subset_key, args.strict)
    duplicates = drop_duplicates(subsets)
    splits = split(subsets, args.val_frac, args.seed, args.max_train)
    os.makedirs(parent, exist_ok=True)
    tmp, lock = aside(out, "tmp")
    locks = [lock]  # held until the end: a run that is going is never taken for a stale one
    try:
        if keep:  # the --tokenizer is out's own tok.model: the new dataset keeps a copy
            shutil.copyfile(keep, os.path.join(tmp, "tok.model"))
        meta = write_dataset(args, sources, list(subsets), splits, tmp, out, bool(keep))
        meta.update(skipped=skipped, duplicates=duplicates, formats=formats)
        meta.update(subset_key=args.subset_key)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        write_record(tmp, dict.fromkeys(set(os.listdir(tmp)) & DATASET_FILES, COMMAND))
        if os.path.exists(out):  # replace the old dataset whole: aside, swap, delete
            old, lock = aside(out, "old")
            locks.append(lock)
            os.replace(out, os.path.join(old, "d"))
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        for lock in locks:
            os.close(lock)
    print(f"wrote {out}/{{train.npz, val.npz, meta.json}}")
    return meta


def write_dataset(args, sources, names, splits, tmp, out, kept=False):
    """Tokenize each split into tmp/<split>.npz; -> meta.json's dict (out: the final folder;
    kept: the --tokenizer is out's own tok.model, copied into tmp)."""
    own = kept or not args.tokenizer  # the dataset's own tok.model, trained here or kept
    tok_path = os.path.join(out, "tok.model") if own else os.path.abspath(args.tokenizer)
    if not args.tokenizer:  # a vocabulary trained on the training pairs only
        train_texts = (t for _, r in splits["train"] for t in texts(r))
        try:
            train_sentencepiece(train_texts, os.path.join(tmp, "tok.model"), args.vocab_size)
        except RuntimeError as e:
            fail(vocab_error(args.vocab_size, e))
        print(f"trained a {args.vocab_size}-piece vocabulary")
    try:  # tok_path is where tok.model will be once the folder is renamed: read it in tmp
        tok = load_tokenizer(os.path.join(tmp, "tok.model") if own else tok_path)
        fmt = chat_format(tok, args.chat)
    except (OSError, ValueError) as e:
        fail(str(e))
    print(f"chat layout: {fmt.name}")
    stats = {n: {} for n in names}
    for split_name, rows in splits.items():
        enc = [encode_pair(tok, r, args.max_len, fmt) for _, r in rows]
        cut = [r["where"] for (_, r), e in zip(rows, enc, strict=True) if e[3]]
        for where in cut[:5]:
            print(f"  {where}: response longer than {args.max_len} tokens, kept its end")
        if len(cut) > 5:
            print(f"  ... and {len(cut) - 5} more rows whose response was cut to its end")
        enc = [e[:3] for e in enc]
        groups = [g for g, _ in rows]
        write_pairs(os.path.join(tmp, f"{split_name}.npz"), enc, tok.vocab_size, groups)
        n_tok = sum(len(a) + len(b) + len(c) for a, b, c in enc)
        print(f"{split_name}: {len(rows)} pairs, {n_tok:,} tokens, {len(cut)} responses truncated")
        for g, n in enumerate(names):
            mine = [e for e, gg in zip(enc, groups, strict=True) if gg == g]
            longer, shorter, ties = heuristics(mine)
            stats[n].update({f"n_{split_name}": len(mine), f"longer_wins_{split_name}": longer})
            stats[n][f"shorter_wins_{split_name}"] = shorter
            stats[n][f"length_ties_{split_name}"] = ties
            if split_name == "val":
                print(f"  {n}: {len(mine)} held-out pairs, longer wins {longer:.3f}, ", end="")
                print(f"shorter wins {shorter:.3f} ({ties} ties, counted half)")
    return {
        "tokenizer": tok_path,
        "tokenizer_fingerprint": tokenizer_fingerprint(tok),
        "chat_format": fmt.name,
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "end_id": fmt.end_id(tok),  # the token each response ends with: the reward is read there
        "pad_id": tok.pad_id if tok.pad_id is not None else tok.eos_id,
        "max_len": args.max_len,
        "sources": [src for _, src in sources],
        "groups": names,
        "subsets": stats,
        "length_baseline_val": heuristics(enc)[0],  # longer wins, all subsets (enc: val's)
    }


def vocab_error(vocab_size, e):
    """SentencePiece's complaint about --vocab_size, in this script's options (its own advice
    names trainer flags, such as --character_coverage, that this script does not take)."""
    said = str(e).rsplit("] ", 1)[-1]
    need = re.search(r"smaller than required_chars\. \d+ vs (\d+)", said)
    if need:  # every character of the text, the 256 bytes and the special pieces
        return (
            f"--vocab_size {vocab_size} is smaller than the {need.group(1)} pieces the training "
            f"text needs (one for each of its characters, the 256 bytes, the special ones): "
            f"pass --vocab_size {need.group(1)} or more, or --tokenizer"
        )
    return f"--vocab_size {vocab_size}: {said}"  # e.g. "Vocabulary size too high (2048)..."


def main(argv=None):
    args = parse_config(PrepareConfig, argv, description=__doc__)
    return prepare(args, find_sources(args.src), args.out_dir)


if __name__ == "__main__":
    run(main)
