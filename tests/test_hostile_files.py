"""Checkpoints that claim what they do not hold, weights and configs whose forward is not finite,
and ckpt.pt fields of the wrong type. Each is refused where the file is read, before anything is
computed from what it claims, in one line naming the file, the field and the fix: exit 2 from
the commands a user runs (data.run prints a UsageError so). Nothing a user has is lost on the
way: a checkpoint that cannot be resumed still scores.

The commands are run in this process through data.run(main, argv), as `python -m nanorm.score`,
`python eval_rm.py` and `python train_rm.py` run them; the tests marked slow run the same files
as child processes and bound the memory each child takes."""

import collections
import io
import json
import math
import pickle
import shutil
import struct

import pytest
import torch
from conftest import run_measured, shared_path
from launcher import python
from test_hostile_inputs import F32, LLAMA_KV, gguf_bytes, kv, kv_str, kv_strings, tensor_info

import eval_rm
import nanorm.score as score
import train_rm
from data.arith.prepare import main as prepare_arith
from model import ModelConfig, Transformer
from nanorm.base.checkpoints import HF_NAMES, load
from nanorm.base.command import UsageError, run

# a LLaMA small enough to build in every test, with stories260K's vocabulary of 512 (its
# tok512.bin tokenizes the text the commands score)
SMALL = dict(dim=8, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=512, hidden_dim=16)
SMALL |= dict(max_seq_len=64)
# what a 14 KB file claims: a (250,000, 2,048) embedding, a 2 GB tensor, and a layer to match
BIG = dict(dim=2048, n_layers=1, n_heads=16, n_kv_heads=16, vocab_size=250_000, hidden_dim=5632)
BIG |= dict(max_seq_len=64)
GB = 1 << 30


def tok512():
    return str(shared_path("llama2c", "stories260K", "tok512.bin"))


# ------------------------------------------------------------------------------ the formats
def shapes(config):
    """{Meta's name: shape} of the weights of a Transformer of config (nothing allocated)."""
    with torch.device("meta"):
        model = Transformer(ModelConfig(**config))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def expanded(shape):
    """A tensor of shape whose elements are all one float: torch.save writes 4 bytes of data and
    strides of 0 (a view, as torch.zeros(1).expand(shape) is)."""
    return torch.zeros(1).expand(shape)


def varied(shape):
    """Small finite weights, the same every time."""
    n = math.prod(shape)
    return (torch.arange(n, dtype=torch.float32).remainder(7) * 0.01).reshape(shape)


def filled(value):
    return lambda shape: torch.full(shape, value)


def weights(config, make=varied, **instead):
    """{Meta's name: make(shape)} of every weight of a Transformer of config, some instead."""
    return {k: instead[k] if k in instead else make(s) for k, s in shapes(config).items()}


def write_ours(path, config, sd, heads=None, **record):
    """nanoRM's ckpt.pt of a RewardModel: kind, config, the state dict, and record's keys."""
    heads = {"head.weight": varied((1, config["dim"])), "head.bias": torch.zeros(1)} | (heads or {})
    model = {f"backbone.{k}": v for k, v in sd.items()} | heads
    torch.save({"kind": "RewardModel", "config": config, "model": model} | record, path)
    return path


def write_llama2c_pt(path, config, sd):
    """llama2.c train.py's checkpoint: its model and model_args (it ties the output)."""
    sd = {k: v for k, v in sd.items() if k != "output.weight"}
    args = {k: v for k, v in config.items() if k != "max_seq_len"} | dict(multiple_of=32)
    torch.save({"model": sd, "model_args": args | dict(max_seq_len=64, dropout=0.0)}, path)
    return path


def hf_config(config, **changes):
    return dict(
        hidden_size=config["dim"], num_hidden_layers=config["n_layers"],
        num_attention_heads=config["n_heads"], num_key_value_heads=config["n_kv_heads"],
        vocab_size=config["vocab_size"], intermediate_size=config["hidden_dim"],
        rms_norm_eps=1e-5, max_position_embeddings=config["max_seq_len"],
    ) | changes  # fmt: skip


def hf_names(sd):
    """The state dict in Hugging Face's names (the values as they are: a test of the reader's
    checks, not of its un-permuting)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("layers."):
            i, rest = k.removeprefix("layers.").split(".", 1)
            module = rest.removesuffix(".weight")
            out[f"model.layers.{i}.{HF_NAMES[module]}.weight"] = v
        else:
            top = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm"}
            out[top.get(k.removesuffix(".weight"), "lm_head") + ".weight"] = v
    return out


def write_hf(folder, config, sd, heads=None, **changes):
    """A Hugging Face directory: config.json and pytorch_model.bin."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(config, **changes)))
    torch.save(hf_names(sd) | (heads or {}), folder / "pytorch_model.bin")
    return folder


def write_meta(folder, config, sd, **changes):
    """Meta's release: params.json and consolidated.00.pth (the FFN width from multiple_of)."""
    folder.mkdir()
    params = dict(dim=config["dim"], n_layers=config["n_layers"], n_heads=config["n_heads"])
    params |= dict(n_kv_heads=config["n_kv_heads"], vocab_size=config["vocab_size"])
    params |= dict(multiple_of=config["multiple_of"], norm_eps=1e-5) | changes
    params = {k: v for k, v in params.items() if v is not None}  # None: left out
    (folder / "params.json").write_text(json.dumps(params))
    torch.save(sd, folder / "consolidated.00.pth")
    return folder


def meta_config(config):
    """config with the FFN width Meta derives from multiple_of (params.json states none)."""
    config = {k: v for k, v in config.items() if k != "hidden_dim"}
    return config | dict(multiple_of=16 if config["dim"] < 256 else 256)


def write_bin(path, config, fill=None, size=None):
    """run.c's legacy v0 .bin: the 7-int header, then every weight (tied output); size: a
    header that claims config's sizes in a file of that many bytes."""
    c = config
    header = struct.pack("7i", c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"],
                         c["n_kv_heads"], c["vocab_size"], c["max_seq_len"])  # fmt: skip
    if size is not None:
        path.write_bytes(header + bytes(size - len(header)))
        return path
    hd, L, d, h = c["dim"] // c["n_heads"], c["n_layers"], c["dim"], c["hidden_dim"]
    kv = c["n_kv_heads"] * hd
    n = c["vocab_size"] * d + L * (2 * d + 2 * d * d + 2 * kv * d + 3 * h * d) + d
    n += c["max_seq_len"] * hd  # the two RoPE tables
    values = varied((n,)) if fill is None else torch.full((n,), fill)
    path.write_bytes(header + values.numpy().tobytes())
    return path


# the GGUF LLaMA of test_hostile_inputs (dim 8, one layer), with a vocabulary of `vocab`
GGUF_SHAPES = {
    "token_embd.weight": (8, None),
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


def write_gguf(path, vocab=512, fill=None, one_offset=False, tokens=None):
    """A llama GGUF in F32; fill: every value; one_offset: every tensor's data at offset 0 (the
    largest tensor's bytes, read by all); tokens: a BPE vocabulary of its own."""
    kvs = [kv_str("general.architecture", "llama")]
    for key, (kind, value) in LLAMA_KV.items():
        if key != "general.architecture":
            kvs.append(kv(key, F32, struct.pack("<f", value)) if kind == "f32" else
                       kv(key, 4, struct.pack("<I", value)))  # fmt: skip
    if tokens is not None:
        kvs += [kv_str("tokenizer.ggml.model", "gpt2"), kv_strings("tokenizer.ggml.tokens", tokens)]
        kvs.append(kv_strings("tokenizer.ggml.merges", ["a b"]))
    infos, data = [], b""
    for name, dims in GGUF_SHAPES.items():
        dims = tuple(vocab if d is None else d for d in dims)
        n = math.prod(dims)
        values = varied((n,)) if fill is None else torch.full((n,), fill)
        blob = values.numpy().tobytes() + bytes(-4 * n % 32)
        infos.append(tensor_info(name, dims, 0, 0 if one_offset else len(data)))
        data = max(data, blob, key=len) if one_offset else data + blob
    path.write_bytes(gguf_bytes(kvs, infos, data))
    return path


class _Storage:
    """A storage as torch.save's pickle names it, claiming numel floats."""

    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class _View:
    """A tensor as torch.save's pickle rebuilds it: a view of a storage."""

    def __init__(self, storage, shape, stride, offset=0):
        self.args = (storage, offset, shape, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, self.args


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None


def write_torch_archive(path, obj, records):
    """torch.save's zip archive of obj, whose _Storage entries name records {key: bytes}: what
    the pickle claims is written as given, whatever the records hold."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    with torch.serialization._open_zipfile_writer(str(path)) as z:
        z.write_record("data.pkl", buf.getvalue(), len(buf.getvalue()))
        z.write_record("byteorder", b"little", 6)
        for key, blob in records.items():
            z.write_record(f"data/{key}", blob, len(blob))
    return path


def write_safetensors(folder, header, data):
    """An HF directory with one model.safetensors of this header (JSON) and these bytes."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(SMALL)))
    blob = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return folder


# ------------------------------------------------------------------------ running a command
COMMANDS = {"score": score.main, "eval": eval_rm.main, "train": train_rm.main}


def command(capsys, name, *argv):
    """(exit status, stdout, stderr) of one command run as its __main__ runs it: data.run(main)
    prints a UsageError as one line and exits 2; anything else is a traceback (raised here)."""
    capsys.readouterr()
    try:
        run(COMMANDS[name], [str(a) for a in argv])
        rc = 0
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def refused(result, *words):
    """Assert a one-line refusal (exit 2) naming each of words."""
    rc, out, err = result
    assert rc == 2, (rc, out[-600:], err[-600:])
    assert err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    for w in words:
        assert str(w) in err, (w, err)
    return err


def child(*args, cap=8 * GB, limit_s=900):
    """Run python args in a child process: (exit status, stderr, peak resident MB, seconds).
    The child's address space is capped at cap and it is killed after limit_s, so a file that is
    not refused fails there instead of taking the machine's memory; neither decides a test: the
    memory it reached does (the command's own peak, conftest.run_measured)."""
    rc, _, err, peak, seconds = run_measured(args, cap=cap, limit_s=limit_s)
    return rc, err, peak / (1 << 20), seconds


# ------------------------------------------------------------------ 11. sizes from the bytes
def hostile_sizes(root):
    """{what: (path, words of its refusal)}: files of a few KB that claim gigabytes. The torch
    files hold views whose elements repeat (strides of 0, overlapping strides) or tensors that
    share bytes; the others claim tensors past their file's end, or over each other's bytes."""
    big = {k: expanded(s) for k, s in shapes(BIG).items()}
    huge = {k: expanded(s) for k, s in shapes(BIG | dict(vocab_size=2_000_000)).items()}
    meta = {k: expanded(s) for k, s in shapes(meta_config(BIG)).items()}
    V, d = SMALL["vocab_size"], SMALL["dim"]
    overlapping = torch.arange(V + d - 1.0).as_strided((V, d), (1, 1))  # row i starts at i
    shared = torch.zeros(64)  # two weights over the same 64 floats, as views of other shapes
    small = weights(SMALL)
    small["layers.0.attention.wk.weight"] = shared[:32].view(4, 8)
    small["layers.0.attention.wv.weight"] = shared[16:48].view(4, 8)
    claims = {"t": _View(_Storage("0", 10**9), (10**9,), (1,))}  # 4 bytes behind 10^9 floats
    over = {"dtype": "F32", "shape": [250_000, 2048], "data_offsets": [0, 4]}
    files = {
        "ckpt.pt, 250,000 x 2,048 of one float": (
            write_ours(root / "stride0.pt", BIG, big),
            "tensor model.backbone.tok_embeddings.weight claims shape (250000, 2048) from 4 bytes",
        ),
        "ckpt.pt, 2,000,000 x 2,048 of one float": (
            write_ours(root / "stride0_2m.pt", BIG | dict(vocab_size=2_000_000), huge),
            "claims shape (2000000, 2048) from 4 bytes",
        ),
        "ckpt.pt, overlapping strides": (
            write_ours(
                root / "overlap.pt", SMALL, weights(SMALL, **{"tok_embeddings.weight": overlapping})
            ),
            "its elements repeat",
        ),
        "ckpt.pt, two weights over the same bytes": (
            write_ours(root / "shared.pt", SMALL, small),
            "share bytes",
        ),
        "llama2.c .pt of one float": (
            write_llama2c_pt(root / "llama2c.pt", BIG, big),
            "tensor model.tok_embeddings.weight claims shape (250000, 2048)",
        ),
        "HF pytorch_model.bin of one float": (
            write_hf(root / "hf", BIG, big),
            "tensor model.embed_tokens.weight claims shape (250000, 2048)",
        ),
        "Meta consolidated.00.pth of one float": (
            write_meta(root / "meta", meta_config(BIG), meta),
            "tensor tok_embeddings.weight claims shape (250000, 2048)",
        ),
        "torch storage claiming more than its record": (
            write_torch_archive(root / "record.pt", claims, {"0": bytes(4)}),
            "is corrupt",
        ),
        "safetensors header past the file": (
            write_safetensors(root / "st", {"model.embed_tokens.weight": over}, bytes(4)),
            "unreadable safetensors",
        ),
        "llama2.c .bin header past the file": (
            write_bin(root / "header.bin", BIG, size=28 + 64),
            "implies",
        ),
        "GGUF tensors over the same bytes": (
            write_gguf(root / "one_offset.gguf", one_offset=True),
            "inside tensor",
        ),
    }
    return files


@pytest.fixture(scope="module")
def sizes(tmp_path_factory):
    return hostile_sizes(tmp_path_factory.mktemp("sizes"))


SIZES = [
    "ckpt.pt, 250,000 x 2,048 of one float", "ckpt.pt, 2,000,000 x 2,048 of one float",
    "ckpt.pt, overlapping strides", "ckpt.pt, two weights over the same bytes",
    "llama2.c .pt of one float", "HF pytorch_model.bin of one float",
    "Meta consolidated.00.pth of one float", "torch storage claiming more than its record",
    "safetensors header past the file", "llama2.c .bin header past the file",
    "GGUF tensors over the same bytes",
]  # fmt: skip


@pytest.mark.parametrize("what", SIZES)
def test_a_file_is_read_for_the_bytes_it_holds(sizes, what):
    """Each tensor's shape is checked against the bytes behind it before anything is computed
    from it: a file of a few KB is refused, in one line naming it and the tensor."""
    path, words = sizes[what]
    assert sum(f.stat().st_size for f in [path, *path.glob("*")] if f.is_file()) < 64 << 10
    with pytest.raises(UsageError) as e:
        load(path)
    assert str(path) in str(e.value) and words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "what, cmd",
    [
        ("ckpt.pt, 250,000 x 2,048 of one float", "score"),
        ("ckpt.pt, 2,000,000 x 2,048 of one float", "eval"),
        ("HF pytorch_model.bin of one float", "score"),
        ("GGUF tensors over the same bytes", "score"),
    ],
)
def test_a_hostile_file_costs_the_commands_no_memory(sizes, tmp_path, what, cmd, record_property):
    """Through the command a user runs, as a child process: one line, exit 2, and the child's
    peak memory under 1 GB (what importing torch takes)."""
    path, words = sizes[what]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Once", "chosen": " upon", "rejected": " a"}) + "\n")
    argv = {
        "score": ["-m", "nanorm.score", "--ckpt", path, "--response", "Once upon a time"],
        "eval": ["eval_rm.py", "--ckpt", path, "--data", pairs, "--out", tmp_path / "e"],
    }[cmd] + ["--tokenizer", tok512()]
    rc, err, peak_mb, seconds = child(*argv)
    record_property(
        "measured", f"{what} through {cmd}: exit {rc}, {peak_mb:.0f} MB, {seconds:.1f} s"
    )
    assert rc == 2 and err.count("\n") == 1, err[-2000:]
    assert str(path) in err and words in err, err
    assert peak_mb < 1024, peak_mb


# --------------------------------------------------------------- 16. weights that are not finite
def not_finite_files(root):
    """{what: (path, the tensor its refusal names)}: one per format, each holding a NaN or an
    infinity."""
    nan, inf = float("nan"), float("inf")
    heads = {"score.weight": torch.full((1, 8), inf)}  # an HF classifier's head
    bad = {"layers.0.feed_forward.w2.weight": torch.full((8, 16), nan)}
    infinite = {"layers.0.feed_forward.w2.weight": torch.full((8, 16), -inf)}
    return {
        "llama2.c .bin of NaN": (write_bin(root / "nan.bin", SMALL, fill=nan), "tok_embeddings"),
        "llama2.c .pt with an inf": (
            write_llama2c_pt(root / "inf.pt", SMALL, weights(SMALL, **infinite)),
            "layers.0.feed_forward.w2.weight",
        ),
        "GGUF of NaN": (write_gguf(root / "nan.gguf", fill=nan), "tok_embeddings"),
        "HF .bin with a NaN layer": (
            write_hf(root / "hf_nan", SMALL, weights(SMALL, **bad)),
            "layers.0.feed_forward.w2.weight",
        ),
        "HF classifier with an infinite score": (
            write_hf(root / "hf_score", SMALL, weights(SMALL), heads),
            "head.weight",
        ),
        "Meta with a NaN layer": (
            write_meta(
                root / "meta_nan", meta_config(SMALL), weights(meta_config(SMALL), filled(nan))
            ),
            "tok_embeddings",
        ),
        "ckpt.pt with a NaN layer": (
            write_ours(root / "nan_layer.pt", SMALL, weights(SMALL, **bad)),
            "layers.0.feed_forward.w2.weight",
        ),
    }


NOT_FINITE = [
    "llama2.c .bin of NaN", "llama2.c .pt with an inf", "GGUF of NaN", "HF .bin with a NaN layer",
    "HF classifier with an infinite score", "Meta with a NaN layer", "ckpt.pt with a NaN layer",
]  # fmt: skip


@pytest.fixture(scope="module")
def nonfinite(tmp_path_factory):
    return not_finite_files(tmp_path_factory.mktemp("nonfinite"))


@pytest.mark.parametrize("what", NOT_FINITE)
def test_weights_that_are_not_finite_are_refused_in_every_format(nonfinite, what):
    path, tensor = nonfinite[what]
    with pytest.raises(UsageError, match="is not finite") as e:
        load(path)
    assert str(path) in str(e.value) and tensor in str(e.value) and "\n" not in str(e.value)


def test_a_nan_backbone_is_not_scored_nor_evaluated(nonfinite, tmp_path, capsys):
    """llama2.c's .bin of NaN weights: nanorm.score printed `reward: nan` with exit 0, and
    eval_rm.py wrote an eval.json of NaN, then failed in its plots."""
    path, _ = nonfinite["llama2.c .bin of NaN"]
    r = command(capsys, "score", "--ckpt", path, "--tokenizer", tok512(), "--response", "Once")
    refused(r, path, "is not finite")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Once", "chosen": " upon", "rejected": " a"}) + "\n")
    out = tmp_path / "e"
    r = command(
        capsys, "eval", "--ckpt", path, "--tokenizer", tok512(), "--data", pairs, "--out", out
    )
    refused(r, path, "is not finite")
    assert not (out / "eval.json").exists()


@pytest.mark.parametrize("fmt", ["ckpt.pt", "llama2.c .pt", "HF .bin", "Meta"])
def test_an_integer_weight_is_refused_by_name(tmp_path, fmt):
    """An int64 weight holds no real numbers: refused by name, never cast (a float16 one is
    cast: test_fp16_weights_in_a_float32_file_are_cast)."""
    wq = {"layers.0.attention.wq.weight": torch.ones(8, 8, dtype=torch.int64)}
    path = {
        "ckpt.pt": lambda: write_ours(tmp_path / "int.pt", SMALL, weights(SMALL, **wq)),
        "llama2.c .pt": lambda: write_llama2c_pt(tmp_path / "int.pt", SMALL, weights(SMALL, **wq)),
        "HF .bin": lambda: write_hf(tmp_path / "hf", SMALL, weights(SMALL, **wq)),
        "Meta": lambda: write_meta(
            tmp_path / "meta", meta_config(SMALL), weights(meta_config(SMALL), **wq)
        ),
    }[fmt]()
    with pytest.raises(UsageError, match="is int64, not floating point") as e:
        load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_init_from_weights_that_are_not_finite_is_refused(nonfinite, tmp_path, capsys):
    """train_rm.py --init a GGUF of NaN weights (no tokenizer: its 512 rows match the data's
    vocabulary): it trained, and stopped at the first step's NaN loss."""
    from conftest import stories_arith

    data = stories_arith(tmp_path / "data", 16, 8)
    path, _ = nonfinite["GGUF of NaN"]
    r = command(capsys, "train", "--init", path, "--dataset", data, "--out_dir", tmp_path / "o",
                "--max_iters", 1, "--batch_size", 8)  # fmt: skip
    refused(r, path, "is not finite")


def test_fp16_weights_in_a_float32_file_are_cast(tmp_path, capsys):
    """A half-precision weight in a float32 ckpt.pt is read as float32 (as a load in float32
    reads any file), not a dtype mismatch in the forward."""
    sd = weights(SMALL)
    sd["layers.0.attention.wq.weight"] = sd["layers.0.attention.wq.weight"].half()
    path = write_ours(tmp_path / "fp16.pt", SMALL, sd)
    assert load(path).backbone.layers[0].attention.wq.weight.dtype == torch.float32
    rc, out, err = command(
        capsys, "score", "--ckpt", path, "--tokenizer", tok512(), "--response", "Once"
    )
    assert rc == 0 and "reward: " in out and "nan" not in out, (out, err)


# ------------------------------------------------------ 16. configs outside their domain
def domain_files(root):
    """{what: (path, the field its refusal names)}: finite values that make the forward NaN."""
    sd, meta_sd = weights(SMALL), weights(meta_config(SMALL))
    llama3 = dict(rope_type="llama3", factor=0.0, low_freq_factor=1.0, high_freq_factor=4.0)
    llama3["original_max_position_embeddings"] = 8192

    def ours(name, **changes):
        return write_ours(root / f"{name}.pt", SMALL | changes, sd)

    return {
        "ckpt.pt rope_theta -1": (ours("theta", rope_theta=-1.0), "rope_theta"),
        "ckpt.pt norm_eps -1": (ours("eps", norm_eps=-1.0), "norm_eps"),
        "ckpt.pt norm_eps 0": (ours("eps0", norm_eps=0.0), "norm_eps"),
        "ckpt.pt norm_eps NaN": (ours("eps_nan", norm_eps=float("nan")), "norm_eps"),
        "ckpt.pt norm_eps None": (ours("eps_none", norm_eps=None), "norm_eps"),
        "ckpt.pt rope_theta a string": (ours("theta_str", rope_theta="1e4"), "rope_theta"),
        "ckpt.pt rope_scaling a string": (ours("scaling_str", rope_scaling="yes"), "rope_scaling"),
        "ckpt.pt llama3 scaling factor 0": (
            ours("llama3", rope_scaling=llama3),
            "rope_scaling",
        ),
        "ckpt.pt dropout 2": (ours("dropout", dropout=2.0), "dropout"),
        "ckpt.pt tie_embeddings a string": (ours("tie", tie_embeddings="no"), "tie_embeddings"),
        "HF rope_theta -1": (write_hf(root / "hf_theta", SMALL, sd, rope_theta=-1.0), "rope_theta"),
        "HF rms_norm_eps -1": (write_hf(root / "hf_eps", SMALL, sd, rms_norm_eps=-1), "norm_eps"),
        "Meta norm_eps -1": (
            write_meta(root / "meta_eps", meta_config(SMALL), meta_sd, norm_eps=-1.0),
            "norm_eps",
        ),
        "Meta params.json without dim": (
            write_meta(root / "meta_dim", meta_config(SMALL), meta_sd, dim=None),
            "dim",
        ),
    }


DOMAINS = [
    "ckpt.pt rope_theta -1", "ckpt.pt norm_eps -1", "ckpt.pt norm_eps 0", "ckpt.pt norm_eps NaN",
    "ckpt.pt norm_eps None", "ckpt.pt rope_theta a string", "ckpt.pt rope_scaling a string",
    "ckpt.pt llama3 scaling factor 0", "ckpt.pt dropout 2",
    "ckpt.pt tie_embeddings a string", "HF rope_theta -1", "HF rms_norm_eps -1",
    "Meta norm_eps -1", "Meta params.json without dim",
]  # fmt: skip


@pytest.fixture(scope="module")
def domains(tmp_path_factory):
    return domain_files(tmp_path_factory.mktemp("domains"))


@pytest.mark.parametrize("what", DOMAINS)
def test_config_values_outside_their_domain_are_refused(domains, what):
    path, field = domains[what]
    with pytest.raises(UsageError) as e:
        load(path)
    assert str(path) in str(e.value) and field in str(e.value) and "\n" not in str(e.value)


def test_a_negative_rope_base_is_not_scored(domains, capsys):
    """rope_theta -1: nanorm.score printed `reward: nan` with exit 0."""
    path, _ = domains["ckpt.pt rope_theta -1"]
    r = command(capsys, "score", "--ckpt", path, "--tokenizer", tok512(), "--response", "Once")
    refused(r, path, "rope_theta")


def overflowing_head(root):
    """A ckpt.pt whose weights are all finite, but whose head (3e38, near float32's largest)
    makes the reward overflow to an infinity: layers of zeros and embeddings of 0.5 leave every
    hidden state at ones after the final norm, so the reward is 8 x 3e38."""
    sd = {k: torch.ones(s) if "norm" in k else torch.zeros(s) for k, s in shapes(SMALL).items()}
    sd["tok_embeddings.weight"] = torch.full((SMALL["vocab_size"], SMALL["dim"]), 0.5)
    return write_ours(root / "3e38.pt", SMALL, sd, {"head.weight": torch.full((1, 8), 3e38)})


def test_score_never_prints_a_reward_that_is_not_finite(tmp_path, capsys):
    path = overflowing_head(tmp_path)
    r = command(capsys, "score", "--ckpt", path, "--tokenizer", tok512(), "--response", "Once")
    refused(r, path, "not finite")


def test_eval_never_writes_rewards_that_are_not_finite(tmp_path, capsys):
    path = overflowing_head(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Once", "chosen": " upon", "rejected": " a"}) + "\n")
    out = tmp_path / "e"
    r = command(
        capsys, "eval", "--ckpt", path, "--tokenizer", tok512(), "--data", pairs, "--out", out
    )
    refused(r, path, "not finite")
    assert not (out / "eval.json").exists()


# ---------------------------------------------------- 14. a tokenizer of a larger vocabulary
SIXTEEN = ["a", "b", "ab", *"cdefghijklmnop"[:13]]  # a BPE vocabulary of 16 tokens


def test_init_from_a_gguf_of_another_vocabulary_names_both_sizes(tmp_path, capsys):
    """train_rm.py --init a GGUF whose own tokenizer has 16 tokens, on data of stories260K's
    512: one line naming both vocabularies and the fix."""
    from conftest import stories_arith

    data = stories_arith(tmp_path / "data", 16, 8)
    path = write_gguf(tmp_path / "sixteen.gguf", vocab=16, tokens=SIXTEEN)
    r = command(capsys, "train", "--init", path, "--dataset", data, "--out_dir", tmp_path / "o",
                "--max_iters", 1, "--batch_size", 8)  # fmt: skip
    refused(r, path, "of 16 tokens", "512 tokens", f"--tokenizer {path}")


def test_score_with_a_tokenizer_larger_than_the_model_names_both_sizes(tmp_path, capsys):
    path = write_gguf(tmp_path / "sixteen.gguf", vocab=16)
    r = command(capsys, "score", "--ckpt", path, "--tokenizer", tok512(), "--response", "Once")
    refused(r, path, "16", "512")


def test_eval_with_a_tokenizer_larger_than_the_model_names_both_sizes(tmp_path, capsys):
    path = write_gguf(tmp_path / "sixteen.gguf", vocab=16)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Once", "chosen": " upon", "rejected": " a"}) + "\n")
    r = command(capsys, "eval", "--ckpt", path, "--tokenizer", tok512(), "--data", pairs,
                "--out", tmp_path / "e")  # fmt: skip
    refused(r, "16", "512", "--tokenizer")


# --------------------------------------------------------- 17. corrupt fields of a ckpt.pt
RUN = ["--eval_pairs", "16", "--batch_size", "8", "--dtype", "float32", "--lm_coef", "0"]
RUN += ["--log_interval", "1", "--eval_interval", "2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(dataset, a run folder): two steps of train_rm.py on arithmetic pairs, whose ckpt.pt
    holds every field (tokenizer files, data_meta, train_config, optimizer, rng, step)."""
    root = tmp_path_factory.mktemp("trained")
    data = str(root / "arith")
    prepare_arith(["--out_dir", data, "--n_train", "64", "--n_val", "16"])
    train_rm.main(["--dataset", data, "--out_dir", str(root / "run"), "--max_iters", "2", *RUN])
    return data, root / "run"


def corrupt(trained, tmp_path, change):
    """A copy of the trained run whose ckpt.pt is change(its dict): -> (its folder, ckpt.pt)."""
    _, run_dir = trained
    folder = tmp_path / "run"
    shutil.copytree(run_dir, folder)
    ckpt = torch.load(folder / "ckpt.pt", weights_only=True)
    torch.save(change(ckpt), folder / "ckpt.pt")
    return folder, folder / "ckpt.pt"


def model_with(**changes):
    """change(ckpt): its state dict with some entries replaced (None: removed)."""

    def change(ckpt):
        model = dict(ckpt["model"])
        for k, v in changes.items():
            model.pop(k) if v is None else model.__setitem__(k, v(model.get(k)))
        return ckpt | {"model": model}

    return change


WQ = "backbone.layers.0.attention.wq.weight"
SCORED = {  # what: (change, extra options, words its refusal says)
    "kind a list": (lambda c: c | {"kind": ["RewardModel"]}, [], "kind"),
    "kind a number": (lambda c: c | {"kind": 3}, [], "kind"),
    "model a list": (lambda c: c | {"model": [1, 2]}, [], "model"),
    "model with int keys": (lambda c: c | {"model": dict(enumerate(c["model"].values()))}, [], "model"),
    "model with a string": (model_with(**{WQ: lambda t: "weights"}), [], "model"),
    "config a string where a number goes": (
        lambda c: c | {"config": c["config"] | {"norm_eps": "1e-5"}},
        [],
        "norm_eps",
    ),
    "config rope_theta None": (
        lambda c: c | {"config": c["config"] | {"rope_theta": None}},
        [],
        "rope_theta",
    ),
    "an int64 weight": (model_with(**{WQ: lambda t: t.long()}), [], "int64"),
    "a boolean head": (model_with(**{"head.bias": lambda t: t > 0}), [], "bool"),
    "tokenizer file named ..": (
        lambda c: c | {"tokenizer_files": {"..": c["tokenizer_files"]["tokenizer.model"]}},
        [],
        "tokenizer_files",
    ),
    "tokenizer file in a folder": (
        lambda c: c | {"tokenizer_files": {"a/tok.model": c["tokenizer_files"]["tokenizer.model"]}},
        [],
        "tokenizer_files",
    ),
    "tokenizer file with an absolute name": (
        lambda c: c | {"tokenizer_files": {"/tmp/tok.model": c["tokenizer_files"]["tokenizer.model"]}},
        [],
        "tokenizer_files",
    ),
    "tokenizer files a list": (lambda c: c | {"tokenizer_files": [1]}, [], "tokenizer_files"),
    "tokenizer file of floats": (
        lambda c: c | {"tokenizer_files": {"tokenizer.model": torch.zeros(3)}},
        [],
        "tokenizer_files",
    ),
    "tokenizer file of random bytes": (
        lambda c: c | {"tokenizer_files": {"tokenizer.model": torch.arange(200).to(torch.uint8)}},
        [],
        "tokenizer_files",
    ),
    "length_calibration a string": (lambda c: c | {"length_calibration": "x"}, [], "length_calibration"),
    "length_calibration coef None": (
        lambda c: c | {"length_calibration": {"kind": "linear_log_length", "coef": None, "n": 4}},
        [],
        "length_calibration coef",
    ),
    "length_calibration coef NaN": (
        lambda c: c | {"length_calibration": {"kind": "linear_log_length", "coef": [float("nan"), 0.0], "n": 4}},
        [],
        "length_calibration coef",
    ),
    "reward_normalization std a string": (
        lambda c: c | {"reward_normalization": {"mean": 0.0, "std": "1", "n": 4, "calibrated": False}},
        ["--normalize"],
        "reward_normalization std",
    ),
    "data_meta a list": (lambda c: c | {"data_meta": [1]}, [], "data_meta"),
    "data_meta chat_format a number": (
        lambda c: c | {"data_meta": c["data_meta"] | {"chat_format": 3}},
        [],
        "data_meta chat_format",
    ),
}  # fmt: skip


@pytest.mark.parametrize("what", list(SCORED))
def test_a_corrupt_field_is_one_line_when_scoring(trained, tmp_path, capsys, what):
    change, options, words = SCORED[what]
    _, path = corrupt(trained, tmp_path, change)
    r = command(
        capsys, "score", "--ckpt", path, "--prompt", "2 + 2 =", "--response", " 4", *options
    )
    refused(r, path, words)


EVALUATED = {  # what: (change, words)
    "train_config a list": (lambda c: c | {"train_config": [1]}, "train_config"),
    "train_config batch_size a string": (
        lambda c: c | {"train_config": c["train_config"] | {"batch_size": "8"}},
        "train_config batch_size",
    ),
    "length_calibration coef None": (
        lambda c: c | {"length_calibration": {"kind": "linear_log_length", "coef": None, "n": 4}},
        "length_calibration coef",
    ),
}


@pytest.mark.parametrize("what", list(EVALUATED))
def test_a_corrupt_field_is_one_line_when_evaluating(trained, tmp_path, capsys, what):
    change, words = EVALUATED[what]
    data, _ = trained
    _, path = corrupt(trained, tmp_path, change)
    r = command(capsys, "eval", "--ckpt", path, "--data", data, "--out", tmp_path / "e")
    refused(r, path, words)
    assert not (tmp_path / "e" / "eval.json").exists()


def nan_moments(ckpt):
    """The optimizer's second moments all NaN: the first update makes every weight NaN."""
    state = {i: s | {"exp_avg_sq": torch.full_like(s["exp_avg_sq"], float("nan"))}
             for i, s in ckpt["optimizer"]["state"].items()}  # fmt: skip
    return ckpt | {"optimizer": ckpt["optimizer"] | {"state": state}}


RESUMED = {  # what: (change, words)
    "step a string": (lambda c: c | {"step": "2"}, "step"),
    "step a fraction": (lambda c: c | {"step": 1.5}, "step"),
    "step negative": (lambda c: c | {"step": -3}, "step"),
    "step a bool": (lambda c: c | {"step": True}, "step"),
    "rng of 3 bytes": (lambda c: c | {"rng": torch.zeros(3, dtype=torch.uint8)}, "rng"),
    "rng of floats": (lambda c: c | {"rng": c["rng"].float()}, "rng"),
    "world a string": (lambda c: c | {"world": "1"}, "world"),
    "optimizer a list": (lambda c: c | {"optimizer": [1]}, "optimizer"),
    "optimizer groups cut": (
        lambda c: c | {"optimizer": c["optimizer"] | {"param_groups": c["optimizer"]["param_groups"][:1]}},
        "optimizer",
    ),
    "optimizer moments of another shape": (
        lambda c: c | {"optimizer": c["optimizer"] | {"state": {
            i: s | {"exp_avg": s["exp_avg"].flatten()[:1]} for i, s in c["optimizer"]["state"].items()
        }}},
        "optimizer",
    ),
    "optimizer moments NaN": (nan_moments, "optimizer state is not finite"),
    "weights NaN": (model_with(**{WQ: lambda t: torch.full_like(t, float("nan"))}), "not finite"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(RESUMED))
def test_a_corrupt_field_is_one_line_when_resuming(trained, tmp_path, capsys, what):
    """train_rm.py --resume refuses the field before anything of the run changes: its
    ckpt.pt and log.jsonl stay as they were. (A negative step resumed before the run's start
    and dropped its log rows; NaN moments made the first update NaN, and the run stopped
    naming this ckpt.pt as its last good checkpoint.)"""
    change, words = RESUMED[what]
    data, _ = trained
    folder, path = corrupt(trained, tmp_path, change)
    before = {f: (folder / f).read_bytes() for f in ("ckpt.pt", "log.jsonl")}
    r = command(capsys, "train", "--dataset", data, "--out_dir", folder, "--max_iters", 4,
                "--resume", *RUN)  # fmt: skip
    err = refused(r, path, words)
    assert "last good checkpoint" not in err
    assert {f: (folder / f).read_bytes() for f in before} == before


def test_a_checkpoint_that_cannot_resume_still_scores(trained, tmp_path, capsys):
    """Nothing a user has is lost: a ckpt.pt whose optimizer state is cut scores as before."""
    _, path = corrupt(trained, tmp_path, lambda c: c | {"step": -3, "rng": torch.zeros(3)})
    rc, out, err = command(
        capsys, "score", "--ckpt", path, "--prompt", "2 + 2 =", "--response", " 4"
    )
    assert rc == 0 and "reward: " in out, (out, err)


def test_a_lock_that_is_a_folder_is_one_line_when_resuming(trained, tmp_path, capsys):
    """out_dir/.lock a directory: the run's lock refuses it (nanorm/run_dir.py's claim)."""
    data, _ = trained
    folder, _ = corrupt(trained, tmp_path, lambda c: c)
    (folder / ".lock").mkdir()
    r = command(capsys, "train", "--dataset", data, "--out_dir", folder, "--max_iters", 4,
                "--resume", *RUN)  # fmt: skip
    refused(r, folder / ".lock", "is not a lock file")


def test_a_nan_checkpoint_is_never_named_the_last_good_one(trained, tmp_path, capsys, monkeypatch):
    data, _ = trained
    folder, _ = corrupt(
        trained, tmp_path, model_with(**{WQ: lambda t: torch.full_like(t, float("nan"))})
    )
    real = torch.optim.AdamW.step

    def diverge(self, *a, **k):  # the first update makes the weights infinite
        out = real(self, *a, **k)
        with torch.no_grad():
            for p in self.param_groups[0]["params"]:
                p.fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", diverge)
    r = command(capsys, "train", "--dataset", data, "--out_dir", folder, "--max_iters", 4,
                "--overwrite", *RUN[:-2], "--eval_interval", 100)  # fmt: skip
    err = refused(r, "stopping")
    assert "last good checkpoint" not in err, err


# ------------------------------------------------------------- the commands, as processes
@pytest.mark.slow
def test_the_commands_say_it_in_one_line_as_processes(trained, nonfinite, tmp_path):
    """The same refusals from `python -m nanorm.score`, `python eval_rm.py` and `python
    train_rm.py --resume` as child processes: one line on stderr, exit 2."""
    data, _ = trained
    nan_bin, _ = nonfinite["llama2.c .bin of NaN"]
    kind = corrupt(trained, tmp_path / "a", SCORED["kind a list"][0])[1]
    batch = corrupt(trained, tmp_path / "b", EVALUATED["train_config batch_size a string"][0])[1]
    folder, step = corrupt(trained, tmp_path / "c", RESUMED["step negative"][0])
    cases = [
        (["-m", "nanorm.score", "--ckpt", nan_bin, "--tokenizer", tok512(), "--response", "a"],
         nan_bin, "is not finite"),
        (["eval_rm.py", "--ckpt", nan_bin, "--tokenizer", tok512(), "--data", data, "--out",
          tmp_path / "e"], nan_bin, "is not finite"),
        (["-m", "nanorm.score", "--ckpt", kind, "--response", " 4"], kind, "kind"),
        (["eval_rm.py", "--ckpt", batch, "--data", data, "--out", tmp_path / "f"], batch,
         "train_config batch_size"),
        (["train_rm.py", "--dataset", data, "--out_dir", folder, "--max_iters", 4, "--resume",
          *RUN], step, "step"),
    ]  # fmt: skip
    for argv, path, words in cases:  # capped as child() caps: a slurped file fails, not the box
        p = python(argv, cap=8 * GB, timeout=900)
        rc, err = p.returncode, p.stderr
        assert rc == 2 and err.count("\n") == 1, (argv, err[-2000:])
        assert str(path) in err and words in err, (argv, err)
    assert not (tmp_path / "e" / "eval.json").exists()
