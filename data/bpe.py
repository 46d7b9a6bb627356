"""
Byte-level BPE (GPT-2, Llama 3, SmolLM2) in plain Python, read from a GGUF file or a Hugging Face
tokenizer.json, giving the same ids as Hugging Face `tokenizers`. Written back as a tokenizer.json
by bpe_tokenizer_files (last section), for exports and checkpoints.

    from data.bpe import BPETokenizer
    tok = BPETokenizer.from_gguf("../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    tok.encode("<|im_start|>user\nHi!<|im_end|>")   # [1, 4093, 198, 26843, 17, 2]

Encoding a text takes four steps, as in `tokenizers`:
1. Added/special tokens ("<|im_start|>", "<|endoftext|>", ...) are cut out of the text first and
   become their own ids (HF's default: special tokens in the text are parsed).
2. Each remaining stretch is split into words by the pre-tokenizer's regex patterns, each pattern
   applied in turn to every piece ("Isolated": both the matches and the text between them are kept).
3. Each word's UTF-8 bytes are mapped to printable characters (GPT-2's bytes->unicode table), so a
   vocabulary of strings covers every byte string.
4. The word is merged by BPE: repeatedly join the adjacent pair with the lowest merge rank.
Decoding maps pieces back to bytes and decodes UTF-8 with errors="replace", as HF does.

Pre-tokenizers: GPT-2's pattern (HF ByteLevel), SmolLM2's (each digit isolated, then GPT-2's), and
Llama 3's (a Split regex), from the GGUF `tokenizer.ggml.pre` name or the tokenizer.json. The
patterns use \\p{L} (letters), \\p{N} (numbers) and \\s, which Python's `re` lacks or defines
differently, so we translate them: \\p{L} and \\p{N} become explicit character classes built once
from `unicodedata.category`, and \\s becomes Unicode's White_Space set (what Oniguruma, the regex
engine of `tokenizers`, uses; Python's own \\s also matches U+001C..U+001F). The translated pattern
then runs in `re`'s C engine: exact, fast, and no new dependency (no `regex` package). The one
limit: character classes follow this Python's Unicode version (`unicodedata.unidata_version`), so a
character assigned in a later Unicode version than Python's may be split differently.

Deliberately left out: normalizers (byte-level vocabularies have none), ByteLevel's
add_prefix_space, Split behaviours other than "Isolated", added tokens with lstrip/rstrip/
single_word, BPE dropout, unk_token and word prefixes/suffixes. A byte missing from the vocabulary
is dropped, as HF does (SmolLM2 lacks 21 bytes, e.g. 0x04 and 0xF1, a lead byte of U+40000+). Each is refused with a ValueError naming the
file rather than silently encoding differently.
"""

import json
import os
import re
import unicodedata
from functools import lru_cache
from pathlib import Path

# HF ByteLevel(use_regex=True)'s pattern, which is GPT-2's
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Llama 3's Split pattern (tiktoken's cl100k_base)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DIGIT_PATTERN = r"\p{N}"  # HF Digits(individual_digits=True): every number character alone

# GGUF tokenizer.ggml.pre -> the split patterns applied in turn (llama.cpp's llama-vocab.cpp table)
GGUF_PRE = {
    "gpt2": [GPT2_PATTERN],
    "smollm": [DIGIT_PATTERN, GPT2_PATTERN],
    "starcoder": [DIGIT_PATTERN, GPT2_PATTERN],
    "llama-bpe": [LLAMA3_PATTERN],
    "llama3": [LLAMA3_PATTERN],
}

# Unicode's White_Space property (PropList.txt); it has not changed since Unicode 6.3
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other
    68 (controls, space, soft hyphen, ...) are moved to U+0100 onwards, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache
def _category_class(major: str) -> str:
    """The body of a [...] class with every codepoint whose general category starts with `major`
    ("L" letters, "N" numbers), as ranges. One pass over all codepoints, about a second."""
    ranges, start = [], None
    for cp in range(0x110001):
        inside = cp < 0x110000 and unicodedata.category(chr(cp))[0] == major
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append(
                f"\\U{start:08x}-\\U{cp - 1:08x}" if cp - 1 > start else f"\\U{start:08x}"
            )
            start = None
    return "".join(ranges)


@lru_cache
def compile_pattern(pattern: str) -> re.Pattern:
    """An Oniguruma-style split pattern as a Python `re`, wrapped in a group so that re.split keeps
    the matches: \\p{L}, \\p{N}, \\s and \\S are spelled out (see the module docstring)."""
    ws = WHITE_SPACE
    inside = {r"\p{L}": _category_class("L"), r"\p{N}": _category_class("N"), r"\s": ws}
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            esc = pattern[i : i + 5] if pattern.startswith(r"\p{", i) else pattern[i : i + 2]
            if esc in inside:
                out.append(inside[esc] if in_class else f"[{inside[esc]}]")
            elif esc == r"\S" and not in_class:
                out.append(f"[^{ws}]")
            elif esc[1] in "pPdDwWbBsS":  # a class whose meaning would differ in Python
                raise ValueError(f"split pattern {pattern!r}: {esc} is not supported")
            else:
                out.append(esc)
            i += len(esc)
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and pattern[i - 1] != "[" and pattern[i - 2 : i] != "[^":
            in_class = False
        out.append(c)
        i += 1
    return re.compile("(" + "".join(out) + ")")


class BPETokenizer:
    """A byte-level BPE vocabulary: `pieces` (id -> string of byte characters), `merges` (pairs,
    in rank order), `special_tokens` (text -> id, cut out of the text before BPE) and `patterns`
    (the pre-tokenizer's split patterns, applied in turn).

    Same interface as data/tokenizer.py's tokenizers: encode(text, bos, eos), decode(ids), and
    vocab_size, bos_id, eos_id, pad_id (None when the file names none), chat_template,
    add_bos_token (whether the file asks for a BOS at the start; encode adds one only for bos=True).
    """

    def __init__(
        self,
        pieces: list[str],
        merges: list[tuple[str, str]],
        special_tokens: dict[str, int],
        patterns: list[str],
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        add_bos_token: bool = False,
        chat_template: str | None = None,
        ignore_merges: bool = False,
        source: str = "",
    ):
        self.pieces, self.merges, self.patterns = pieces, merges, patterns
        self.special_tokens = dict(special_tokens)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.add_bos_token, self.chat_template = add_bos_token, chat_template
        self.ignore_merges = ignore_merges  # Llama 3: a word already in the vocabulary is one id
        self.source = source
        self.vocab_size = len(pieces)
        self.piece_to_id = {p: i for i, p in enumerate(pieces) if p is not None}
        self.ranks = {pair: r for r, pair in enumerate(merges)}
        for a, b in merges:
            if a + b not in self.piece_to_id:
                raise ValueError(f"{source}: merge {a!r} {b!r} makes {a + b!r}, not in the vocab")
        self.byte_char = bytes_to_unicode()
        self._to_chars = str.maketrans({chr(b): c for b, c in self.byte_char.items()})
        char_byte = {c: b for b, c in self.byte_char.items()}
        # what each id decodes to: specials as their text; a piece with a character outside the
        # byte table (none in a real byte-level vocab) as its UTF-8, as HF's ByteLevel decoder
        self.id_bytes = []
        for p in pieces:
            p = p or ""
            ok = all(c in char_byte for c in p)
            self.id_bytes.append(bytes(char_byte[c] for c in p) if ok else p.encode())
        for text, i in self.special_tokens.items():
            self.id_bytes[i] = text.encode()
        self._splits = [compile_pattern(p) for p in patterns]
        # longest first, so that of two specials starting at the same place the longer wins
        specials = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = (
            re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
        )
        self._cache: dict[str, list[int]] = {}

    def token_to_id(self, piece: str) -> int:
        if piece in self.special_tokens:
            return self.special_tokens[piece]
        return self.piece_to_id[piece]

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        if (bos and self.bos_id is None) or (eos and self.eos_id is None):
            raise ValueError(f"{self.source}: no {'bos' if bos else 'eos'} token in this tokenizer")
        ids = [self.bos_id] * bos
        parts = self._special_re.split(text) if self._special_re else [text]
        for k, part in enumerate(parts):  # re.split with a group: text, special, text, ...
            if k % 2:
                ids.append(self.special_tokens[part])
                continue
            words = [part]
            for split in self._splits:
                words = [w for word in words for w in split.split(word) if w]
            for word in words:
                ids.extend(self._bpe(word.encode().decode("latin-1").translate(self._to_chars)))
        return ids + [self.eos_id] * eos

    def _bpe(self, word: str) -> list[int]:
        """The ids of one word (already in byte characters). GPT-2's loop: merge every occurrence of
        the lowest-ranked pair, left to right, until no pair has a rank. HF pops one pair at a
        time from a heap; that is the same order, since a merge's parts always rank before it."""
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        if self.ignore_merges and word in self.piece_to_id:
            parts = [word]
        else:
            # a byte the vocabulary lacks (SmolLM2 has no 0x04, 0xF1, ...) is dropped, as HF's BPE
            # does without an unk_token: such text cannot round-trip through this vocabulary
            parts = [c for c in word if c in self.piece_to_id]
        while len(parts) > 1:
            pairs = list(zip(parts, parts[1:], strict=False))
            best = min(pairs, key=lambda p: self.ranks.get(p, len(self.ranks)))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self.piece_to_id[p] for p in parts]
        if len(self._cache) > 200_000:  # a bound on memory for endless streams of new words
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def decode(self, ids) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} out of range for vocab_size {self.vocab_size}")
            out.append(self.id_bytes[i])
        # join bytes first: one character may be spread over several tokens
        return b"".join(out).decode("utf-8", errors="replace")

    # ---- readers ----

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "BPETokenizer":
        """The tokenizer in a GGUF file's metadata (`tokenizer.ggml.*`), model "gpt2"."""
        from nanorm.base.gguf_reader import read_gguf_metadata  # the GGUF format, read for its file

        meta = read_gguf_metadata(path)
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(
                f"{path}: tokenizer.ggml.model is {model!r}; only 'gpt2' (BPE) is read"
            )
        pre = meta.get("tokenizer.ggml.pre", "gpt2")
        if pre not in GGUF_PRE:
            raise ValueError(f"{path}: pre-tokenizer {pre!r} not supported (know {list(GGUF_PRE)})")
        pieces = list(meta["tokenizer.ggml.tokens"])
        types = meta.get("tokenizer.ggml.token_type", [1] * len(pieces))
        # 3 control, 4 user-defined: the tokens llama.cpp (and HF's conversion) parse in the text
        specials = {p: i for i, (p, t) in enumerate(zip(pieces, types, strict=True)) if t in (3, 4)}
        return cls(
            pieces,
            [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]],
            specials,
            GGUF_PRE[pre],
            bos_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_id=meta.get("tokenizer.ggml.eos_token_id"),
            pad_id=meta.get("tokenizer.ggml.padding_token_id"),
            add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=meta.get("tokenizer.chat_template"),
            ignore_merges=pre in ("llama-bpe", "llama3"),  # llama.cpp does this for Llama 3
            source=str(path),
        )

    @classmethod
    def from_hf(cls, path: str | os.PathLike) -> "BPETokenizer":
        """A Hugging Face tokenizer.json, or a directory holding one; bos/eos/pad and the chat
        template come from tokenizer_config.json (and chat_template.jinja) beside it if present."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        spec = json.loads(path.read_text(encoding="utf-8"))
        model = spec.get("model", {})
        if model.get("type") != "BPE":
            raise ValueError(
                f"{path}: tokenizer model type {model.get('type')!r} is not supported "
                "(only byte-level BPE)"
            )
        if model.get("unk_token") is not None:
            raise ValueError(f"{path}: BPE unk_token is not supported (byte-level BPE has none)")
        for key, ok in [
            ("dropout", None),
            ("continuing_subword_prefix", ""),
            ("end_of_word_suffix", ""),
        ]:
            if model.get(key) not in (ok, None):
                raise ValueError(f"{path}: BPE option {key}={model[key]!r} is not supported")
        if spec.get("normalizer") is not None:
            raise ValueError(
                f"{path}: normalizer {spec['normalizer'].get('type')!r} is not "
                "supported (byte-level BPE has none)"
            )
        patterns = _hf_patterns(spec.get("pre_tokenizer"), path)

        added = spec.get("added_tokens", [])
        for t in added:
            if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
                raise ValueError(
                    f"{path}: added token {t['content']!r}: lstrip/rstrip/single_word "
                    "are not supported"
                )
        vocab = model["vocab"]
        n = max([*vocab.values(), *(t["id"] for t in added)]) + 1
        pieces = [None] * n
        for p, i in vocab.items():
            pieces[i] = p
        for t in added:
            pieces[t["id"]] = t["content"]
        merges = [
            tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]
        ]
        specials = {t["content"]: t["id"] for t in added}

        config = {}
        if (path.parent / "tokenizer_config.json").is_file():
            config = json.loads((path.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if template is None and (path.parent / "chat_template.jinja").is_file():
            template = (path.parent / "chat_template.jinja").read_text(encoding="utf-8")
        ids = {**vocab, **specials}

        def token_id(name):
            t = config.get(name)
            t = t.get("content") if isinstance(t, dict) else t
            return ids.get(t) if t is not None else None

        # a post-processor template that starts with a special token adds it as BOS (Llama 3)
        post_bos = _post_processor_bos(spec.get("post_processor"))
        bos_id = token_id("bos_token")
        if bos_id is None and post_bos is not None:
            bos_id = ids.get(post_bos)
        return cls(
            pieces,
            merges,
            specials,
            patterns,
            bos_id=bos_id,
            eos_id=token_id("eos_token"),
            pad_id=token_id("pad_token"),
            add_bos_token=post_bos is not None,
            chat_template=template,
            ignore_merges=bool(model.get("ignore_merges", False)),
            source=str(path),
        )


def _hf_patterns(pre: dict | None, path: Path) -> list[str]:
    """A tokenizer.json pre_tokenizer as split patterns; it must end in a ByteLevel."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    patterns = []
    for k, step in enumerate(steps):
        kind = step.get("type") if step else None
        if kind == "ByteLevel" and k == len(steps) - 1:
            if step.get("add_prefix_space"):
                raise ValueError(f"{path}: ByteLevel add_prefix_space=true is not supported")
            patterns += [GPT2_PATTERN] if step.get("use_regex", True) else []
            return patterns
        if kind == "Split" and step.get("behavior") == "Isolated" and not step.get("invert"):
            p = step["pattern"]
            patterns.append(p["Regex"] if "Regex" in p else re.escape(p["String"]))
        elif kind == "Digits":
            patterns.append(DIGIT_PATTERN if step.get("individual_digits") else DIGIT_PATTERN + "+")
        else:
            detail = f"Split behavior {step.get('behavior')!r}" if kind == "Split" else repr(kind)
            raise ValueError(
                f"{path}: pre-tokenizer {detail} is not supported (byte-level BPE "
                "needs ByteLevel last, after Split (Isolated) / Digits)"
            )
    raise ValueError(f"{path}: pre-tokenizer has no ByteLevel step: not a byte-level BPE")


def _post_processor_bos(post: dict | None) -> str | None:
    """The special token a TemplateProcessing puts before a single text, if any."""
    if not post:
        return None
    if post.get("type") == "Sequence":
        found = [_post_processor_bos(p) for p in post.get("processors", [])]
        return next((f for f in found if f is not None), None)
    if post.get("type") == "TemplateProcessing" and post.get("single"):
        first = post["single"][0]
        return first["SpecialToken"]["id"] if "SpecialToken" in first else None
    return None


# ----------------------------------------------------------------------------- as Hugging Face files
def bpe_tokenizer_json(tok):
    """A BPETokenizer as a Hugging Face tokenizer.json dict, which `tokenizers` reads back to
    the same ids: every split pattern becomes a Split (Isolated) step before a ByteLevel that
    only maps bytes (use_regex false), so a .gguf's pre-tokenizer (SmolLM2's digit split
    included) survives; the special tokens are added tokens; bos/eos/pad and the chat template
    are not in this file (they go to tokenizer_config.json, see hf_tokenizer_config)."""
    split = lambda p: {
        "type": "Split",
        "pattern": {"Regex": p},
        "behavior": "Isolated",
        "invert": False,
    }
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    post = None
    if tok.add_bos_token and tok.bos_id is not None:  # the BOS the file asked for
        bos = tok.pieces[tok.bos_id]
        first = {"SpecialToken": {"id": bos, "type_id": 0}}
        post = {
            "type": "TemplateProcessing",
            "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                first,
                {"Sequence": {"id": "A", "type_id": 0}},
                first,
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [tok.bos_id], "tokens": [bos]}},
        }
    added = [
        dict(
            id=i,
            content=t,
            single_word=False,
            lstrip=False,
            rstrip=False,
            normalized=False,
            special=True,
        )
        for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [*map(split, tok.patterns), dict(byte_level, use_regex=False)],
        },
        "post_processor": post,
        "decoder": dict(byte_level, use_regex=True),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": tok.ignore_merges,
            "vocab": {p: i for i, p in enumerate(tok.pieces) if p is not None},
            "merges": [list(m) for m in tok.merges],
        },
    }


def hf_tokenizer_config(tok, pad_id=None):
    """tokenizer_config.json beside bpe_tokenizer_json's file: the special tokens by their text
    and the chat template, which BPETokenizer.from_hf and AutoTokenizer read. pad_id, if given,
    replaces the tokenizer's own."""
    text = lambda i: None if i is None else tok.pieces[i]
    pad_id = tok.pad_id if pad_id is None else pad_id
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tok.bos_id),
        "eos_token": text(tok.eos_id),
        "pad_token": text(pad_id),
        "add_bos_token": tok.add_bos_token,
        "padding_side": "right",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    if tok.chat_template is not None:
        config["chat_template"] = tok.chat_template
    return config


def bpe_tokenizer_files(tok, pad_id=None):
    """{file name: bytes}: a BPETokenizer as tokenizer.json + tokenizer_config.json, which
    BPETokenizer.from_hf, `tokenizers` and AutoTokenizer read back to the same ids. What an
    export writes (nanorm/export_hf.py) and what a checkpoint carries (nanorm/ckpt.py)."""
    files = {
        "tokenizer.json": bpe_tokenizer_json(tok),
        "tokenizer_config.json": hf_tokenizer_config(tok, pad_id),
    }
    return {k: json.dumps(v, ensure_ascii=False, indent=1).encode() for k, v in files.items()}
