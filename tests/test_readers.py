"""What the readers and data/prepare.py do with inputs they must never lose: a tokenizer inside
the dataset being replaced, a JSON array where rows are expected, compressed files that unpack
to gigabytes, folders a killed run left behind. Each bad input is one line naming the file (and
line) and the fix, exit status 2; nothing the user has is deleted, replaced or written through
a link; a read takes memory in proportion to the rows it keeps, not to the file."""

import fcntl
import gzip
import json
import os
import stat
import tracemalloc

import pytest
from conftest import run_measured, shared_path

import data.rows as rows_mod
from data.prepare import main as prepare
from data.rows import BadRowError, read_pairs
from data.sources import first_row, gsm8k_pairs
from nanorm.base.command import UsageError, run


def row(i):
    return {"prompt": f"Question {i}?", "chosen": f" answer {i}", "rejected": " no"}


def jsonl(n, start=0):
    return b"".join(json.dumps(row(start + i)).encode() + b"\n" for i in range(n))


def repeated_gz(path, head, piece, times, tail):
    """head + piece * times + tail, gzip'd cheaply: piece is compressed once and its gzip member
    written `times` times (gzip readers read concatenated members as one stream)."""
    member = gzip.compress(piece, mtime=0)
    with open(path, "wb") as f:
        f.write(gzip.compress(head, mtime=0))
        for _ in range(times):
            f.write(member)
        f.write(gzip.compress(tail, mtime=0))
    return path


def one_line_exit_2(capsys, argv):
    """The command as a user runs it (data.run around main): its stderr, after checking that it
    is one line and the exit status 2."""
    with pytest.raises(SystemExit) as e:
        run(prepare, [str(a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def snapshot(folder):
    """Every file under folder, links as where they point, with its bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p)] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p)] = p.read_bytes()
    return out


# ---------------------------------------------------------------- a tokenizer is an input
def test_the_dataset_own_vocabulary_given_as_tokenizer_survives_overwrite(tmp_path, capsys):
    """--out_dir D --tokenizer D/tok.model --overwrite: D is replaced, D/tok.model is not lost
    (the new D holds the same vocabulary at the same path), so the datasets that name it (D and
    E here) still find it."""
    src = tmp_path / "prefs.jsonl"
    src.write_bytes(jsonl(40))
    d, e = tmp_path / "D", tmp_path / "E"
    prepare(["--src", str(src), "--out_dir", str(d), "--vocab_size", "300"])
    vocab = (d / "tok.model").read_bytes()
    tok = str(d / "tok.model")
    prepare(["--src", str(src), "--out_dir", str(e), "--tokenizer", tok])
    meta = prepare(["--src", str(src), "--out_dir", str(d), "--tokenizer", tok, "--overwrite"])
    assert (d / "tok.model").read_bytes() == vocab
    assert meta["tokenizer"] == tok
    e_meta = json.loads((e / "meta.json").read_text())
    assert os.path.exists(e_meta["tokenizer"]) and e_meta["tokenizer"] == tok
    assert e_meta["tokenizer_fingerprint"] == meta["tokenizer_fingerprint"]
    assert sorted(os.listdir(tmp_path)) == ["D", "E", "prefs.jsonl"]  # nothing left aside
    before = snapshot(d)  # anything else in D given as a tokenizer: refused, D untouched
    err = one_line_exit_2(
        capsys,
        ["--src", src, "--out_dir", d, "--tokenizer", d / "meta.json", "--overwrite"],
    )
    assert f"--tokenizer {d / 'meta.json'} lies in --out_dir" in err
    assert snapshot(d) == before


def test_a_link_in_the_dataset_is_never_removed(tmp_path, capsys):
    """A dataset folder whose tok.model is the user's link to their vocabulary: --overwrite
    would delete the link with the folder; it is refused in one line instead."""
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    src = tmp_path / "prefs.jsonl"
    src.write_bytes(jsonl(20))
    d = tmp_path / "D"
    prepare(["--src", str(src), "--out_dir", str(d), "--tokenizer", str(tok)])
    (tmp_path / "mine.model").write_bytes(b"the user's vocabulary")
    (d / "tok.model").symlink_to(tmp_path / "mine.model")
    before = snapshot(tmp_path)
    argv = ["--src", src, "--out_dir", d, "--tokenizer", tok, "--overwrite"]
    err = one_line_exit_2(capsys, argv)
    assert f"--out_dir {d} holds tok.model, a link or a folder" in err
    assert snapshot(tmp_path) == before


# ------------------------------------------------------- a JSON array: the whole file or no
def test_a_jsonl_line_that_is_an_array_is_one_bad_row(tmp_path, capsys):
    """The first line of a .jsonl is an array of two rows: a bad row, and every row after it is
    read (not the array alone, with the rest dropped and "bad rows: 0")."""
    path = tmp_path / "prefs.jsonl"
    path.write_bytes(json.dumps([row(0), row(1)]).encode() + b"\n" + jsonl(10, start=2))
    seen = []
    pairs, skipped = read_pairs(path, strict=False, report=seen.append)
    assert [p["prompt"] for p in pairs] == [f"Question {i}?" for i in range(2, 12)]
    assert skipped == {"invalid row": 1}
    assert seen == [
        f"skipping {path}:1: invalid row: expected a JSON object, got an array (a .jsonl file "
        "holds one row object a line; an array of rows is a .json file)"
    ]
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    prepare(["--src", str(path), "--out_dir", str(tmp_path / "d"), "--tokenizer", str(tok)])
    assert f"{path}: 10 rows, format 10 string pairs; bad rows: 1" in capsys.readouterr().out


def test_a_jsonl_holding_one_array_over_many_lines_is_refused(tmp_path, capsys):
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n" + json.dumps([row(i) for i in range(10)], indent=1))
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    err = one_line_exit_2(capsys, ["--src", path, "--out_dir", tmp_path / "d", "--tokenizer", tok])
    assert f"{path}:2: a JSON array starts here, over many lines" in err
    assert "an array of rows is a .json file: rename it" in err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("after", ["array", "rows", "junk"])
def test_anything_after_a_json_array_is_refused(tmp_path, capsys, after):
    """A .json holding two arrays (or an array and JSON Lines, or junk) is refused naming the
    file and the line, strict or not: its second part is never silently lost."""
    first = json.dumps([row(i) for i in range(10)], indent=1)
    more = {
        "array": json.dumps([row(i) for i in range(10, 20)], indent=1),
        "rows": jsonl(5, start=10).decode(),
        "junk": "oops",
    }[after]
    path = tmp_path / "prefs.json"
    path.write_text(first + "\n\n" + more + "\n")
    line = first.count("\n") + 3
    for strict in (True, False):
        with pytest.raises(BadRowError, match=rf"prefs\.json:{line}: more JSON after the array"):
            read_pairs(path, strict=strict)
    err = one_line_exit_2(capsys, ["--src", path, "--out_dir", tmp_path / "d"])
    assert f"{path}:{line}: more JSON after the array that ends at line {line - 2}: " in err
    assert "a .json file is one array of rows" in err


def test_a_json_of_json_lines_is_read_as_json_lines(tmp_path):
    """`datasets`' to_json writes JSON Lines under a .json name: every row is read."""
    path = tmp_path / "prefs.json"
    path.write_bytes(b"\xef\xbb\xbf" + jsonl(12))  # a BOM, as some editors write, too
    pairs, skipped = read_pairs(path)
    assert len(pairs) == 12 and skipped == {} and pairs[11]["where"] == f"{path}:12"


# ----------------------------------------------------------- streaming: memory follows rows
LONG_HEAD = b'{"prompt": "p", "chosen": "'
LONG_TAIL = b'", "rejected": "b"}\n'


def peak_of(fn):
    """(fn's result or the BadRowError it raised, the peak of Python's allocations meanwhile)."""
    tracemalloc.start()
    try:
        try:
            got = fn()
        except BadRowError as e:
            got = e
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_blank_lines_and_long_lines_cost_no_memory(tmp_path):
    """8 MB of newlines between rows, a 64 MB line: read in a few MB, every row after them
    kept, the long line refused in strict mode after reading little more than the bound."""
    blank = repeated_gz(tmp_path / "blank.jsonl.gz", jsonl(5), b"\n" * (1 << 20), 8, jsonl(5, 5))
    long = repeated_gz(
        tmp_path / "long.jsonl.gz", jsonl(3) + LONG_HEAD, b"x" * (1 << 20), 64, LONG_TAIL + jsonl(3)
    )
    bound = 4 * rows_mod.MAX_ROW_BYTES  # a line at the bound, the chunk being read, a copy
    (pairs, skipped), peak = peak_of(lambda: read_pairs(blank, strict=False))
    assert len(pairs) == 10 and skipped == {} and pairs[5]["where"] == f"{blank}:{8 * 2**20 + 6}"
    assert peak < bound, peak
    seen = []
    (pairs, skipped), peak = peak_of(lambda: read_pairs(long, strict=False, report=seen.append))
    assert len(pairs) == 6 and skipped == {"row too long": 1} and peak < bound, peak
    n = len(LONG_HEAD) + (64 << 20) + len(LONG_TAIL) - 1
    assert seen == [f"skipping {long}:4: row too long: {n:,} bytes > {rows_mod.MAX_ROW_BYTES:,}"]
    err, peak = peak_of(lambda: read_pairs(long, strict=True))
    assert str(err) == f"{long}:4: row too long: more than {rows_mod.MAX_ROW_BYTES:,} bytes"
    assert peak < bound, peak
    # eval_rm.py's readers (data/sources.py) stream the same way
    gsm = tmp_path / "gsm.jsonl.gz"
    question = json.dumps({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}).encode() + b"\n"
    repeated_gz(gsm, question, b"\n" * (1 << 20), 8, question)
    got, peak = peak_of(lambda: first_row(str(gsm)))
    assert got["question"] == "1 + 1?" and peak < bound, peak
    (pairs, _, left_out), peak = peak_of(lambda: gsm8k_pairs(str(gsm)))
    assert len(pairs) == 2 * 3 and left_out == 0 and peak < bound, peak


@pytest.mark.slow
def test_gigabytes_of_gzip_are_read_in_little_memory(tmp_path, record_property):
    """A 300 KB .jsonl.gz of 40 rows and 300 MB of newlines, a 1 MB .gz holding a 1 GB line:
    data/prepare.py reads both (the long line a bad row) in well under 1 GB, where reading the
    whole file then splitting it took 3 GB and 2.3 GB."""
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    blank = repeated_gz(
        tmp_path / "blank.jsonl.gz", jsonl(20), b"\n" * (1 << 20), 300, jsonl(20, 20)
    )
    long = repeated_gz(
        tmp_path / "long.jsonl.gz",
        jsonl(5) + LONG_HEAD,
        b"x" * (1 << 20),
        1024,
        LONG_TAIL + jsonl(5),
    )
    assert os.path.getsize(blank) < 400_000 and os.path.getsize(long) < 1_200_000
    argv = [
        "data/prepare.py",
        "--src",
        blank,
        long,
        "--tokenizer",
        tok,
        "--out_dir",
        tmp_path / "d",
    ]
    rc, out, err, peak, seconds = run_measured(argv, cap=4 << 30)
    record_property(
        "measured",
        f"prepare on 300 MB of newlines and a 1 GB line: {seconds:.1f} s, {peak >> 20} MB",
    )
    assert rc == 0, err[-2000:]
    assert f"{blank}: 40 rows, format 40 string pairs; bad rows: 0" in out
    n = len(LONG_HEAD) + (1 << 30) + len(LONG_TAIL) - 1
    assert f"skipping {long}:6: row too long: {n:,} bytes > {rows_mod.MAX_ROW_BYTES:,}" in out
    assert f"{long}: 10 rows, format 10 string pairs; bad rows: 1" in out
    assert peak < 1 << 30, peak


def test_files_past_the_bounds_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """A .json array is parsed whole: over MAX_JSON_BYTES (its size checked before it is read,
    or as it is unpacked) it is refused naming the file and the limit; a .gz stops at
    MAX_UNPACKED_BYTES unpacked."""
    monkeypatch.setattr(rows_mod, "MAX_JSON_BYTES", 1000)
    array = json.dumps([row(i) for i in range(40)]).encode()
    big = tmp_path / "big.json"
    big.write_bytes(array)
    packed = tmp_path / "big.json.gz"
    packed.write_bytes(gzip.compress(array))
    for path, unpacked in ((big, ""), (packed, " once decompressed")):
        err = one_line_exit_2(capsys, ["--src", path, "--out_dir", tmp_path / "d"])
        assert f"{path}: a JSON array of more than 1,000 bytes{unpacked}, which would" in err
        assert "write it as JSON Lines (.jsonl, one row a line)" in err
    monkeypatch.setattr(rows_mod, "MAX_UNPACKED_BYTES", 1 << 20)
    blank = repeated_gz(tmp_path / "blank.jsonl.gz", jsonl(5), b"\n" * (1 << 20), 2, jsonl(5))
    err = one_line_exit_2(capsys, ["--src", blank, "--out_dir", tmp_path / "d"])
    assert f"{blank}: more than 1,048,576 bytes once decompressed: split it into" in err
    assert not (tmp_path / "d").exists()


def test_a_damaged_gzip_stream_is_one_line(tmp_path, capsys):
    """Bytes changed inside the deflate stream (zlib's error, not gzip's): one line too."""
    damaged = bytearray(gzip.compress(b"".join(jsonl(200) for _ in range(5))))
    damaged[200:260] = bytes(b ^ 0x55 for b in damaged[200:260])
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(damaged)
    err = one_line_exit_2(capsys, ["--src", path, "--out_dir", tmp_path / "d"])
    assert f"{path}: unreadable (" in err and "copy it again" in err
    assert not (tmp_path / "d").exists()


def test_a_gsm8k_row_of_the_wrong_types_is_named(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "1 + 1?", "answer": 2}) + "\n")
    with pytest.raises(ValueError, match=r"gsm\.jsonl:1: not a GSM8K row \{question, answer\}"):
        gsm8k_pairs(str(path))


# ----------------------------------------------- prepare's defaults agree with train_rm.py's
@pytest.mark.slow
def test_a_dataset_longer_than_the_model_is_one_line_naming_both_options(tmp_path):
    """prepare's default --max_len (512) against train_rm.py's default --max_seq_len (256, --init
    scratch): a pair longer than the model is one line saying which option to change."""
    from train_rm import main as train

    src = tmp_path / "prefs.jsonl"
    long = " ".join(f"word{i}" for i in range(300))
    rows = [{"prompt": f"Q{i}?", "chosen": " " + long, "rejected": " no"} for i in range(10)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = tmp_path / "d"
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    meta = prepare(["--src", str(src), "--out_dir", str(d), "--tokenizer", str(tok)])
    assert meta["max_len"] == 512
    argv = ["--dataset", str(d), "--out_dir", str(tmp_path / "out"), "--max_iters", "1"]
    argv += ["--batch_size", "2", "--eval_pairs", "2", "--device", "cpu"]
    with pytest.raises(UsageError, match="--max_len.*--max_seq_len|--max_seq_len.*--max_len") as e:
        train(argv)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------- what prepare says and leaves
def test_a_vocabulary_too_small_names_this_script_option(tmp_path, capsys):
    """SentencePiece's advice names --character_coverage, which prepare does not take: the
    refusal names --vocab_size and the size that works, and that size works."""
    src = tmp_path / "wide.jsonl"
    rows = [
        {
            "prompt": "Q" + chr(0x4E00 + i) * 3,
            "chosen": " " + "".join(chr(0x4E00 + 7 * i + j) for j in range(7)),
            "rejected": " no" + chr(0x3000 + i),
        }
        for i in range(60)
    ]
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    argv = ["--src", src, "--out_dir", tmp_path / "d", "--vocab_size", "256"]
    err = one_line_exit_2(capsys, argv)
    assert "character_coverage" not in err
    need = int(err.split("pass --vocab_size ")[1].split()[0])
    assert f"--vocab_size 256 is smaller than the {need} pieces the training text needs" in err
    meta = prepare(["--src", str(src), "--out_dir", str(tmp_path / "d"), "--vocab_size", str(need)])
    assert meta["vocab_size"] == need


def test_folders_a_killed_run_left_are_cleaned_and_nothing_else(tmp_path, capsys):
    """kill -9 during `prepare --overwrite` leaves D.tmp-* (the new dataset, part written) and
    D.old-* (the old one, set aside). The next run removes those nobody holds; a folder of that
    name holding a user's file, and one a running prepare holds, are kept."""
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    src = tmp_path / "prefs.jsonl"
    src.write_bytes(jsonl(20))
    d = tmp_path / "D"
    argv = ["--src", str(src), "--out_dir", str(d), "--tokenizer", str(tok)]
    prepare(argv)
    stale_tmp, stale_old = tmp_path / "D.tmp-0a1b2c3d", tmp_path / "D.old-4e5f6a7b"
    stale_tmp.mkdir()
    (stale_tmp / "train.npz").write_bytes((d / "train.npz").read_bytes())
    (stale_tmp / "val.npz.tmp").write_bytes(b"half")
    (stale_old / "d").mkdir(parents=True)
    (stale_old / "d" / "meta.json").write_text("{}")
    users = tmp_path / "D.tmp-notes123"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    running = tmp_path / "D.tmp-9c8d7e6f"
    running.mkdir()
    held = os.open(running, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a prepare that is going holds its folder
    try:
        prepare([*argv, "--overwrite"])
    finally:
        os.close(held)
    assert sorted(os.listdir(tmp_path)) == ["D", "D.tmp-9c8d7e6f", "D.tmp-notes123", "prefs.jsonl"]
    assert (users / "notes.txt").read_text() == "mine"
    # killed between the two renames: no D, the old dataset aside; it is put back, and
    # --overwrite still decides whether it is replaced
    aside = tmp_path / "D.old-0f0f0f0f"
    aside.mkdir()
    os.replace(d, aside / "d")
    dataset = snapshot(aside / "d")
    capsys.readouterr()
    err = one_line_exit_2(capsys, argv)
    assert f"{d} already holds a dataset: pass --overwrite" in err
    assert {k.replace(str(aside / "d"), str(d)): v for k, v in dataset.items()} == snapshot(d)
    assert not aside.exists()


def test_a_dataset_is_made_with_the_mode_of_the_umask(tmp_path):
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    src = tmp_path / "prefs.jsonl"
    src.write_bytes(jsonl(20))
    old = os.umask(0o022)
    try:
        prepare(["--src", str(src), "--out_dir", str(tmp_path / "d"), "--tokenizer", str(tok)])
        prepare(
            ["--src", str(src), "--out_dir", str(tmp_path / "d"), "--tokenizer", str(tok)]
            + ["--overwrite"]
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o755
    for f in os.listdir(tmp_path / "d"):
        assert stat.S_IMODE(os.stat(tmp_path / "d" / f).st_mode) == 0o644, f
