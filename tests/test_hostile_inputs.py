"""Files made to break the readers: rows nested past the recursion limit or holding half of a
UTF-16 pair, tokenizer files that are not what their name says, and GGUF files of a few KB that
claim more than they hold. Each is refused by the reader with a one-line error naming the file and
the field (a bad row costs only itself), before anything is allocated from what it claims."""

import json
import os
import random
import struct
import tracemalloc
from types import SimpleNamespace

import pytest
from conftest import shared_path
from launcher import python

import nanorm.base.gguf_reader as gguf_reader
from data.prepare import main as prepare
from data.rows import BadRowError, read_pairs
from data.tokenizer import load_tokenizer
from nanorm.base.command import UsageError

# ------------------------------------------------------------------------------------ rows
GOOD = [
    {"prompt": f"Question {i}?", "chosen": f" answer {i}", "rejected": " no"} for i in range(20)
]
DEEP_LIST = '{"prompt": "p", "chosen": ' + "[" * 100_000 + "]" * 100_000 + ', "rejected": "b"}'
DEEP_DICT = '{"prompt": "p", "chosen": "a", "rejected": "b", "x": ' + '{"a": ' * 100_000
DEEP_DICT += "1" + "}" * 100_000 + "}"
SURROGATES = {  # a lone half of a UTF-16 pair, in each place a row holds text
    "response": '{"prompt": "p", "chosen": "a\\ud800b", "rejected": "b"}',
    "prompt": '{"prompt": "p\\udfff", "chosen": "a", "rejected": "b"}',
    "message": '{"chosen": [{"role": "user", "content": "\\ud83d"}, '
    '{"role": "assistant", "content": "a"}], '
    '"rejected": [{"role": "user", "content": "\\ud83d"}, {"role": "assistant", "content": "b"}]}',
}
# an integer past Python's digit limit: json raises a ValueError that is not a JSONDecodeError
LONG_NUMBER = '{"prompt": "p", "chosen": "a", "rejected": "b", "n": ' + "9" * 5000 + "}"
HOSTILE = {"deep list": DEEP_LIST, "deep dict": DEEP_DICT, "long number": LONG_NUMBER} | {
    f"surrogate in {k}": v for k, v in SURROGATES.items()
}
KIND = {"deep list": "nested too deep", "deep dict": "nested too deep"}
KIND["long number"] = "number too long"


def write_rows(path, bad, at=10):
    """GOOD with the bad row's text at line at + 1, as JSON Lines or one JSON array."""
    rows = [json.dumps(r) for r in GOOD]
    rows.insert(at, bad)
    if str(path).endswith(".json"):
        path.write_text("[\n" + ",\n".join(rows) + "\n]\n")
    else:
        path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
@pytest.mark.parametrize("what", list(HOSTILE))
def test_a_hostile_row_is_one_bad_row(tmp_path, what, suffix):
    path = write_rows(tmp_path / f"rows{suffix}", HOSTILE[what])
    kind = KIND.get(what, "lone surrogate")
    line = 11 if suffix == ".jsonl" else 12  # the array's "[" has a line of its own
    seen = []
    pairs, skipped = read_pairs(path, strict=False, report=seen.append)
    assert [p["prompt"] for p in pairs] == [r["prompt"] for r in GOOD]  # all the rest is kept
    assert skipped == {kind: 1}
    assert len(seen) == 1 and seen[0].startswith(f"skipping {path}:{line}: {kind}: ")
    assert len(seen[0]) < 300  # says what is wrong, does not echo the row
    with pytest.raises(BadRowError, match=rf"rows{suffix}:{line}: {kind}: ") as e:
        read_pairs(path, strict=True)
    assert "\n" not in str(e.value)


def test_prepare_keeps_the_good_rows_around_hostile_ones(tmp_path, capsys):
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    path = tmp_path / "prefs.jsonl"
    rows = [json.dumps(r) for r in GOOD]
    for i, bad in enumerate(HOSTILE.values()):
        rows.insert(2 * i + 1, bad)
    path.write_text("\n".join(rows) + "\n")
    args = ["--src", str(path), "--tokenizer", str(tok)]
    meta = prepare([*args, "--out_dir", str(tmp_path / "d")])
    assert meta["skipped"] == {"nested too deep": 2, "number too long": 1, "lone surrogate": 3}
    assert meta["subsets"]["prefs"]["n_train"] + meta["subsets"]["prefs"]["n_val"] == len(GOOD)
    assert f"{path}: {len(GOOD)} rows, format {len(GOOD)} string pairs; bad rows: 6" in (
        capsys.readouterr().out
    )
    with pytest.raises(UsageError, match=r"prefs\.jsonl:2: nested too deep: "):
        prepare([*args, "--out_dir", str(tmp_path / "e"), "--strict"])
    assert not (tmp_path / "e").exists()


def test_eval_reads_past_hostile_rows(tmp_path):
    """eval_rm.py's raw preference files go through the same reader (data/sources.py)."""
    from data.chat import chat_format
    from data.sources import load_source

    tok = load_tokenizer(shared_path("llama2c", "stories260K", "tok512.bin"))
    path = tmp_path / "prefs.jsonl"
    rows = [json.dumps(r) for r in GOOD]
    rows[3:3] = list(HOSTILE.values())
    path.write_text("\n".join(rows) + "\n")
    args = SimpleNamespace(max_len=64, max_pairs=None)
    source = load_source("pairs", str(path), args, {"max_len": 64}, lambda: (tok, chat_format(tok)))
    assert len(source.data) == len(GOOD)


# ------------------------------------------------------------------------------ tokenizers
def gguf_string(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return gguf_string(key) + struct.pack("<I", vtype) + payload


U32, I32, F32, STRING, ARRAY = 4, 5, 6, 8, 9


def kv_u32(key, value):
    return kv(key, U32, struct.pack("<I", value))


def kv_str(key, value):
    return kv(key, STRING, gguf_string(value))


def kv_strings(key, values):
    return kv(
        key, ARRAY, struct.pack("<IQ", STRING, len(values)) + b"".join(map(gguf_string, values))
    )


def tensor_info(name, dims, ggml_type=0, offset=0):
    dims = struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
    return gguf_string(name) + dims + struct.pack("<IQ", ggml_type, offset)


def gguf_bytes(kvs=(), tensors=(), data=b"", n_kv=None, n_tensors=None):
    """A GGUF v3 file: header, the key/values and tensor infos given, padding to 32, data."""
    n_kv = len(kvs) if n_kv is None else n_kv
    n_tensors = len(tensors) if n_tensors is None else n_tensors
    out = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"".join(kvs) + b"".join(tensors)
    return out + bytes(-len(out) % 32) + data


def tokenizer_kvs(pieces=("a", "b", "ab")):
    return [
        kv_str("tokenizer.ggml.model", "gpt2"),
        kv_strings("tokenizer.ggml.tokens", list(pieces)),
        kv_strings("tokenizer.ggml.merges", ["a b"]),
    ]


ACCEPTED = r".*accepted: a SentencePiece \.model, a llama2\.c \.bin, a \.gguf"


def hostile_tokenizers(tmp_path):
    """{file name: bytes}: each is refused with the file's name and what is accepted."""
    gguf = gguf_bytes(tokenizer_kvs())
    return {
        "random.model": random.Random(0).randbytes(2000),
        "random.bin": random.Random(1).randbytes(2000),
        "not_json.json": b"\x00not json",
        "a_list.json": b"[1, 2, 3]",
        "no_vocab.json": json.dumps({"model": {"type": "BPE"}}).encode(),
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "cut.gguf": gguf[: len(gguf) // 2],  # inside the vocabulary
        "no_tokens.gguf": gguf_bytes([kv_str("tokenizer.ggml.model", "gpt2")]),
        "int_tokens.gguf": gguf_bytes(
            [kv_str("tokenizer.ggml.model", "gpt2"), kv_u32("tokenizer.ggml.tokens", 7)]
        ),
    }


def test_a_hostile_tokenizer_file_is_one_line(tmp_path):
    # the crafted GGUF tokenizer reads, so what fails below is the damage, not the crafting
    (tmp_path / "ok.gguf").write_bytes(gguf_bytes(tokenizer_kvs()))
    assert load_tokenizer(tmp_path / "ok.gguf").vocab_size == 3
    for name, blob in hostile_tokenizers(tmp_path).items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(UsageError, match=rf"{name}: {ACCEPTED}") as e:
            load_tokenizer(tmp_path / name)
        assert "\n" not in str(e.value), name


def test_a_truncated_bin_tokenizer_says_what_is_accepted(tmp_path):
    data = shared_path("llama2c", "stories260K", "tok512.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-3])
    with pytest.raises(UsageError, match=rf"cut\.bin: .*token 511{ACCEPTED}"):
        load_tokenizer(tmp_path / "cut.bin")


def test_prepare_refuses_a_hostile_tokenizer_in_one_line(tmp_path):
    src = write_rows(tmp_path / "prefs.jsonl", json.dumps(GOOD[0]))
    (tmp_path / "tok.model").write_bytes(random.Random(0).randbytes(2000))
    args = ["--src", str(src), "--tokenizer", str(tmp_path / "tok.model")]
    with pytest.raises(UsageError, match=rf"tok\.model: {ACCEPTED}"):
        prepare([*args, "--out_dir", str(tmp_path / "d")])
    assert sorted(os.listdir(tmp_path)) == ["prefs.jsonl", "tok.model"]  # nothing left behind


# ------------------------------------------------------------------------------------ GGUF
def nested_arrays(depth):
    """An array of an array of ... of one empty uint8 array."""
    return struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", 0, 0)


BIG = 1 << 62
HOSTILE_GGUF = {  # name: (bytes, what the error must name)
    "alignment 0": (gguf_bytes([kv_u32("general.alignment", 0)]), "general.alignment"),
    "alignment 48": (gguf_bytes([kv_u32("general.alignment", 48)]), "general.alignment"),
    "alignment a string": (gguf_bytes([kv_str("general.alignment", "32")]), "general.alignment"),
    "nested arrays": (gguf_bytes([kv("deep", ARRAY, nested_arrays(1000))]), "deep"),
    "array length": (gguf_bytes([kv("big", ARRAY, struct.pack("<IQ", STRING, BIG))]), "big"),
    "array of arrays length": (
        gguf_bytes([kv("big", ARRAY, struct.pack("<IQ", ARRAY, BIG))]),
        "big",
    ),
    "scalar array length": (gguf_bytes([kv("big", ARRAY, struct.pack("<IQ", F32, BIG))]), "big"),
    "string length": (gguf_bytes([kv("s", STRING, struct.pack("<Q", BIG))]), "'s'"),
    "key length": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, BIG) + bytes(64), "key"),
    "key not UTF-8": (gguf_bytes([kv_u32(b"\xff\xfe", 1)]), "UTF-8"),
    "value type": (gguf_bytes([kv("v", 99, bytes(8))]), "'v'"),
    "array element type": (gguf_bytes([kv("v", ARRAY, struct.pack("<IQ", 99, 1))]), "'v'"),
    "duplicate key": (gguf_bytes([kv_u32("k", 1), kv_u32("k", 2)]), "'k'"),
    "n_kv": (gguf_bytes(n_kv=BIG), "n_kv"),
    "n_tensors": (gguf_bytes(n_tensors=BIG), "n_tensors"),
    "n_dims 5": (gguf_bytes(tensors=[tensor_info("t", (1, 1, 1, 1, 1))], data=bytes(32)), "n_dims"),
    "n_dims huge": (gguf_bytes(tensors=[gguf_string("t") + struct.pack("<I", 1 << 31)]), "n_dims"),
    "dims past the file": (gguf_bytes(tensors=[tensor_info("t", (1 << 40, 1 << 40))]), "tensor t"),
    "dims over int64": (gguf_bytes(tensors=[tensor_info("t", (1 << 63, 4))]), "tensor t"),
    "dims a product over int64": (
        gguf_bytes(tensors=[tensor_info("t", (1 << 32, 1 << 32, 1 << 32))]),
        "tensor t",
    ),
    "offset past the file": (
        gguf_bytes(tensors=[tensor_info("t", (8,), offset=1 << 60)], data=bytes(32)),
        "tensor t",
    ),
    "offset not aligned": (
        gguf_bytes(tensors=[tensor_info("t", (8,), offset=4)], data=bytes(64)),
        "tensor t",
    ),
    "blocks cut": (gguf_bytes(tensors=[tensor_info("t", (33,), 8)], data=bytes(96)), "tensor t"),
    "unknown tensor type": (
        gguf_bytes(tensors=[tensor_info("t", (8,), 99)], data=bytes(64)),
        "tensor t",
    ),
    "duplicate tensor": (
        gguf_bytes(tensors=[tensor_info("t", (8,)), tensor_info("t", (8,))], data=bytes(32)),
        "tensor t",
    ),
}


@pytest.mark.parametrize("what", list(HOSTILE_GGUF))
def test_a_hostile_gguf_is_refused_naming_the_field(tmp_path, what):
    blob, field = HOSTILE_GGUF[what]
    assert len(blob) < 16 << 10  # a few KB
    path = tmp_path / "x.gguf"
    path.write_bytes(blob)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"x\.gguf: .*{field}") as e:
            gguf_reader.read_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(e.value) and len(str(e.value)) < 300
    assert peak < 50 << 20  # what the file claims is never allocated


# a LLaMA of dim 8 (2 heads of 4, 1 key/value head), 1 layer, FFN 16, vocabulary 16, in F32
LLAMA = {
    "token_embd.weight": (8, 16),
    "output_norm.weight": (8,),
    "blk.0.attn_norm.weight": (8,),
    "blk.0.ffn_norm.weight": (8,),
    "blk.0.attn_q.weight": (8, 8),
    "blk.0.attn_k.weight": (8, 4),
    "blk.0.attn_v.weight": (8, 4),
    "blk.0.attn_output.weight": (8, 8),
    "blk.0.ffn_gate.weight": (8, 16),
    "blk.0.ffn_up.weight": (8, 16),
    "blk.0.ffn_down.weight": (16, 8),
}
LLAMA_KV = {
    "general.architecture": ("str", "llama"),
    "llama.embedding_length": ("u32", 8),
    "llama.block_count": ("u32", 1),
    "llama.attention.head_count": ("u32", 2),
    "llama.attention.head_count_kv": ("u32", 1),
    "llama.feed_forward_length": ("u32", 16),
    "llama.context_length": ("u32", 64),
    "llama.attention.layer_norm_rms_epsilon": ("f32", 1e-5),
}


def tiny_llama(path, drop=(), **changes):
    """The LLaMA above as a GGUF file, with metadata keys changed (None: removed) or added."""
    kvs = []
    for key, (kind, value) in (LLAMA_KV | changes).items():
        if value is None:
            continue
        if kind == "str":
            kvs.append(kv_str(key, value))
        elif kind == "f32":
            kvs.append(kv(key, F32, struct.pack("<f", value)))
        elif kind == "strs":
            kvs.append(kv_strings(key, value))
        else:
            vtype, fmt = (I32, "<i") if kind == "i32" else (U32, "<I")
            kvs.append(kv(key, vtype, struct.pack(fmt, value)))
    infos, data = [], b""
    for name, dims in LLAMA.items():
        if name in drop:
            continue
        infos.append(tensor_info(name, dims, 0, len(data)))
        n = 4 * dims[0] * (dims[1] if len(dims) > 1 else 1)
        data += struct.pack(f"<{n // 4}f", *[0.01 * (i % 7) for i in range(n // 4)])
    path.write_bytes(gguf_bytes(kvs, infos, data))
    return path


def test_the_tiny_llama_loads(tmp_path):
    from nanorm.base.checkpoints import load_transformer

    path = tiny_llama(tmp_path / "ok.gguf")
    kw, sd = gguf_reader.load_gguf_checkpoint(path)
    assert (kw["dim"], kw["n_layers"], kw["n_heads"], kw["n_kv_heads"]) == (8, 1, 2, 1)
    assert (kw["vocab_size"], kw["hidden_dim"], kw["max_seq_len"]) == (16, 16, 64)
    assert load_transformer(str(path)).config.vocab_size == 16


HOSTILE_LLAMA = {  # name: (metadata changes or dropped tensors, what the error must name)
    "block_count 0": (dict(**{"llama.block_count": ("u32", 0)}), "llama.block_count"),
    "block_count huge": (dict(**{"llama.block_count": ("u32", 1 << 31)}), "llama.block_count"),
    "block_count negative": (dict(**{"llama.block_count": ("i32", -1)}), "llama.block_count"),
    "block_count a string": (dict(**{"llama.block_count": ("str", "1")}), "llama.block_count"),
    "embedding_length": (dict(**{"llama.embedding_length": ("u32", 16)}), "embedding_length"),
    "embedding_length a string": (
        dict(**{"llama.embedding_length": ("str", "8")}),
        "llama.embedding_length",
    ),
    "head_count 0": (dict(**{"llama.attention.head_count": ("u32", 0)}), "head_count"),
    "head_count 3": (dict(**{"llama.attention.head_count": ("u32", 3)}), "head_count"),
    "head_count_kv 0": (dict(**{"llama.attention.head_count_kv": ("u32", 0)}), "head_count_kv"),
    "head_count_kv 2": (dict(**{"llama.attention.head_count_kv": ("u32", 2)}), "attn_k"),
    "feed_forward_length": (
        dict(**{"llama.feed_forward_length": ("u32", 1 << 30)}),
        "feed_forward_length",
    ),
    "context_length 0": (dict(**{"llama.context_length": ("u32", 0)}), "llama.context_length"),
    "context_length a string": (
        dict(**{"llama.context_length": ("str", "64")}),
        "llama.context_length",
    ),
    "epsilon a string": (
        dict(**{"llama.attention.layer_norm_rms_epsilon": ("str", "x")}),
        "layer_norm_rms_epsilon",
    ),
    "vocabulary": (
        dict(**{"tokenizer.ggml.tokens": ("strs", ["a"] * 17)}),
        "tokenizer.ggml.tokens",
    ),
    "a missing tensor": ({"drop": ("blk.0.ffn_up.weight",)}, "blk.0.ffn_up.weight"),
}


@pytest.mark.parametrize("what", list(HOSTILE_LLAMA))
def test_gguf_metadata_a_loader_trusts_is_checked(tmp_path, what):
    changes, field = HOSTILE_LLAMA[what]
    changes = dict(changes)
    path = tiny_llama(tmp_path / "x.gguf", changes.pop("drop", ()), **changes)
    with pytest.raises(ValueError, match=rf"x\.gguf: .*{field}") as e:
        gguf_reader.load_gguf_checkpoint(path)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_every_entry_point_says_it_in_one_line(tmp_path):
    """The same hostile files through the commands a user runs: one line on stderr, exit 2."""
    from data.arith.prepare import main as prepare_arith

    prepare_arith(["--out_dir", str(tmp_path / "arith"), "--n_train", "32", "--n_val", "8"])
    src = write_rows(tmp_path / "prefs.jsonl", DEEP_LIST)
    rand = tmp_path / "r.model"
    rand.write_bytes(random.Random(0).randbytes(2000))
    ok = tiny_llama(tmp_path / "ok.gguf")
    heads = tiny_llama(tmp_path / "heads.gguf", **{"llama.attention.head_count": ("u32", 0)})
    align = tmp_path / "align.gguf"
    align.write_bytes(HOSTILE_GGUF["alignment 0"][0])
    not_tok = f"{rand}: not a readable tokenizer: "
    cases = [
        (
            ["data/prepare.py", "--src", src, "--out_dir", tmp_path / "d", "--tokenizer", rand],
            not_tok,
        ),
        (["-m", "nanorm.score", "--ckpt", ok, "--tokenizer", rand, "--response", "hi"], not_tok),
        (["-m", "nanorm.score", "--ckpt", align, "--response", "hi"], "general.alignment is 0"),
        (
            ["eval_rm.py", "--ckpt", heads, "--data", src, "--out", tmp_path / "e"],
            "head_count is 0",
        ),
        (
            ["train_rm.py", "--init", heads, "--dataset", tmp_path / "arith"]
            + ["--out_dir", tmp_path / "t", "--max_iters", "1"],
            "head_count is 0",
        ),
    ]
    for args, says in cases:
        p = python(args, timeout=300)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (args, p.stderr[-2000:])
        assert says in p.stderr, (args, p.stderr)
