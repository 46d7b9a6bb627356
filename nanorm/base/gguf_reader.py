"""
GGUF, llama.cpp's one-file checkpoint: its metadata, its tensors, and a LLaMA in Meta's names.

    python gguf_reader.py ../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   # keys, tensors

The layout (little-endian; versions 2 and 3; facts from llama.cpp's docs/gguf.md and gguf-py):
    "GGUF", uint32 version, uint64 n_tensors, uint64 n_kv
    n_kv times       string key, uint32 value type, value
    n_tensors times  string name, uint32 n_dims, uint64 dims[n_dims] (innermost first),
                     uint32 ggml type, uint64 offset (from the data start)
    padding up to a multiple of general.alignment (default 32), then the tensor data.
A string is a uint64 byte count and UTF-8; an array is a uint32 element type, a uint64 count and
the elements, which may be strings or arrays again.

Quantized types store blocks of 32 values along the innermost dimension, each with its own scale:
    Q8_0  34 bytes: float16 d, int8 q[32]                      value = d * q
    Q4_0  18 bytes: float16 d, 16 bytes of nibbles             value = d * (nibble - 8)
    Q4_1  20 bytes: float16 d, float16 m, 16 bytes of nibbles  value = d * nibble + m
where value j < 16 is the low nibble of byte j and value j + 16 its high nibble.

A file is untrusted until checked: every count, length, type, dimension and offset it claims is
checked against its size before anything is allocated or looped over (as llama.cpp's gguf.cpp
does), no two tensors may share bytes, and the llama.* sizes a model is built from are checked
against the tensors present, so a damaged or hostile file of a few KB is a UsageError (a
ValueError) naming the file and the field, one line from every entry point, never gigabytes.

The module is named gguf_reader, not gguf, so that it does not shadow the `gguf` package that
transformers imports to read the same files (tests compare against it in one process).

Simplifications: version 1 (32-bit counts, 2023) and big-endian files are refused; of the many
ggml types only the ones small LLaMAs commonly ship in are dequantized (F32, F16, BF16, Q8_0,
Q4_0, Q4_1); a k-quant or i-quant tensor is refused with its name. Only the `llama`
architecture becomes a checkpoint.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the project root is not on the path
    raise SystemExit(
        f"{__file__} is part of the nanorm library: run python -m nanorm.base.gguf_reader"
    )

import math
import os
import reprlib
import struct
import sys
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch

from nanorm.base.command import UsageError

# ggml type id -> (name, values per block, bytes per block), from gguf-py's GGML_QUANT_SIZES
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# metadata value types: struct formats of the scalars; 8 is a string, 9 an array
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


def type_name(ggml_type):
    """'Q6_K (14)': the name and the number, as error messages should give them."""
    name = GGML_TYPES.get(ggml_type, ("unknown",))[0]
    return f"{name} ({ggml_type})"


@dataclass
class TensorInfo:
    name: str
    dims: tuple  # as stored: innermost first, so [576, 49152] is a (49152, 576) matrix
    type: int  # ggml type id, a key of GGML_TYPES
    offset: int  # absolute position in the file (the table's offset + the data start)

    @property
    def shape(self):  # numpy/torch order, outermost first
        return tuple(reversed(self.dims))

    @property
    def nbytes(self):
        _, block, size = GGML_TYPES[self.type]
        return math.prod(self.dims) // block * size  # Python ints: a huge claim cannot wrap


@dataclass
class GGUF:
    path: str
    version: int
    metadata: dict
    tensors: dict  # name -> TensorInfo, in file order
    data_offset: int  # where tensor data starts: the table's end rounded up to the alignment
    data: np.memmap  # the whole file as uint8; nothing is read until a tensor is sliced


class _Bad(ValueError):
    """What is wrong with the field being read; _parse names the file and the field."""


MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays: the format allows them, no known file goes past 2
_MIN_SIZE = {_STRING: 8, _ARRAY: 12}  # the fewest bytes a value of a type can take


class _Cursor:
    """Reads values front to back from a buffer; a read past its end raises IndexError. Every
    count is checked against the bytes left before anything is made from it."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def unpack(self, fmt):
        s = struct.Struct("<" + fmt)
        if self.pos + s.size > len(self.buf):
            raise IndexError
        out = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return out if len(out) > 1 else out[0]

    def string(self):
        n = self.unpack("Q")
        if n > len(self.buf) - self.pos:
            raise _Bad(f"a string of {n:,} bytes, past the end of the file")
        try:
            s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Bad(f"a string that is not UTF-8 (byte {e.start} of {n})") from None
        self.pos += n
        return s

    def value(self, vtype, depth=0):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise _Bad(f"unknown value type {vtype} (0 to 12 are GGUF's)")
        if depth == MAX_NESTING:
            raise _Bad(f"arrays nested more than {MAX_NESTING} deep")
        etype, n = self.unpack("IQ")
        if etype in _SCALARS:
            size = struct.calcsize(_SCALARS[etype])
        elif etype in _MIN_SIZE:
            size = _MIN_SIZE[etype]
        else:
            raise _Bad(f"an array of unknown value type {etype} (0 to 12 are GGUF's)")
        if n * size > len(self.buf) - self.pos:
            raise _Bad(f"an array of {n:,} values, more than the rest of the file holds")
        if etype in _SCALARS:  # one numpy read for the whole array (49k token types, scores)
            dtype = np.dtype("<" + _SCALARS[etype])
            arr = np.frombuffer(self.buf, dtype, count=n, offset=self.pos)
            self.pos += n * dtype.itemsize
            return arr.tolist()
        return [self.value(etype, depth + 1) for _ in range(n)]  # strings (the vocabulary), arrays


def _parse(path, with_tensors):
    """Metadata, and (with_tensors) the tensor table, from one memory map of the file. Every
    count, length, type and offset is checked against the file before it is used: a damaged or
    hostile file is a ValueError naming the file and the field."""
    path = str(path)
    size = os.path.getsize(path)
    if size < 24:  # magic, version and the two counts
        raise UsageError(f"{path}: {size} bytes is too short for a GGUF header")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(data))
    magic = bytes(data[:4])
    if magic != b"GGUF":
        raise UsageError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    cur.pos = 4
    version = cur.unpack("I")
    if version not in (2, 3):
        raise UsageError(
            f"{path}: GGUF version {version} is not supported (2 and 3 are; 1 is from 2023 and "
            f"a huge number means a big-endian file)"
        )
    n_tensors, n_kv = cur.unpack("QQ")
    # the fewest bytes an entry takes: a key/value 8 + 4 + 1, a tensor 8 + 4 + 8 + 4 + 8
    for count, name, least in ((n_kv, "n_kv", 13), (n_tensors, "n_tensors", 32)):
        if count * least > size - 24:
            raise UsageError(
                f"{path}: header field {name} claims {count:,} entries, more than the file's "
                f"{size:,} bytes can hold"
            )
    field = "the metadata"
    try:
        metadata = {}
        for i in range(n_kv):
            field = f"metadata key {i + 1} of {n_kv}"
            key = cur.string()
            field = f"metadata key {key!r}"
            if key in metadata:
                raise _Bad("appears twice")
            metadata[key] = cur.value(cur.unpack("I"))
        if not with_tensors:
            return version, metadata, None, None, data
        tensors = {}
        for i in range(n_tensors):
            field = f"tensor {i + 1} of {n_tensors}"
            name = cur.string()
            field = f"tensor {name}"
            if name in tensors:
                raise _Bad("appears twice")
            n_dims = cur.unpack("I")
            if not 1 <= n_dims <= MAX_DIMS:
                raise _Bad(f"n_dims is {n_dims:,}; ggml tensors have 1 to {MAX_DIMS}")
            dims = cur.unpack(f"{n_dims}Q")
            dims = dims if isinstance(dims, tuple) else (dims,)
            ggml_type, offset = cur.unpack("IQ")
            tensors[name] = TensorInfo(name, dims, ggml_type, offset)
            _check_tensor(tensors[name], size)
    except IndexError:
        raise UsageError(f"{path}: truncated: {field} runs past the end of the file") from None
    except _Bad as e:
        raise UsageError(f"{path}: {field}: {e}") from None
    align = metadata.get("general.alignment", 32)
    if type(align) is not int or align < 1 or align & (align - 1):
        raise UsageError(f"{path}: general.alignment is {align!r}; it must be a power of two")
    data_offset = -(-cur.pos // align) * align
    for t in tensors.values():
        if t.offset % align:
            raise UsageError(
                f"{path}: tensor {t.name}: offset {t.offset} is not a multiple of the "
                f"alignment {align}"
            )
        t.offset += data_offset
        if t.offset + t.nbytes > size:
            raise UsageError(
                f"{path}: truncated: tensor {t.name} ends at byte {t.offset + t.nbytes:,}, "
                f"past the end of the file ({size:,} bytes)"
            )
    # each tensor's bytes are its own (llama.cpp lays them end to end): tensors that share bytes
    # would be read, and dequantized, once per tensor from bytes the file holds once
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (_, end, a), (start, _, b) in pairwise(spans):
        if start < end:
            raise UsageError(
                f"{path}: tensor {b} starts at byte {start:,}, inside tensor {a} (which ends at "
                f"{end:,}): each tensor's data is its own (convert the model again with "
                "llama.cpp's convert_hf_to_gguf.py)"
            )
    return version, metadata, tensors, data_offset, data


def _check_tensor(t, size):
    """A tensor's type and dims: a known type, whole blocks, and no more bytes than the file."""
    if t.type not in GGML_TYPES:
        raise _Bad(f"unknown ggml type {t.type}")
    _, block, _ = GGML_TYPES[t.type]
    if t.dims[0] % block:
        raise _Bad(
            f"its innermost dimension {t.dims[0]} is not a whole number of {type_name(t.type)} "
            f"blocks of {block}"
        )
    if t.nbytes > size:  # also catches dims whose product is past any int64
        raise _Bad(f"dims {list(t.dims)} take {t.nbytes:,} bytes, more than the file's {size:,}")


def read_gguf_metadata(path):
    """The key/value metadata alone: no tensor table, no tensor data."""
    return _parse(path, with_tensors=False)[1]


def read_gguf(path):
    """Metadata and tensor table of a GGUF file, and a lazy memory map of its data."""
    version, metadata, tensors, data_offset, data = _parse(path, with_tensors=True)
    return GGUF(str(path), version, metadata, tensors, data_offset, data)


def _f16(blocks, at):
    """The float16 at byte `at` of every block, as a float32 column (n_blocks, 1)."""
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs):
    """(n_blocks, 16) bytes -> (n_blocks, 32) float32: low nibbles first, then high nibbles."""
    out = np.empty((qs.shape[0], 32), dtype=np.float32)
    out[:, :16] = qs & 0x0F
    out[:, 16:] = qs >> 4
    return out


def dequantize(raw, ggml_type, shape):
    """float32 array of `shape` (outermost first) from the raw uint8 bytes of one tensor."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if ggml_type == 0:  # F32
        out = raw.view(np.float32).copy()
    elif ggml_type == 1:  # F16
        out = raw.view(np.float16).astype(np.float32)
    elif ggml_type == 30:  # BF16: the top half of a float32
        out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif ggml_type in (2, 3, 8):
        _, block, size = GGML_TYPES[ggml_type]
        blocks = raw.reshape(-1, size)  # (n_blocks, bytes per block)
        d = _f16(blocks, 0)
        if ggml_type == 8:  # Q8_0
            out = d * blocks[:, 2:].view(np.int8)
        elif ggml_type == 2:  # Q4_0: nibbles are offset by 8 to be signed
            out = _nibbles(blocks[:, 2:])
            out -= 8
            out *= d
        else:  # Q4_1: unsigned nibbles with a per-block minimum
            out = _nibbles(blocks[:, 4:])
            out *= d
            out += _f16(blocks, 2)
    else:
        supported = ", ".join(type_name(t) for t in (0, 1, 30, 8, 2, 3))
        raise ValueError(f"ggml type {type_name(ggml_type)} is not supported ({supported} are)")
    return out.reshape(shape)


def read_tensor(gguf, name):
    """One tensor of a read_gguf result as float32 numpy, dequantized."""
    t = gguf.tensors[name]
    if t.type not in (0, 1, 30, 8, 2, 3):
        raise UsageError(
            f"{gguf.path}: tensor {name} has type {type_name(t.type)}, which nanoRM cannot "
            f"dequantize (F32, F16, BF16, Q8_0, Q4_0 and Q4_1 only)"
        )
    return dequantize(gguf.data[t.offset : t.offset + t.nbytes], t.type, t.shape)


# ------------------------------------------------------------------ a LLaMA checkpoint
_LAYER_NAMES = {
    "attn_q": "attention.wq",
    "attn_k": "attention.wk",
    "attn_v": "attention.wv",
    "attn_output": "attention.wo",
    "ffn_gate": "feed_forward.w1",
    "ffn_down": "feed_forward.w2",
    "ffn_up": "feed_forward.w3",
    "attn_norm": "attention_norm",
    "ffn_norm": "ffn_norm",
}
_TOP_NAMES = {"token_embd": "tok_embeddings", "output_norm": "norm", "output": "output"}


def _meta_name(name):
    """llama.cpp's tensor name -> Meta's, or None for a tensor a plain LLaMA does not have."""
    parts = name.split(".")
    if len(parts) == 2 and parts[1] == "weight" and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.weight"
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    return None


def _decimal(x):
    """A float32 from the file as the decimal it was written from: 9.99999975e-06 -> 1e-05."""
    return float(str(np.float32(x)))


def load_gguf_checkpoint(path):
    """(ModelConfig kwargs, float32 state dict in Meta's names) of a llama-architecture GGUF.

    llama.cpp's converter stores wq and wk rows in Meta's interleaved-pair RoPE order (it undoes
    Hugging Face's permutation), so they are used as stored; tests/test_gguf.py checks that
    against transformers' own reading of the same file."""
    g = read_gguf(path)
    md = g.metadata
    arch = md.get("general.architecture")
    if arch != "llama":
        raise UsageError(
            f"{path}: architecture {reprlib.repr(arch)}; only 'llama' GGUF files are supported"
        )
    scaling = md.get("llama.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in g.tensors:
        raise UsageError(
            f"{path}: RoPE scaling ({reprlib.repr(scaling)}, or a rope_freqs.weight table) is not "
            "supported"
        )
    names = {}
    for name in g.tensors:
        key = _meta_name(name)
        if key is None:
            raise UsageError(f"{path}: tensor {name} has no place in a plain LLaMA")
        names[name] = key
    kw = _llama_config(path, md, g.tensors)
    for name, t in g.tensors.items():  # refuse before spending seconds dequantizing the rest
        if t.type not in (0, 1, 30, 8, 2, 3):
            read_tensor(g, name)
    sd = {key: torch.from_numpy(read_tensor(g, name)) for name, key in names.items()}
    return kw, sd


# what the metadata may claim: each a generous multiple of the largest LLaMA's (405B: 126 layers,
# dim 16384, FFN 53248, 128 heads, a 128k vocabulary and context)
LIMITS = {
    "block_count": 1024,
    "embedding_length": 1 << 16,
    "feed_forward_length": 1 << 18,
    "attention.head_count": 1024,
    "attention.head_count_kv": 1024,
    "context_length": 1 << 24,
}


def _llama_config(path, md, tensors):
    """ModelConfig kwargs from the llama.* metadata, each size checked before anything is built
    from it: a positive int below LIMITS, heads that divide the width, the layers block_count
    names, and every tensor the shape those sizes give it."""

    def get(key, default=None):
        if f"llama.{key}" not in md and default is None:
            raise UsageError(f"{path}: metadata key llama.{key} is missing")
        value = md.get(f"llama.{key}", default)
        if key in LIMITS and (type(value) is not int or not 1 <= value <= LIMITS[key]):
            raise UsageError(
                f"{path}: llama.{key} is {reprlib.repr(value)}; expected an integer from 1 to "
                f"{LIMITS[key]:,}"
            )
        if key not in LIMITS and not (type(value) in (int, float) and 0 < value < math.inf):
            raise UsageError(f"{path}: llama.{key} is {reprlib.repr(value)}; expected a number > 0")
        return value

    dim, n_heads = get("embedding_length"), get("attention.head_count")
    n_kv_heads = get("attention.head_count_kv", n_heads)
    if dim % n_heads or n_heads % n_kv_heads:
        raise UsageError(
            f"{path}: llama.attention.head_count {n_heads} must divide llama.embedding_length "
            f"{dim}, and llama.attention.head_count_kv {n_kv_heads} must divide it"
        )
    head_dim = dim // n_heads
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if md.get(f"llama.{key}", head_dim) != head_dim:
            raise UsageError(
                f"{path}: llama.{key} is {reprlib.repr(md[f'llama.{key}'])}, but nanoRM's LLaMA "
                f"needs dim / n_heads = {head_dim} (full-width RoPE, no separate head size)"
            )
    n_layers, hidden = get("block_count"), get("feed_forward_length")
    layers = {n.split(".")[1] for n in tensors if n.startswith("blk.")}
    if layers != {str(i) for i in range(n_layers)}:
        raise UsageError(
            f"{path}: llama.block_count is {n_layers}, but the file holds {len(layers)} layers "
            f"({', '.join(sorted(layers)[:3])}{', ...' if len(layers) > 3 else ''})"
        )
    embd = tensors.get("token_embd.weight")
    vocab = embd.shape[0] if embd is not None else 0
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and embd is not None and len(tokens) != vocab:
        raise UsageError(
            f"{path}: tokenizer.ggml.tokens holds {len(tokens):,} tokens, but token_embd.weight "
            f"has {vocab:,} rows"
        )
    E, F = "llama.embedding_length", "llama.embedding_length and llama.feed_forward_length"
    K = "llama.embedding_length and the head counts"
    expected = {
        "token_embd": ((vocab, dim), E),
        "output_norm": ((dim,), E),
        "output": ((vocab, dim), f"{E} and token_embd.weight"),
    }
    kv_dim = n_kv_heads * head_dim
    for i in range(n_layers):
        for name, want in (
            ("attn_norm", ((dim,), E)),
            ("ffn_norm", ((dim,), E)),
            ("attn_q", ((dim, dim), E)),
            ("attn_k", ((kv_dim, dim), K)),
            ("attn_v", ((kv_dim, dim), K)),
            ("attn_output", ((dim, dim), E)),
            ("ffn_gate", ((hidden, dim), F)),
            ("ffn_up", ((hidden, dim), F)),
            ("ffn_down", ((dim, hidden), F)),
        ):
            expected[f"blk.{i}.{name}"] = want
    for name, (shape, keys) in expected.items():
        t = tensors.get(f"{name}.weight")
        if t is None and name != "output":  # output is absent when tied to token_embd
            raise UsageError(f"{path}: tensor {name}.weight is missing")
        if t is not None and t.shape != shape:
            raise UsageError(
                f"{path}: tensor {name}.weight has shape {t.shape}, but {keys} make it {shape}"
            )
    return dict(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        vocab_size=vocab,
        hidden_dim=hidden,
        norm_eps=_decimal(get("attention.layer_norm_rms_epsilon")),
        rope_theta=_decimal(get("rope.freq_base", 10000.0)),
        max_seq_len=get("context_length"),
        tie_embeddings="output.weight" not in tensors,
    )


def main():
    g = read_gguf(sys.argv[1])
    print(f"{g.path}: GGUF v{g.version}, {len(g.metadata)} keys, {len(g.tensors)} tensors")
    for k, v in g.metadata.items():
        s = repr(v) if not isinstance(v, list) else f"[{len(v)} items] {v[:3]!r}..."
        print(f"  {k} = {s[:100]}")
    for t in g.tensors.values():
        print(f"  {t.name:32s} {type_name(t.type):10s} {t.shape}")


if __name__ == "__main__":
    main()
