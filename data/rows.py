"""
Preference rows: reading them from files, whatever their format, and reporting the bad ones.

    pairs, skipped = read_pairs("prefs.jsonl", strict=False)   # [{"prompt", "chosen", ...}]

Files: JSON Lines (.jsonl, optionally .gz: one row object a line) or one JSON array (.json,
optionally .gz: the whole file is the array). Rows, detected one by one:
    string pairs       {"prompt": str, "chosen": str, "rejected": str}: two responses to a prompt
    HH dialogues       {"chosen": str, "rejected": str}: two full HH-RLHF dialogues (split_dialogue)
    conversational     {"chosen": [messages], "rejected": [messages]} (implicit prompt: the shared
                       leading messages) or with "prompt": [messages] (explicit prompt), TRL's
                       formats; messages are {"role": system|user|assistant, "content": str}
A conversational pair's prompt is a list of (role, text) turns; data/chat.py renders either kind.

Bad rows (bytes that are not UTF-8, overlong lines, invalid JSON, JSON nested past Python's
recursion limit, text holding a lone UTF-16 surrogate ("\\ud800": no tokenizer can encode it),
missing keys, non-string values, empty responses, chosen == rejected; in conversations, a prompt
that differs between chosen and rejected, no final assistant turn, unknown roles, non-string
content) are reported with file and line. strict=True stops at the first; strict=False skips them
and counts them per reason. Nothing is dropped silently. Files are read as they come, a chunk at
a time, so memory follows the rows kept, not the file: a line over MAX_ROW_BYTES is skipped
without being held, blank lines cost nothing, and a .gz stops at MAX_UNPACKED_BYTES unpacked.
Tokenizing and storing the pairs is data/pairs.py's.
"""

import collections
import gzip
import itertools
import json
import os
import re
import reprlib
import sys
import zlib

from nanorm.base.command import UsageError

ASSISTANT = "\n\nAssistant:"


class BadRowError(UsageError):  # a ValueError; one line naming file:line from run
    pass


def split_dialogue(chosen: str, rejected: str):
    """HH-RLHF: the prompt is everything up to and including the last "\\n\\nAssistant:" that
    both dialogues share; the responses are what follows. In the few rows whose earlier turns
    differ (a handful of HH-RLHF rows), the shared prefix ends at an earlier turn, so the
    responses carry the differing turns too; prompt + response is still each full dialogue."""
    n = 0
    limit = min(len(chosen), len(rejected))
    while n < limit and chosen[n] == rejected[n]:
        n += 1
    cut = chosen.rfind(ASSISTANT, 0, n)  # the last marker wholly inside the shared prefix
    cut = cut + len(ASSISTANT) if cut >= 0 else 0
    return chosen[:cut], chosen[cut:], rejected[cut:]


ROLES = ("system", "user", "assistant")


def split_conversation(prompt, chosen, rejected):
    """TRL's conversational rows -> (prompt turns [(role, text)], chosen text, rejected text).
    Each side's conversation is prompt + its messages (a prompt string is one user turn; a side
    that already starts with the prompt's messages, as UltraFeedback's do, holds it once). The
    response is the last message, an assistant's; everything before it must be the same on both
    sides, else the pair would compare two answers to two different prompts."""
    if prompt is None:
        head = []
    elif isinstance(prompt, str):
        head = [("user", prompt)]
    else:
        head = _messages("prompt", prompt)
    sides = []
    for key, messages in (("chosen", chosen), ("rejected", rejected)):
        turns = _messages(key, messages)
        turns = turns if turns[: len(head)] == head else head + turns
        if turns[-1][0] != "assistant":
            raise BadRowError(
                f"no final assistant turn: '{key}' ends with a {turns[-1][0]} message; "
                "the response must be the last message, with role assistant"
            )
        sides.append(turns)
    c, r = sides
    if c[:-1] != r[:-1]:
        pairs = enumerate(zip(c[:-1], r[:-1], strict=False))
        i = next((i for i, (a, b) in pairs if a != b), min(len(c), len(r)) - 1)
        raise BadRowError(
            f"prompt differs: chosen and rejected differ at message {i + 1} of the conversation, "
            "before the final assistant turn; both must share every message but the response"
        )
    return c[:-1], c[-1][1], r[-1][1]


def _messages(key, messages):
    """A row's list of {"role", "content"} messages -> [(role, text)], each one checked."""
    if not isinstance(messages, list) or not messages:
        got = type(messages).__name__ if messages != [] else "an empty list"
        raise BadRowError(
            f"invalid messages: '{key}' is {got}, expected a list of {{role, content}} objects"
        )
    turns = []
    for i, m in enumerate(messages):
        where = f"'{key}' message {i + 1}"
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise BadRowError(f"invalid message: {where} is not an object with role and content")
        if m["role"] not in ROLES:
            raise BadRowError(
                f"unknown role: {where} has role {reprlib.repr(m['role'])}; use system, user or "
                "assistant"
            )
        if not isinstance(m["content"], str):
            kind = type(m["content"]).__name__
            raise BadRowError(f"non-string content: {where} has {kind} content (text only)")
        turns.append((m["role"], m["content"]))
    return turns


MAX_ROW_BYTES = 4 << 20  # a longer line is reported, not parsed (HH's longest row is ~10 kB)
MAX_ROW_LINES = 64  # how far a row broken by a raw newline is followed before giving up
MAX_UNPACKED_BYTES = 4 << 30  # of a .gz, decompressed: a few MB of gzip can unpack to terabytes
MAX_JSON_BYTES = 256 << 20  # a .json array is parsed whole; JSON Lines are read row by row
CHUNK = 1 << 20  # how much of a file is read at a time
BOM = b"\xef\xbb\xbf"  # some editors start UTF-8 text with it; JSON has no use for it


def read_pairs(path, strict=True, report=print, subset_key=None):
    """Read preference pairs from a .jsonl / .jsonl.gz file, or a .json / .json.gz file holding
    one array (a .json of JSON Lines, as `datasets`' to_json writes, is read as JSON Lines).

    Returns (pairs, skipped): each pair is {"prompt", "chosen", "rejected", "format", "where"}
    with where = "file:line" (and "subset": the row's subset_key field, when given), and skipped
    maps each kind of bad row to its count. A bad row (bytes that are not UTF-8, a line over
    MAX_ROW_BYTES, invalid JSON, a line that is not one row object, a missing key, ...) never
    stops the reading: it is reported as file:line (the physical line where the row starts) and
    the rest is read. strict=True raises BadRowError at the first one instead. What spoils the
    whole file (a broken gzip stream, a .gz unpacking past MAX_UNPACKED_BYTES, anything after a
    .json's array) raises BadRowError naming the file, strict or not."""
    pairs, skipped = [], {}
    for lineno, row in iter_rows(path, measure=not strict):
        try:
            if isinstance(row, BadRowError):
                raise row
            pairs.append({**to_pair(row, subset_key), "where": f"{path}:{lineno}"})
        except BadRowError as e:
            if strict:
                raise BadRowError(f"{path}:{lineno}: {e}") from None
            report(f"skipping {path}:{lineno}: {e}")
            kind = str(e).split(":")[0]
            skipped[kind] = skipped.get(kind, 0) + 1
    return pairs, skipped


def iter_rows(path, measure=True):
    """(line, parsed JSON value) of each row of a preference file, or (line, BadRowError) for a
    row that cannot be parsed; rows are read as they come, so memory follows the rows, not the
    file (blank lines cost nothing). measure=False reports a line over MAX_ROW_BYTES as soon as
    it is seen (its length then is "more than"); else its length is counted as it is skipped."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found")
    gz = str(path).endswith(".gz")
    try:
        with gzip.open(path, "rb") if gz else open(path, "rb") as f:
            if re.search(r"\.json(\.gz)?$", str(path)) and _first_byte(path, f) == b"[":
                f.seek(0)
                yield from _array_rows(path, _read_array(path, f, gz))
            else:
                f.seek(0)
                yield from _line_rows(path, _lines(path, f, measure))
    except (OSError, EOFError, zlib.error) as e:  # gzip's bad header, cut or corrupt stream
        raise BadRowError(
            f"{path}: unreadable ({e}): the file is damaged or not what its name says; copy it "
            "again"
        ) from None


def _chunks(path, f):
    """The file's bytes, CHUNK at a time, a leading BOM dropped; of a .gz, at most
    MAX_UNPACKED_BYTES (a plain file holds what its size says)."""
    total, first, gz = 0, True, str(path).endswith(".gz")
    while chunk := f.read(CHUNK):
        total += len(chunk)
        if gz and total > MAX_UNPACKED_BYTES:
            raise BadRowError(
                f"{path}: more than {MAX_UNPACKED_BYTES:,} bytes once decompressed: split it "
                "into several files (--src takes many), or decompress it if it is real data"
            )
        if first and chunk.startswith(BOM):
            chunk = chunk[len(BOM) :]
        first = False
        yield chunk


def _first_byte(path, f):
    """The first byte that is not whitespace (b"" in an empty file): "[" starts a JSON array."""
    for chunk in _chunks(path, f):
        if chunk := chunk.lstrip():
            return chunk[:1]
    return b""


def _read_array(path, f, gz):
    """A .json file's text, whole: at most MAX_JSON_BYTES, its size checked before it is read."""
    over = os.path.getsize(path) > MAX_JSON_BYTES if not gz else False
    raw = b"" if over else f.read(MAX_JSON_BYTES + 1)
    if over or len(raw) > MAX_JSON_BYTES:
        unpacked = " once decompressed" if gz else ""
        raise BadRowError(
            f"{path}: a JSON array of more than {MAX_JSON_BYTES:,} bytes{unpacked}, which would "
            "be parsed whole: write it as JSON Lines (.jsonl, one row a line), read row by row"
        )
    raw = raw.removeprefix(BOM)
    try:
        return _decode(raw)
    except BadRowError as e:
        raise BadRowError(f"{path}: {e} (a JSON array is read whole)") from None


_BLANK = re.compile(rb"[ \t\r\n]*")


def _lines(path, f, measure=True):
    """(line number, bytes) of each line holding more than whitespace, split from CHUNK-sized
    reads: blank lines are counted in C, never held; a line over MAX_ROW_BYTES is never held
    whole either: it comes as (line number, BadRowError) and is skipped to its end."""
    chunks = itertools.chain(_chunks(path, f), [b"\n"])  # the last line ends like the others
    rest, lineno = b"", 1  # rest: the start of a line whose end is not read yet
    for chunk in chunks:
        buf, pos = rest + chunk, 0
        while True:
            end = _BLANK.match(buf, pos).end()
            if (nl := buf.rfind(b"\n", pos, end)) >= 0:  # blank lines: counted, not split
                lineno += buf.count(b"\n", pos, end)
                pos = nl + 1
            if (nl := buf.find(b"\n", end)) < 0:
                break
            yield lineno, buf[pos:nl] if nl - pos <= MAX_ROW_BYTES else _too_long(nl - pos)
            lineno, pos = lineno + 1, nl + 1
        rest = buf[pos:]
        if len(rest) > MAX_ROW_BYTES:  # read on to the line's end, keeping none of it
            n, blank = len(rest), _BLANK.fullmatch(rest)  # (spaces alone: a blank line)
            rest, told = b"", False
            for chunk in itertools.chain([b""], chunks):
                if not blank and not measure and not told:  # strict: stop as soon as seen
                    told = True
                    yield lineno, _too_long(n, more=True)
                nl = chunk.find(b"\n")
                blank = blank and _BLANK.fullmatch(chunk, 0, len(chunk) if nl < 0 else nl)
                if nl >= 0:
                    n, rest = n + nl, chunk[nl + 1 :]
                    break
                n += len(chunk)
            if not blank and not told:
                yield lineno, _too_long(n, more=not measure)
            lineno += 1


def _too_long(n, more=False):
    n = f"more than {MAX_ROW_BYTES:,} bytes" if more else f"{n:,} bytes > {MAX_ROW_BYTES:,}"
    return BadRowError(f"row too long: {n}")


def _line_rows(path, lines):
    """(line, row or BadRowError) for each JSON Lines row. A row whose string holds a raw
    newline spans several lines: it is reported once, at its first line, and the lines it
    covers are skipped, instead of reporting each piece at the wrong line. A file whose first
    line opens an array alone is a JSON array written over many lines: refused, naming it,
    rather than each of its lines reported as a bad row."""
    ahead = collections.deque()  # lines read to follow a broken row, then given back
    first = True
    while ahead or (nxt := next(lines, None)) is not None:
        lineno, line = ahead.popleft() if ahead else nxt
        if first and isinstance(line, bytes) and line.strip() == b"[":
            raise BadRowError(
                f"{path}:{lineno}: a JSON array starts here, over many lines: a .jsonl file "
                "holds one row object a line; an array of rows is a .json file: rename it"
            )
        first = False
        if isinstance(line, BadRowError):
            yield lineno, line
            continue
        try:
            text = _decode(line)
            row = _parse(text)
            if isinstance(row, list):  # never read as the file's rows: this line is one row
                raise BadRowError(f"invalid row: expected a JSON object, got an array{_hint(text)}")
            yield lineno, row
        except BadRowError as e:
            if str(e).startswith("invalid JSON: Unterminated string"):
                e = _raw_newline(lineno, text, lines, ahead) or e
            yield lineno, e


def _raw_newline(lineno, text, lines, ahead):
    """The error for a row broken by raw newlines, at `lineno`, if the lines after it close it
    (they are then used up); else None, and every line read is given back to `ahead`."""
    read, last = [], lineno
    while len(text) <= MAX_ROW_BYTES:
        nxt = ahead.popleft() if ahead else next(lines, None)
        if nxt is None:
            break
        read.append(nxt)
        j, line = nxt
        if j >= lineno + MAX_ROW_LINES or isinstance(line, BadRowError):
            break
        try:
            text += "\n" * (j - last) + _decode(line)  # blank lines between come back as "\n"
        except BadRowError:
            break
        last = j
        try:
            json.loads(text, strict=False)  # strict=False: allow raw newlines in strings
        except (ValueError, RecursionError):  # JSONDecodeError, or a number past int's limit
            continue
        err = BadRowError(f"invalid JSON: a raw newline inside a string (lines {lineno}-{j})")
        return err  # the lines it covers are used up
    ahead.extendleft(reversed(read))
    return None


def _array_rows(path, text):
    """(line, row) for each element of a .json file's one JSON array. One syntax error spoils
    the whole array (there is no next line to resume at), so it stops the reading, naming its
    line, and so does anything after the array's closing "]": a second array would be lost."""
    decoder, i, line = json.JSONDecoder(), text.index("[") + 1, 1
    seen = 0  # text[:seen] holds `line - 1` newlines: count each character once
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1  # (a stray comma is forgiven; a missing one is not: raw_decode stops there)
        if i >= len(text):
            lines = text.count("\n") + 1
            raise BadRowError(f"{path}:{lines}: invalid JSON: the array has no closing ']'")
        if text[i] == "]":
            after = _SPACE.match(text, i + 1).end()
            if after < len(text):  # a second array, rows as JSON Lines: never a silent prefix
                raise BadRowError(
                    f"{path}:{text.count(chr(10), 0, after) + 1}: more JSON after the array "
                    f"that ends at line {text.count(chr(10), 0, i) + 1}: a .json file is one "
                    "array of rows; put every row in it, or one row a line in a .jsonl file"
                )
            return
        line, seen = line + text.count("\n", seen, i), i
        try:
            row, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            msg = f"{path}:{e.lineno}: invalid JSON: {e.msg} at column {e.colno}"
            raise BadRowError(msg) from None
        except RecursionError:  # one bad element: skip to its end, read on
            row, i = too_deep(), _value_end(text, i)
        except ValueError:  # a number past int's digit limit: one bad element, read on
            row, i = number_too_long(), _value_end(text, i)
        yield line, row


_SPACE = re.compile(r"[ \t\r\n]*")
_JSON_PARTS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[][{}]')  # a string, or a bracket


def _value_end(text, i):
    """Where the JSON object or array starting at text[i] ends, found without recursion."""
    depth = 0
    for m in _JSON_PARTS.finditer(text, i):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(m.group(), 0)
        if depth == 0:
            return m.end()
    return len(text)


def too_deep():
    return BadRowError(
        f"nested too deep: JSON nested past Python's limit of {sys.getrecursionlimit()} levels "
        "(a row is an object of strings and lists of messages)"
    )


def number_too_long():
    return BadRowError(
        f"number too long: over {sys.get_int_max_str_digits()} digits (no field of a pair is a "
        "number this long)"
    )


def _decode(raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start : e.start + 1].hex()
        raise BadRowError(f"not UTF-8: byte 0x{bad} at column {e.start + 1}") from None


def _parse(text):
    """One JSON Lines row's text -> its JSON value."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRowError(f"invalid JSON: {e.msg} at column {e.colno}{_hint(text)}") from None
    except RecursionError:  # json's parser recurses once per level: [[[[...]]]] 100k deep
        raise too_deep() from None
    except ValueError:  # an integer past Python's digit limit (4300 by default)
        raise number_too_long() from None


def _hint(text):
    """What a line that opens an array likely is: a .json file's array, in a .jsonl file."""
    if not text.lstrip().startswith("["):
        return ""
    return " (a .jsonl file holds one row object a line; an array of rows is a .json file)"


def parse_row(line: str, subset_key=None):
    return to_pair(_parse(line), subset_key)


def to_pair(row, subset_key=None):
    """One parsed row, in any of the formats above -> {"prompt", "chosen", "rejected",
    "format"} (+ "subset", the row's subset_key field, when given)."""
    if not isinstance(row, dict):
        raise BadRowError(f"invalid row: expected a JSON object, got {type(row).__name__}")
    for k in ("chosen", "rejected"):
        if k not in row:
            raise BadRowError(f"missing key: '{k}'")
    if isinstance(row["chosen"], list) or isinstance(row["rejected"], list):
        args = row.get("prompt"), row["chosen"], row["rejected"]
        prompt, chosen, rejected = split_conversation(*args)
        form = f"conversational ({'explicit' if 'prompt' in row else 'implicit'} prompt)"
    else:
        for k in ("prompt", "chosen", "rejected") if "prompt" in row else ("chosen", "rejected"):
            if not isinstance(row[k], str):
                raise BadRowError(f"non-string value: '{k}' is {type(row[k]).__name__}")
        if "prompt" in row:
            prompt, chosen, rejected = row["prompt"], row["chosen"], row["rejected"]
            form = "string pairs"
        else:
            prompt, chosen, rejected = split_dialogue(row["chosen"], row["rejected"])
            form = "HH dialogues"
    if isinstance(prompt, str):
        _encodable("'prompt'", prompt)
    else:
        for i, (_, text) in enumerate(prompt):
            _encodable(f"the prompt's message {i + 1}", text)
    _encodable("'chosen'", chosen)
    _encodable("'rejected'", rejected)
    for k, v in (("chosen", chosen), ("rejected", rejected)):
        if not v.strip():
            raise BadRowError(f"empty response: '{k}' is empty")
    if chosen == rejected:
        raise BadRowError("identical responses: chosen == rejected")
    pair = {"prompt": prompt, "chosen": chosen, "rejected": rejected, "format": form}
    if subset_key is not None:
        subset = row.get(subset_key)
        if subset is None or subset == "":
            raise BadRowError(f"missing key: '{subset_key}' (--subset_key): the row's subset")
        if not isinstance(subset, str | int) or isinstance(subset, bool):  # ids name subsets too
            kind = type(subset).__name__
            raise BadRowError(f"non-string value: '{subset_key}' (--subset_key) is {kind}")
        pair["subset"] = str(subset)
        _encodable(f"'{subset_key}' (--subset_key)", pair["subset"])
    return pair


def _encodable(what, text):
    """JSON's "\\ud800" parses to a str no UTF-8 encoder (no tokenizer) accepts: a bad row."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRowError(
            f"lone surrogate: {what} holds U+{ord(text[e.start]):04X} at character "
            f"{e.start + 1}, half of a UTF-16 pair; escape the whole character (both halves)"
        ) from None
