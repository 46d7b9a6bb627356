"""
Verifiable rewards: score a response by checking its final answer, in pure Python.

RLVR needs no learned reward model: pull the final answer out of the response (extract.py)
and compare it with the reference, exactly (this file, with the exact algebra of exact.py).
Safe on any str: no eval or exec, no regex that can backtrack catastrophically, bounded work
on megabyte inputs (an answer longer than MAX_ANSWER_CHARS never matches).

    python verifiable.py          # a tiny demo
    from verifiable import math_reward, gsm8k_reward, VerifiableRewardModel

The extractors (extract_answer, extract_boxed, ...) live in extract.py and are importable
from here too.

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

VerifiableRewardModel decodes input_ids[b, start:end], end exclusive (ColossalChat's reward
functions decode input_ids[s : e + 1], the end inclusive).
"""

import re
from functools import lru_cache

import nanorm.algebra.extract as _extract
from nanorm.algebra.decimals import (
    close,  # a written decimal as a rounded value: that file's policies
)
from nanorm.algebra.exact import same_set, split_top, unlabel, wraps
from nanorm.algebra.extract import (  # noqa: F401 (all re-exported: callers import the extractors from here)
    MAX_ANSWER_CHARS,
    ONE_NUMBER,
    extract_answer_tag,
    extract_boxed,
    extract_conclusion,
    extract_gsm8k,
)
from nanorm.algebra.matrices import (
    key,  # exact.key, with matrix literals and their arithmetic read first
)
from nanorm.algebra.named import named, solutions
from nanorm.algebra.spellings import respell
from nanorm.algebra.units import COMMAND, attached, drop_text_unit, drop_words, is_percent

# ------------------------------------------------------------------ canonical strings

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
_DECIMAL_COMMA = re.compile(r"(?<![0-9])[-+]?[0-9]+,(?:[0-9]{1,2}|[0-9]{4,})")  # not 3 digits
_ESCAPED_TWICE = re.compile(r"(?<!\\)\\\\(?=[a-zA-Z]{2})")
_SPACED = re.compile(r"(?<=[0-9]) +(?=[0-9])")
_SPACED_THOUSANDS = re.compile(r"[-+]?[0-9]{1,3}(?: [0-9]{3})+(?:\.[0-9]+)?")
_BASE = re.compile(r"(?<![0-9A-Z])([0-9A-Z]+)_\{([0-9]+)\}")  # 4210_{5} after canonical()
_OR_AND = re.compile(r"(?<!\s)\s+(?:or|and)\s+|(?<=\))or(?=\()")
_OVER = re.compile(r"\{([^{}]*)\\over(?![a-zA-Z])([^{}]*)\}")
_FRAC_SPACED = re.compile(r"\\frac\s+([0-9a-zA-Z])\s+([0-9a-zA-Z])(?![0-9a-zA-Z])")
_LOG_BASE = re.compile(r"\\log_([0-9]) *")  # "\log_2 8": the base is one digit, as in TeX
_RATIO = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?):([0-9]+(?:\.[0-9]+)?)")  # "3:4"
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


# ------------------------------------------------------------------ matching


IGNORE_CASE = "words"  # policy (measured on dev, bench/CORPUS.md); "all": Math-Verify's
_FOLD = {"words": re.compile(r"\\[a-zA-Z]+|[a-zA-Z]{2,}"), "all": re.compile(r"\\[a-zA-Z]+|[A-Z]+")}


def _fold(s):
    """s with words ("words": 2+ letters; "all": every letter) lowercased, commands kept:
    "\\text{Monday}" == "monday". Math-Verify lowercases every symbol ("all": "X+Y" == "x+y");
    nanoRM only words, so "3R^2" != "3r^2" and the choice "E" != Euler's "e"."""
    pattern = _FOLD[IGNORE_CASE]
    return pattern.sub(lambda m: m.group() if m.group()[0] == "\\" else m.group().lower(), s)


SET_AS_TUPLE = True  # policies (measured on dev, bench/CORPUS.md)
LIST_AS_TUPLE = True


def _as_tuple(a, b):
    """A set written "{1,3}", or a bare list "1, 3", answers the tuple "(1,3)": its items in the
    order written, as Math-Verify reads a set against a tuple; "{3,1}" is not "(1,3)"."""
    if not (b[:1] == "(" and b[-1:] == ")" and wraps(b)):
        return False
    if SET_AS_TUPLE and a[:1] == "\u2983" and a[-1:] == "\u2984" and wraps(a):
        return key("(" + a[1:-1] + ")") == key(b)
    if not LIST_AS_TUPLE or "," not in a or len(split_top(a, ",")) < 2:
        return False
    return key("(" + a + ")") == key(b)


def answers_match(predicted, reference):
    """True when the two answer strings denote the same answer (see the module docstring).
    Never raises: non-str, empty or over-long (> MAX_ANSWER_CHARS) answers do not match."""
    if not isinstance(predicted, str) or not isinstance(reference, str):
        return False
    if len(predicted) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    a, b = canonical(predicted), canonical(reference)
    if not a or not b:
        return False
    if a == b:
        return True
    base_a, base_b = _BASE.fullmatch(a), _BASE.fullmatch(b)
    if (base_a is None) != (base_b is None):  # a base written on one side only: 4210_5, 4210
        a, b = (base_a[1], b) if base_a else (a, base_b[1])
        return a == b
    if IGNORE_CASE and (a + b).lower() != a + b:  # an upper-case letter
        a, b = _fold(a), _fold(b)
        if a == b:
            return True
    key_a, key_b = key(a), key(b)
    if key_a == key_b or same_set(key_a, key_b) or _as_tuple(a, b) or _as_tuple(b, a):
        return True
    for one, other in ((a, key_b), (b, key_a)):  # "\\{2\\}" answers "2" (Math-Verify's reading)
        inside = one[1:-1] if one[:1] == "\u2983" and wraps(one) else ","
        if len(split_top(inside, ",")) == 1 and key(inside) == other:
            return True
    bare_a, bare_b = unlabel(a), unlabel(b)
    if bare_a and bare_b and "," not in a + b and a.split("=")[0] == b.split("=")[0]:
        key_a, key_b = key(bare_a), key(bare_b)  # one label: "x=5+5+1=11" is "x=11"
    elif (bare_a is None) != (bare_b is None):  # "(a,b)=(2,7)" answers "(2,7)"; "x=5" != "y=5"
        key_a, key_b = key(bare_a or a), key(bare_b or b)
        if _as_tuple(bare_a or a, bare_b or b) or _as_tuple(bare_b or b, bare_a or a):
            return True  # "x=2, y=3" answers "(2,3)", in the order written
    elif bare_a and bare_b and (named(a) or 0) == named(b):  # "(x,y)=(2,3)" == "y=3,x=2"
        return True
    elif _DECIMAL_COMMA.fullmatch(a) or _DECIMAL_COMMA.fullmatch(b):  # "0,25" vs "0.25"
        key_a = key(a.replace(",", ".")) if _DECIMAL_COMMA.fullmatch(a) else key_a
        key_b = key(b.replace(",", ".")) if _DECIMAL_COMMA.fullmatch(b) else key_b
    if key_a == key_b or same_set(key_a, key_b):
        return True
    decimal_a, decimal_b = ("." in x and "/" not in x and "frac" not in x for x in (a, b))
    if (decimal_a and close(key_a, key_b)) or (decimal_b and close(key_b, key_a)):
        return True
    if is_percent(reference) and not is_percent(predicted) and "," not in b:  # 28% is 0.28
        return key("(" + b + ")/100") == key_a
    ratio_a, ratio_b = _RATIO.fullmatch(a), _RATIO.fullmatch(b)
    if (ratio_a is None) != (ratio_b is None):  # "3:4" is 3/4 against a number; "3:45" != "1:15"
        ratio, other = (ratio_a, b) if ratio_a else (ratio_b, a)
        return ratio[2].strip("0.") != "" and key(ratio[1] + "/" + ratio[2]) == key(other)
    return False


# ------------------------------------------------------------------ extraction with matching
# extract.py finds answers; where it must tell whether two candidates are one answer ("\\boxed{2}
# or \\boxed{2.0}", a repeated "A: x" line) it takes the matcher as an argument, so it never
# imports this file. These are its extractors with answers_match, under their usual names.


def extract_answer(text):
    """extract.extract_answer with answers_match: the response's final answer, or None."""
    return _extract.extract_answer(text, answers_match)


def extract_boxes(text):
    """extract.extract_boxes with answers_match: the last box and the boxes joined to it."""
    return _extract.extract_boxes(text, answers_match)


def extract_answer_is(text):
    """extract.extract_answer_is with answers_match: what follows the last "answer is"."""
    return _extract.extract_answer_is(text, answers_match)


# ------------------------------------------------------------------ reward functions
# Every reward function has the signature fn(response: str, gt_answer: str | None) -> float.


def _accuracy(response, gt_answer, extract):
    """1.0 when the response's answer matches gt_answer's, read by extract or else whole;
    a reference too long to be an answer is a solution, read like a response."""
    if not isinstance(gt_answer, str):
        return 0.0
    reference = extract(gt_answer) or gt_answer.strip()
    if len(reference) > MAX_ANSWER_CHARS:  # it could never match: its final answer might
        reference = extract_answer(gt_answer)
    predicted = extract_answer(response)
    if reference is None or predicted is None:
        return 0.0
    return 1.0 if answers_match(predicted, reference) else 0.0


def gsm8k_reward(response, gt_answer):
    """1.0 if the response's answer matches; gt_answer is "18" or a whole "... #### 18" solution."""
    return _accuracy(response, gt_answer, extract_gsm8k)


def math_reward(response, gt_answer):
    """1.0 if the response's answer matches; gt_answer is the answer or a \\boxed{} solution
    (boxes joined as in extract_boxes: "\\boxed{1}, \\boxed{2}" is the answer "1, 2")."""
    return _accuracy(response, gt_answer, extract_boxes)


_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def format_reward(response, gt_answer=None):
    """1.0 when each of <think> </think> <answer> </answer> occurs exactly once, in that order."""
    if not isinstance(response, str) or any(response.count(t) != 1 for t in _TAGS):
        return 0.0
    positions = [response.find(t) for t in _TAGS]
    return 1.0 if positions == sorted(positions) else 0.0


def format_gated(accuracy_fn):
    """accuracy if the format is right, else 0: a gate, not a bonus. An added format reward
    pays a long wrong answer in the right tags more than a short right one without them
    (allenai/open-instruct#659)."""

    def gated(response, gt_answer):
        return accuracy_fn(response, gt_answer) if format_reward(response) else 0.0

    gated.__name__ = f"format_gated_{getattr(accuracy_fn, '__name__', 'reward')}"
    return gated


gated_math_reward = format_gated(math_reward)


def overlong_penalty(max_length, buffer, length=len):
    """DAPO's soft over-length penalty as a reward function: 0 up to max_length - buffer,
    then linear down to -1 at max_length, -1 beyond. length() measures the response
    (characters by default; pass lambda s: len(tok.encode(s)) to count tokens)."""
    if buffer <= 0:
        raise ValueError("buffer must be positive")

    def penalty(response, gt_answer=None):
        return min(0.0, max(-1.0, (max_length - buffer - length(response)) / buffer))

    return penalty


# ------------------------------------------------------------------ drop-in reward model


class VerifiableRewardModel:
    """Weighted sum of reward functions over decoded responses, shaped like a reward model:
    __call__ returns a float tensor (B,) on input_ids' device; to() and eval() do nothing.

    Row b's response is input_ids[b, start:end], end exclusive. response_start/end are an
    int, or one int per row (list or tensor); start defaults to 0, end to one past the last
    1 in attention_mask (or the row's length without a mask). gt_answer is a list of str, one
    per row, or None (the functions then get None)."""

    def __init__(self, reward_fns, tokenizer, weights=None):
        self.reward_fns = list(reward_fns)
        self.tokenizer = tokenizer
        self.weights = [1.0] * len(self.reward_fns) if weights is None else list(weights)
        if len(self.weights) != len(self.reward_fns):
            raise ValueError("need one weight per reward function")

    @staticmethod
    def _per_row(value, batch):
        values = value.tolist() if hasattr(value, "tolist") else value  # tensors, arrays
        if isinstance(values, (int, float)):
            return [int(values)] * batch
        return [int(v) for v in values]

    def __call__(
        self, input_ids, attention_mask=None, response_start=None, response_end=None, gt_answer=None
    ):
        import torch  # lazily: the graders above work without torch

        batch, length = input_ids.shape
        starts = self._per_row(0 if response_start is None else response_start, batch)
        if response_end is None and attention_mask is not None:
            positions = torch.arange(1, length + 1, device=attention_mask.device)
            response_end = (attention_mask.ne(0) * positions).amax(dim=1)
        ends = self._per_row(length if response_end is None else response_end, batch)
        texts = [
            self.tokenizer.decode(input_ids[b, starts[b] : ends[b]].tolist()) for b in range(batch)
        ]
        gts = [None] * batch if gt_answer is None else gt_answer
        rewards = [
            sum(w * fn(t, gt) for w, fn in zip(self.weights, self.reward_fns, strict=True))
            for t, gt in zip(texts, gts, strict=True)
        ]
        return torch.tensor(rewards, dtype=torch.float32, device=input_ids.device)

    def to(self, *args, **kwargs):
        return self

    def eval(self):
        return self


DEMO = r"""
$1,000.              | 1000
\dfrac{3}{4}         | 0.75
\frac{1}{\sqrt3}     | \frac{\sqrt{3}}{3}
y = 2x + 3           | 2x - y + 3 = 0
(a,b)=(2,7)          | (2, 7)
y \geq 3             | [3, \infty)
0,25                 | 0.25
32, 349              | 32349
50%                  | 0.5
(3,4]                | (3,4)
"""


def main():
    for line in DEMO.strip().splitlines():
        predicted, reference = (side.strip() for side in line.split("|"))
        print(f"{predicted!r:>24} vs {reference!r:<24} -> {answers_match(predicted, reference)}")
    response = "<think>2 + 2 = 4</think> <answer>The answer is \\boxed{4}.</answer>"
    print(
        f"extract_answer -> {extract_answer(response)!r}, reward {gated_math_reward(response, '4')}"
    )


if __name__ == "__main__":
    main()
