"""
Tokenizers: text <-> token ids, for both vocabulary formats this project meets.

- SentencePieceTokenizer wraps a SentencePiece `.model` (e.g. LLaMA-2's tokenizer.model).
- Llama2cTokenizer reads llama2.c's `.bin` vocabulary (tok512.bin, tokenizer.bin) and both
  decodes and encodes it exactly like llama2.c's run.c, so no sentencepiece is needed to run
  stories260K end to end from text.
- train_sentencepiece trains a new BPE vocabulary from an iterator of texts, with the settings
  llama2.c's tinystories.py uses for TinyStories.
- BPETokenizer (data/bpe.py) reads byte-level BPE (GPT-2, Llama 3, SmolLM2) from a `.gguf` or a
  Hugging Face tokenizer.json.
- load_tokenizer(path) picks the class from the file extension; tokenizer_fingerprint(tok) hashes
  the vocabulary, to tell whether ids made by two tokenizers can be mixed.

Both classes share one small interface (see `Tokenizer`): encode(text, bos, eos) -> ids,
decode(ids) -> text, and bos_id, eos_id, pad_id, vocab_size.

Simplifications: no sampling/dropout encoding, no batching, no special-token parsing in the text
("<s>" in a string is just the characters "<", "s", ">", as in SentencePiece). One deliberate
departure from run.c: merges only ever produce normal pieces, never <unk>/<s>/</s> or a byte
token such as "<0x41>" (run.c would merge the literal text "<0x41>" into byte 0x41 if the
vocabulary had pieces for its halves; SentencePiece never does).

Llama2cTokenizer on tokenizer.bin gives the same ids as sentencepiece on tokenizer.model, except
for a literal "▁" (U+2581) in the text: sentencepiece takes it for its own space marker (and
decodes it as " "), the .bin has no "▁" piece so it becomes 3 byte tokens and round-trips.
Decoding differs only after a <s> inside a sequence: like run.c, we drop the piece's leading
space there (each <s> starts a new text); sentencepiece only does so at the very start.
"""

import hashlib
import heapq
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from nanorm.base.command import UsageError, atomic_write

BYTE_OFFSET = 3  # llama2.c layout: ids 0,1,2 = <unk>, <s>, </s>; ids 3..258 = <0x00>..<0xFF>


class Tokenizer(Protocol):
    bos_id: int
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


def _check_exists(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    return path


def _import_sentencepiece():
    # imported lazily so the llama2.c path (and everything else) works without sentencepiece
    try:
        import sentencepiece
    except ImportError as e:
        raise ImportError("this needs the sentencepiece package: pip install sentencepiece") from e
    return sentencepiece


class SentencePieceTokenizer:
    """A SentencePiece `.model` file.

    pad_id: LLaMA's model defines no pad token (sp.pad_id() == -1), so we pad with eos_id, as
    Hugging Face users usually do. The value never matters: the models find the real tokens from
    the attention mask, never by comparing ids with pad_id.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = _check_exists(Path(path))
        spm = _import_sentencepiece()
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.vocab_size = self.sp.vocab_size()
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()
        self.pad_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else self.eos_id

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self.sp.encode(text)
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids: Iterable[int]) -> str:
        # control tokens (<s>, </s>) decode to nothing
        return self.sp.decode([int(i) for i in ids])


class Llama2cTokenizer:
    """llama2.c's `.bin` vocabulary, decoded and encoded like run.c.

    File format: int32 max_token_length, then per token id in order: float32 score, int32 len,
    len bytes of UTF-8. Pieces use a plain space where SentencePiece writes "▁". The file does not
    store the vocabulary size; pass `vocab_size` to also catch a file cut at a token boundary.
    There is no pad token: pad_id is eos_id (see SentencePieceTokenizer).
    """

    bos_id = 1
    eos_id = 2
    pad_id = 2

    def __init__(self, path: str | os.PathLike, vocab_size: int | None = None):
        self.path = _check_exists(Path(path))
        self.max_token_length, self.pieces, self.scores = _read_llama2c_vocab(self.path)
        self.vocab_size = len(self.pieces)
        if vocab_size is not None and self.vocab_size != vocab_size:
            raise ValueError(
                f"{self.path}: expected {vocab_size} tokens, file ends after token "
                f"{self.vocab_size}"
            )
        for b in range(256):  # run.c's byte fallback relies on this layout
            if self.vocab_size < 259 or self.pieces[BYTE_OFFSET + b] != b"<0x%02X>" % b:
                raise ValueError(f"{self.path}: token {BYTE_OFFSET + b} is not byte <0x{b:02X}>")
        # piece -> id for normal pieces only: what codepoints and merges may turn into
        self.piece_to_id = {p: i for i, p in enumerate(self.pieces) if i >= BYTE_OFFSET + 256}
        # what each id prints as: byte tokens are one raw byte, <s> and </s> print nothing
        self.surface = list(self.pieces)
        for b in range(256):
            self.surface[BYTE_OFFSET + b] = bytes([b])
        self.surface[self.bos_id] = self.surface[self.eos_id] = b""

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = []
        if text:
            # SentencePiece's add_dummy_prefix: the text starts with a space
            ids.append(self.piece_to_id.get(b" ", ord(" ") + BYTE_OFFSET))
        for ch in text:  # one symbol per codepoint, or its UTF-8 bytes if not in the vocabulary
            b = ch.encode("utf-8")
            i = self.piece_to_id.get(b)
            ids.extend([i] if i is not None else [x + BYTE_OFFSET for x in b])
        ids = self._merge(ids)
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def _merge(self, ids: list[int]) -> list[int]:
        """BPE as run.c: repeatedly merge the adjacent pair whose concatenation is the
        highest-scoring piece, leftmost on ties, until no pair is in the vocabulary.

        run.c rescans all pairs after every merge (O(n^2)); we keep the candidate pairs in a heap
        keyed by (-score, position) and the symbols in a linked list, which picks the same pair
        each step. Positions never reorder: a merged symbol keeps its left position.
        """
        n = len(ids)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap = []

        def push(i):  # queue the pair starting at symbol i, if it is a piece
            j = nxt[i]
            if i >= 0 and j >= 0:
                m = self.piece_to_id.get(self.pieces[ids[i]] + self.pieces[ids[j]])
                if m is not None:
                    heapq.heappush(heap, (-self.scores[m], i, ids[i], ids[j], m))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, left, right, m = heapq.heappop(heap)
            j = nxt[i]
            # stale entry: one of the two symbols has been merged into something else since
            if ids[i] != left or j < 0 or ids[j] != right:
                continue
            ids[i], ids[j] = m, -1
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prv[nxt[j]] = i
            push(prv[i])
            push(i)
        return [i for i in ids if i >= 0]

    def decode_piece(self, prev_id: int | None, id: int) -> bytes:
        """The bytes token `id` prints as after `prev_id` (None at the start of the text).
        As run.c, the first piece of a text (after <s>) loses the dummy-prefix space. Bytes, not
        str: a multi-byte character may be split over several byte tokens."""
        if not 0 <= id < self.vocab_size:
            raise ValueError(f"token id {id} out of range for vocab_size {self.vocab_size}")
        piece = self.pieces[id]
        if (prev_id is None or prev_id == self.bos_id) and piece.startswith(b" "):
            return piece[1:]
        return self.surface[id]

    def decode(self, ids: Iterable[int]) -> str:
        out, prev = [], None
        for i in ids:
            i = int(i)
            out.append(self.decode_piece(prev, i))
            prev = i
        # join bytes first so characters split over byte tokens come out whole
        return b"".join(out).decode("utf-8", errors="replace")


def _read_llama2c_vocab(path: Path) -> tuple[int, list[bytes], list[float]]:
    data = path.read_bytes()
    if len(data) < 4:
        raise ValueError(f"{path}: too short for a llama2.c vocabulary (no header)")
    (max_token_length,) = struct.unpack_from("<i", data, 0)
    pieces, scores, off = [], [], 4
    while off < len(data):  # no count in the file: tokens run to the end
        i = len(pieces)
        if off + 8 > len(data):
            raise ValueError(f"{path}: truncated in the score/length of token {i}")
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        if n < 0 or off + n > len(data):
            raise ValueError(f"{path}: truncated or corrupt at token {i} (length {n})")
        pieces.append(data[off : off + n])
        scores.append(score)
        off += n
    return max_token_length, pieces, scores


def train_sentencepiece(
    texts: Iterable[str], model_path: str | os.PathLike, vocab_size: int = 512, **options
) -> Path:
    """Train a BPE SentencePiece vocabulary on `texts` and write it to `model_path`.

    Settings as llama2.c's tinystories.py: byte fallback (no <unk> in practice), digits split into
    single-digit pieces, whitespace kept as is (identity normalization). `options` override or add
    sentencepiece trainer flags. Returns the path of the written `.model`.
    """
    spm = _import_sentencepiece()
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    settings = dict(
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        unk_surface=" \u2047 ",  # " ⁇ ", what tinystories.py spells r" \342\201\207 "
        num_threads=os.cpu_count() or 1,
        minloglevel=2,  # sentencepiece logs every step to stderr otherwise
    )
    settings.update(options)
    with atomic_write(model_path) as f:  # never through a link, never a half-written file
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=f, **settings)
    return model_path


ACCEPTED = (
    "a SentencePiece .model, a llama2.c .bin, a .gguf holding a BPE vocabulary "
    "(tokenizer.ggml.model gpt2), a Hugging Face tokenizer.json or a folder holding one"
)


# what a tokenizer file's damage raises in its reader (see load_tokenizer)
READ_ERRORS = (OSError, RuntimeError, ValueError, KeyError, IndexError, TypeError, AttributeError)
READ_ERRORS += (RecursionError,)


def load_tokenizer(path: str | os.PathLike):
    """.model -> SentencePieceTokenizer, .bin -> Llama2cTokenizer, .gguf / tokenizer.json / a
    Hugging Face directory holding a tokenizer.json -> BPETokenizer. A file that is not what its
    name says (random bytes, a cut download, JSON of another shape) is a UsageError naming it and
    what is accepted; a missing one stays FileNotFoundError."""
    path = Path(path)
    try:
        if path.suffix == ".model":
            return SentencePieceTokenizer(path)
        if path.suffix == ".bin":
            return Llama2cTokenizer(path)
        if path.suffix == ".gguf":
            from data.bpe import BPETokenizer  # byte-level BPE: read only where a file holds it

            return BPETokenizer.from_gguf(_check_exists(path))
        if path.suffix == ".json" or (path.is_dir() and (path / "tokenizer.json").is_file()):
            from data.bpe import BPETokenizer

            return BPETokenizer.from_hf(path)
    except (FileNotFoundError, ImportError):
        raise
    # what a file's damage raises in the readers: sentencepiece's parse error, ValueError (json's
    # too), the lookups of a JSON or GGUF value of the wrong shape, json's recursion on nesting
    except READ_ERRORS as e:
        reason = " ".join(str(e).split()).removeprefix(f"{path}: ") or type(e).__name__
        if isinstance(e, KeyError | IndexError | TypeError | AttributeError):
            reason = f"not the layout its format has ({type(e).__name__}: {reason})"
        if len(reason) > 200:
            reason = reason[:200] + "..."
        raise UsageError(
            f"{path}: not a readable tokenizer: {reason}; accepted: {ACCEPTED}"
        ) from None
    raise UsageError(f"{path}: unknown tokenizer format; accepted: {ACCEPTED}")


def tokenizer_fingerprint(tok) -> str:
    """16 hex digits of sha256 over what decides the ids: the pieces in id order, their scores or
    merges, the special tokens, the pre-tokenizer patterns, and bos/eos ids. Not the file path or
    format: the same SentencePiece vocabulary from tokenizer.model and llama2.c's tokenizer.bin
    gives the same fingerprint, and so does a BPE vocabulary from a .gguf and a tokenizer.json,
    when both split the text the same way (Hugging Face's GGUF conversion drops SmolLM2's
    digit split, so its exported tokenizer.json differs from the .gguf, as its ids can)."""
    if hasattr(tok, "merges"):  # a BPETokenizer (data/bpe.py)
        content = dict(
            kind="bpe",
            pieces=tok.pieces,
            merges=[" ".join(m) for m in tok.merges],
            special=sorted(tok.special_tokens.items()),
            patterns=tok.patterns,
            ignore_merges=tok.ignore_merges,
        )
    elif isinstance(tok, SentencePieceTokenizer | Llama2cTokenizer):
        # one form for both: pieces with spaces (not "▁") as text, float32 scores; the text of
        # <unk>, <s>, </s> is left out (the .bin writes "\n<s>\n" where the .model has "<s>")
        if isinstance(tok, SentencePieceTokenizer):
            sp = tok.sp
            control = {i for i in range(tok.vocab_size) if sp.is_control(i) or sp.is_unknown(i)}
            pieces = [sp.id_to_piece(i).replace("\u2581", " ") for i in range(tok.vocab_size)]
            scores = [sp.get_score(i) for i in range(tok.vocab_size)]
        else:
            control = {0, tok.bos_id, tok.eos_id}
            pieces = [p.decode("utf-8", errors="replace") for p in tok.pieces]
            scores = tok.scores
        pieces = ["" if i in control else p for i, p in enumerate(pieces)]
        scores = [struct.unpack("<f", struct.pack("<f", s))[0] for s in scores]
        content = dict(kind="sentencepiece", pieces=pieces, scores=scores)
    else:
        raise TypeError(f"no fingerprint for {type(tok).__name__}")
    content.update(bos=tok.bos_id, eos=tok.eos_id)
    blob = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
