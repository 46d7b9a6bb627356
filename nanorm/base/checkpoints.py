"""
Reading checkpoints, below the heads: any LLaMA on disk -> model.py's Transformer, plus the
tensors beside it (a reward head, a length head, ...) as plain named tensors. It knows no model
class: reward.py's cls(pretrained=) and nanorm/ckpt.py build the models on what it returns.

    c = load(path)                  # a Checkpoint: c.backbone, c.heads, c.kind, c.head, c.record
    c = load(path, config=cfg, dtype=torch.bfloat16)   # cfg: the shape, when the file lacks one
    model = load_transformer(path)  # load(path).backbone, to generate with

Formats, recognised by their shape on disk, each file opened and read once:
    llama2.c .bin    run.c's legacy v0 file: a 7-int header, then every weight in float32
    llama2.c .pt     llama2.c train.py's checkpoint: {"model": state dict, "model_args": dict}
    Meta directory   params.json + consolidated.00.pth (Meta's original release, one shard)
    HF directory     config.json + *.safetensors or pytorch_model*.bin, sharded or not, of any
                     Llama class: LlamaForCausalLM, LlamaModel (names without "model."), and
                     LlamaForSequenceClassification, whose `score` becomes the reward head
    ColossalChat RM  its RewardModel's state dict: HF's "model.*" names plus value_head.weight
                     and .bias, the reward head. Its booster writes pytorch_model.bin.index.json
                     and shards without a config.json (the class is no transformers model): pass
                     config=, or copy the base model's config.json beside them. An unsharded
                     save is one torch file of the state dict, read with config= too.
    .gguf            llama.cpp's file, parsed by gguf_reader.py
    ckpt.pt          nanoRM's own (nanorm/ckpt.py writes it): kind, config, state dict, heads

Every tensor in a file goes somewhere: into the backbone, into heads, or into DROPPED, which
says why nothing reads it; any other is refused by name. A read takes memory in proportion to
what the file holds: each tensor's shape is checked against the bytes behind it (a torch file's
storages, safetensors' and GGUF's offsets, the .bin's size) before anything is computed from it,
and the sizes a config claims against the tensors present before anything is allocated. Then
every weight is checked to be a finite float, one tensor at a time, and every config value to be
in its domain (a RoPE base or an RMSNorm epsilon <= 0 makes the forward NaN): a backbone that
cannot give a finite reward is refused here, whatever its format. Torch files are read here
alone (weights_only=True, memory-mapped); a missing, truncated, foreign or hostile file is one
UsageError naming it and the field. Nothing is copied that need not be: the .bin is read once
and every weight is a view into it, HF tensors are converted one at a time. HF_NAMES, the one
table of HF's module names, serves export_hf.py's writing too.

Simplifications: Meta's sharded releases (consolidated.01.pth, ...) are refused, and so are HF
configs with biases or a head_dim that is not hidden_size / num_heads (not LLaMA as Meta wrote it).
"""

import json
import math
import os
import pickle
import re
import reprlib
import struct
import zipfile
from dataclasses import asdict, dataclass, field
from itertools import pairwise

import torch

from model import ModelConfig, Transformer, rope_frequencies
from nanorm.base.command import UsageError


@dataclass
class Checkpoint:
    """What a checkpoint file holds, read once."""

    path: str
    format: str  # "nanorm" (our ckpt.pt), "llama2c", "meta", "hf" (ColossalChat's too), "gguf"
    backbone: Transformer  # in eval mode
    heads: dict  # tensors beside the backbone, in nanoRM's names: "head.weight" (1, dim), ...
    head: str  # where heads["head.*"] come from: "trained" (a ckpt.pt), "value_head"
    # (ColossalChat's RewardModel), "score" (an HF classifier), or "random": none, a model
    # built on this backbone gets a new one
    kind: str | None = None  # the model class a ckpt.pt names; None: a foreign file
    record: dict = field(default_factory=dict)  # our ckpt.pt's whole dict (data_meta,
    # train_config, its calibration, ...); an HF export's config.json "nanorm_reward"; or {}


# tensors files hold that nothing here reads, and why (a name ending so is dropped)
DROPPED = {
    "rotary_emb.inv_freq": "RoPE frequencies, derived from the config (older HF files)",
    "rope.freqs": "Llama 2's RoPE table, derived from the config",
    "freqs_cos": "llama2.c's RoPE table, derived from the config",
    "freqs_sin": "llama2.c's RoPE table, derived from the config",
}


def load(path, config=None, dtype=None):
    """The Checkpoint of any file or directory above. config (a ModelConfig, a transformers
    LlamaConfig, or ModelConfig's keywords) replaces the file's own shape, as ColossalChat's
    from_pretrained(pretrained, config=config) does, and supplies it where the file has none.
    dtype (a torch dtype or its name): the backbone's; by default a file's own (an HF file's
    converted to float32); "auto" keeps every file's own. Anything wrong is one UsageError."""
    path = str(path)
    if not os.path.exists(path):
        hub = path.count("/") == 1 and not path.startswith((".", "/"))  # e.g. org/model
        hub = hub and not os.path.isdir(os.path.dirname(path))
        raise UsageError(
            f"{path} is not a local checkpoint, and nanoRM reads no hub: download it first "
            f"(huggingface-cli download {path} --local-dir DIR) and pass DIR"
            if hub
            else f"{path} not found"
        )
    dtype = _dtype(dtype)
    override = None if config is None else asdict(model_config(config))
    try:
        return _load(path, override, dtype)
    except UsageError:
        raise
    except (ValueError, OSError) as e:  # the readers' "truncated, shapes do not fit, missing"
        raise UsageError(str(e) if path in str(e) else f"{path}: {e}") from None


def load_transformer(path):
    """The LLaMA (in eval mode) of any checkpoint: a foreign one, or a ckpt.pt's backbone."""
    return load(path).backbone


def model_config(config):
    """A ModelConfig from a ModelConfig, its keywords, or a transformers LlamaConfig (read
    through its dict, so transformers need not be imported here)."""
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, dict):
        return ModelConfig(**config)
    if hasattr(config, "to_dict"):
        return ModelConfig(**_config_from_hf(config.to_dict()))
    raise TypeError(f"config must be a ModelConfig or a LlamaConfig, got {type(config).__name__}")


def _dtype(dtype):
    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise UsageError(f"torch_dtype {dtype!r} is not a floating-point torch dtype")
    return found


def _load(path, override, dtype):
    """Recognise path's format and read it once: -> Checkpoint."""
    kind, record = None, {}
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "params.json")):
        fmt, (config, sd, heads, head) = "meta", _read_meta(path)
    elif os.path.isdir(path):
        fmt, (config, sd, heads, head, record) = "hf", _read_hf(path, override)
    elif path.endswith(".gguf"):
        from nanorm.base.gguf_reader import load_gguf_checkpoint  # the GGUF format, for its file

        fmt, (config, sd), heads, head = "gguf", load_gguf_checkpoint(path), {}, "random"
    elif _is_torch_file(path):
        obj = _read_torch(path)
        if isinstance(obj, dict) and MODEL_KEYS <= obj.keys():
            fmt, (config, sd, heads, head), kind, record = "nanorm", _ours(obj), obj["kind"], obj
        elif isinstance(obj, dict) and {"model", "model_args"} <= obj.keys():
            fmt, (config, sd), heads, head = "llama2c", _llama2c_pt(obj), {}, "random"
        elif _is_state_dict(obj):  # ColossalChat's unsharded save, a pytorch_model.bin alone
            if override is None:
                raise UsageError(
                    f"{path} is a state dict without its model's shape: pass config= (the "
                    "LlamaConfig or ModelConfig it was trained with), or put it in a directory "
                    "with that model's config.json"
                )
            fmt, (sd, heads, head) = "hf", _from_hf_names(obj.items(), override, dtype, path)
            config = override
        else:
            found = list(obj) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(
                f"{path}: not a checkpoint nanoRM reads: a torch file needs kind/config/model "
                f"(train_rm.py's ckpt.pt) or model and model_args (llama2.c's), or is a state "
                f"dict of tensors read with config= (ColossalChat's), found {found}"
            )
    else:
        fmt, (config, sd), heads, head = "llama2c", _read_llama2c_bin(path), {}, "random"
    config = override or config
    if fmt == "hf" and not config.get("tie_embeddings") and "output.weight" not in sd:
        # a reward model's file (an HF classifier, ColossalChat's RM, a LlamaModel) has no LM
        # head: load it with a zero one, which reward heads never read
        _checked_config(config, sd, path)  # its sizes, before (vocab, dim) is allocated
        sd["output.weight"] = torch.zeros(config["vocab_size"], config["dim"])
    sd = _one_dtype(sd, heads, dtype, path)
    backbone = _build(config, sd, path)
    _check_finite({**sd, **heads}, path)  # the backbone's weights and the file's heads
    dim = backbone.config.dim
    for name, want in (("head.weight", (1, dim)), ("head.bias", (1,))):
        if head != "trained" and name in heads and tuple(heads[name].shape) != want:
            raise ValueError(f"{path}: its reward head {name} is {tuple(heads[name].shape)}")
    return Checkpoint(path, fmt, backbone, heads, head, kind, record)


def _is_state_dict(obj):
    return (
        isinstance(obj, dict)
        and bool(obj)
        and all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in obj.items())
    )


def _one_dtype(sd, heads, dtype, path):
    """sd in one floating-point dtype: dtype if given (not "auto"), else the token embeddings'
    (a file's own). A float16 or bfloat16 tensor in a float32 file is cast, as a load in that
    dtype would; an integer or boolean weight holds no real numbers and is refused by name."""
    for name, t in {**sd, **heads}.items():
        if not t.is_floating_point():
            raise ValueError(
                f"{path}: tensor {name} is {str(t.dtype).removeprefix('torch.')}, not floating "
                "point: a weight holds real numbers (a damaged or foreign file)"
            )
    if dtype is None or dtype == "auto":
        emb = sd.get("tok_embeddings.weight")
        dtype = emb.dtype if emb is not None else None
    if dtype is None:  # no embeddings: _build refuses the file, naming them
        return sd
    return {k: v if v.dtype == dtype else v.to(dtype) for k, v in sd.items()}


FINITE_SLICE = 1 << 24  # values checked at a time: 16 MB of flags, whatever the tensor's size


def finite(t):
    """Whether every value of the tensor t is finite, read a slice of rows at a time: the
    check allocates FINITE_SLICE flags at most, never a copy of a large tensor."""
    if t.numel() == 0:
        return True
    rows = t.reshape(1) if t.dim() == 0 else t
    step = max(1, FINITE_SLICE // max(1, rows[0].numel()))
    return all(bool(torch.isfinite(part).all()) for part in rows.split(step))


def _check_finite(tensors, path):
    """Refuse a NaN or an infinity in any of tensors ({name: float tensor}), one tensor at a
    time (finite). A weight shared by two names (tied embeddings) is read once."""
    seen = set()
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride())
        if key in seen or t.numel() == 0:
            continue
        seen.add(key)
        if not finite(t):
            raise ValueError(
                f"{path}: tensor {name} is not finite (it holds NaN or infinite values): a "
                "diverged run or a damaged file, not loaded; use the last checkpoint whose "
                "weights are finite, or convert the model again"
            )


# ----------------------------------------------------------------------------- torch files
def _is_torch_file(path):
    """Whether path starts as torch.save's zip archive does (a truncated one does too)."""
    with open(path, "rb") as f:
        return f.read(2) == b"PK"


def _read_torch(path):
    """torch.load(path, weights_only=True), memory-mapped on the CPU: the tensors are read
    where they are used. A damaged file is one UsageError."""
    if not zipfile.is_zipfile(path):  # the archive's directory is at its end: cut off
        raise UsageError(f"{path} is corrupt (truncated: its zip archive has no end)")
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except (RuntimeError, EOFError, OSError) as e:  # e.g. a truncated file: no central directory
        reason = str(e).split(". ")[0]  # torch's first sentence; the rest is advice
        raise UsageError(f"{path} is corrupt ({reason})") from None
    except pickle.UnpicklingError:
        raise UsageError(f"{path} holds more than tensors and plain data: not loaded") from None
    _check_bytes(obj, path)
    return obj


def _check_bytes(obj, path):
    """Every tensor in obj (nested in dicts, lists and tuples) against the bytes behind it,
    before anything is computed from it. torch.save writes a tensor as a shape, strides and an
    offset into a storage, so a file of a few KB can claim a (2,000,000, 2,048) tensor over one
    4-byte float with strides of 0, and a finiteness check or a cast then allocates gigabytes.
    A saved model's tensor holds each of its elements once: no stride 0 (an expanded view), no
    two elements at one place (overlapping strides), none past its storage's bytes. Two tensors
    may share bytes only as the same view (tied weights); torch.save writes nothing else."""
    spans, stack = [], [((), obj)]  # a walk with a stack: a deep nesting cannot recurse
    while stack:
        keys, x = stack.pop()
        if isinstance(x, (dict, list, tuple)):  # pushed last first: read in the file's order
            items = x.items() if isinstance(x, dict) else enumerate(x)
            stack.extend(reversed([((*keys, k), v) for k, v in items]))
        elif isinstance(x, torch.Tensor) and x.numel():
            name = ".".join(map(str, keys))
            stored = x.untyped_storage().nbytes()
            reach = 1  # elements from the first to the last, the inner dimensions' first
            for stride, n in sorted(
                (st, n) for st, n in zip(x.stride(), x.shape, strict=True) if n > 1
            ):
                if stride < reach:
                    raise UsageError(
                        f"{path}: tensor {name} claims shape {tuple(x.shape)} from {stored:,} "
                        f"bytes (strides {x.stride()}: its elements repeat, an expanded or "
                        "overlapping view): not a saved model's tensor, which holds every "
                        "element (save it again from .contiguous() tensors)"
                    )
                reach += stride * (n - 1)
            start = x.storage_offset() * x.element_size()
            end = start + reach * x.element_size()
            if end > stored:
                raise UsageError(
                    f"{path}: tensor {name} claims {end:,} bytes of a storage of {stored:,}"
                )
            at = x.untyped_storage().data_ptr()  # where its storage lies in the mapped file
            spans.append((at + start, at + end, (x.dtype, x.shape, x.stride()), name))
    spans.sort(key=lambda s: s[:2])
    for (a, a_end, a_view, a_name), (b, _, b_view, b_name) in pairwise(spans):
        if b < a_end and (a, a_view) != (b, b_view):
            raise UsageError(
                f"{path}: tensors {a_name} and {b_name} share bytes of the file: a saved "
                "model's tensors are each their own, or the same tied tensor (save it again "
                "from .clone()s)"
            )


# ----------------------------------------------------------------------------- the model
SIZES = ("dim", "n_layers", "n_heads", "vocab_size")  # what every file states or implies


def _build(config, sd, source):
    """A Transformer of config (ModelConfig keyword arguments) holding sd's tensors (Meta's
    names), checked against it; source names the file in errors. What a file claims is
    checked before anything is built (sizes, then the embeddings and the layers present), so a
    few-KB file claiming a billion layers is refused, not allocated. Built on the meta device,
    then adopts the tensors (assign=True): no second copy. A stray key is an error naming it."""
    cfg = _checked_config(config, sd, source)
    with torch.device("meta"):
        model = Transformer(cfg)
    if cfg.tie_embeddings:
        sd = {k: v for k, v in sd.items() if k != "output.weight"}
    expected = set(model.state_dict().keys()) - ({"output.weight"} if cfg.tie_embeddings else set())
    missing, unexpected = sorted(expected - sd.keys()), sorted(sd.keys() - expected)
    if missing or unexpected:
        raise ValueError(
            f"{source}: checkpoint does not match the config: missing keys "
            f"{missing[:5]}, unexpected keys {unexpected[:5]}"
        )
    for k, t in model.state_dict().items():
        if k in sd and tuple(sd[k].shape) != tuple(t.shape):
            raise ValueError(
                f"{source}: {k} has shape {tuple(sd[k].shape)}, the config expects {tuple(t.shape)}"
            )
    model.load_state_dict(sd, strict=False, assign=True)
    if cfg.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    model.inv_freq = rope_frequencies(cfg)  # buffers on meta are empty: compute them
    return model.eval()


def _checked_config(config, sd, source):
    """ModelConfig(**config) once its sizes are positive integers that fit each other and the
    tensors in sd: the token embeddings (vocab_size, dim) and n_layers layers present."""
    if not isinstance(config, dict):
        raise ValueError(f"{source}: its config is a {type(config).__name__}, not a dict")
    for key in (*SIZES, "n_kv_heads", "hidden_dim", "max_seq_len"):
        value = config.get(key)
        if value is None and key not in SIZES:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{source}: {key} must be a positive integer, got {value!r}")
    dim, n_heads = config["dim"], config["n_heads"]
    n_kv_heads = config.get("n_kv_heads") or n_heads
    if dim % n_heads or n_heads % n_kv_heads:
        raise ValueError(
            f"{source}: dim {dim}, n_heads {n_heads}, n_kv_heads {n_kv_heads} do not fit"
        )
    emb = sd.get("tok_embeddings.weight")
    want = (config["vocab_size"], dim)
    if emb is None or tuple(emb.shape) != want:
        found = "none" if emb is None else tuple(emb.shape)
        raise ValueError(f"{source}: token embeddings {found}, the config claims {want}")
    layers = {k.split(".")[1] for k in sd if k.startswith("layers.")}
    if len(layers) != config["n_layers"]:
        raise ValueError(
            f"{source}: the config claims {config['n_layers']} layers, the file holds {len(layers)}"
        )
    _check_domains(config, source)
    try:
        cfg = ModelConfig(**config)
    except (TypeError, AssertionError) as e:
        raise ValueError(f"{source}: not a LLaMA config ({e})") from None
    try:
        inv_freq = rope_frequencies(cfg)
    except (KeyError, TypeError, ZeroDivisionError) as e:  # a llama3 rope_scaling cut short
        raise ValueError(
            f"{source}: rope_scaling {cfg.rope_scaling!r} is not Llama 3's ({e})"
        ) from None
    # the angles RoPE turns by, up to the last position: finite, or every attention is NaN
    if not torch.isfinite(inv_freq * cfg.max_seq_len).all() or not (inv_freq > 0).all():
        raise ValueError(
            f"{source}: rope_theta {cfg.rope_theta!r} and rope_scaling {cfg.rope_scaling!r} give "
            "RoPE frequencies that are not finite and positive"
        )
    return cfg


# the values of a config that are real numbers, and the domain the forward needs them in:
# an RMSNorm epsilon <= 0 divides by zero or takes the root of a negative number, a RoPE base
# <= 0 raises a negative number to fractional powers; each makes every reward NaN
DOMAINS = {
    "norm_eps": (lambda v: v > 0, "a number > 0"),
    "rope_theta": (lambda v: v > 0, "a number > 0"),
    "ffn_dim_multiplier": (lambda v: v > 0, "a number > 0, or none"),
    "dropout": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
}
ROPE_LLAMA3 = {  # Llama 3.1's rope_scaling: each a positive number
    "factor": float,
    "low_freq_factor": float,
    "high_freq_factor": float,
    "original_max_position_embeddings": int,
}


def _check_domains(config, source):
    """The config's values other than the sizes, each of its type and in its domain (DOMAINS,
    multiple_of, tie_embeddings, rope_scaling), named when it is not."""

    def real(value):
        return type(value) in (int, float) and math.isfinite(value)

    for key, (ok, want) in DOMAINS.items():
        value = config.get(key)
        if key not in config or (value is None and key == "ffn_dim_multiplier"):
            continue  # ModelConfig's default
        if not (real(value) and ok(value)):
            raise ValueError(f"{source}: {key} is {value!r}; it must be {want}")
    value = config.get("multiple_of", 1)
    if type(value) is not int or value <= 0:
        raise ValueError(f"{source}: multiple_of must be a positive integer, got {value!r}")
    if type(config.get("tie_embeddings", False)) is not bool:
        raise ValueError(f"{source}: tie_embeddings is {config['tie_embeddings']!r}, not a bool")
    rs = config.get("rope_scaling")
    if rs is not None and not isinstance(rs, dict):
        raise ValueError(f"{source}: rope_scaling is a {type(rs).__name__}, not a dict")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        for key, kind in ROPE_LLAMA3.items():
            value = rs.get(key)
            if not (real(value) and value > 0 and (kind is float or type(value) is int)):
                raise ValueError(f"{source}: rope_scaling {key} is {value!r}; it must be > 0")


def _drop(sd):
    """sd without the tensors DROPPED names (nothing reads them)."""
    return {k: v for k, v in sd.items() if not k.endswith(tuple(DROPPED))}


# ----------------------------------------------------------------------------- llama2.c
# llama2.c's ModelArgs: the model_args a train.py checkpoint saves (all are ModelConfig fields)
LLAMA2C_ARGS = (
    "dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "vocab_size",
    "hidden_dim",
    "multiple_of",
    "norm_eps",
    "max_seq_len",
    "dropout",
)


def _llama2c_pt(ckpt):
    """llama2.c train.py's checkpoint, which always ties the output to the embeddings."""
    if not isinstance(ckpt["model_args"], dict):
        raise ValueError(f"its model_args is a {type(ckpt['model_args']).__name__}, not a dict")
    if not _is_state_dict(ckpt["model"]):
        raise ValueError("its model is not a state dict (names -> tensors)")
    config = {k: v for k, v in ckpt["model_args"].items() if k in LLAMA2C_ARGS}
    sd = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}  # torch.compile
    return config | {"tie_embeddings": True}, _drop(sd)


def _read_llama2c_bin(path):
    """run.c's legacy v0 .bin: tied output, unless its vocab_size is negative."""
    size = os.path.getsize(path)
    if size < 28:
        raise ValueError(f"{path}: {size} bytes is too short for the 28-byte llama2.c header")
    with open(path, "rb") as f:
        header = struct.unpack("7i", f.read(28))
    dim, hidden, L, n_heads, n_kv, vocab, seq_len = header
    if min(dim, hidden, L, n_heads, n_kv, seq_len) <= 0 or vocab == 0 or dim % n_heads:
        raise ValueError(f"{path}: its header {header} is not a llama2.c model's (sizes > 0)")
    shared = vocab > 0  # a negative vocab_size means an untied classifier follows
    V, head_dim = abs(vocab), dim // n_heads
    kv_dim = n_kv * head_dim
    shapes = [  # the order run.c reads them in; each stacks all L layers
        ("tok_embeddings", (V, dim)),
        ("attention_norm", (L, dim)),
        ("wq", (L, dim, dim)),
        ("wk", (L, kv_dim, dim)),
        ("wv", (L, kv_dim, dim)),
        ("wo", (L, dim, dim)),
        ("ffn_norm", (L, dim)),
        ("w1", (L, hidden, dim)),
        ("w2", (L, dim, hidden)),
        ("w3", (L, hidden, dim)),
        ("norm", (dim,)),
        ("freq_cis_real", (seq_len, head_dim // 2)),  # RoPE tables, unused: we derive them
        ("freq_cis_imag", (seq_len, head_dim // 2)),
    ]
    if not shared:
        shapes.append(("output", (V, dim)))
    n_floats = sum(math.prod(s) for _, s in shapes)
    if size != 28 + 4 * n_floats:
        raise ValueError(
            f"{path}: {size} bytes, but its header {header} "
            f"implies {28 + 4 * n_floats} bytes (truncated or not a llama2.c v0 file)"
        )
    data = torch.from_file(path, shared=False, size=size // 4, dtype=torch.float32)[7:]
    w, off = {}, 0
    for name, shape in shapes:  # one read of the file; every weight is a view into it
        n = math.prod(shape)
        w[name], off = data[off : off + n].view(shape), off + n
    sd = {"tok_embeddings.weight": w["tok_embeddings"], "norm.weight": w["norm"]}
    if not shared:
        sd["output.weight"] = w["output"]
    for i in range(L):
        for name in ("wq", "wk", "wv", "wo"):
            sd[f"layers.{i}.attention.{name}.weight"] = w[name][i]
        for name in ("w1", "w2", "w3"):
            sd[f"layers.{i}.feed_forward.{name}.weight"] = w[name][i]
        sd[f"layers.{i}.attention_norm.weight"] = w["attention_norm"][i]
        sd[f"layers.{i}.ffn_norm.weight"] = w["ffn_norm"][i]
    config = dict(
        dim=dim,
        n_layers=L,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        vocab_size=V,
        hidden_dim=hidden,
        max_seq_len=seq_len,
        tie_embeddings=shared,
    )
    return config, sd


# ----------------------------------------------------------------------------- Meta
def _read_meta(directory, max_seq_len=2048):
    """Meta's original release: params.json + consolidated.00.pth (one shard). params.json does
    not say the context length, so it is Meta's 2048."""
    params_path = os.path.join(directory, "params.json")
    params = _read_json(params_path)
    if not isinstance(params, dict):
        raise ValueError(f"{params_path}: a JSON {type(params).__name__}, not a params object")
    missing = [k for k in ("dim", "n_layers", "n_heads") if k not in params]
    if missing:
        raise ValueError(f"{params_path}: no {missing[0]!r}, which Meta's params.json has")
    ckpt_path = os.path.join(directory, "consolidated.00.pth")
    if not os.path.exists(ckpt_path):
        raise FileNotFoundError(
            f"{ckpt_path} not found (only single-shard checkpoints are supported)"
        )
    sd = _read_torch(ckpt_path)
    if not _is_state_dict(sd):
        raise ValueError(f"{ckpt_path}: not a state dict (names -> tensors)")
    sd = _drop(sd)
    rope_scaling = None
    if params.get("use_scaled_rope"):  # Llama 3.1's published scaling constants
        rope_scaling = {
            "rope_type": "llama3",
            "factor": params.get("rope_scaling_factor", 8.0),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    emb = sd.get("tok_embeddings.weight")
    config = dict(
        dim=params["dim"],
        n_layers=params["n_layers"],
        n_heads=params["n_heads"],
        n_kv_heads=params.get("n_kv_heads"),
        vocab_size=params.get("vocab_size", -1) if emb is None else emb.shape[0],  # Llama 2: -1
        multiple_of=params.get("multiple_of", 256),  # the FFN width is derived, not stored
        ffn_dim_multiplier=params.get("ffn_dim_multiplier"),
        norm_eps=params.get("norm_eps", 1e-5),
        rope_theta=params.get("rope_theta", 1e4),
        rope_scaling=rope_scaling,
        max_seq_len=max_seq_len,
        tie_embeddings="output.weight" not in sd,
    )
    return config, sd, {}, "random"


def _read_json(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None


# ----------------------------------------------------------------------------- Hugging Face
def _read_hf(directory, override):
    """A local Hugging Face directory (or ColossalChat's booster output): config.json (or the
    override) + safetensors or pytorch_model*.bin. -> (config, sd, heads, head, record)."""
    path = os.path.join(directory, "config.json")
    record = {}
    if os.path.exists(path):
        hf = _read_json(path)
        if not isinstance(hf, dict):
            raise ValueError(f"{path}: a JSON {type(hf).__name__}, not a config object")
        record = hf.get("nanorm_reward") or {}  # an export's calibration (nanorm/export_hf.py)
        if not isinstance(record, dict):
            raise ValueError(f"{path}: nanorm_reward is a {type(record).__name__}, not an object")
        if override is None:
            try:
                override = _config_from_hf(hf)
            except KeyError as e:
                raise ValueError(f"{path}: no {e.args[0]!r}, which a LLaMA config has") from None
            except (TypeError, ZeroDivisionError):
                raise ValueError(
                    f"{path}: hidden_size and num_attention_heads must be positive integers"
                ) from None
    elif override is None:
        raise FileNotFoundError(
            f"{directory}: neither params.json (Meta) nor config.json (Hugging Face) in this "
            "directory (ColossalChat's booster writes none: pass config=, or copy the base "
            "model's config.json here)"
        )
    sd, heads, head = _from_hf_names(_iter_hf_tensors(directory), override, None, directory)
    return override, sd, heads, head, record


# a head beside HF's module names -> nanoRM's name, and where the head comes from
HF_HEADS = {
    "score.weight": ("head.weight", "score"),  # LlamaForSequenceClassification (no bias)
    "value_head.weight": ("head.weight", "value_head"),  # ColossalChat's RewardModel, Critic
    "value_head.bias": ("head.bias", "value_head"),
}


def _from_hf_names(named, config, dtype, source):
    """(sd in Meta's names, heads, head's origin) of (HF name, tensor) pairs: wq and wk
    un-permuted, converted to float32 unless dtype says otherwise, one tensor at a time."""
    n_heads = config["n_heads"]
    n_kv_heads = config.get("n_kv_heads") or n_heads
    head_dim = config["dim"] // n_heads
    sd, heads, head = {}, {}, "random"
    for name, tensor in named:
        if name.endswith(tuple(DROPPED)):
            continue
        if not tensor.is_floating_point():  # before .float() would hide it
            raise ValueError(
                f"{source}: tensor {name} is {str(tensor.dtype).removeprefix('torch.')}, not "
                "floating point: a weight holds real numbers (a damaged or foreign file)"
            )
        if name in HF_HEADS:
            key, head = HF_HEADS[name]
            heads[key] = tensor.float()
            continue
        key = _hf_to_meta_name(name)
        if key is None:
            raise ValueError(f"{source}: tensor {name} has no place in a LLaMA: nothing reads it")
        if dtype is None:
            tensor = tensor.float()
        # HF's conversion script permuted the rows of wq and wk so that its rotate-half RoPE
        # (pairs i and i + d/2) equals Meta's interleaved RoPE (pairs 2i and 2i+1). Undo it:
        # per head, rows [first half | second half] go back to interleaved order.
        if key.endswith("attention.wq.weight"):
            tensor = _unpermute(tensor, n_heads, head_dim)
        elif key.endswith("attention.wk.weight"):
            tensor = _unpermute(tensor, n_kv_heads, head_dim)
        sd[key] = tensor
    return sd, heads, head


def _config_from_hf(hf):
    """ModelConfig kwargs from a Hugging Face LlamaConfig dict (transformers 4.x or 5.x keys)."""
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError("config.json: attention_bias / mlp_bias are not LLaMA; not supported")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})  # 5.x nests theta here
    theta = hf.get("rope_theta", rope.pop("rope_theta", 10000.0))
    dim, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim", dim // n_heads) != dim // n_heads:
        raise ValueError(f"config.json: head_dim {hf['head_dim']} != hidden_size / num_heads")
    return dict(
        dim=dim,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        vocab_size=hf["vocab_size"],
        hidden_dim=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=rope or None,
        max_seq_len=hf.get("max_position_embeddings", 2048),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def _iter_hf_tensors(directory):
    """Yield (name, tensor) one at a time from every weight file, so a conversion (dtype, the
    wq/wk permutation) never holds a second copy of the whole model."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if files:
        try:
            from safetensors import safe_open
        except ImportError:
            raise ImportError(
                "loading .safetensors needs the safetensors package: pip install safetensors"
            ) from None
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index):  # sharded: the index names the shards, in this directory
            shards = _read_json(index)
            shards = shards.get("weight_map") if isinstance(shards, dict) else None
            names = list(shards.values()) if isinstance(shards, dict) else [None]
            bad = [f for f in names if not plain_file_name(f)]
            if bad:
                raise ValueError(
                    f"{index}: its weight_map must map names to files in {directory}, found "
                    f"{bad[0]!r}"
                )
            files = sorted(set(names))
        for fname in files:
            path = os.path.join(directory, fname)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} is named in the index but missing")
            try:
                with safe_open(path, framework="pt") as f:
                    for name in f.keys():
                        yield name, f.get_tensor(name)
            except Exception as e:  # safetensors raises its own error types for bad headers
                if isinstance(e, (FileNotFoundError, ImportError)):
                    raise
                raise ValueError(f"{path}: unreadable safetensors file ({e})") from None
        return
    files = sorted(
        f for f in os.listdir(directory) if f.startswith("pytorch_model") and f.endswith(".bin")
    )
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors or pytorch_model*.bin weights")
    for fname in files:  # one file or ColossalChat's / HF's shards (pytorch_model-00001.bin)
        path = os.path.join(directory, fname)
        sd = _read_torch(path)  # corrupt: one line naming it
        if not _is_state_dict(sd):
            raise ValueError(f"{path}: not a state dict (names -> tensors)")
        yield from sd.items()


def plain_file_name(name):
    """Whether name is a file's name alone: no folder, no way out of the one it is read in."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and os.path.basename(name) == name
        and "\0" not in name
        and not (os.path.altsep and os.path.altsep in name)
    )


# nanoRM's (Meta's) module names in a layer -> Hugging Face's; export_hf.py writes with it
HF_NAMES = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_FROM_HF = {hf: meta for meta, hf in HF_NAMES.items()}


def _hf_to_meta_name(name):
    """model.layers.3.self_attn.q_proj.weight (or, saved from a LlamaModel, without "model.")
    -> layers.3.attention.wq.weight; None: not a LLaMA's."""
    if name == "lm_head.weight":
        return "output.weight"
    name = name.removeprefix("model.")
    if name == "embed_tokens.weight":
        return "tok_embeddings.weight"
    if name == "norm.weight":
        return "norm.weight"
    if name.startswith("layers.") and name.count(".") >= 3:
        i, rest = name.removeprefix("layers.").split(".", 1)
        module, suffix = rest.rsplit(".", 1)
        if module in _FROM_HF and i.isdigit() and suffix == "weight":  # LLaMA has no biases
            return f"layers.{i}.{_FROM_HF[module]}.{suffix}"
    return None


def _unpermute(w, n_heads, head_dim):
    # (n_heads * head_dim, dim): per head, rows are [x_0, x_2, ..., x_1, x_3, ...] in HF;
    # view as (heads, 2, head_dim/2) and swap the last two axes to interleave again
    return w.view(n_heads, 2, head_dim // 2, -1).transpose(1, 2).reshape(n_heads * head_dim, -1)


# ----------------------------------------------------------------------------- ours
# nanoRM's own ckpt.pt (nanorm/ckpt.py writes it): "backbone.*" is the Transformer, every other
# tensor a head, handed over by name; the model class says which it reads
MODEL_KEYS = {"kind", "config", "model"}
HEAD_NAME = re.compile(r"^(value_|reward_)?head\.")  # a scoring head, under its older names too


def _ours(ckpt):
    """(config, the backbone's state dict in Meta's names, heads, "trained") of a ckpt.pt: the
    one place the "backbone." prefix comes off and older head names are renamed."""
    sd, kind = ckpt["model"], ckpt["kind"]
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ValueError(f"its kind is {reprlib.repr(kind)}, not the name of a model class")
    if not isinstance(sd, dict):
        raise ValueError(f"its model is a {type(sd).__name__}, not a state dict")
    for k, v in sd.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise ValueError(
                f"its model holds {reprlib.repr(k)}: {type(v).__name__}; a state dict maps "
                "names (str) to tensors"
            )
    backbone = {k[len("backbone.") :]: v for k, v in sd.items() if k.startswith("backbone.")}
    heads = {HEAD_NAME.sub("head.", k): v for k, v in sd.items() if not k.startswith("backbone.")}
    return ckpt["config"], backbone, heads, "trained" if heads else "random"
