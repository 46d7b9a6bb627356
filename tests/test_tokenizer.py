"""Tests for data/tokenizer.py: llama2.c .bin encoder == sentencepiece, tok512, training, errors."""

import random
import sys
from pathlib import Path

import pytest
import torch

from data.tokenizer import Llama2cTokenizer, SentencePieceTokenizer, load_tokenizer

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
LLAMA2C = DATA / "llama2c"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"../shared/data absent: {path} not found")
    return path


@pytest.fixture(scope="module")
def llama_pair():
    pytest.importorskip("sentencepiece")
    sp = load_tokenizer(need(LLAMA2C / "tokenizer.model"))
    bin_tok = load_tokenizer(need(LLAMA2C / "tokenizer.bin"))
    return sp, bin_tok


TEXTS = [
    "Hello world",
    "Once upon a time, there was a little girl named Lily.",
    "",
    " ",
    "    ",
    "   leading spaces",
    "trailing spaces   ",
    "ab  cd   ef    gh     ij      kl" + " " * 33 + "end",
    "tabs\tand\t\tnewlines\n\nand CRLF\r\n done \r",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 🤗🚀 and a family 👩‍👩‍👧 and flags 🇫🇷",
    "café naïve Ångström façade Ægir Œuvre über",
    "Ṫ̈ḧ̈ë̈ combining marks, zero\u200bwidth, Ω≈ç√∫˜µ≤≥÷",
    "1234567890 3.14159 1,000,000 -42 2024-01-01 0x1F 1e-9",
    "def f(x):\n    return x ** 2  # square\n\tif x: pass\n",
    "{'a': [1, 2]}; x += 1 && y || z <=> w; <s> </s> <unk> <0x41>",
    "!!!???...---***///|||~~~^^^",
    "\x00\x01\x7f control chars",
]


def random_texts(n=300, seed=0):
    # short mixes of words, whitespace runs, and random unicode (BMP, CJK, emoji)
    rng = random.Random(seed)
    words = " ".join(TEXTS).split()
    spaces = [" ", "  ", "\t", "\n", "\r\n", " \r"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 20)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(words))
            elif r < 0.7:
                parts.append(rng.choice(spaces) * rng.randint(1, 12))
            else:
                lo, hi = rng.choice([(0x20, 0x2FFF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)])
                parts.append(chr(rng.randint(lo, hi)))
        # U+2581 is excluded: see test_literal_sentencepiece_space_marker
        out.append("".join(parts).replace("\u2581", ""))
    return out


def test_bin_encoder_matches_sentencepiece(llama_pair):
    sp, bin_tok = llama_pair
    assert bin_tok.vocab_size == sp.vocab_size == 32000
    assert (bin_tok.bos_id, bin_tok.eos_id) == (sp.bos_id, sp.eos_id) == (1, 2)
    for text in TEXTS + random_texts():
        for bos, eos in [(False, False), (True, True)]:
            ids = sp.encode(text, bos=bos, eos=eos)
            assert bin_tok.encode(text, bos=bos, eos=eos) == ids, repr(text)
            assert bin_tok.decode(ids) == sp.decode(ids), repr(text)
        assert sp.decode(sp.encode(text)) == text, repr(text)
        assert bin_tok.decode(bin_tok.encode(text)) == text, repr(text)


def test_literal_sentencepiece_space_marker(llama_pair):
    # The one difference found: a literal "▁" (U+2581) in the text. SentencePiece uses it as its
    # own space marker and leaves it as is in the input, so it becomes a space (encodes as the
    # "▁" piece and decodes as " ": sentencepiece does not round-trip it). The .bin file writes
    # spaces instead of "▁" in its pieces, so llama2.c finds no "▁" piece and falls back to the
    # character's three UTF-8 bytes, which round-trip.
    sp, bin_tok = llama_pair
    text = "a\u2581b"
    assert sp.decode(sp.encode(text)) == "a b"
    assert bin_tok.encode(text)[1:4] == [0xE2 + 3, 0x96 + 3, 0x81 + 3]
    assert bin_tok.decode(bin_tok.encode(text)) == text


def test_long_text_equals_sentencepiece(llama_pair):
    sp, bin_tok = llama_pair
    text = " ".join(TEXTS) * 10  # 5k+ characters: the merges run over one long word list
    assert len(text) > 5000
    assert bin_tok.encode(text) == sp.encode(text)


def runc_merge(tok: Llama2cTokenizer, ids: list[int]) -> list[int]:
    # run.c's loop literally: rescan all pairs, merge the best (leftmost on ties), repeat
    ids = list(ids)
    while True:
        best = None
        for k in range(len(ids) - 1):
            m = tok.piece_to_id.get(tok.pieces[ids[k]] + tok.pieces[ids[k + 1]])
            if m is not None and (best is None or tok.scores[m] > best[0]):
                best = (tok.scores[m], k, m)
        if best is None:
            return ids
        _, k, m = best
        ids[k : k + 2] = [m]


def test_tok512_round_trip():
    tok = load_tokenizer(need(LLAMA2C / "stories260K" / "tok512.bin"))
    assert isinstance(tok, Llama2cTokenizer)
    assert tok.vocab_size == 512
    text = "Once upon a time, there was a little girl named Lily."
    ids = tok.encode(text, bos=True)
    assert ids[0] == tok.bos_id and len(ids) < len(text) // 2  # merges happened
    assert all(0 <= i < 512 for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text  # tensors (and their tolist()) decode too
    streamed = [tok.decode_piece(p, i) for p, i in zip([None] + ids[:-1], ids, strict=True)]
    assert b"".join(streamed).decode() == text  # streaming, as run.c prints
    # the heap-based merge picks the same pairs as run.c's rescanning loop
    for text in TEXTS + random_texts(100, seed=1):
        unmerged = [tok.piece_to_id[b" "]] if text else []
        for ch in text:
            b = ch.encode()
            unmerged += [tok.piece_to_id[b]] if b in tok.piece_to_id else [x + 3 for x in b]
        assert tok.encode(text) == runc_merge(tok, unmerged), repr(text)
        assert tok.decode(tok.encode(text)) == text


def test_train_sentencepiece(tmp_path):
    pytest.importorskip("sentencepiece")
    from data.tokenizer import train_sentencepiece

    rng = random.Random(0)
    names = ["Lily", "Tom", "Sue", "Max", "Ben", "Mia"]
    things = ["ball", "cat", "dog", "tree", "box", "cake", "boat", "kite"]
    verbs = ["saw", "liked", "found", "took", "made", "wanted"]
    lines = (
        f"{rng.choice(names)} {rng.choice(verbs)} {rng.randint(0, 99999)} {rng.choice(things)}s."
        for _ in range(3000)
    )
    path = train_sentencepiece(lines, tmp_path / "tok320.model", vocab_size=320)
    assert path == tmp_path / "tok320.model" and path.is_file()
    tok = load_tokenizer(path)
    assert isinstance(tok, SentencePieceTokenizer)
    assert tok.vocab_size == 320
    assert tok.pad_id == tok.eos_id  # no pad piece: eos doubles as pad
    pieces = [tok.sp.id_to_piece(i) for i in tok.encode("12345")]
    assert pieces[-5:] == ["1", "2", "3", "4", "5"]  # split_digits
    text = "Lily saw 42 zebras 🦓 in Zürich."  # z, 🦓, ü, Z never seen: byte fallback
    assert tok.sp.unk_id() not in tok.encode(text)
    assert tok.decode(tok.encode(text, bos=True, eos=True)) == text


def test_missing_file(tmp_path):
    for name in ["nope.bin", "nope.model", "nope.gguf", "nope.json"]:
        with pytest.raises(FileNotFoundError, match="nope"):
            load_tokenizer(tmp_path / name)
    # an unknown suffix, and a directory without a tokenizer.json: the path and what is accepted
    for path in [tmp_path / "tok.txt", tmp_path]:
        with pytest.raises(ValueError, match=r"unknown tokenizer format.*\.gguf.*tokenizer\.json"):
            load_tokenizer(path)


def test_fingerprint_same_vocab_both_formats(llama_pair):
    from data.tokenizer import tokenizer_fingerprint

    sp, bin_tok = llama_pair
    fp = tokenizer_fingerprint(sp)
    assert len(fp) == 16 and fp == tokenizer_fingerprint(bin_tok)
    tok512 = load_tokenizer(need(LLAMA2C / "stories260K" / "tok512.bin"))
    assert tokenizer_fingerprint(tok512) != fp


def test_sentencepiece_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # makes the import fail
    with pytest.raises(ImportError, match="pip install sentencepiece"):
        SentencePieceTokenizer(need(LLAMA2C / "tokenizer.model"))


def test_truncated_bin(tmp_path):
    data = need(LLAMA2C / "stories260K" / "tok512.bin").read_bytes()
    # cut inside a token near the end: header 4 bytes, then 8 bytes + piece per token
    bad = tmp_path / "cut.bin"
    bad.write_bytes(data[:-3])
    with pytest.raises(ValueError, match=r"cut\.bin.*token 511"):
        Llama2cTokenizer(bad)
    bad.write_bytes(data[:-10])  # inside the last token's score/length
    with pytest.raises(ValueError, match=r"cut\.bin.*token 511"):
        Llama2cTokenizer(bad)
    # cut at a token boundary: only caught when the expected size is known
    with pytest.raises(ValueError, match=r"cut\.bin.*512"):
        Llama2cTokenizer(_cut_after_tokens(data, bad, 300), vocab_size=512)


def _cut_after_tokens(data: bytes, path: Path, n: int) -> Path:
    off = 4
    for _ in range(n):
        off += 8 + int.from_bytes(data[off + 4 : off + 8], "little")
    path.write_bytes(data[:off])
    return path
