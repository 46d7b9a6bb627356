"""
Answer extraction: which part of a response is its final answer, in pure Python.

    from nanorm.base.algebra.extract import extract_answer
    extract_answer(r"... so the area is \\boxed{\\frac{3}{4}}.")   # -> "\\frac{3}{4}"

verifiable.py compares what this returns with the reference; this file only finds it. It is
safe on any str: re and linear scans, no eval or exec, no regex that can backtrack
catastrophically, bounded work on megabyte inputs (an answer longer than MAX_ANSWER_CHARS
counts as no answer).

extract_answer(text), first hit wins:
  1. the last <answer>...</answer> (or a last <answer> left unclosed); 2-5 run inside it
  2. the last \\boxed{} / \\fbox{}, with the boxes before it that only "and", "or", commas
     or spacing separate from it: "\\boxed{2} and \\boxed{5}" is the one answer "2, 5"
  3. GSM8K's "#### x"
  4. "the answer is x", "answer: x", 答案是 x, or a last line "A: x" (few-shot "Q: ... A:"),
     to the end of its sentence: "Answer: 18 dollars, since ..." -> "18". It goes before 2
     when it comes after the last box ("\\boxed{255} ... The final answer is $10,455$").
  5. the last sentence: the first math span after "hence / therefore / thus / so / we get";
     else the sentence if it is only math ("$3 + 4 = 7$", "-5"); else its last math span
     after "is", "=" or ":" ("The identity matrix is $...$."); else the number after its last
     "is" or "=" when nothing follows ("so 8 * 3 = 24 hours."); else, in a concluding
     sentence, its only number ("Thus he spent $58 in all.").
Measured on the dev corpus (bench/CORPUS.md), step 5 past its first clause, the "A:" line and
the one-number rule each raised agreement and added no false positive. A "$" before a number
is a price unless a math span closes it ("$28.00 and $30.00" are prices). A question or an
instruction ("Evaluate $2+3i$.") states nothing. Ending on many numbers is never paid: the
last number of the text is no answer, and a list of candidates ("A: 2\\nA: 3",
"\\boxed{3} or \\boxed{4}", "The answer is 3.\\nThe answer is 4.") earns nothing.
"""

import re

MAX_ANSWER_CHARS = 1000  # longer extracted answers count as no answer; answers_match -> False


def _literal(a, b):
    """The default `same`: equal strings. verifiable.py passes its answers_match instead (this
    file cannot import it: verifiable.py imports this file)."""
    return a.strip() == b.strip()


def _capped(s):
    s = None if s is None else s.strip()
    return s if s and len(s) <= MAX_ANSWER_CHARS else None


def _braced(text, i):
    """Content of the {...} group opening at text[i], by a linear scan; None if unclosed.
    Escaped braces (\\{ \\}) do not count. The scan stops after MAX_ANSWER_CHARS, which bounds
    the work on an unbalanced "\\boxed{" in front of a megabyte of text."""
    depth, j, stop = 0, i, min(len(text), i + MAX_ANSWER_CHARS + 2)
    while j < stop:
        c = text[j]
        if c == "\\":
            j += 1  # skip the escaped character
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def extract_boxed(text):
    """The content of the last \\boxed{...} or \\fbox{...}, or None.
    Only the last one is looked at (rfind): a wrong final box after a right one is wrong,
    and an unclosed final box is no answer rather than a reason to look further back."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    start = i + (6 if text.startswith("\\boxed", i) else 5)
    rest = text[start : start + 2 * MAX_ANSWER_CHARS]
    body = rest.lstrip()
    if body.startswith("{"):
        return _capped(_braced(body, 0))
    if len(body) == len(rest) or not body:  # "\boxedx" is some other macro
        return None
    return _capped(body[: MAX_ANSWER_CHARS + 1].split(None, 1)[0].split("$", 1)[0])  # \boxed 18


def extract_gsm8k(text):
    """The rest of the line after the last "####" (GSM8K's format), or None."""
    i = text.rfind("####")
    if i < 0:
        return None
    return _capped(text[i + 4 : i + 4 + MAX_ANSWER_CHARS + 2].split("\n", 1)[0])


def extract_answer_tag(text):
    """The content of the last <answer>...</answer> block, or what follows a last <answer>
    left unclosed (a response cut at its stop token), or None."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if text.rfind("<answer>") > end:  # unclosed
        start, end = text.rfind("<answer>"), text.rfind("<answer>") + 8 + MAX_ANSWER_CHARS + 1
    return None if start < 0 else _capped(text[start + 8 : end])


# rfind on a few spellings rather than a regex: no lower() (which can change string lengths
# on some Unicode text) and no scan over every match of a megabyte of "answer is answer is".
# "\nA:" is the last line of a "Q: ... A: ..." few-shot solution; 答案是 is "the answer is".
_ANSWER_PHRASES = tuple(
    "answer is|Answer is|ANSWER IS|answer:|Answer:|ANSWER:|\nA:|答案是|答案：".split("|")
)


_HEDGE = re.compile(r"^(?:[A-Z]:|(?:the )?answer is)? ?\$?([-0-9.,]+)\.?$", re.I)  # "A: 3"


def extract_answer_is(text, same=_literal):
    """What follows the last "the answer is" / "answer:" (step 4 of the module docstring).
    same(a, b) says whether two answers are one (a repeated "A: x" line is no hedge)."""
    best, phrase = max((text.rfind(p), p) for p in _ANSWER_PHRASES)
    if best < 0 and text.startswith("A:"):
        best, phrase = 0, "A:"
    if best < 0:
        return None
    rest = text[best + len(phrase) : best + len(phrase) + MAX_ANSWER_CHARS + 2]
    line, _, below = rest.partition("\n")
    if not line.strip(" :*$\\[]("):  # "answer is:\n$$ 7 $$": displayed below
        line = line + " " + below.split("\n\n", 1)[0].replace("\n", " ")
    rest = _SENTENCE_END.split(_uncurrency(line), 1)[0].replace("**", "")
    rest = rest.replace('\\"', '"').strip(" :")
    if rest[:1] == '"':  # 'the answer is "12 and 13".': the quotes are no part of it
        rest = rest.rstrip(".").strip('"')
    if rest[:2].isalpha() and " is " in rest:
        rest = rest.rsplit(" is ", 1)[1]
    lead = _LEADING.match(rest)  # "Answer: 18 dollars, because ...", "18 (dieciocho)"
    value = _capped(lead[1] if lead else _value_of(rest) or _only_number(rest))
    line_start = text.rfind("\n", max(0, best - 200), best + 1)  # the line before this one
    before = _HEDGE.search(text[max(0, line_start - 80) : max(line_start, 0)].rpartition("\n")[2])
    if value and line_start >= 0 and before and not same(before[1], value):
        return ""  # "A: 2\nA: 3\nA: 4": a list of candidates, none of them committed to
    return value


# A "$" before a number is a price, not LaTeX, when no math could be closed by the next "$":
# "$28.00 and the shoes cost $30.00" is two prices, "$1 + 4 \cdot 3 = 13$" is math.
_PRICE = re.compile(r"\$(?=[0-9])([^$]*)(\$?)")
_WORD = re.compile(r"(?<![\\a-zA-Z])(?!(?:or|and)\b)[a-zA-Z]{2,}")  # "5 or 6" is math


def _uncurrency(s):
    s = s.replace("\\$", "")  # an escaped dollar is always a price

    def price(m):
        inside = m[1].rstrip()
        if (
            m[2]
            and inside == m[1]
            and ("\\" in inside or (not _WORD.search(inside) and inside[-1:] not in "+-*/=x"))
        ):
            return m[0]  # "$12$" and "$12 \\text{ hours}$": math
        return m[1] + m[2]

    return _PRICE.sub(price, s) if "$" in s else s


_SENTENCE_END = re.compile(r"(?<=[.!?])(?:\$\$|\\\])?\s+(?=\S)|。|\n")  # "... 2.$$ Thus"
_MATH_SPAN = re.compile(r"\$\$([^$]+)\$\$|\$([^$]+)\$|\\\[(.+?)\\\]|\\\((.+?)\\\)", re.S)
# a number after "=", "is", ":" ...; taken only when no other number follows it
_STATES = (
    r"(?:=|\b(?:is|are|be|equals|was|makes?|gets?|gives?|of|[Aa]nswer|approximately)\b|'s\b|:)"
)
_STATED = re.compile(  # "is 1 000 dollars": thousands spaced, as canonical() reads "1 000"
    _STATES
    + r"\s*([-+]?(?:[0-9]{1,3}(?: [0-9]{3})+(?![0-9])|[0-9][0-9,]*|(?=\.[0-9]))(?:\.[0-9]+)?"
    r"(?:/[0-9]+(?![0-9.,]))?|\\[dt]?frac\{[0-9]+\}\{[0-9]+\})"
)
# "... is $x$" and "Matrix with fractions: $M$" state x and M; "Simplify: $x$" does not
_STATES_END = re.compile(r"(?:[=:]|\b(?:is|are|be|equals|was|gives?|of|[Aa]nswer)\b)[^0-9]{0,40}$")
_IMPERATIVE = re.compile(
    r"(?:Simplify|Evaluate|Compute|Find|Solve|Calculate|Determine|Express|Let|Given|Consider|Prove"
    r"|Show|Write|Compare|Suppose)\b"
)
# what may follow the one math span of a sentence that states it: units ("$12$ hours", "$5$
# square feet") or "is the answer"; "$3$ is prime" and "$n$ must be even" state no answer
_TRAILING = re.compile(r"[a-z]+(?: [a-z]+){0,2}")
_NOT_UNITS = set("is are was were be and or not to of for if in on by as so".split())
_IS_THE_ANSWER = ("is the answer", "is the final answer", "is the correct answer")
_NUMBER = re.compile(r"[-+]?[0-9][0-9,]*(?:\.[0-9]+)?")
_NUMBER_IS = re.compile(
    r"(?<![0-9,.])([-+]?[0-9][0-9,]*(?:\.[0-9]+)?) is (?:the (?:final |correct )?answer|correct)"
)
_UNITS_ONLY = re.compile(r"(?<![0-9,.])" + _NUMBER.pattern + r"(?: [a-zA-Z]+){1,3}")
_NOT_WORDS = r"(?!(?:or|and|to|plus|minus|times|over|pi)\b)"  # "5 or 6" is a list, not "5"
_LEADING = re.compile(r"(?<![0-9,.])(" + _NUMBER.pattern + r")\s+\(?" + _NOT_WORDS + "[a-zA-Z]{2,}")


def _value_of(s):
    """The answer a short text states: the text itself when it is math (no words outside
    math spans), else its last math span, else the number after its last "=" or "is" when no
    number follows it: "Angle A is 36 degrees" -> "36", "18 dollars, as 9 * 2 = 18" -> "18"."""
    s = s.strip().rstrip(".").strip()
    if s[-1:] == "!" and "$" not in s and "\\" not in s:  # "is 120!": a mark, not 120!
        s = s[:-1]
    if _NUMBER_IS.fullmatch(s):  # "7 is the answer", "7 is correct"
        return _NUMBER_IS.fullmatch(s)[1]
    if _UNITS_ONLY.fullmatch(s):  # "28 percent", "15 cups of feed"
        return s
    spans = list(_MATH_SPAN.finditer(s))
    if not _WORD.search(_MATH_SPAN.sub("", s).replace("\\text", "")):
        return s
    if len(spans) == 1 and spans[0].start() == 0:  # "$12$ hours", "$x=3$ is the answer"
        rest = _TRAILING.fullmatch(s[spans[0].end() :].strip())
        if rest and (rest[0] in _IS_THE_ANSWER or not _NOT_UNITS.intersection(rest[0].split())):
            return next(g for g in spans[0].groups() if g is not None)
    start = spans[-1].start() if spans else 0
    if spans and _STATES_END.search(s, max(0, start - 40), start) and not _IMPERATIVE.match(s):
        return next(g for g in spans[-1].groups() if g is not None)
    s = _MATH_SPAN.sub(" ", s)  # the number of a sentence is outside its math
    stated = list(_STATED.finditer(s))  # the last "is"/"=" of the sentence, with a number:
    last = list(re.finditer(_STATES, s))[-1:]  # "... = 20 cups =" (cut) states nothing
    if stated and last[0].start() == stated[-1].start() and not _NUMBER.search(s, stated[-1].end()):
        return stated[-1][1]
    return None


_CONCLUDES = re.compile(r"\b(?:[Hh]ence|[Tt]herefore|[Tt]hus|[Ss]o|[Ww]e (?:get|obtain|find))\b")
# what follows an answer without stating one: Minerva's sign-off, a chat template's next turn
_IS_BEFORE = re.compile(r"(?:\b(?:is|are|equals)|=|:) *$")  # "... of $n$ is $12$": 12
_TRAILERS = ("I hope it is correct.", "<|im_end|>", "<|im_start|>user", "<|endoftext|>")
_DISPLAY = re.compile(r"\$\$[^$]*\$\$|\\\[.*?\\\]", re.S)


def extract_conclusion(text):
    """The answer stated by the last sentence (step 5 of the module docstring), or None:
    the first math span after a concluding word, else _value_of(the sentence)."""
    tail = _DISPLAY.sub(lambda m: m[0].replace("\n", " "), text[-2 * MAX_ANSWER_CHARS :])
    while tail.rstrip().endswith(_TRAILERS):  # a bounded tail: at most len(tail) rounds
        tail = tail.rstrip()
        tail = tail[: -len(next(t for t in _TRAILERS if tail.endswith(t)))]
    sentence = _SENTENCE_END.split(_uncurrency(tail.strip()))[-1].strip()
    if not sentence or sentence.endswith("?"):  # a question is not an answer
        return None
    marks = list(_CONCLUDES.finditer(sentence))[-4:][::-1]
    spans = list(_MATH_SPAN.finditer(sentence, marks[0].end())) if marks else []
    last = spans[-1].start() if len(spans) > 1 else 0  # "the value of $n$ is $12$": 12
    if last and _IS_BEFORE.search(sentence, max(0, last - 12), last):
        return _capped(next(g for g in spans[-1].groups() if g is not None))
    for mark in marks:  # "Thus $x=3$, so done."
        span = _MATH_SPAN.search(sentence, mark.end())
        if span:
            return _capped(next(g for g in span.groups() if g is not None))
    value = _value_of(sentence)
    if value is None and _CONCLUDES.search(sentence):  # measured on dev: bench/CORPUS.md
        value = _only_number(sentence)  # "Thus he spent 58 in all.": its one number
    return _capped(value)


def _only_number(sentence):
    numbers = _NUMBER.findall(_MATH_SPAN.sub(" ", sentence))
    return numbers[0] if len(numbers) == 1 else None


# what may stand between boxes of one answer: "$x = \boxed{-2}$ or $x = \boxed{3}$", math
# delimiters and a subscripted label: "\( y_1 = \boxed{x+1} \) and \( y_2 = \boxed{3} \)"
_LABEL = r"[a-zA-Z](?:_\{?[0-9a-z]{1,3}\}?)? ?="
_JOINED = re.compile(
    r"(?:\s|[$,;&]|\\[(),]|\\quad|\\qquad|\\text\{ ?(?:and|or) ?\}|and|or|" + _LABEL + ")*"
)


def extract_boxes(text, same=_literal):
    """The last box and the boxes joined to it (step 2 of the module docstring), or None.
    One answer boxed twice ("\\boxed{15\\frac{39}{40}} or \\boxed{\\frac{639}{40}}") is one
    when same(a, b) says so."""
    last = extract_boxed(text)
    parts, end = [last], max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    while last is not None and len(parts) < 16:
        start = text.rfind("\\boxed{", max(0, end - MAX_ANSWER_CHARS), end)
        inside = _braced(text, start + 6) if start >= 0 else None
        if inside is None or not _JOINED.fullmatch(text, start + len(inside) + 8, end):
            break
        parts, end = [inside.strip()] + parts, start
    if len(parts) == 1 or all(same(p, last) for p in parts):
        return last
    return _capped(", ".join(parts))


def extract_answer(text, same=_literal):
    """The response's final answer by the order in the module docstring, or None. same(a, b)
    compares two candidate answers (boxes of one answer, hedged "A:" lines); verifiable.py's
    extract_answer passes answers_match, the default only equal strings."""
    if not isinstance(text, str):
        return None
    scope = extract_answer_tag(text) or text
    boxes, answer_is = (lambda t: extract_boxes(t, same)), (lambda t: extract_answer_is(t, same))
    order = [boxes, extract_gsm8k, answer_is, extract_conclusion]
    box = max(scope.rfind("\\boxed"), scope.rfind("\\fbox"))
    if 0 <= box < max(scope.rfind(p) for p in _ANSWER_PHRASES):  # "\\boxed{255} ... Final
        order.insert(0, answer_is)  # Answer: 10,455": the statement after the box wins
    for extract in order:
        found = extract(scope)
        if found is not None:
            return found or None  # "": the extractor saw an answer it refuses (hedging)
    return None
