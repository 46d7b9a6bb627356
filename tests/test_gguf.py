"""gguf_reader.py against known-good readers: the `gguf` package (llama.cpp's gguf-py) for the
format and each dequantization, transformers for a whole real model (SmolLM2-135M-Instruct)."""

import contextlib
import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import smollm2_hf_tokenizers

import nanorm.base.gguf_reader as gguf_reader

SMOL = (
    Path(__file__).resolve().parents[1].parent
    / "shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):",
]


# ------------------------------------------------------------ small files written by gguf-py
def write_gguf(path, tensors, kv=()):
    """A GGUF file holding {name: (float32 array, gguf type name)} and extra metadata."""
    gg = pytest.importorskip("gguf", reason="the gguf package is the reference writer")
    w = gg.GGUFWriter(str(path), "llama")
    for key, value in kv:
        if key == "general.alignment":  # the writer pads the tensors to it too
            w.add_custom_alignment(value[0])
            continue
        w.add_key_value(key, value[0], value[1], sub_type=value[2] if len(value) > 2 else None)
    for name, (x, tname) in tensors.items():
        qtype = gg.GGMLQuantizationType[tname]
        if tname == "F32":
            w.add_tensor(name, x)
        elif tname == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gg.quants.quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("tname", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_dequantize_matches_gguf_package(tmp_path, tname):
    gg = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5, 64)) * rng.uniform(0.1, 3, (3, 5, 1))).astype(np.float32)
    x[0, 0] = 0.0  # an all-zero block (scale 0) must not produce NaNs
    path = write_gguf(tmp_path / "t.gguf", {"w": (x, tname), "v": (x[0, 0, :32] + 1, "F32")})
    g = gguf_reader.read_gguf(path)
    t = g.tensors["w"]
    assert t.shape == (3, 5, 64) and t.dims == (64, 5, 3)
    assert gguf_reader.type_name(t.type) == f"{tname} ({int(gg.GGMLQuantizationType[tname])})"
    ours = gguf_reader.read_tensor(g, "w")
    raw = gg.GGUFReader(path).get_tensor(0).data  # quantized bytes as gguf-py reads them
    ref = gg.quants.dequantize(np.asarray(raw), gg.GGMLQuantizationType[tname])
    assert ours.dtype == np.float32 and ours.shape == x.shape
    np.testing.assert_array_equal(ours, ref.reshape(x.shape))  # same arithmetic, bit for bit
    if tname == "F32":
        np.testing.assert_array_equal(ours, x)
    np.testing.assert_array_equal(gguf_reader.read_tensor(g, "v"), x[0, 0, :32] + 1)


def test_metadata_round_trip(tmp_path):
    gg = pytest.importorskip("gguf")
    T = gg.GGUFValueType
    kv = [
        ("s", ("héllo ✓", T.STRING)),
        ("u8", (255, T.UINT8)),
        ("i16", (-3, T.INT16)),
        ("u32", (4_000_000_000, T.UINT32)),
        ("i64", (-(2**40), T.INT64)),
        ("u64", (2**63, T.UINT64)),
        ("f32", (0.5, T.FLOAT32)),
        ("f64", (0.1, T.FLOAT64)),
        ("yes", (True, T.BOOL)),
        ("no", (False, T.BOOL)),
        ("ints", ([1, -2, 3], T.ARRAY, T.INT32)),
        ("floats", ([0.25, -1.5], T.ARRAY, T.FLOAT32)),
        ("strs", (["a", "", "Ġthe"], T.ARRAY, T.STRING)),
        ("nested", ([[1, 2], [3]], T.ARRAY, T.ARRAY)),
        ("general.alignment", (64, T.UINT32)),
    ]
    x = np.arange(32, dtype=np.float32)
    path = write_gguf(tmp_path / "m.gguf", {"a": (x[:3], "F32"), "b": (x, "F32")}, kv)
    md = gguf_reader.read_gguf_metadata(path)
    assert md["general.architecture"] == "llama"
    for key, value in kv:
        assert md[key] == value[0] and type(md[key]) is type(value[0]), key
    g = gguf_reader.read_gguf(path)
    assert g.metadata == md and g.version == 3
    assert g.data_offset % 64 == 0  # general.alignment honoured, not the default 32
    np.testing.assert_array_equal(gguf_reader.read_tensor(g, "b"), x)


# ------------------------------------------------------------------------------- errors
def test_unsupported_type_names_tensor_type_and_file(tmp_path):
    gg = pytest.importorskip("gguf")
    w = gg.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    w.add_tensor(
        "blk.0.ffn_down.weight",
        np.zeros((4, 210), np.uint8),
        raw_dtype=gg.GGMLQuantizationType.Q6_K,
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = gguf_reader.read_gguf(tmp_path / "k.gguf")
    assert g.tensors["blk.0.ffn_down.weight"].shape == (4, 256)
    with pytest.raises(ValueError, match=r"k\.gguf: tensor blk\.0\.ffn_down\.weight .*Q6_K \(14\)"):
        gguf_reader.read_tensor(g, "blk.0.ffn_down.weight")
    with pytest.raises(ValueError, match=r"Q6_K \(14\)"):
        gguf_reader.dequantize(np.zeros(210, np.uint8), 14, (256,))


def test_bad_magic_and_truncation(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match=r"bad\.gguf: not a GGUF file"):
        gguf_reader.read_gguf_metadata(bad)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"short\.gguf: 4 bytes is too short"):
        gguf_reader.read_gguf(short)

    x = np.ones((8, 32), np.float32)
    full = write_gguf(
        tmp_path / "full.gguf", {"w": (x, "Q8_0")}, [("s", ("x" * 100, 8))]
    ).read_bytes()
    cut_data = tmp_path / "cut_data.gguf"
    cut_data.write_bytes(full[:-20])  # the last 4 bytes of w (and the 16 of padding after it)
    gguf_reader.read_gguf_metadata(cut_data)  # the metadata alone is intact
    with pytest.raises(ValueError, match=r"cut_data\.gguf: truncated: tensor w ends at byte"):
        gguf_reader.read_gguf(cut_data)
    cut_header = tmp_path / "cut_header.gguf"
    cut_header.write_bytes(full[:80])  # inside the 100-byte string
    with pytest.raises(
        ValueError, match=r"cut_header\.gguf: truncated: metadata key 's' runs past"
    ):
        gguf_reader.read_gguf_metadata(cut_header)


def test_non_llama_architecture_is_refused(tmp_path):
    gg = pytest.importorskip("gguf")
    w = gg.GGUFWriter(str(tmp_path / "q.gguf"), "qwen2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"q\.gguf: architecture 'qwen2'; only 'llama'"):
        gguf_reader.load_gguf_checkpoint(tmp_path / "q.gguf")


# ------------------------------------------------ the real model against transformers
@contextlib.contextmanager
def gguf_kept():
    """Two of gguf-py's pure functions kept while transformers reads a file: the parsed file
    (transformers parses it once per call, twice per model) and the tensor-name map (built once
    per module of the model, 397 times for SmolLM2). The same weights come out, bit for bit
    (compared once by hand), in 17 s instead of 35 on a 2-core CPU; a wrong weight would fail
    the comparison with ours below, never pass it."""
    import gguf

    kept = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = map(functools.cache, kept)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = kept


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    if not SMOL.exists():
        pytest.skip(f"{SMOL} absent: this test needs the shared SmolLM2 GGUF file")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf", reason="transformers reads GGUF through the gguf package")
    from nanorm.base.checkpoints import load_transformer

    kw, _ = gguf_reader.load_gguf_checkpoint(SMOL)
    ours = load_transformer(str(SMOL))  # what --init does with the file
    d, name = str(SMOL.parent), SMOL.name
    with gguf_kept():
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            d, gguf_file=name, dtype=torch.float32
        )
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_hf_tokenizers(tmp_path_factory) / "hf")
    return kw, ours, hf.eval(), tok


@pytest.mark.slow
def test_smollm2_config_logits_and_greedy_match_transformers(smol):
    """One test on the model transformers reads from the GGUF file (about 40 s to load): a
    second would load it again on the other pytest-xdist worker."""
    kw, ours, hf, tok = smol
    c = hf.config
    # the file holds eps as float32 (9.99999975e-06); we read back the decimal it came from
    kw = dict(kw)
    assert kw.pop("norm_eps") == 1e-5 and abs(c.rms_norm_eps - 1e-5) < 1e-12
    assert kw == dict(
        dim=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        vocab_size=c.vocab_size,
        hidden_dim=c.intermediate_size,
        rope_theta=100000.0,  # SOURCES.md section 5; transformers 5 keeps it in rope_parameters
        max_seq_len=c.max_position_embeddings,
        tie_embeddings=True,
    )
    assert ours.output.weight is ours.tok_embeddings.weight
    with torch.no_grad():
        logits_and_greedy_match(ours, hf, tok)


def logits_and_greedy_match(ours, hf, tok):
    for prompt in PROMPTS:
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
        a, b = ours(ids), hf(ids).logits
        # both fp32 on the same dequantized weights: only summation order differs, so the gap
        # is ~1.5e-6 of the logit scale here (5e-5 at 36); wq/wk permuted to the rotate-half
        # layout give 12.7, so this also checks that GGUF stores Meta's interleaved layout
        scale = b.abs().max().item()
        assert (a - b).abs().max().item() < 1e-5 * scale, prompt
        # transformers stops at <|im_end|> (eos, id 2); ours runs on, so compare up to it
        out = ours.generate(ids, max_new_tokens=20)[0].tolist()
        ref = hf.generate(ids, max_new_tokens=20, do_sample=False)[0].tolist()
        if 2 in out[ids.size(1) :]:
            out = out[: out.index(2, ids.size(1)) + 1]
        assert out == ref, prompt
    ids = tok("The capital of France is", add_special_tokens=False)["input_ids"]
    out = ours.generate(torch.tensor([ids]), max_new_tokens=3)
    assert tok.decode(out[0, len(ids) :]).startswith(" Paris.")
