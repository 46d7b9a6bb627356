"""data/rows.py and data/pairs.py: the row formats, HH-RLHF splitting, bad rows, truncation."""

import gzip
import json
import math

import numpy as np
import pytest
import torch
from conftest import shared_path

from data.pairs import (
    PairDataset,
    balance_weights,
    balanced_order,
    encode_pair,
    length_heuristics,
    write_pairs,
)
from data.rows import BadRowError, read_pairs, split_conversation, split_dialogue
from nanorm.base.command import UsageError


class CharTok:
    """One id per character (plus BOS=1, EOS=2): lengths are easy to reason about."""

    bos_id, eos_id, pad_id, vocab_size = 1, 2, 0, 300

    def encode(self, text, bos=False, eos=False):
        return [1] * bos + [ord(c) % 250 + 3 for c in text] + [2] * eos


def test_bad_rows_name_file_and_line(tmp_path):
    rows = [
        '{"prompt": "p", "chosen": "a", "rejected": "b"}',
        "{not json",
        '{"prompt": "p", "chosen": "a"}',
        '{"prompt": "p", "chosen": 3, "rejected": "b"}',
        '{"prompt": "p", "chosen": "  ", "rejected": "b"}',
        '{"prompt": "p", "chosen": "same", "rejected": "same"}',
        "[1, 2]",
        '{"chosen": "\\n\\nHuman: hi\\n\\nAssistant: yes", "rejected": "\\n\\nHuman: hi\\n\\nAssistant: no"}',
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(rows) + "\n")
    expected = {
        2: "invalid JSON",
        3: "missing key: 'rejected'",
        4: "non-string value: 'chosen'",
        5: "empty response: 'chosen'",
        6: "identical responses",
        7: "invalid row",
    }
    with pytest.raises(BadRowError, match=r"pairs\.jsonl:2: invalid JSON"):
        read_pairs(path, strict=True)
    pairs, skipped = read_pairs(path, strict=False)
    assert len(pairs) == 2 and sum(skipped.values()) == len(expected)
    assert pairs[1] == {
        "prompt": "\n\nHuman: hi\n\nAssistant:",
        "chosen": " yes",
        "rejected": " no",
        "format": "HH dialogues",
        "where": f"{path}:8",
    }
    for lineno, msg in expected.items():  # each one alone, strict, names its line and reason
        one = tmp_path / f"row{lineno}.jsonl"
        one.write_text(rows[0] + "\n" + rows[lineno - 1] + "\n")
        with pytest.raises(BadRowError, match=rf"row{lineno}\.jsonl:2: {msg}"):
            read_pairs(one, strict=True)


def test_split_dialogue_is_lossless_on_hh_rlhf():
    for sub in ("helpful-base", "harmless-base"):
        path = shared_path("hh-rlhf", sub, "test.jsonl.gz")
        with gzip.open(path, "rt") as f:
            rows = [json.loads(line) for line in f]
        for r in rows:
            prompt, c, j = split_dialogue(r["chosen"], r["rejected"])
            assert prompt + c == r["chosen"] and prompt + j == r["rejected"]
            assert prompt == "" or prompt.endswith("\n\nAssistant:")
        pairs, skipped = read_pairs(path, strict=False)
        assert len(pairs) + sum(skipped.values()) == len(rows)


def test_truncation_keeps_the_response_end():
    tok = CharTok()
    pair = {"prompt": "abcdefghij", "chosen": " xyz", "rejected": " uv"}
    p, c, r, trunc = encode_pair(tok, pair, max_len=20)
    assert (len(p), len(c), len(r), trunc) == (11, 4, 3, False)  # BOS + 10; "xyz" + EOS
    p, c, r, trunc = encode_pair(tok, pair, max_len=8)  # prompt cut from the left
    assert p == tok.encode("abcdefghij", bos=True)[-4:] and c[-1] == tok.eos_id and not trunc
    long = {"prompt": "abc", "chosen": " " + "k" * 30 + "END", "rejected": " no"}
    p, c, r, trunc = encode_pair(tok, long, max_len=10)
    assert trunc and p == [] and len(c) == 10 and c[-4:] == tok.encode("END", eos=True)


def test_storage_and_collate(tmp_path):
    tok = CharTok()
    pairs = [{"prompt": "q" * n, "chosen": " a" * n, "rejected": " bb"} for n in (1, 4, 2)]
    enc = [encode_pair(tok, p, 64)[:3] for p in pairs]
    write_pairs(tmp_path / "x.npz", enc, tok.vocab_size)
    ds = PairDataset(tmp_path / "x.npz")
    assert len(ds) == 3 and [list(x) for x in ds[1]] == [list(x) for x in enc[1]]
    b = ds.collate([0, 1, 2], pad_id=0)
    for i, (p, c, r) in enumerate(enc):
        assert b.chosen[i, : len(p) + len(c)].tolist() == p + c
        assert b.chosen_mask[i].sum() == len(p) + len(c)
        assert b.rejected[i, : len(p) + len(r)].tolist() == p + r
        response = b.chosen_response_mask[i].nonzero().flatten().tolist()
        assert response == list(range(len(p), len(p) + len(c)))
    assert b.n_tokens == sum(2 * len(p) + len(c) + len(r) for p, c, r in enc)
    with pytest.raises(FileNotFoundError, match="prepare.py"):
        PairDataset(tmp_path / "missing.npz")


def test_length_heuristics_count_a_tie_half_and_say_how_many():
    h = length_heuristics([(3, 1), (1, 2), (2, 2), (4, 2), (5, 5)])  # 2 longer, 1 shorter, 2 ties
    assert h == ((2 + 1) / 5, (1 + 1) / 5, 2) and h.longer_wins + h.shorter_wins == 1
    assert length_heuristics(torch.tensor([[7, 1], [1, 7]])) == (0.5, 0.5, 0)  # eval_rm's (n, 2)
    empty = length_heuristics([])
    assert math.isnan(empty.longer_wins) and math.isnan(empty.shorter_wins) and empty.ties == 0


GOOD = b'{"prompt": "p", "chosen": "a", "rejected": "b"}'


def test_unreadable_rows_are_reported_and_the_rest_is_read(tmp_path, monkeypatch):
    """Bytes that are not UTF-8, an overlong line and a row broken by a raw newline are each
    reported at the line where the row starts; the rows after them are still read."""
    import data.rows as pairs_mod

    monkeypatch.setattr(pairs_mod, "MAX_ROW_BYTES", 200)
    lines = [
        GOOD,
        b'{"prompt": "p", "chosen": "caf\xe9", "rejected": "b"}',  # latin-1, not UTF-8
        GOOD,
        b'{"prompt": "p", "chosen": "' + b"x" * 300 + b'", "rejected": "b"}',
        b'{"prompt": "p", "chosen": "two',  # a raw newline inside the string: lines 5-6
        b'lines", "rejected": "b"}',
        GOOD,
    ]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    seen = []
    pairs, skipped = read_pairs(path, strict=False, report=seen.append)
    assert [p["where"] for p in pairs] == [f"{path}:1", f"{path}:3", f"{path}:7"]
    assert skipped == {"not UTF-8": 1, "row too long": 1, "invalid JSON": 1}
    assert seen[0] == f"skipping {path}:2: not UTF-8: byte 0xe9 at column 31"
    assert seen[1].startswith(f"skipping {path}:4: row too long: 3")
    assert seen[2] == f"skipping {path}:5: invalid JSON: a raw newline inside a string (lines 5-6)"
    for lineno in (2, 4, 5):  # strict stops at the first, naming it
        one = tmp_path / f"one{lineno}.jsonl"
        one.write_bytes(GOOD + b"\n" + b"\n".join(lines[lineno - 1 : lineno + 1]) + b"\n")
        with pytest.raises(BadRowError, match=rf"one{lineno}\.jsonl:2: "):
            read_pairs(one, strict=True)


def test_groups_are_stored(tmp_path):
    tok = CharTok()
    enc = [encode_pair(tok, {"prompt": "q", "chosen": " a", "rejected": " b"}, 16)[:3]] * 3
    write_pairs(tmp_path / "g.npz", enc, tok.vocab_size, groups=[0, 1, 1])
    assert PairDataset(tmp_path / "g.npz").groups.tolist() == [0, 1, 1]
    write_pairs(tmp_path / "n.npz", enc, tok.vocab_size)
    assert PairDataset(tmp_path / "n.npz").groups is None


def msg(role, content):
    return {"role": role, "content": content}


SYS, USER = msg("system", "Be brief."), msg("user", "Hi")
EARLIER = [SYS, USER, msg("assistant", "Hello."), msg("user", "Name a color.")]
ROWS = [  # one row of each format
    {"prompt": "p", "chosen": "a", "rejected": "b"},
    {"chosen": "\n\nHuman: hi\n\nAssistant: yes", "rejected": "\n\nHuman: hi\n\nAssistant: no"},
    {
        "chosen": [*EARLIER, msg("assistant", "Blue.")],
        "rejected": [*EARLIER, msg("assistant", "No.")],
    },
    {
        "prompt": EARLIER,
        "chosen": [msg("assistant", "Blue.")],
        "rejected": [msg("assistant", "No.")],
    },
]
FORMATS = [
    "string pairs",
    "HH dialogues",
    "conversational (implicit prompt)",
    "conversational (explicit prompt)",
]
TURNS = [
    ("system", "Be brief."),
    ("user", "Hi"),
    ("assistant", "Hello."),
    ("user", "Name a color."),
]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json"])
def test_each_format_is_detected_in_each_file_type(tmp_path, suffix):
    """.json is one array written with indentation: each row is reported at its own first line."""
    path = tmp_path / f"rows{suffix}"
    if suffix == ".json":
        text = json.dumps(ROWS, indent=1)
        starts = [i + 1 for i, line in enumerate(text.split("\n")) if line == " {"]
    else:
        text, starts = "".join(json.dumps(r) + "\n" for r in ROWS), [1, 2, 3, 4]
    path.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
    pairs, skipped = read_pairs(path)
    assert skipped == {} and [p["format"] for p in pairs] == FORMATS
    assert [p["where"] for p in pairs] == [f"{path}:{n}" for n in starts]
    assert len(set(starts)) == 4 and (suffix != ".json" or starts[1] > 2)
    assert pairs[2]["prompt"] == pairs[3]["prompt"] == TURNS  # system and earlier turns kept
    assert (pairs[2]["chosen"], pairs[3]["rejected"]) == ("Blue.", "No.")


def test_conversational_bad_rows_name_file_line_and_reason(tmp_path):
    good = ROWS[2]
    blue, no = msg("assistant", "Blue."), msg("assistant", "No.")
    bad = {
        "prompt differs": {"chosen": [USER, blue], "rejected": [msg("user", "Yo"), no]},
        "no final assistant turn": {"chosen": [USER, blue], "rejected": [USER, no, USER]},
        "unknown role": {"chosen": [msg("human", "Hi"), blue], "rejected": [USER, no]},
        "non-string content": {"chosen": [msg("user", ["Hi"]), blue], "rejected": [USER, no]},
        "invalid message": {"chosen": [USER, "Blue."], "rejected": [USER, no]},
    }
    explicit = {  # an explicit prompt, and a side that brings turns of its own before its answer
        "prompt": [USER],
        "chosen": [blue],
        "rejected": [msg("assistant", "Hm?"), msg("user", "Well?"), no],
    }
    rows = [good, *bad.values(), explicit]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = []
    pairs, skipped = read_pairs(path, strict=False, report=seen.append)
    assert len(pairs) == 1 and skipped == {**dict.fromkeys(bad, 1), "prompt differs": 2}
    for line, kind in enumerate([*bad, "prompt differs"], start=2):
        assert any(s.startswith(f"skipping {path}:{line}: {kind}: ") for s in seen), (line, seen)
    assert f"{path}:2: prompt differs: chosen and rejected differ at message 1" in "".join(seen)
    assert "'rejected' ends with a user message" in "".join(seen)
    array = tmp_path / "conv.json"  # the same in a JSON array: strict stops at the first
    text = json.dumps(rows, indent=2)
    array.write_text(text)
    line = [i + 1 for i, row in enumerate(text.split("\n")) if row == "  {"][1]  # row 2's
    with pytest.raises(BadRowError, match=rf"conv\.json:{line}: prompt differs"):
        read_pairs(array)


def test_the_prompt_is_held_once_and_subsets_come_from_a_field(tmp_path):
    """UltraFeedback's rows repeat the prompt (a string) inside each side: it counts once."""
    prompt, c, r = split_conversation(
        "Hi", [USER, msg("assistant", "Hello.")], [USER, msg("assistant", "Go.")]
    )
    assert (prompt, c, r) == ([("user", "Hi")], "Hello.", "Go.")
    a, b = [USER, msg("assistant", "A")], [USER, msg("assistant", "B")]
    prompt, _, _ = split_conversation([SYS], a, b)  # an explicit prompt: the system message
    assert prompt == [("system", "Be brief."), ("user", "Hi")]
    path = tmp_path / "s.jsonl"
    rows = [dict(ROWS[0], source="x"), dict(ROWS[2], source="y"), ROWS[3]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs, skipped = read_pairs(path, strict=False, subset_key="source", report=lambda _: None)
    assert [p["subset"] for p in pairs] == ["x", "y"] and skipped == {"missing key": 1}
    with pytest.raises(BadRowError, match=r"s\.jsonl:3: missing key: 'source' \(--subset_key\)"):
        read_pairs(path, subset_key="source")


def test_a_broken_json_array_is_named_by_line(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[\n {"prompt": "p", "chosen": "a", "rejected": "b"},\n {"prompt": oops}\n]\n')
    with pytest.raises(BadRowError, match=r"a\.json:3: invalid JSON: Expecting value"):
        read_pairs(path, strict=False)
    path.write_text('[\n {"prompt": "p", "chosen": "a", "rejected": "b"},\n')
    with pytest.raises(BadRowError, match=r"a\.json:3: invalid JSON: the array has no closing"):
        read_pairs(path, strict=False)


def balance_set(tmp_path):
    """Two subsets: 0 has 6 chosen-longer, 2 chosen-shorter, 1 tie; 1 has 3 chosen-longer only."""
    sides = [(0, 1)] * 6 + [(0, -1)] * 2 + [(0, 0)] + [(1, 1)] * 3
    pairs = [([1, 5], [7] * (3 + s), [8] * 3) for _, s in sides]
    write_pairs(tmp_path / "b.npz", pairs, 300, groups=[g for g, _ in sides])
    groups = torch.tensor([g for g, _ in sides])
    return PairDataset(tmp_path / "b.npz"), groups, torch.tensor([s for _, s in sides])


def test_balance_weights_give_each_cell_its_mass(tmp_path):
    data, groups, side = balance_set(tmp_path)
    mass = lambda w, sel: float(torch.as_tensor(w)[sel].sum())
    w = balance_weights(data, "none")
    assert math.isclose(w.sum(), 1) and np.allclose(w, 1 / 12)
    w = balance_weights(data, "length")  # subset masses kept (9/12, 3/12), its sides even
    longer0, shorter0 = (groups == 0) & (side == 1), (groups == 0) & (side == -1)
    assert math.isclose(mass(w, longer0), mass(w, shorter0), rel_tol=1e-12)
    assert math.isclose(mass(w, (groups == 0) & (side == 0)), 1 / 12)  # a tie keeps its share
    assert math.isclose(mass(w, groups == 1), 3 / 12)  # one side only: nothing to even
    w = balance_weights(data, "subset")
    assert math.isclose(mass(w, groups == 0), 0.5) and math.isclose(mass(w, groups == 1), 0.5)
    assert np.allclose(w[:9], w[0])  # within a subset, every pair alike
    w = balance_weights(data, "subset+length")
    assert math.isclose(mass(w, groups == 0), 0.5)
    assert math.isclose(mass(w, longer0), mass(w, shorter0), rel_tol=1e-12)
    with pytest.raises(UsageError, match="balance 'sides'"):
        balance_weights(data, "sides")


def test_balanced_order_draws_by_the_weights(tmp_path):
    data, groups, side = balance_set(tmp_path)
    w = balance_weights(data, "subset+length")
    n = 60000
    order = balanced_order(w, n, seed=3)
    assert torch.equal(order, balanced_order(w, n, seed=3))  # every rank draws the same
    counts = torch.bincount(order, minlength=len(w)).double() / n
    sigma = (torch.as_tensor(w) * (1 - torch.as_tensor(w)) / n).sqrt()
    assert ((counts - torch.as_tensor(w)).abs() < 5 * sigma).all()
