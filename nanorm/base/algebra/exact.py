"""
Exact keys for answer strings: two canonical answers match when their keys are equal.

A small exact algebra in pure Python (re and fractions), written for comparing final
answers, not for doing mathematics. key(s) turns a canonical answer string into a hashable
key: numbers and simple expressions become an exact sum of terms coef * sqrt(n) * symbols
(coef a Fraction, so 3/4 == 0.75 and 1/sqrt(3) == sqrt(3)/3); tuples and intervals keep their
order and brackets; sets, bare lists and "a \\pm b" are sets (matrices: matrices.py);
an equation L = R is L - R up to a constant factor; a relation in one variable ("y>=3",
"-40<b<6") is the interval it allows; anything else is the string itself. unlabel(s) gives
the value side of a labelled answer ("(a,b)=(2,7)" -> "(2,7)"); same_set() lets a relation
match its interval. verifiable.answers_match decides when to use them.

What it deliberately does not do: no eval or exec, no floats (nothing is ever rounded), no
factoring, no identity but i^2 = -1, the trigonometric ones of trig.py (sums, multiples,
k*pi/12, sin^2 + cos^2 = 1) and the evaluations of constants in roots.py (8^{1/3} = 2,
\\sqrt{3+2\\sqrt2} = 1+\\sqrt2), logs.py (\\log_2 8 = 3, \\ln 4 = 2\\ln 2, \\exp) and integers.py
(floor, ceiling, \\binom, n!); a sum in a denominator is rationalized (1/(1+\\sqrt2)) or
one opaque factor (values._reciprocal). A symbol is one letter or \\pi: "ab" alone is a word, but
a run of 2-3 letters in algebra (digits or + - * / ^ about) is a product: "2ab" == "2ba".
\\sin x, \\ln x, \\sqrt{x}, 10^{x} are opaque factors: they commute ("\\sin b\\cos a" ==
"\\cos a\\sin b") but no identity of x applies. Every step has a size limit, so any str is
handled in bounded time; past a limit the answer is compared as a string. It does not solve:
"2x=8" is an equation, not the answer 4, and a relation is read only when one side is a name
or it is linear in one symbol.
"""

import re
from fractions import Fraction

from nanorm.base.algebra.brackets import split_top, wraps  # noqa: F401 (re-exported: verifiable.py imports them)
from nanorm.base.algebra.integers import binomial, factorial, rounded
from nanorm.base.algebra.intervals import difference, union
from nanorm.base.algebra.logs import logarithm
from nanorm.base.algebra.polynomials import quotient
from nanorm.base.algebra.roots import MAX_ROOT, power, square_root
from nanorm.base.algebra.trig import _INVERSE, _function, _pythagoras
from nanorm.base.algebra.values import (  # noqa: F401 (re-exported: matrices.py imports them from here)
    MAX_BITS,
    MAX_DEPTH,
    MAX_EXPONENT,
    MAX_TERMS,
    _bits,
    _const,
    _frozen,
    _inverse,
    _mul,
    _NoValue,
    _opaque,
    _reciprocal,
    _squarefree,
)

# ------------------------------------------------------------------ exact expression values
# Values (sums of coef * sqrt(r) * symbols) and their algebra are in values.py.

_TOKEN = re.compile(
    r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|\\[a-zA-Z]+|[a-zA-Z]+|\S"
)
_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_ALGEBRA = re.compile(r"[-+*/^0-9]")
_SHORT = re.compile(r"[a-zA-Z]{2,3}")  # a run of 2-3 letters in algebra: a product
_FRACTION = re.compile(r"(?<![0-9])([-+]?)([0-9]*)\\frac\{([0-9]+)\}\{([0-9]+)\}")


# an opaque factor (\sin x, 10^{x}) is a symbol named by its exact parts: equal only to itself
_FUNCTIONS = set(
    "\\sin \\cos \\tan \\cot \\sec \\csc \\ln \\log \\exp \\arcsin \\arccos \\arctan".split()
)
_ROUNDING = {"\\lfloor": "\\rfloor", "\\lceil": "\\rceil"}
_CLOSE = {"(": ")", "{": "}", "[": "]"}
_CLOSERS = (None, "+", "-", ")", "}", "]", "\\rfloor", "\\rceil")  # what ends a product
_LOGS = ("\\ln", "\\log", "\\exp")
_STOPS = _CLOSERS + ("*", "/", "=", ",")  # what ends a function's argument


class _Parser:
    """Recursive descent over tokens: sum of products of powers of atoms."""

    def __init__(self, text):
        self.tokens, self.i, self.depth = _TOKEN.findall(text), 0, 0
        if _ALGEBRA.search(text):  # "2ab", "a^2+ab": products of letters; "odd" alone a word
            self.tokens = [c for t in self.tokens for c in (t if _SHORT.fullmatch(t) else [t])]

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected=None):
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _NoValue
        self.i += 1
        return token

    def sum(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _NoValue
        total, sign = {}, 1
        if self.peek() in ("+", "-"):
            sign = -1 if self.take() == "-" else 1
        while True:
            for term, coef in self.product().items():
                total[term] = total.get(term, 0) + sign * coef
            if self.peek() not in ("+", "-"):
                break
            sign = -1 if self.take() == "-" else 1
        self.depth -= 1
        return {t: c for t, c in total.items() if c}

    def product(self):
        value = self.power()
        while self.peek() not in _CLOSERS:
            if self.peek() == "/":
                self.take()
                value = quotient(value, self.power())
                continue
            if self.peek() == "*":
                self.take()
            value = _mul(value, self.power())  # "*" or implicit: 2\pi, (a+5)(b+2)
        return value

    def power(self):
        base = self.atom()
        while self.peek() == "!":  # 5!: integers.py ("the answer is 5!" is 5: extract.py)
            self.take()
            base = factorial(base)
        if self.peek() != "^":
            return base
        self.take()
        return power(base, self.atom())  # 2^{10}, 8^{1/3}, x^{1/2}, 10^{x}: roots.py

    def argument(self):
        """What a function applies to: a bracketed group, else the factors up to the next
        operator or function (\\sin 2x is \\sin(2x); \\sin x\\cos y is two factors)."""
        if self.peek() in _CLOSE:
            return self.atom()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _NoValue
        value = self.power()
        while self.peek() not in _STOPS and self.peek() not in _FUNCTIONS:
            value = _mul(value, self.power())
        self.depth -= 1
        return value

    def group(self, opener, closer):
        self.take(opener)
        value = self.sum()
        self.take(closer)
        return value

    def atom(self):
        token = self.peek()
        if token in _CLOSE:  # (x), {x} and [x]: "\left[ x \right]" is x, as Math-Verify reads it
            return self.group(token, _CLOSE[token])
        self.take()
        if token[0] in "0123456789.":
            mantissa, _, exponent = token.lower().partition("e")
            value = Fraction(mantissa) if "." in mantissa else int(mantissa)
            if exponent:
                if abs(int(exponent)) > MAX_EXPONENT:
                    raise _NoValue
                value *= Fraction(10) ** int(exponent)
            return {(1, ()): value} if value else {}
        if token == "\\frac":
            numerator = self.group("{", "}")
            return quotient(numerator, self.group("{", "}"))  # polynomials.py
        if token in _FUNCTIONS:  # \sin x, \cos^2(2x), \log_2 8; \sin^{-1} x is refused
            base = self.atom() if self.peek() == "_" and self.take() else {}
            n = _const(self.atom()) if self.peek() == "^" and self.take() else 1
            if n == -1 and token in _INVERSE and not base:  # \sin^{-1} x is \arcsin x
                token, n = _INVERSE[token], 1
            if n not in range(1, 10):
                raise _NoValue
            if token in _LOGS:  # \log_2 8, \ln 4, \exp(x): logs.py
                return logarithm(token, base, self.argument(), int(n))
            return _function(token, base, self.argument(), int(n))
        if token == "\\sqrt":
            if self.peek() == "[":  # \sqrt[3]{x} is x^{1/3}
                self.take()
                q = Fraction(_const(self.atom()))
                self.take("]")
                if q.denominator != 1 or not 2 <= q <= MAX_ROOT:
                    raise _NoValue
                return power(self.group("{", "}"), {(1, ()): 1 / q})
            inside = self.group("(", ")") if self.peek() == "(" else self.group("{", "}")
            return square_root(inside)  # exact, denested or opaque: roots.py; "sqrt(2)" too
        if token in _ROUNDING:  # \lfloor x \rfloor, \lceil x \rceil: integers.py
            value = self.sum()
            self.take(_ROUNDING[token])
            return rounded(value, token == "\\lceil")
        if token == "\\binom":
            top = self.group("{", "}")
            return binomial(top, self.group("{", "}"))
        if token == "\\pi" or (token.isascii() and token.isalpha() and len(token) == 1):
            return {(1, ((token, 1),)): 1}
        raise _NoValue  # words, unknown commands, "=", "_", "!", ...


def _value(s):
    """The exact value of s, or None when s is not a simple expression."""
    if _NUMBER.fullmatch(s):  # the common cases, without the parser
        return {(1, ()): Fraction(s) if "." in s else int(s)}
    m = _FRACTION.fullmatch(s)  # and "1\frac{4}{5}" is the mixed number 9/5, not 1 * 4/5
    if m and int(m[4]):  # (a zero denominator goes to the parser, which refuses it)
        q = int(m[2] or 0) + Fraction(int(m[3]), int(m[4]))
        value = {(1, ()): -q if m[1] == "-" else q}
    else:
        try:
            parser = _Parser(s)
            value = parser.sum()
            value = _pythagoras(value) if "\\" in s else value  # sin^2 u -> 1 - cos^2 u
        except (_NoValue, ValueError, ZeroDivisionError, OverflowError, RecursionError):
            return None
        if parser.peek() is not None or any(_bits(c) > MAX_BITS for c in value.values()):
            return None
    return value


def _difference(left, right):
    """The value of left - right, or None."""
    lv, rv = _value(left), _value(right)
    if lv is None or rv is None:
        return None
    for t, c in rv.items():
        lv[t] = lv.get(t, 0) - c
    return {t: c for t, c in lv.items() if c}


def _equation(s):
    """ "L=R" as L - R scaled so its largest term has coefficient 1, or None.
    So 5x-7y+11z+4=0 == -5x+7y-11z=4, and y=2x+3 == 2x-y+3=0."""
    lv = _difference(*s.split("="))
    if lv is None:
        return None
    lead = lv[max(lv)] if lv else 1
    return _frozen({t: Fraction(c) / lead for t, c in lv.items()})


# ------------------------------------------------------------------ labels and relations
# A label names the answer rather than computing it: letters, subscripts, a function's
# argument, a tuple or fraction of names ("x", "PQ", "a_1", "g(x)", "(a,b)", "\\frac{AM}{MC}").
# An expression with a number or an operator is not a label: "x+1=5" is an equation to solve.

_ARGUMENTS = re.compile(r"_\{[^{}]*\}|_[0-9a-zA-Z]|(?<=[a-zA-Z])\([^()]*\)")
_RELATION = re.compile("([<>\u2264\u2265\u2260])")  # < > <= >= != after canonical()
_FLIP = {"<": ">", ">": "<", "\u2264": "\u2265", "\u2265": "\u2264", "\u2260": "\u2260"}


def _is_label(s):
    bare = _ARGUMENTS.sub("", s)
    return any(c.isalpha() for c in bare) and not any(c in "0123456789+-*/^=!." for c in bare)


def _constant(s):
    """The value of s when it has no symbols (numbers, radicals), else None."""
    value = _value(s)
    return None if value is None or any(syms for _, syms in value) else value


def unlabel(s):
    """The value side of a labelled answer, item by item, or None when nothing is labelled:
    "(a,b)=(2,7)" -> "(2,7)", "PQ=3,RS=8" -> "3,8", "5=x" -> "5", a worked chain
    "y=2+2+3=9=7" or "3*5=15" -> its last side. "x+1=5" is an equation and stays."""
    if "=" not in s:
        return None
    items, changed = split_top(s, ","), False
    for i, item in enumerate(items):
        sides = split_top(item, "=")
        if len(sides) > 2 or (
            len(sides) == 2 and (_is_label(sides[0]) or _constant(sides[0]) is not None)
        ):
            items[i], changed = sides[-1], True
        elif len(sides) == 2 and _is_label(sides[1]):
            items[i], changed = sides[0], True
    return ",".join(items) if changed and all(items) else None


def _interval(low, high, closed_low, closed_high):
    low = key("-\\infty") if low is None else ("num", _frozen(low))
    high = key("\\infty") if high is None else ("num", _frozen(high))
    return ("seq", "[" if closed_low else "(", "]" if closed_high else ")", low, high)


def _one_sided(variable, op, value):
    """ "variable op value" as ("rel", variable, the set of values it allows)."""
    if op == "\u2260":
        below, above = _interval(None, value, False, False), _interval(value, None, False, False)
        return ("rel", variable, union([below, above]))
    if op in "<\u2264":
        return ("rel", variable, _interval(None, value, False, op == "\u2264"))
    return ("rel", variable, _interval(value, None, op == "\u2265", False))


def _linear(left, right):
    """(variable, a, rest) with left - right = a * variable + rest, rest a constant, or None."""
    lv = _difference(left, right)
    if lv is None:
        return None
    terms = [(t, c) for t, c in lv.items() if t[1]]
    if len(terms) != 1 or terms[0][0][0] != 1 or len(terms[0][0][1]) != 1:
        return None
    ((_, ((name, power),)), a) = terms[0]
    rest = {t: c for t, c in lv.items() if not t[1]}
    return None if power != 1 or "(" in name else (name, a, rest)  # not \sin x > 0


def _inequality(left, op, right):
    """ "a<b" in any number of symbols as ("ineq", op, left - right) with op < or <= (a > b is
    b - a < 0), scaled by a positive number: "a<b" == "b>a" == "2a<2b"; or None."""
    if op in ">\u2265":
        left, op, right = right, _FLIP[op], left
    diff = _difference(left, right)
    if not diff:
        return None
    lead = diff[max(diff)] if op == "\u2260" else abs(diff[max(diff)])
    return ("ineq", op, _frozen({t: Fraction(c) / lead for t, c in diff.items()}))


def relation(s):
    """ "y>=3", "3<=y", "-t>-2", "-40<b<6", "t!=4" as ("rel", variable, interval key), or
    None. One side must be a label or the relation linear in one symbol; so "x>3" and
    "3<x" are one key, and the interval part equals the key of "(3,\\infty)"."""
    parts = _RELATION.split(s)
    if len(parts) == 3:
        left, op, right = parts
        if _is_label(left) and _constant(right) is not None:
            return _one_sided(left, op, _constant(right))
        if _is_label(right) and _constant(left) is not None:
            return _one_sided(right, _FLIP[op], _constant(left))
        found = _linear(left, right)
        if found is None:
            return _inequality(left, op, right)
        name, a, rest = found  # a * name + rest op 0, so name op' -rest / a
        return _one_sided(
            name, op if a > 0 else _FLIP[op], {t: -Fraction(c) / a for t, c in rest.items()}
        )
    if len(parts) == 5 and _is_label(parts[2]):
        low, op1, name, op2, high = parts
        if op1 in ">\u2265" and op2 in ">\u2265":  # 6 > b > -40 reads as -40 < b < 6
            low, op1, op2, high = high, _FLIP[op2], _FLIP[op1], low
        low, high = _constant(low), _constant(high)
        if op1 in "<\u2264" and op2 in "<\u2264" and low is not None and high is not None:
            return ("rel", name, _interval(low, high, op1 == "\u2264", op2 == "\u2264"))
    return None


def same_set(a, b):
    """A relation and an interval key denote the same set: "x>=3" and "[3,\\infty)"."""
    if a[0] == "rel" and b[0] != "rel":
        return a[2] == b
    return b[0] == "rel" and a[0] != "rel" and b[2] == a


# ------------------------------------------------------------------ structure and matching


def key(s, depth=0):
    """A hashable key; two answers match when their keys are equal."""
    if depth > MAX_DEPTH or not s:
        return ("str", s)
    if "\\setminus" in s and len(split_top(s, "\\setminus")) == 2:  # intervals.py
        left, right = split_top(s, "\\setminus")
        return difference(key(left, depth + 1), key(right, depth + 1))
    parts = split_top(s, "\\cup") if "\\cup" in s else [s]
    if len(parts) > 1:  # order-free, finite sets joined, touching intervals merged
        return union([key(p, depth + 1) for p in parts])
    if s[0] == "\u2983" and s[-1] == "\u2984" and wraps(s):
        return _multiset(split_top(s[1:-1], ","), depth)
    if s[0] in "([" and s[-1] in ")]" and wraps(s):
        items = split_top(s[1:-1], ",")
        if len(items) > 1:  # tuples and intervals: order and brackets matter
            return ("seq", s[0], s[-1]) + tuple(key(x, depth + 1) for x in items)
    items = split_top(s, ",") if "," in s else [s]
    if len(items) > 1 or s.count("\\pm") == 1:
        return _multiset(items, depth)
    if _RELATION.search(s):
        return relation(s) or ("str", s)
    if s.count("=") == 1:
        value = _equation(s)
        return ("str", s) if value is None else ("eq", value)
    value = _value(s)
    return ("str", s) if value is None else ("num", _frozen(value))


def _multiset(items, depth):
    """Bare lists, sets and a \\pm b: order does not matter, nor do repeats ("(1,2),(1,2),(3,4)"
    lists the solutions "(1,2),(3,4)", as Math-Verify's sets do)."""
    out = []
    for item in items:  # a \pm b is the two items a + b, a - b
        a, pm, b = item.partition("\\pm")
        out.extend([a + "+" + b, a + "-" + b] if pm and "\\pm" not in b else [item])
    keys = [key(x, depth + 1) for x in out]
    return ("set",) + tuple(sorted(set(keys), key=repr))  # repeats: measured, CORPUS.md
