"""
Quotients of polynomials, for exact.py's "/" and \\frac: in one symbol the common factor of
numerator and denominator cancels, as sympy's simplify does (\\frac{x^2-1}{x-1} == x+1,
\\frac{2x+2}{x^2-1} == \\frac{2}{x-1}); in any symbols a multiple of the denominator is a number
(\\frac{a+b}{2a+2b} == 1/2). What is left of the denominator becomes the opaque factor of
values._reciprocal, so equal quotients have one value. Only polynomials in one symbol with
rational coefficients and degree <= MAX_DEGREE are divided (Euclid's algorithm on Fractions,
bounded by the degrees); any other quotient is n * _reciprocal(d), as before.
"""

from fractions import Fraction

from nanorm.base.algebra.values import MAX_BITS, _bits, _mul, _NoValue, _reciprocal

MAX_DEGREE = 12


def _poly(value):
    """(symbol, [coefficient of x^0, x^1, ...]) for a polynomial in one symbol, else None."""
    names, powers = set(), {}
    for (r, syms), c in value.items():
        if r != 1 or len(syms) > 1 or (syms and not 0 < syms[0][1] <= MAX_DEGREE):
            return None
        names.update(name for name, _ in syms)
        powers[syms[0][1] if syms else 0] = Fraction(c)
    if len(names) != 1 or (names & {"i"}):
        return None
    coefs = [powers.get(k, Fraction(0)) for k in range(max(powers) + 1)]
    return names.pop(), coefs


def _divmod(n, d):
    """Quotient and remainder of coefficient lists (d's last coefficient nonzero)."""
    n, q = list(n), [Fraction(0)] * max(len(n) - len(d) + 1, 1)
    for k in range(len(n) - len(d), -1, -1):
        c = n[k + len(d) - 1] / d[-1]
        q[k] = c
        for j, dc in enumerate(d):
            n[k + j] -= c * dc
        if any(_bits(x) > MAX_BITS for x in n):
            raise _NoValue
    while len(n) > 1 and not n[-1]:
        n.pop()
    return q, n[: len(d) - 1] or [Fraction(0)]


def _gcd(a, b):
    while any(b):
        _, r = _divmod(a, b)
        while len(r) > 1 and not r[-1]:
            r.pop()
        a, b = b, r
    return a


def _value(name, coefs):
    return {(1, ((name, k),) if k else ()): c for k, c in enumerate(coefs) if c}


def quotient(n, d):
    """n / d as a value: the common factor cancelled when both are polynomials in one symbol."""
    ratios = {Fraction(n[t]) / Fraction(d[t]) for t in d} if n and set(n) == set(d) else ()
    if len(d) > 1 and len(ratios) == 1:  # \\frac{a+b}{2a+2b} == 1/2, in any symbols
        return {(1, ()): ratios.pop()}
    pn, pd = _poly(n) if n else None, _poly(d)
    if pn is None or pd is None or pn[0] != pd[0] or len(pd[1]) < 2:
        return _mul(n, _reciprocal(d))
    g = _gcd(pn[1], pd[1])
    top, _ = _divmod(pn[1], g) if len(g) > 1 else (pn[1], None)
    bottom, _ = _divmod(pd[1], g) if len(g) > 1 else (pd[1], None)
    return _mul(_value(pn[0], top), _reciprocal(_value(pd[0], bottom)))
