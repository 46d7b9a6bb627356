"""
Exact values: the algebra under exact.py, in pure Python (fractions, no floats).

A value is a dict {(radicand, symbols): Fraction coefficient}: a sum of terms
coef * sqrt(radicand) * x^a * pi^b ..., with radicand square-free and symbols a sorted tuple
of (name, power). Equal dicts mean equal expressions; nothing is ever rounded. Every
operation has a size limit below and raises _NoValue past it, so any input is bounded work.
exact.py parses answers into values, trig.py rewrites sines and cosines, matrices.py adds them.
"""

from fractions import Fraction
from math import gcd

MAX_EXPONENT = 400  # 1e400 is a number; 1e99999 is not parsed (it would be a huge integer)
MAX_DEPTH = 40  # nesting limit for brackets and the expression parser
MAX_TERMS = 64  # expanding (a+b)^n past this many terms is refused
MAX_RADICAND = 10**6  # sqrt(n) is simplified by trial division up to 10^3
MAX_BITS = 10_000  # bigger numerators or denominators are refused (about 3000 digits)


class _NoValue(Exception):
    pass


def _squarefree(n):
    """n = out^2 * inside with inside square-free; trial division, so n is capped."""
    if n > MAX_RADICAND:
        raise _NoValue
    out, d = 1, 2
    while d * d <= n:
        while n % (d * d) == 0:
            n //= d * d
            out *= d
        d += 1
    return out, n


def _mul_terms(a, b):
    (ra, sa), (rb, sb) = a, b
    g = gcd(ra, rb)  # sqrt(ra) * sqrt(rb) = g * sqrt(ra/g * rb/g), still square-free
    coef, powers = g, dict(sa)
    for name, p in sb:
        powers[name] = powers.get(name, 0) + p
    if "i" in powers:  # the one identity applied to symbols: i^2 = -1
        coef = -coef if powers["i"] // 2 % 2 else coef
        powers["i"] %= 2
    syms = tuple(sorted((k, p) for k, p in powers.items() if p))
    return coef, ((ra // g) * (rb // g), syms)


def _mul(x, y):
    out = {}
    for ta, ca in x.items():
        for tb, cb in y.items():
            coef, term = _mul_terms(ta, tb)
            out[term] = out.get(term, 0) + ca * cb * coef
    out = {t: c for t, c in out.items() if c}
    if len(out) > MAX_TERMS or any(_bits(c) > MAX_BITS for c in out.values()):
        raise _NoValue
    return out


def _bits(c):
    return max(c.numerator.bit_length(), c.denominator.bit_length())


def _inverse(x):
    """1 / x for a single term c*sqrt(r)*syms: (1/(c*r)) * sqrt(r) * syms^-1. Sums refused."""
    if len(x) != 1:
        raise _NoValue
    ((r, syms), c) = next(iter(x.items()))
    return _mul({(r, ()): Fraction(1) / (c * r)}, {(1, tuple((k, -p) for k, p in syms)): 1})


def _const(x):
    """The rational number x, or raise: only constants can be exponents or radicands."""
    if not x:
        return 0
    if len(x) != 1 or (1, ()) not in x:
        raise _NoValue
    return x[(1, ())]


# an opaque factor (\sin x, 10^{x}) is a symbol named by its exact parts: equal only to itself
def _opaque(name, *parts, power=1):
    return {(1, ((name + repr(tuple(_frozen(p) for p in parts)), power),)): 1}


def _frozen(value):
    """A value as a sorted tuple; integral coefficients as int so that equal keys also have
    equal repr (multisets sort by repr)."""
    return tuple(sorted((t, int(c) if c.denominator == 1 else c) for t, c in value.items() if c))


def _reciprocal(x):
    """1 / x for any value: _inverse for one term; for a two-term a + b whose a^2 - b^2 is one
    term (1 + \\sqrt2, 3 + 4i, \\sqrt3 + \\sqrt2) the conjugate over it, as sympy rationalizes;
    any other sum an opaque factor "1/(x / lead)" over lead, its largest term's coefficient, so
    1/(2x+2) == (1/2) / (x+1) and (x-1)^{-1} == 1/(x-1). It cancels nothing: polynomials.py
    does, for a quotient in one symbol."""
    if len(x) <= 1:
        return _inverse(x)  # (refuses 1/0)
    if len(x) == 2:
        (a, ca), (b, cb) = sorted(x.items())
        norm = _mul({a: ca}, {a: ca})
        for t, c in _mul({b: cb}, {b: cb}).items():
            norm[t] = norm.get(t, 0) - c
        norm = {t: c for t, c in norm.items() if c}
        if len(norm) == 1:
            return _mul({a: ca, b: -cb}, _inverse(norm))
    lead = Fraction(x[max(x)])
    scaled = {t: Fraction(c) / lead for t, c in x.items()}
    return _mul({(1, ()): 1 / lead}, _opaque("1/", scaled))
