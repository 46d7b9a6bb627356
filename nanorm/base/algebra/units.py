"""
Units and percent signs after a number, for verifiable.canonical() and answers_match().

A unit says what a number counts; it is no part of the answer, so it goes:
- words after a number and a space: "18 dollars", "15 cm^2" (drop_words). A single letter
  after a space stays algebra ("5 m" could be 5m), and so do "5 or 6" and "x cm".
- a unit attached to a number: "45km", "12.5cm^2", "100m2" (attached); "5m" and "2k" stay
  algebra. One letter with a power is a unit only as m: "100 m^2", "100 m2" (areas).
- a unit in a text command at the end, after a number or a closing brace: "5 \\text{ m}",
  "\\frac{1}{3}\\,\\mathrm{cm}^2", "12\\mathrm{~km}/\\mathrm{h}" (drop_text_unit). The command
  says it is not a variable, so one letter is a unit here; "\\mathrm{e}" and "\\mathrm{i}" are
  the constants and stay.
Percent (is_percent): "28\\%", "28 percent", "28 pct" is 28 and also 0.28 (Math-Verify
equates both with it); answers_match compares the other side both ways.
"""

import re

_UNIT_WORD = re.compile(r"(?:[a-zA-Z]{2,}|m\^?(?=\{?[23]))(?:\^?\{?[23]\}?)?|\^\{?[23]\}?")
_NOT_UNITS = {"or", "and", "to", "plus", "minus", "times", "over", "pi", "is", "not", "of"}
_ATTACHED = re.compile(r"(?<![0-9,.])([-+]?[0-9][0-9,.]*)([a-zA-Z]{1,3})(\^?\{?[23]\}?)?")
_UNITS = set("km cm mm m kg g mg ml mL L ft in mi h hr hrs min s sec mph".split())  # "45km"
COMMAND = re.compile(r"\\(?:[a-zA-Z]+|.)", re.S)  # one LaTeX command (verifiable.py too)

# one unit in a text command: "\text{ km}", "\mathrm{~cm}^2", "\text{km/h}"; the content is
# letters, with a "/" or a power, nothing else ("\text{ and }" is a word the caller keeps)
_TEXT_UNIT = re.compile(
    r"\\(?:text|textrm|mathrm|mbox|rm)\s*\{[\s~]*([a-zA-Z]+(?:\s*/\s*[a-zA-Z]+)?)"
    r"(?:\^\{?[23]\}?)?[\s~]*\}(?:\s*\^\s*\{?[23]\}?)?\s*"
)
_SPACING = ("\\,", "\\;", "\\:", "\\!", "\\ ", "~", "\\quad")
_PERCENT = re.compile(r"%|\bpercent(?:age)?\b|\bpct\b")


def drop_words(s):
    """ "18 dollars" -> "18", "15 cm^2" -> "15": trailing words after a number are units.
    Needs a space, so "2k" and "5x" stay algebra; "5 or 6" and "x cm" keep their words."""
    words = s.split()
    n = len(words)
    while n > 1 and _UNIT_WORD.fullmatch(words[n - 1]) and words[n - 1] not in _NOT_UNITS:
        n -= 1
    head = " ".join(words[:n])
    bare = COMMAND.sub("", head)
    if n == len(words) or not any(c.isdigit() for c in bare) or any(c.isalpha() for c in bare):
        return s
    return head


def attached(s):
    """ "45km" -> "45", "3,000.5m^2" -> "3,000.5"; "5m" and "2k" stay (a single letter only
    after a decimal point or a thousands comma); anything else is returned as it is."""
    m = None if s[-1:].isdigit() and "^" not in s and s[-2:-1] != "m" else _ATTACHED.fullmatch(s)
    if m and m[2] in _UNITS and (len(m[2]) > 1 or "." in m[1] or "," in m[1] or m[3]):
        return m[1]
    return s


def drop_text_unit(s):
    """s without one or two units in text commands at its end ("12\\text{ km}/\\text{h}"),
    when a number or a closing brace comes before them; else s. Linear: rfind and fullmatch."""
    head = s.rstrip().rstrip("$").rstrip()
    for _ in range(2):
        start = max(head.rfind("\\text"), head.rfind("\\mathrm"), head.rfind("\\mbox"),
                    head.rfind("\\rm"))  # fmt: skip
        unit = _TEXT_UNIT.fullmatch(head, start) if start > 0 else None
        if unit is None or unit[1] in ("e", "i"):
            break
        head = head[:start].rstrip()
        if head.endswith("/"):  # "km / h": the second unit, "/" between
            head = head[:-1].rstrip()
        while head.endswith(_SPACING):
            head = head[: -len(next(x for x in _SPACING if head.endswith(x)))].rstrip()
        if head[-1:].isdigit() or head[-1:] == "}" and not head.endswith("\\}"):
            s = head
    return s


def is_percent(s):
    """Whether an answer is written as a percentage: "28\\%", "28 %", "28 percent", "28 pct"."""
    return "%" in s or (("per" in s or "pct" in s) and bool(_PERCENT.search(s)))
