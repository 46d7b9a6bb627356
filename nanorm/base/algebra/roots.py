"""
Powers and roots of exact values (values.py), for exact.py's "^" and \\sqrt, as sympy
evaluates them: integer powers expand; a rational power of a rational number is exact when
the root is (8^{1/3} is 2, 4^{-1/2} is 1/2, 12^{1/2} is 2\\sqrt3, \\sqrt[3]{16} is
2\\sqrt[3]{2}); x^{1/2} is \\sqrt{x} and x^{3/2} is x\\sqrt{x}; and a square root of
a + b\\sqrt r denests by the one exact rule, sqrt(a + b sqrt r) = sqrt((a+d)/2) +
sgn(b) sqrt((a-d)/2) when d^2 = a^2 - b^2 r is a rational square (\\sqrt{3+2\\sqrt2} is
1+\\sqrt2). A root that is not exact is an opaque factor named by its base and 1/q, so
\\sqrt[3]{2} == 2^{1/3} and equals nothing else; odd roots of negative numbers stay opaque
(sympy's principal root is complex). Powers with a symbol in the exponent have one form:
9^n == 3^{2n}, 2^{n+1} == 2 \\cdot 2^n, 2^{-n} == \\frac{1}{2^n} (_exponential).
"""

from fractions import Fraction
from math import isqrt

from nanorm.base.algebra.values import (
    MAX_BITS,
    MAX_EXPONENT,
    MAX_TERMS,
    _bits,
    _const,
    _mul,
    _NoValue,
    _opaque,
    _reciprocal,
    _squarefree,
)

MAX_ROOT = 64  # \sqrt[q]{x} and x^{p/q}: q up to this, else no value
MAX_ROOT_BITS = 256  # exact q-th roots (q > 2) are looked for in numbers up to this size
MAX_TRIAL = 1000  # q-th powers are pulled out of a radicand by trial division up to this


def sqrt_value(c):
    """The square root of a rational c: out * sqrt(inside) / denominator (times i if c < 0)."""
    out, inside = _squarefree(abs(c.numerator) * c.denominator)
    value = {(inside, ()): Fraction(out, c.denominator)} if c else {}
    return _mul(value, {(1, (("i", 1),)): 1}) if c < 0 else value


def _rational_sqrt(c):
    """sqrt(c) as a Fraction when c >= 0 is the square of a rational, else None."""
    n, d = isqrt(c.numerator), isqrt(c.denominator)
    return Fraction(n, d) if n * n == c.numerator and d * d == c.denominator else None


def _denest(inside):
    """sqrt(a + b sqrt r) as sqrt((a+d)/2) +- sqrt((a-d)/2), or None when d is no rational."""
    a = inside.get((1, ()))
    if a is None or len(inside) != 2 or any(syms for _, syms in inside):
        return None
    ((r, _), b) = next((t, c) for t, c in inside.items() if t != (1, ()))
    a, b = Fraction(a), Fraction(b)
    square = a * a - b * b * r
    d = _rational_sqrt(square) if a > 0 and square >= 0 else None
    if d is None:
        return None
    out = sqrt_value((a + d) / 2)
    for t, c in sqrt_value((a - d) / 2).items():
        out[t] = out.get(t, 0) + (c if b > 0 else -c)
    return {t: c for t, c in out.items() if c}


def square_root(inside):
    """\\sqrt{inside}: exact for rationals, denested for a + b sqrt r, the root of a positive
    coefficient taken out of one term (\\sqrt{12x} is 2\\sqrt3 \\sqrt{x}), else opaque."""
    if not set(inside) - {(1, ())}:
        return sqrt_value(Fraction(_const(inside)))
    (((r, syms), c),) = inside.items() if len(inside) == 1 else (((0, ()), 0),)
    if r == 1 and syms and c > 0 and c != 1:
        return _mul(sqrt_value(Fraction(c)), _opaque("\\sqrt", {(1, syms): 1}))
    return _denest(inside) or _opaque("\\sqrt", inside)


def _iroot(n, q):
    """The integer q-th root of n >= 0 when n is a q-th power, else None (binary search)."""
    if n.bit_length() > MAX_ROOT_BITS:
        return None
    low, high = 0, 1 << (n.bit_length() // q + 1)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if mid**q <= n else (low, mid - 1)
    return low if low**q == n else None


def _root(base, q):
    """base^(1/q) as a value, or None when there is no rule for it."""
    if q == 2:
        return square_root(base)  # x^{1/2} is \\sqrt{x}
    if set(base) - {(1, ())}:
        return None
    c = Fraction(_const(base))
    if c <= 0:
        return None if c else {}
    n = c.numerator * c.denominator ** (q - 1)  # c^(1/q) = n^(1/q) / denominator
    exact = _iroot(n, q)
    if exact is not None:
        return {(1, ()): Fraction(exact, c.denominator)}
    out, d = 1, 2
    while d <= MAX_TRIAL and d**q <= n:  # pull q-th powers out: 16^(1/3) = 2 * 2^(1/3)
        while n % d**q == 0:
            n //= d**q
            out *= d
        d += 1
    return _mul({(1, ()): Fraction(out, c.denominator)}, _opaque("^", {(1, ()): n}, _ONE_OVER[q]))


_ONE_OVER = {q: {(1, ()): Fraction(1, q)} for q in range(2, MAX_ROOT + 1)}


def integer_power(base, n):
    """base^n for an int n, refused (_NoValue) before the result would grow past the limits."""
    if abs(n) > MAX_EXPONENT:
        raise _NoValue
    if n < 0:
        base, n = _reciprocal(base), -n
    if n * max(map(_bits, base.values()), default=0) > MAX_BITS or (
        len(base) > 1 and n > MAX_TERMS
    ):
        raise _NoValue  # bound the size of the result before computing it
    out = {(1, ()): 1}
    while True:  # square and multiply; _mul refuses more than MAX_TERMS terms
        if n & 1:
            out = _mul(out, base)
        n >>= 1
        if not n:
            return out
        base = _mul(base, base)


def _perfect_power(n):
    """(m, j) with n = m^j and j as large as can be: 9 -> (3, 2), 12 -> (12, 1)."""
    for j in range(min(n.bit_length(), MAX_ROOT), 1, -1):
        m = _iroot(n, j)
        if m is not None and m > 1:
            return m, j
    return n, 1


def _exponential(base, exponent):
    """base^exponent for an exponent that is no number, one form for equal powers: an integer
    base is its smallest root (9^n is 3^{2n}), 1/b is b with the exponent negated, and each term
    of the exponent is its own factor, an integer coefficient its power (2^{n+1} is 2 * 2^n,
    e^{x+y} is e^x e^y, e^{2x} is (e^x)^2, 2^{-n} is 1/2^n)."""
    exponent = dict(exponent)
    if not set(base) - {(1, ())} and base and _const(base) > 0:
        c = Fraction(_const(base))
        if c.numerator == 1 and c.denominator > 1:
            c, exponent = 1 / c, {t: -v for t, v in exponent.items()}
        if c.denominator == 1 and c > 1:
            m, j = _perfect_power(c.numerator)
            base, exponent = {(1, ()): m}, {t: v * j for t, v in exponent.items()}
    k = exponent.pop((1, ()), 0)
    out = power(base, {(1, ()): k}) if k else {(1, ()): 1}
    for t, c in sorted(exponent.items()):
        c = Fraction(c)
        whole = c.denominator == 1
        factor = _opaque("^", base, {t: 1 if whole else abs(c)})
        out = _mul(out, integer_power(factor, int(c) if whole else (1 if c > 0 else -1)))
    return out


def power(base, exponent):
    """base^exponent: integer powers expand, rational ones take exact roots (_root); any other
    exponent (10^{x}, 2^{\\sqrt2}) makes an opaque factor (_exponential)."""
    if set(exponent) - {(1, ())}:
        return _exponential(base, exponent)
    e = Fraction(_const(exponent))
    if abs(e) > MAX_EXPONENT:
        raise _NoValue
    if e.denominator == 1:
        return integer_power(base, int(e))
    root = _root(base, e.denominator) if e.denominator <= MAX_ROOT else None
    if root is None:
        return _opaque("^", base, exponent)
    if e.denominator == 2 and any(syms for _, syms in base):  # x^{3/2} is x \\sqrt{x}
        whole = _mul(integer_power(base, (abs(e.numerator) - 1) // 2), root)
        return whole if e > 0 else _reciprocal(whole)
    return integer_power(root, e.numerator)
