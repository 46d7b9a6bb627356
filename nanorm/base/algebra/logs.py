"""
Logarithms and exponentials of exact values (values.py), for exact.py, as sympy evaluates
them. \\ln of a positive rational times a square root and a power of e is a sum of logarithms
of primes plus that power (\\ln 4 == 2\\ln 2, \\ln\\frac{e^2}{3} == 2 - \\ln 3, \\ln e == 1);
\\log_b x is \\ln x / \\ln b, a number when x is a power of b (\\log_2 8 == 3,
\\log_{10} 1000 == 3, \\log_{\\sqrt2} 4 == 4) and \\frac{\\ln 3}{\\ln 2} for \\log_2 3
(and \\frac{\\ln x}{\\ln 2} for \\log_2 x).
\\log without a base is base 10, as latex2sympy (so Math-Verify) reads it. \\exp(x) is e^x.
Anything else (\\ln x, \\ln(-1), \\log_6 5) stays an opaque factor equal only to itself.
Primes are found by trial division up to MAX_TRIAL; a larger cofactor counts as one "prime",
the same on both sides, so the work is bounded.
"""

from fractions import Fraction

from nanorm.base.algebra.roots import integer_power, power
from nanorm.base.algebra.values import _inverse, _mul, _opaque

MAX_TRIAL = 1000
E = {(1, (("e", 1),)): 1}
_TEN = {(1, ()): 10}


def _ln_of_prime(p):
    """The term of \\ln p: the opaque factor \\ln of p, as exact.py has always named it."""
    return next(iter(_opaque("\\ln", {}, {(1, ()): p})))


def _factor(n):
    """[(prime, multiplicity)] of n >= 1, trial division up to MAX_TRIAL, then the cofactor."""
    out, d = [], 2
    while d <= MAX_TRIAL and d * d <= n:
        m = 0
        while n % d == 0:
            n, m = n // d, m + 1
        out += [(d, m)] if m else []
        d += 1
    return out + ([(n, 1)] if n > 1 else [])


def _ln(x):
    """ln x as a value for x = c * sqrt(r) * e^k with c > 0 rational, else None."""
    if len(x) != 1:
        return None
    (((r, syms), c),) = x.items()
    if c <= 0 or any(name != "e" for name, _ in syms):
        return None
    c = Fraction(c)
    out = {(1, ()): Fraction(syms[0][1])} if syms else {}
    for n, weight in ((c.numerator, 1), (c.denominator, -1), (r, Fraction(1, 2))):
        for p, m in _factor(n):
            term = _ln_of_prime(p)
            out[term] = out.get(term, 0) + weight * m
    return {t: c for t, c in out.items() if c}


def _ratio(x, y):
    """t with x == t * y when there is one (y not empty), else None."""
    if set(x) != set(y):
        return None
    ratios = {Fraction(x[t]) / Fraction(y[t]) for t in y}
    return ratios.pop() if len(ratios) == 1 else None


def logarithm(name, base, arg, n):
    """\\ln, \\log (base 10 unless a subscript gives one) or \\exp of arg, to the power n."""
    if name == "\\exp":
        return integer_power(power(E, arg), n)
    if name == "\\ln" and base:
        return _opaque(name, base, arg, power=n)
    base = E if name == "\\ln" else (base or _TEN)
    ln_x, ln_b = _ln(arg), _ln(base)
    if ln_x is None and ln_b and len(ln_b) == 1:  # \\log_2 x is \\ln x / \\ln 2
        ln_x = _opaque("\\ln", {}, arg)
    if ln_x is None or not ln_b:
        return _opaque(name, {} if name == "\\ln" else base, arg, power=n)
    if len(ln_b) == 1:
        return integer_power(_mul(ln_x, _inverse(ln_b)), n)
    ratio = _ratio(ln_x, ln_b) if ln_x else 0
    if ratio is None:
        return _opaque(name, base, arg, power=n)
    return integer_power({(1, ()): ratio} if ratio else {}, n)
