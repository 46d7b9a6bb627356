"""
Reading checkpoints, the one home of it: any LLaMA on disk -> model.py's Transformer, and the
parts a model with heads is built from (nanorm/ckpt.py's load_reward_model builds the class a
ckpt.pt names on them).

    model = load_transformer(path)         # the LLaMA of any file below (a ckpt.pt's backbone too)
    rm = RewardModel(pretrained=path)      # cls(pretrained=): pretrained_parts, below
    config, sd = read_checkpoint(path)     # a foreign file's parts, before a model is built
    ckpt = load_checkpoint(path)           # our ckpt.pt's dict

Formats, recognised by their shape on disk:
    llama2.c .bin    run.c's legacy v0 file: a 7-int header, then every weight in float32
    llama2.c .pt     llama2.c train.py's checkpoint: {"model": state dict, "model_args": dict}
    Meta directory   params.json + consolidated.00.pth (Meta's original release, one shard)
    HF directory     config.json + *.safetensors or pytorch_model*.bin (LlamaForCausalLM, or
                     LlamaForSequenceClassification: its head comes back as "score.weight")
    .gguf            llama.cpp's file, read by gguf_reader.py
    ckpt.pt          nanoRM's own (nanorm/ckpt.py writes it): kind, config, state dict, heads

Its last section reads our ckpt.pt and builds the models with heads. Torch files are read here
alone (load_torch: weights_only=True, a missing or corrupt file one line).

A reader knows nothing of model.py: it renames, un-permutes and converts tensors, and the model
builder (transformer_from_state_dict) checks that names and shapes fit the config. Nothing is
copied that need not be: the .bin is read once and every weight is a view into it, .pt/.pth files
are memory-mapped, and HF tensors are converted one at a time. HF_NAMES, the one table of HF's
module names, serves export_hf.py's writing too.

Simplifications: Meta's sharded releases (consolidated.01.pth, ...) are refused, and so are HF
configs with biases or a head_dim that is not hidden_size / num_heads (not LLaMA as Meta wrote it).
"""

import json
import math
import os
import pickle
import re
import struct
import zipfile
from functools import lru_cache

import torch

from data import UsageError
from model import ModelConfig, Transformer, rope_frequencies


def is_torch_file(path):
    """Whether path starts as torch.save's zip archive does (a truncated one does too)."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(2) == b"PK"


def load_torch(path, **kwargs):
    """torch.load(path, weights_only=True), a missing or unreadable file as one UsageError. A
    file mapped on the CPU (map_location="cpu", mmap=True: every reader here) is loaded once
    while it stays the same file: recognising it and reading it are one torch.load."""
    if kwargs == dict(map_location="cpu", mmap=True) and os.path.isfile(path):
        st = os.stat(path)
        return _load_mapped(str(path), (st.st_ino, st.st_size, st.st_mtime_ns))
    return _load_torch(path, **kwargs)


@lru_cache(maxsize=2)
def _load_mapped(path, identity):
    return _load_torch(path, map_location="cpu", mmap=True)


def _load_torch(path, **kwargs):
    if not os.path.isfile(path):
        raise UsageError(f"{path} not found")
    if not is_torch_file(path):
        raise UsageError(f"{path} is corrupt (not a zip archive, which torch.save writes)")
    if not zipfile.is_zipfile(path):  # the archive's directory is at its end: cut off
        raise UsageError(f"{path} is corrupt (truncated: its zip archive has no end)")
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except (RuntimeError, EOFError, OSError) as e:  # e.g. a truncated file: no central directory
        reason = str(e).split(". ")[0]  # torch's first sentence; the rest is advice
        raise UsageError(f"{path} is corrupt ({reason})") from None
    except pickle.UnpicklingError:
        raise UsageError(f"{path} holds more than tensors and plain data: not loaded") from None


SIZES = ("dim", "n_layers", "n_heads", "vocab_size")  # what every file states or implies


def transformer_from_state_dict(config, sd, source):
    """A Transformer of config (ModelConfig keyword arguments) holding sd's tensors (Meta's
    names), checked against it; source names the file in errors. What a file claims is
    checked before anything is built (sizes, then the embeddings and the layers present), so a
    few-KB file claiming a billion layers is refused, not allocated. Built on the meta device,
    then adopts the tensors (assign=True): no second copy. An HF classifier's "score.weight" is
    left to the caller (reward.py makes it the reward head); any other stray key is an error."""
    cfg = checked_config(config, sd, source)
    with torch.device("meta"):
        model = Transformer(cfg)
    sd = {k: v for k, v in sd.items() if k != "score.weight"}
    if cfg.tie_embeddings:
        sd.pop("output.weight", None)
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


def checked_config(config, sd, source):
    """ModelConfig(**config) once its sizes are positive integers that fit each other and the
    tensors in sd: the token embeddings (vocab_size, dim) and n_layers layers present (sd None:
    the sizes alone)."""
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
    if sd is None:  # the sizes alone, before any tensor is read
        return ModelConfig(**config)
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
    try:
        return ModelConfig(**config)
    except (TypeError, AssertionError) as e:
        raise ValueError(f"{source}: not a LLaMA config ({e})") from None


def read_checkpoint(path):
    """(config kwargs, state dict) of any checkpoint above, whichever format it is."""
    path = str(path)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "params.json")):
            return read_meta(path)
        if os.path.exists(os.path.join(path, "config.json")):
            return read_hf(path)
        raise FileNotFoundError(
            f"{path}: neither params.json (Meta) nor config.json (Hugging Face) in this directory"
        )
    if path.endswith(".gguf"):
        from nanorm.gguf_reader import load_gguf_checkpoint  # the GGUF format, for its file

        return load_gguf_checkpoint(path)
    return read_llama2c(path)


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


def read_llama2c(path):
    """llama2.c checkpoints: the legacy v0 `.bin` (run.c's format) or train.py's `.pt`.
    llama2.c always ties the output to the embeddings, except a .bin with a negative vocab."""
    path = str(path)
    if path.endswith(".pt"):
        ckpt = load_torch(path, map_location="cpu", mmap=True)  # damaged: one line naming it
        if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
            found = list(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
            raise ValueError(
                f"{path}: not a checkpoint nanoRM reads: a torch file needs kind/config/model "
                f"(train_rm.py's ckpt.pt) or model and model_args (llama2.c's), found {found}"
            )
        config = {k: v for k, v in ckpt["model_args"].items() if k in LLAMA2C_ARGS}
        sd = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}  # torch.compile
        sd = {k: v for k, v in sd.items() if k not in ("freqs_cos", "freqs_sin")}  # we derive them
        return config | {"tie_embeddings": True}, sd
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
def read_meta(directory, max_seq_len=2048):
    """Meta's original release: params.json + consolidated.00.pth (one shard). params.json does
    not say the context length, so max_seq_len is the caller's."""
    params = _read_json(os.path.join(directory, "params.json"))
    ckpt_path = os.path.join(directory, "consolidated.00.pth")
    if not os.path.exists(ckpt_path):
        raise FileNotFoundError(
            f"{ckpt_path} not found (only single-shard checkpoints are supported)"
        )
    sd = load_torch(ckpt_path, map_location="cpu", mmap=True)
    sd.pop("rope.freqs", None)  # Llama 2 ships a precomputed table; we derive it
    rope_scaling = None
    if params.get("use_scaled_rope"):  # Llama 3.1's published scaling constants
        rope_scaling = {
            "rope_type": "llama3",
            "factor": params.get("rope_scaling_factor", 8.0),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    config = dict(
        dim=params["dim"],
        n_layers=params["n_layers"],
        n_heads=params["n_heads"],
        n_kv_heads=params.get("n_kv_heads"),
        vocab_size=sd["tok_embeddings.weight"].shape[0],  # params says -1 in Llama 2
        multiple_of=params.get("multiple_of", 256),  # the FFN width is derived, not stored
        ffn_dim_multiplier=params.get("ffn_dim_multiplier"),
        norm_eps=params.get("norm_eps", 1e-5),
        rope_theta=params.get("rope_theta", 1e4),
        rope_scaling=rope_scaling,
        max_seq_len=max_seq_len,
        tie_embeddings="output.weight" not in sd,
    )
    return config, sd


def _read_json(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None


# ----------------------------------------------------------------------------- Hugging Face
def read_hf(directory, dtype=torch.float32):
    """A local Hugging Face Llama directory: config.json + safetensors or pytorch_model*.bin.
    A LlamaForSequenceClassification's head comes back as sd["score.weight"] (1, dim), for a
    reward model to adopt; the model builder ignores it."""
    path = os.path.join(directory, "config.json")
    hf = _read_json(path)
    if not isinstance(hf, dict):
        raise ValueError(f"{path}: a JSON {type(hf).__name__}, not a config object")
    try:
        config = config_from_hf(hf)
    except KeyError as e:
        raise ValueError(f"{path}: no {e.args[0]!r}, which a LLaMA config has") from None
    except (TypeError, ZeroDivisionError):
        raise ValueError(
            f"{path}: hidden_size and num_attention_heads must be positive integers"
        ) from None
    n_heads, n_kv_heads = config["n_heads"], config["n_kv_heads"]
    head_dim = config["dim"] // n_heads
    sd = {}
    for name, tensor in _iter_hf_tensors(directory):
        key = "score.weight" if name == "score.weight" else _hf_to_meta_name(name)
        if key is None:  # e.g. rotary_emb.inv_freq in old checkpoints
            continue
        tensor = tensor.to(dtype)
        # HF's conversion script permuted the rows of wq and wk so that its rotate-half RoPE
        # (pairs i and i + d/2) equals Meta's interleaved RoPE (pairs 2i and 2i+1). Undo it:
        # per head, rows [first half | second half] go back to interleaved order.
        if key.endswith("attention.wq.weight"):
            tensor = _unpermute(tensor, n_heads, head_dim)
        elif key.endswith("attention.wk.weight"):
            tensor = _unpermute(tensor, n_kv_heads, head_dim)
        sd[key] = tensor
    if "score.weight" in sd and not config["tie_embeddings"] and "output.weight" not in sd:
        # a *ForSequenceClassification checkpoint has a score head and no lm_head: load its
        # backbone with a zero LM head, which reward heads never read
        checked_config(config, sd, directory)  # its sizes, before (vocab, dim) is allocated
        sd["output.weight"] = torch.zeros(config["vocab_size"], config["dim"], dtype=dtype)
    return config, sd


def config_from_hf(hf):
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
        n_kv_heads=hf.get("num_key_value_heads", n_heads),
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
        if os.path.exists(index):  # sharded: the index names the shards
            files = sorted(set(_read_json(index)["weight_map"].values()))
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
    for fname in files:
        path = os.path.join(directory, fname)
        sd = load_torch(path, map_location="cpu", mmap=True)  # corrupt: one line naming it
        if not isinstance(sd, dict) or not all(isinstance(t, torch.Tensor) for t in sd.values()):
            raise ValueError(f"{path}: not a state dict (names -> tensors)")
        yield from sd.items()


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
    """model.layers.3.self_attn.q_proj.weight -> layers.3.attention.wq.weight; None: not ours."""
    if name == "model.embed_tokens.weight":
        return "tok_embeddings.weight"
    if name == "model.norm.weight":
        return "norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    if name.startswith("model.layers.") and "rotary_emb" not in name:
        i, rest = name.removeprefix("model.layers.").split(".", 1)
        module, suffix = rest.rsplit(".", 1)
        if module in _FROM_HF:
            return f"layers.{i}.{_FROM_HF[module]}.{suffix}"
    return None


def _unpermute(w, n_heads, head_dim):
    # (n_heads * head_dim, dim): per head, rows are [x_0, x_2, ..., x_1, x_3, ...] in HF;
    # view as (heads, 2, head_dim/2) and swap the last two axes to interleave again
    return w.view(n_heads, 2, head_dim // 2, -1).transpose(1, 2).reshape(n_heads * head_dim, -1)


# ----------------------------------------------------------------------------- ours
# nanoRM's own ckpt.pt, read (nanorm/ckpt.py writes it), and the parts a model with heads is
# built from, whatever the file: what cls(pretrained=path) reads. The model classes are passed
# in, never imported: reward.py reaches this file when it reads one.
MODEL_KEYS = {"kind", "config", "model"}
HEAD_NAME = re.compile(r"^(value_|reward_)?head\.")  # a scoring head, under its older names too


def is_ours(path):
    """Whether path is a checkpoint this module wrote (a llama2.c .pt is a torch file too)."""
    if not is_torch_file(path):
        return False
    try:
        ckpt = load_torch(path, map_location="cpu", mmap=True)
    except UsageError:
        return True  # a damaged zip archive: load_checkpoint says how it is damaged
    return isinstance(ckpt, dict) and MODEL_KEYS <= ckpt.keys()


def load_checkpoint(path, map_location="cpu"):
    """The checkpoint's dict. A missing, truncated or corrupt file, or a torch file that is not
    ours, is one UsageError naming the file."""
    ckpt = load_torch(path, map_location=map_location, mmap=True)  # missing, corrupt: one line
    if not isinstance(ckpt, dict) or not MODEL_KEYS <= ckpt.keys():
        found = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise UsageError(
            f"{path} is not a nanoRM checkpoint (it needs kind/config/model, has {found}): "
            "give a ckpt.pt that train_rm.py wrote, or a backbone (.bin, .gguf, HF dir)"
        )
    return ckpt


def split_heads(sd):
    """(the backbone's state dict in Meta's names, the heads' {name: tensor}) of a ckpt.pt's
    model: the one place the "backbone." prefix comes off and older head names are renamed."""
    backbone = {k[len("backbone.") :]: v for k, v in sd.items() if k.startswith("backbone.")}
    heads = {HEAD_NAME.sub("head.", k): v for k, v in sd.items() if not k.startswith("backbone.")}
    return backbone, heads


def load_transformer(path):
    """The LLaMA (in eval mode) of any checkpoint: a foreign one above, or a ckpt.pt's backbone
    (a reward model's, to generate with or to start from)."""
    if is_ours(path):
        ckpt = load_checkpoint(path)
        backbone, _ = split_heads(ckpt["model"])
        return transformer_from_state_dict(ckpt["config"], backbone, path)
    config, sd = read_checkpoint(path)
    sd.pop("score.weight", None)
    return transformer_from_state_dict(config, sd, path)


def pretrained_parts(cls, path):
    """(backbone, {head parameter: tensor}) for cls(pretrained=path), from any checkpoint
    nanoRM reads. A ckpt.pt of cls's own kind gives all its heads (strictly, when the model
    is built); another kind's gives its scoring head (a reward model's head to a Critic, as
    Critic.from_reward_model does; the bias where cls has one); a foreign backbone none (a new
    head), or an HF classifier's score. A name that is not a file or directory here (a hub
    name) is refused in one line saying how to download it."""
    path = str(path)
    if not os.path.exists(path):
        raise UsageError(
            f"{path} is not a local checkpoint, and nanoRM reads no hub: download it first "
            f"(huggingface-cli download {path} --local-dir DIR) and pass pretrained=DIR"
        )
    try:
        return _parts(cls, path)
    except ValueError as e:  # the readers' "wrong format, truncated, shapes do not fit"
        raise UsageError(str(e) if path in str(e) else f"{path}: {e}") from None


def _parts(cls, path):
    if not is_ours(path):
        return _foreign_parts(path)
    ckpt = load_checkpoint(path)
    backbone, heads = split_heads(ckpt["model"])
    backbone = transformer_from_state_dict(ckpt["config"], backbone, path)
    if ckpt["kind"] != cls.__name__:  # another kind: its scoring head alone
        heads = {k: v for k, v in heads.items() if k.startswith("head.")}
        if "head.weight" not in heads:
            raise UsageError(f"{path}: its {ckpt['kind']} has no scoring head to start from")
        if not cls.head_bias:
            heads.pop("head.bias", None)
    return backbone, heads


def _foreign_parts(path):
    """(the backbone, {"head.weight": an HF classifier's score} or {}) of a foreign checkpoint."""
    config, sd = read_checkpoint(path)
    score = sd.pop("score.weight", None)
    backbone = transformer_from_state_dict(config, sd, path)
    if score is None:
        return backbone, {}
    if tuple(score.shape) != (1, backbone.config.dim):
        raise ValueError(f"{path}: score.weight {tuple(score.shape)} is not (1, dim)")
    return backbone, {"head.weight": score}  # HF's score has no bias: ours stays 0


def check_heads(model, heads, source):
    """Copy heads ({name: tensor}) into model's, which must be exactly the model's heads."""
    own = {k for k in model.state_dict() if not k.startswith("backbone.")}
    if own != heads.keys():
        raise ValueError(f"{source}: its heads {sorted(heads)} do not fit a {type(model).__name__}")
    model.load_state_dict(heads, strict=False)  # the heads; the backbone is assigned
