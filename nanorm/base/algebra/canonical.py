"""
An answer as a canonical string, and the policies of answers_match (verifiable.py) that decide
what two answers written differently have in common.

    canonical("\\dfrac{3}{4}\\,\\text{m}")  ->  "\\frac{3}{4}"
    fold("\\text{Monday}") -> "\\text{monday}";  as_tuple("{1,3}", "(1,3)")

answers_match is exact: both answers become a canonical string (spacing, \\left, \\text{}, $,
degrees and units gone), then a key (exact.key): 3/4 == \\frac34 == 0.75; tuples and intervals
keep order; lists, sets and a \\pm b are sets ("or", "and", ";" separate); matrices
compare by cell; equations up to a factor. Policies (tests cover both sides of each):
- Labels: "(a,b)=(2,7)" == "(2,7)", "g(x)=2" == "2", a chain "y=2+2+3=9=7" is 7; "x+1=5" is
  an equation, not 5; "x=5" != "y=5". Named values: "x=2, y=3" == "(2,3)" (written order) and
  == "(x,y)=(2,3)" == "y=3, x=2".
- Relations are the sets they allow: "y \\geq 3" == "[3,\\infty)", "-40<b<6" == "(-40,6)".
- Degrees: "30^\\circ" == "30" != "\\pi/6" (Math-Verify's reading); after sin, cos, tan ... they
  are the angle: "\\sin 30^\\circ" == "1/2" (Math-Verify: sin of 30 radians).
- Numbers: "1,000", "1 000" and "14{,}916" are one number, "32, 349" and "1 2 3" lists, "0,25"
  a decimal comma against a number; units after a number go ("2,500.75€", "45km",
  "5\\text{ m}": units.py), "5m" stays algebra. "50%" == "50", and a reference "50%" is also
  the response "0.5" (not the other way: a response "50%" to the reference 0.5 is 50, as the
  dev labels have it). "3:4" == "3/4" (two ratios compare as written: "3:45" is a time).
  "4210_5" == "4210" (a base on one side only).
- Rounding (decimals.py): a number written with 2+ decimals is a value with no exact decimal
  that long, rounded or cut (0.33 for 1/3); 0.8 is not 3/4. Or, written to 6+ places, both
  agree to 6 (Math-Verify's rule: 3.141593 is pi). "x = 1/3 \\approx 0.33" is 1/3.
- A list never equals one of its elements (a set of one does: "\\{2\\}" == "2"); "{1,3}" is
  the set \\{1,3\\}. Repeats in a list do not count ("(1,2),(1,2)" lists one solution); a set
  or a bare list answers a tuple of its items in the order written ("{1,3}" == "1, 3" ==
  "(1,3)" != "(3,1)"). Measured on dev as
  Math-Verify's choices: dev agreement 0.994 -> 0.998 (repeats) -> 1.000 (set as tuple), no
  false positive added; dev cannot tell a bare list as a tuple from not (both 1.000): Math-Verify
  reads "1, 3" as "(1,3)", so nanoRM does, in the order written (Math-Verify: any order when
  the list is the reference, the written order when it is the prediction).
- Solutions: "p=5,q=2;p=7,q=2" == "(5,2),(7,2)" (";" between groups that name the same
  variables in alphabetical order). A reference too long to be an answer is read like a response.
- Case: words of 2+ letters ignore it ("\\text{Monday}" == "monday"), single letters do not
  ("B" != "b", "3R^2" != "3r^2"); Math-Verify lowercases every symbol. Dev cannot tell the two.
- Functions of numbers take their value (roots.py, logs.py, integers.py): "8^{1/3}" == "2",
  "\\log_2 8" == "3" ("\\log" alone is base 10, as in latex2sympy), "\\binom{5}{2}" == "10",
  "5!" == "120" ("the answer is 3!" in plain text is 3: extract.py); "|-3|" is not read.
What the algebra leaves out is listed in exact.py.
"""

import re
from functools import lru_cache

from nanorm.base.algebra.exact import split_top, wraps
from nanorm.base.algebra.matrices import key
from nanorm.base.algebra.named import solutions
from nanorm.base.algebra.spellings import respell
from nanorm.base.algebra.units import COMMAND, attached, drop_text_unit, drop_words

_TEXT_CMDS = r"text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox"
_TEXT_SPLIT = re.compile(r"(\\(?:" + _TEXT_CMDS + r")\s*\{|\\.|[{}])", re.S)
_REWRITES = {  # what each group of commands becomes; relations become one character
    "": "\\! \\, \\; \\: \\left \\right \\displaystyle \\% \\$ \\[ \\] \\( \\) \\small \\large \\Large"
    " \\LARGE \\huge \\Huge",
    " ": "\\quad \\qquad",
    "\\frac": "\\dfrac \\tfrac \\cfrac",
    "\\binom": "\\dbinom \\tbinom",
    "*": "\\cdot \\times",
    "\u00b0": "\\circ \\degree",
    "\u2264": "\\le \\leq \\leqslant",
    "\u2265": "\\ge \\geq \\geqslant",
    "\u2260": "\\ne \\neq",
}
_COMMAND_MAP = {c: to for to, commands in _REWRITES.items() for c in commands.split()} | {
    "\\ ": " ",
    "\\{": "\u2983",
    "\\}": "\u2984",
    "\\lt": "<",
    "\\div": "/",
    "\\varnothing": "\\emptyset",
    "\\backslash": "\\setminus",
    "\\gt": ">",
    "\\approx": "\u2248",
}
# whitespace goes, except the one space LaTeX needs between a command and a letter: "\cot x"
_SPACES = re.compile(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])|\s+")
# single-token arguments get braces so \frac34, \frac 3 4 and \frac{3}{4} read the same
_ARG = r" ?(\\[a-zA-Z]+|[0-9a-zA-Z])"  # one token: a command, a digit or a letter
_BRACE_ARGS = (  # (only when this is in the string, pattern, replacement)
    ("\\frac", re.compile(r"\\frac" + _ARG + _ARG), r"\\frac{\1}{\2}"),
    ("\\frac", re.compile(r"\\frac" + _ARG + r"\{"), r"\\frac{\1}{"),
    ("\\frac", re.compile(r"\\frac\{([^{}]*)\}" + _ARG), r"\\frac{\1}{\2}"),
    ("\\sqrt", re.compile(r"\\sqrt" + _ARG), r"\\sqrt{\1}"),
    ("^", re.compile(r"\^([0-9]+|[a-zA-Z])"), r"^{\1}"),  # x^10 is x^{10} as typed
    ("_", re.compile(r"_([0-9]+|[a-zA-Z])"), r"_{\1}"),
)
_THOUSANDS = re.compile(r"[-+]?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")
DECIMAL_COMMA = re.compile(r"(?<![0-9])[-+]?[0-9]+,(?:[0-9]{1,2}|[0-9]{4,})")  # not 3 digits
_ESCAPED_TWICE = re.compile(r"(?<!\\)\\\\(?=[a-zA-Z]{2})")
_SPACED = re.compile(r"(?<=[0-9]) +(?=[0-9])")
_SPACED_THOUSANDS = re.compile(r"[-+]?[0-9]{1,3}(?: [0-9]{3})+(?:\.[0-9]+)?")
BASE = re.compile(r"(?<![0-9A-Z])([0-9A-Z]+)_\{([0-9]+)\}")  # 4210_{5} after canonical()
_OR_AND = re.compile(r"(?<!\s)\s+(?:or|and)\s+|(?<=\))or(?=\()")
_OVER = re.compile(r"\{([^{}]*)\\over(?![a-zA-Z])([^{}]*)\}")
_FRAC_SPACED = re.compile(r"\\frac\s+([0-9a-zA-Z])\s+([0-9a-zA-Z])(?![0-9a-zA-Z])")
_LOG_BASE = re.compile(r"\\log_([0-9]) *")  # "\log_2 8": the base is one digit, as in TeX
RATIO = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?):([0-9]+(?:\.[0-9]+)?)")  # "3:4"
# an angle in degrees right after a trigonometric function: "\sin 30^\circ" is \sin(30\pi/180)
_TRIG_DEGREES = re.compile(
    r"(\\(?:sin|cos|tan|cot|sec|csc)(?:\^\{?[0-9]\}?)?[ ({]*)([0-9]+(?:\.[0-9]+)?) ?"
    r"(?:\^\{\u00b0\}|\^\u00b0|\u00b0)"
)


def _unwrap_text(s):
    """\\text{Evelyn} -> " Evelyn ", in one pass with a stack (nesting is fine)."""
    out, stack = [], []
    for piece in _TEXT_SPLIT.split(s):
        if piece == "{":
            stack.append("}")
            out.append("{")
        elif piece == "}":
            out.append(stack.pop() if stack else "}")
        elif piece.startswith("\\") and piece.endswith("{") and len(piece) > 2:
            stack.append(" ")
            out.append(" ")
        else:
            out.append(piece)
    return "".join(out)


@lru_cache(maxsize=4096)  # a pure function of the text: in RL a prompt's reference is the
def canonical(answer):  # same for every sampled completion (8-64), so it is read once
    """The answer as a canonical string: no spacing, delimiters, units or LaTeX noise."""
    s = respell(answer)  # unicode, "inf", " sqrt 2", "2**10", "5^{\\text{th}}": spellings.py
    if "\\" in s:
        if "{" in s:
            s = _unwrap_text(drop_text_unit(s))  # "5\\text{ m}" -> "5"
        s = s.replace("\\! ", "\\!")  # "11,\\! 111" is one number; "32, 349" is a list
        s = _ESCAPED_TWICE.sub(r"\\", s)  # "\\\\frac" from a JSON string escaped twice
        if "\\over" in s:  # TeX's "{1 \\over 3}" is \\frac{1}{3}
            s = _OVER.sub(r"{\\frac{\1}{\2}}", "{" + s + "}")[1:-1]
        if "\\frac " in s:  # "\\frac 1 3": the space is no list separator
            s = _FRAC_SPACED.sub(r"\\frac{\1}{\2}", s)
        if "\\mathbb" in s:  # the real line
            s = s.replace("\\mathbb{R}", "(-\\infty,\\infty)").replace(
                "\\mathbb R", "(-\\infty,\\infty)"
            )
        s = COMMAND.sub(lambda m: _COMMAND_MAP.get(m.group(), m.group()), s)
        if "\\log_" in s:  # before spaces are read: "\log_2 8" is no list "2,8"
            s = _LOG_BASE.sub(r"\\log_{\1}", s)
        s = s.replace("\u2983\u2984", "\\emptyset")  # "\\{\\}"
    if "\u2248" in s:  # "x = 1/3 \\approx 0.33" is 1/3; "x \\approx 11" is 11
        left, _, right = s.partition("\u2248")
        s = left if "=" in left or any(c.isdigit() for c in left) else left + "=" + right
        s = right if not left.strip() else s  # "\\approx 42" is 42
    if "infty" in s or "infinity" in s:  # "(1, +\\infty)" is "(1, \\infty)"
        s = s.replace("+\\infty", "\\infty").replace("infinity", "\\infty")
    if "\u00b0" in s and "\\" in s:  # degrees in trigonometry are an angle; elsewhere they go
        s = _TRIG_DEGREES.sub(r"\1(\2\\pi/180)", s)
    s = s.replace("$", "").replace("%", "").replace("^{\u00b0}", "").replace("^\u00b0", "")
    s = s.replace("\u00b0", "").strip().rstrip(".").strip()
    if s[:2] == "**" and s[-2:] == "**" and len(s) > 4:  # markdown bold: "**6**"
        s = s[2:-2].strip()
    if "=" in s:
        s = s.replace("<=", "\u2264").replace(">=", "\u2265").replace("!=", "\u2260")
        s = s.replace(":=", "=")  # "x := 3" defines x as 3
    if " " in s or ")or(" in s:
        s = drop_words(_OR_AND.sub(",", s))  # "8,3 or 4" and "(5,2) or (2,5)" are lists
    s = attached(s)  # "45km" -> "45"; "5m" and "2k" stay algebra
    if ";" in s and "=" in s:
        s = solutions(s)
    s = s.replace(";", ",").replace("{,}", ",")  # "14{,}916": LaTeX's spacing of a comma
    if " " in s and _SPACED.search(s):  # "1 000" is a thousand, "1 2 3" a list
        s = s.replace(" ", "") if _SPACED_THOUSANDS.fullmatch(s) else _SPACED.sub(",", s)
    if "," in s and _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")  # before spaces go: "32, 349" is a list
    s = _SPACES.sub(lambda m: m.group(1) + " " if m.group(1) else "", s)
    for trigger, pattern, replacement in _BRACE_ARGS:
        if trigger in s:
            s = pattern.sub(replacement, s)
    if s[1:4] == "\\in" and s[:1].isalpha() and not s[4:5].isalpha():
        s = s[4:]  # "x\in[-2,7]" -> "[-2,7]"
    if s[:1] == "{" and s[-1:] == "}" and "," in s and wraps(s):
        s = "\u2983" + s[1:-1] + "\u2984"  # "{1,3}": a set whose braces were not escaped
    if len(s) == 3 and s[0] == "(" and s[2] == ")" and s[1].isalpha():
        s = s[1]  # multiple choice "(B)" -> "B"
    return s[1:] if s.startswith("+") else s


# ------------------------------------------------------------------ policies of the match
# (each measured on dev, bench/CORPUS.md, where the alternatives are tabled)

# case: words of 2+ letters ignore it, single letters and commands do not. Math-Verify
# lowercases every symbol ("X+Y" == "x+y"); here "3R^2" != "3r^2" and the choice "E" != e.
_WORDS = re.compile(r"\\[a-zA-Z]+|[a-zA-Z]{2,}")


def fold(s):
    """s with its words of 2+ letters lowercased, commands kept: "\\text{Monday}" -> "\\text{monday}"."""
    return _WORDS.sub(lambda m: m.group() if m.group()[0] == "\\" else m.group().lower(), s)


def as_tuple(a, b):
    """A set written "{1,3}", or a bare list "1, 3", answers the tuple "(1,3)": its items in the
    order written, as Math-Verify reads a set against a tuple; "{3,1}" is not "(1,3)"."""
    if not (b[:1] == "(" and b[-1:] == ")" and wraps(b)):
        return False
    if a[:1] == "\u2983" and a[-1:] == "\u2984" and wraps(a):
        return key("(" + a[1:-1] + ")") == key(b)
    if "," not in a or len(split_top(a, ",")) < 2:
        return False
    return key("(" + a + ")") == key(b)
