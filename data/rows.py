"""
Preference rows: reading them from files, whatever their format, and reporting the bad ones.

    pairs, skipped = read_pairs("prefs.jsonl", strict=False)   # [{"prompt", "chosen", ...}]

Files: JSON Lines (.jsonl, optionally .gz) or one JSON array (.json). Rows, detected one by one:
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
and counts them per reason. Nothing is dropped silently. Tokenizing and storing the pairs is
data/pairs.py's.
"""

import gzip
import json
import os
import re
import reprlib
import sys

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


def read_pairs(path, strict=True, report=print, subset_key=None):
    """Read preference pairs from a .jsonl / .jsonl.gz file, or a .json file holding one array.

    Returns (pairs, skipped): each pair is {"prompt", "chosen", "rejected", "format", "where"}
    with where = "file:line" (and "subset": the row's subset_key field, when given), and skipped
    maps each kind of bad row to its count. A bad row (bytes that are not UTF-8, a line over
    MAX_ROW_BYTES, invalid JSON, a missing key, ...) never stops the reading: it is reported as
    file:line (the physical line where the row starts) and the rest is read. strict=True raises
    BadRowError at the first one instead."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found")
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # gzip's bad header / truncated stream
        raise BadRowError(f"{path}: unreadable ({e})") from None
    pairs, skipped = [], {}

    def bad(e, lineno):
        if strict:
            raise BadRowError(f"{path}:{lineno}: {e}") from None
        report(f"skipping {path}:{lineno}: {e}")
        kind = str(e).split(":")[0]
        skipped[kind] = skipped.get(kind, 0) + 1

    if raw.lstrip().startswith(b"["):  # a JSON array (.json): each element is a row
        for lineno, row in _array_rows(path, raw):
            try:
                if isinstance(row, BadRowError):
                    raise row
                pairs.append({**to_pair(row, subset_key), "where": f"{path}:{lineno}"})
            except BadRowError as e:
                bad(e, lineno)
        return pairs, skipped
    lines, i = raw.split(b"\n"), 0
    while i < len(lines):
        lineno, used = i + 1, 1
        try:
            if len(lines[i]) > MAX_ROW_BYTES:
                raise BadRowError(f"row too long: {len(lines[i]):,} bytes > {MAX_ROW_BYTES:,}")
            if lines[i].strip():
                row, used = _parse_lines(lines, i, subset_key)
                pairs.append({**row, "where": f"{path}:{lineno}"})
        except BadRowError as e:
            bad(e, lineno)
            used = max(used, getattr(e, "lines", 1))
        i += used
    return pairs, skipped


def _array_rows(path, raw):
    """(line, row) for each element of a JSON array. One syntax error spoils the whole array
    (there is no next line to resume at), so it stops the reading, naming its line."""
    try:
        text = _decode(raw)
    except BadRowError as e:
        raise BadRowError(f"{path}: {e} (a JSON array is read whole)") from None
    decoder, i, line = json.JSONDecoder(), text.index("[") + 1, 1
    seen = 0  # text[:seen] holds `line - 1` newlines: count each character once
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1  # (a stray comma is forgiven; a missing one is not: raw_decode stops there)
        if i >= len(text):
            lines = text.count("\n") + 1
            raise BadRowError(f"{path}:{lines}: invalid JSON: the array has no closing ']'")
        if text[i] == "]":
            return
        line, seen = line + text.count("\n", seen, i), i
        try:
            row, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            msg = f"{path}:{e.lineno}: invalid JSON: {e.msg} at column {e.colno}"
            raise BadRowError(msg) from None
        except RecursionError:  # one bad element: skip to its end, read on
            row, i = too_deep(), _value_end(text, i)
        yield line, row


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


def _decode(raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start : e.start + 1].hex()
        raise BadRowError(f"not UTF-8: byte 0x{bad} at column {e.start + 1}") from None


def _parse_lines(lines, i, subset_key=None):
    """(row, number of physical lines it used) for the row starting at lines[i]. A row whose
    string holds a raw newline spans several lines: report it once, at its first line, and
    skip the lines it covers, instead of reporting each piece at the wrong line."""
    text = _decode(lines[i])
    try:
        return parse_row(text, subset_key), 1
    except BadRowError as e:
        if not str(e).startswith("invalid JSON: Unterminated string"):
            raise
        for j in range(i + 1, min(len(lines), i + MAX_ROW_LINES)):
            text += "\n" + _decode(lines[j])
            try:
                json.loads(text, strict=False)  # strict=False: allow raw newlines in strings
            except json.JSONDecodeError:
                continue
            err = BadRowError(
                f"invalid JSON: a raw newline inside a string (lines {i + 1}-{j + 1})"
            )
            err.lines = j - i + 1
            raise err from None
        raise


def parse_row(line: str, subset_key=None):
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRowError(f"invalid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:  # json's parser recurses once per level: [[[[...]]]] 100k deep
        raise too_deep() from None
    return to_pair(row, subset_key)


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
