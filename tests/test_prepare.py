"""data/prepare.py and data/hh_rlhf/prepare.py, its HH user: formats, subsets and their held-out
parts, naming, and nothing overwritten."""

import gzip
import json
import os

import pytest
from conftest import shared_path

from data.hh_rlhf.prepare import main as prepare
from data.pairs import PairDataset
from data.prepare import main as prepare_any
from nanorm.base.command import UsageError


def hh_row(i, good, bad):
    prompt = f"\n\nHuman: question {i}?\n\nAssistant:"
    return json.dumps({"chosen": prompt + " " + good, "rejected": prompt + " " + bad})


@pytest.fixture
def hh_folder(tmp_path):
    """Two subsets in the shared layout: 20 helpful rows (chosen longer), 10 harmless rows
    (chosen shorter)."""
    src = tmp_path / "hh"
    for name, n, good, bad in (
        ("helpful-base", 20, "a long and useful answer", "no"),
        ("harmless-base", 10, "no", "a long and harmful answer"),
    ):
        (src / name).mkdir(parents=True)
        rows = [hh_row(i, good, bad) for i in range(n)]
        (src / name / "test.jsonl").write_text("\n".join(rows) + "\n")
    return src


def test_subsets_held_out_and_meta(hh_folder, tmp_path):
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    out = tmp_path / "out"
    meta = prepare(["--src", str(hh_folder), "--tokenizer", str(tok), "--out_dir", str(out)])
    assert meta["groups"] == ["harmless-base", "helpful-base"]  # sorted folder order
    harmless, helpful = meta["subsets"]["harmless-base"], meta["subsets"]["helpful-base"]
    assert (helpful["n_val"], helpful["n_train"], harmless["n_val"]) == (4, 16, 2)
    assert helpful["longer_wins_val"] == 1.0 and harmless["shorter_wins_val"] == 1.0
    assert meta["chat_format"] == "plain" and meta["end_id"] == meta["eos_id"]
    val = PairDataset(out / "val.npz")
    assert sorted(val.groups.tolist()) == [0, 0, 1, 1, 1, 1]
    assert sorted(os.listdir(tmp_path)) == ["hh", "out"]  # nothing left aside


def test_nothing_is_overwritten_by_accident(hh_folder, tmp_path):
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    big = shared_path("llama2c", "tokenizer.model")
    out = tmp_path / "out"
    args = ["--src", str(hh_folder), "--out_dir", str(out)]
    prepare([*args, "--tokenizer", str(tok)])
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    with pytest.raises(UsageError, match="already holds a dataset: pass --overwrite"):
        prepare([*args, "--tokenizer", str(big)])
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    with pytest.raises(UsageError, match="not found"):  # a failure midway leaves it too
        prepare([*args, "--tokenizer", str(tmp_path / "missing.model"), "--overwrite"])
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    meta = prepare([*args, "--tokenizer", str(big), "--overwrite"])  # replaced whole
    assert meta["vocab_size"] == 32000 and json.loads((out / "meta.json").read_text()) == meta
    assert sorted(os.listdir(tmp_path)) == ["hh", "out"]


def test_output_is_never_named_after_a_temporary_path(tmp_path):
    (tmp_path / "x").mkdir()
    rows = tmp_path / "x" / "rows.jsonl"
    rows.write_text(hh_row(0, "yes", "no") + "\n")
    with pytest.raises(UsageError, match="name the output folder: --out_dir"):
        prepare(["--src", str(rows), "--tokenizer", "unused"])


def conversation(i, implicit=True, source=None):
    """A TRL row: system message, two user turns; chosen longer for even i, shorter for odd."""
    turns = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": f"Question {i}?"},
        {"role": "assistant", "content": "Which one?"},
        {"role": "user", "content": "The first."},
    ]
    good, bad = ("a long and useful answer", "no") if i % 2 == 0 else ("yes", "a long refusal")
    c, r = [{"role": "assistant", "content": good}], [{"role": "assistant", "content": bad}]
    row = {"chosen": turns + c, "rejected": turns + r} if implicit else {}
    row = row or {"prompt": turns, "chosen": c, "rejected": r}
    return row | ({"source": source} if source else {})


def test_any_format_and_file_type_with_subsets_from_names(tmp_path, capsys):
    """A folder: a file is a subset by its name, or by its folder's when named after a split."""
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    src = tmp_path / "prefs"
    (src / "chat").mkdir(parents=True)
    implicit = "".join(json.dumps(conversation(i)) + "\n" for i in range(10))
    (src / "chat" / "train.jsonl.gz").write_bytes(gzip.compress(implicit.encode()))
    explicit = [conversation(10 + i, False) for i in range(5)]  # not the pairs of chat/ again
    (src / "explicit.json").write_text(json.dumps(explicit))
    pairs = [json.loads(hh_row(i, "yes", "no")) for i in range(4)]
    pairs = [{"prompt": "Q?", "chosen": " a", "rejected": " bb"}] + pairs
    (src / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    (src / "notes.txt").write_text("not a preference file")
    meta = prepare_any(
        ["--src", str(src), "--tokenizer", str(tok), "--out_dir", str(tmp_path / "d")]
    )
    said = capsys.readouterr().out
    assert meta["groups"] == ["chat", "explicit", "mixed"]  # sorted paths; notes.txt ignored
    assert (
        f"{src / 'chat' / 'train.jsonl.gz'}: 10 rows, "
        "format 10 conversational (implicit prompt); bad rows: 0" in said
    )
    assert f"{src / 'explicit.json'}: 5 rows, format 5 conversational (explicit prompt); " in said
    assert f"{src / 'mixed.jsonl'}: 5 rows, format 1 string pairs, 4 HH dialogues; " in said
    assert meta["formats"][str(src / "mixed.jsonl")] == {"string pairs": 1, "HH dialogues": 4}
    chat = meta["subsets"]["chat"]
    assert (chat["n_train"], chat["n_val"]) == (8, 2)
    assert chat["longer_wins_train"] + chat["shorter_wins_train"] == 1
    assert chat["length_ties_train"] == chat["length_ties_val"] == 0  # never equally long
    val = PairDataset(tmp_path / "d" / "val.npz")
    assert sorted(val.groups.tolist()) == [0, 0, 1, 2]


def test_subsets_from_a_row_field(tmp_path, capsys):
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    rows = [conversation(i, i % 3 == 0, source=["web", "books"][i % 2]) for i in range(20)]
    rows.insert(5, conversation(99, source=None))  # no subset: a bad row at line 6
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--src", str(tmp_path / "all.jsonl"), "--tokenizer", str(tok), "--subset_key", "source"]
    meta = prepare_any([*args, "--out_dir", str(tmp_path / "d")])
    assert meta["groups"] == ["web", "books"] and meta["subset_key"] == "source"
    assert meta["subsets"]["web"]["n_val"] == meta["subsets"]["books"]["n_val"] == 2
    assert meta["skipped"] == {"missing key": 1}
    assert f"skipping {tmp_path / 'all.jsonl'}:6: missing key: 'source'" in capsys.readouterr().out
    with pytest.raises(UsageError, match=r"all\.jsonl:6: missing key: 'source' \(--subset_key\)"):
        prepare_any([*args, "--out_dir", str(tmp_path / "e"), "--strict"])


def test_sources_that_cannot_be_told_apart_or_read(tmp_path):
    (tmp_path / "a").mkdir()
    for f in ("a.jsonl", "a/test.jsonl"):  # both subset "a"
        (tmp_path / f).write_text(json.dumps(conversation(0)) + "\n")
    args = ["--tokenizer", "unused", "--out_dir", str(tmp_path / "d")]
    with pytest.raises(
        UsageError, match=r"same subset name: \['a', 'a'\] \(rename them, or --subset_key"
    ):
        prepare_any(["--src", str(tmp_path), *args])
    (tmp_path / "x.csv").write_text("prompt,chosen,rejected\n")
    with pytest.raises(UsageError, match=r"x\.csv: not a preference file; give \.jsonl"):
        prepare_any(["--src", str(tmp_path / "x.csv"), *args])


@pytest.mark.parametrize("what", ["folder", "file", "dataset_plus", "checkout"])
def test_out_dir_that_is_not_a_dataset_is_never_touched(hh_folder, tmp_path, what, monkeypatch):
    """--out_dir holding a user's folder, a file, a dataset with a stranger's file in it, or the
    current folder (a checkout): refused in one line, --overwrite or not; every byte kept."""
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    out = tmp_path / "mine"
    if what == "file":
        out.write_text("my notes")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("my notes")
        if what == "dataset_plus":
            (out / "meta.json").write_text("{}")
        if what == "checkout":
            (out / ".git").mkdir()
            (out / ".git" / "HEAD").write_text("ref: refs/heads/main")
            monkeypatch.chdir(out)
            out = "."

    def snapshot():
        root = tmp_path / "mine"
        if root.is_file():
            return root.read_bytes()
        return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    before = snapshot()
    for extra in ([], ["--overwrite"]):
        with pytest.raises(UsageError, match="--out_dir .*(file|not a prepared dataset)"):
            prepare_any(
                ["--src", str(hh_folder), "--tokenizer", str(tok), "--out_dir", str(out), *extra]
            )
        assert snapshot() == before
    assert sorted(os.listdir(tmp_path)) == ["hh", "mine"]  # nothing left aside


def test_empty_out_dir_is_used(hh_folder, tmp_path):
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    out = tmp_path / "empty"
    out.mkdir()
    prepare_any(["--src", str(hh_folder), "--tokenizer", str(tok), "--out_dir", str(out)])
    assert sorted(os.listdir(out)) == [".nanorm", "meta.json", "train.npz", "val.npz"]


def pair_tokens(path):
    """The (prompt, chosen, rejected) token tuples of a prepared split."""
    return [tuple(tuple(x.tolist()) for x in p) for p in PairDataset(path)]


def test_a_pair_given_twice_is_never_both_held_out_and_trained_on(tmp_path, capsys):
    """Each of 20 pairs three times, and two of them once more in a second file: each pair is
    kept once, in one split, and the copies are counted."""
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    rows = [{"prompt": f"Q{i}?", "chosen": f" yes {i}", "rejected": " no"} for i in range(20)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 3))
    more = [*rows[:2], {"prompt": "Other?", "chosen": " yes", "rejected": " no"}]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in more))
    src = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    out = tmp_path / "d"
    meta = prepare_any(["--src", *src, "--tokenizer", str(tok), "--out_dir", str(out)])
    said = capsys.readouterr().out
    assert meta["duplicates"] == 42 and "42 pairs are copies of an earlier one" in said
    assert f"e.g. {tmp_path / 'a.jsonl'}:21 repeats {tmp_path / 'a.jsonl'}:1" in said
    a, b = meta["subsets"]["a"], meta["subsets"]["b"]
    assert (a["n_train"] + a["n_val"], b["n_train"] + b["n_val"]) == (20, 1)
    train, val = pair_tokens(out / "train.npz"), pair_tokens(out / "val.npz")
    assert len(set(train)) == len(train) == 17 and len(set(val)) == len(val) == 4
    assert not set(train) & set(val)


def test_a_tiny_val_frac_still_holds_out_a_pair_of_each_subset(hh_folder, tmp_path, capsys):
    """--val_frac 0.001 of 20 and 10 rows rounds to none: one of each is held out, so train_rm.py
    and eval_rm.py never get an empty held-out split."""
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    args = ["--src", str(hh_folder), "--tokenizer", str(tok), "--val_frac", "0.001"]
    meta = prepare([*args, "--out_dir", str(tmp_path / "d")])
    assert (
        meta["subsets"]["helpful-base"]["n_val"] == meta["subsets"]["harmless-base"]["n_val"] == 1
    )
    assert meta["subsets"]["helpful-base"]["n_train"] == 19
    assert "helpful-base: --val_frac 0.001 of 20 pairs is none; holding out 1" in (
        capsys.readouterr().out
    )
    assert len(PairDataset(tmp_path / "d" / "val.npz")) == 2


def test_subsets_of_one_pair_each_hold_out_nothing_and_are_refused(tmp_path):
    rows = [conversation(i, source=f"s{i}") for i in range(3)]  # three subsets of one pair
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--src", str(tmp_path / "all.jsonl"), "--subset_key", "source", "--tokenizer", "x"]
    with pytest.raises(UsageError, match=r"--val_frac 0\.2 holds out no pair: each of the 3 "):
        prepare_any([*args, "--out_dir", str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()
