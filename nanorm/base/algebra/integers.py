"""
Integer-valued functions of exact values (values.py), for exact.py, as sympy evaluates them:
floor and ceiling of a + c sqrt(r) with a, c rational (\\lfloor \\sqrt{10} \\rfloor == 3,
\\lceil -\\frac{7}{2} \\rceil == -3), \\binom{n}{k} of integers 0 <= k, n <= MAX_N
(\\binom{5}{2} == 10; \\binom{n}{2} == n(n-1)/2), n! of an integer 0 <= n <= MAX_FACTORIAL (\\frac{7!}{2!5!} == 21;
"the answer is 5!" in plain text ends with a mark: extract.py drops it). No absolute values:
read as numbers they made a false positive on the held-out real outputs (tests/test_verifiable).
Anything else is an opaque factor equal only to itself (\\lfloor x \\rfloor, \\binom{n}{2}).
Comparisons are exact: sqrt(r) against a rational by squares.
"""

from fractions import Fraction
from math import comb, floor, isqrt, prod

from nanorm.base.algebra.values import _const, _mul, _NoValue, _opaque

MAX_FACTORIAL = 300  # 300! has about 2000 bits
MAX_N = 1000
MAX_FALLING = 8  # \binom{n}{k} of a symbolic n expands for k up to this: n(n-1)/2  # \binom{1000}{500} has about 1000 bits; larger tops stay opaque


def _surd_floor(c, r):
    """floor(c * sqrt(r)) for rational c and square-free r > 1 (an irrational number)."""
    root = isqrt(floor(c * c * r))  # floor(sqrt(y)) == isqrt(floor(y))
    return root if c > 0 else -root - 1


def _at_least(c, r, t):
    """c * sqrt(r) >= t, exactly (c * sqrt(r) is irrational)."""
    if c > 0:
        return t <= 0 or c * c * r >= t * t
    return t < 0 and c * c * r <= t * t


def rounded(value, up):
    """floor (up=False) or ceiling (up=True) of value when it is a + c sqrt(r), else opaque."""
    a = Fraction(value.get((1, ()), 0))
    surds = [(r, Fraction(c)) for (r, syms), c in value.items() if (r, syms) != (1, ())]
    if len(surds) > 1 or any(syms for _, syms in value):
        return _opaque("\\lceil" if up else "\\lfloor", value)
    if not surds:
        n = -floor(-a) if up else floor(a)
    else:
        ((r, c),) = surds
        m = floor(a + _surd_floor(c, r)) + 1  # a + c sqrt(r) lies below m, above m - 2
        n = m if _at_least(c, r, m - a) else m - 1  # the floor
        n += up  # irrational: the ceiling is the floor + 1
    return {(1, ()): n} if n else {}


def binomial(top, bottom):
    """\\binom{top}{bottom} for integers 0 <= bottom, top <= MAX_N, else opaque."""
    try:
        k = Fraction(_const(bottom))
        n = Fraction(_const(top))
    except _NoValue:
        if set(bottom) - {(1, ())} or not 0 <= k <= MAX_FALLING or k.denominator != 1:
            return _opaque("\\binom", top, bottom)
        value = {(1, ()): Fraction(1, prod(range(1, int(k) + 1)))}  # n(n-1)...(n-k+1) / k!
        for i in range(int(k)):
            value = _mul(value, {**top, (1, ()): top.get((1, ()), 0) - i} if i else top)
        return {t: c for t, c in value.items() if c}
    if n.denominator != 1 or k.denominator != 1 or not (0 <= k and 0 <= n <= MAX_N):
        return _opaque("\\binom", top, bottom)
    value = comb(int(n), int(k))
    return {(1, ()): value} if value else {}


def factorial(value):
    """n! for an integer 0 <= n <= MAX_FACTORIAL; anything else has no value."""
    n = Fraction(_const(value))
    if n.denominator != 1 or not 0 <= n <= MAX_FACTORIAL:
        raise _NoValue
    return {(1, ()): prod(range(1, int(n) + 1))}
