"""
Written decimals against exact values, for verifiable.answers_match. exact.py never rounds:
reading "0.33" as 1/3 is a policy, and this file holds it.

close(a, b) compares exact.key()s where a was written in decimals. Either rule suffices, number
by number (cell by cell in tuples and matrices; sets are compared exactly, their order is by
value):
- nanoRM's own: a number of 2+ places in a is b's value rounded or cut to its places, when that
  value has no exact decimal that long (0.33 for 1/3, 0.0833 for 1/12). 0.8 for 3/4 stays
  wrong: 3/4 is exactly 0.75.
- Math-Verify's (its default float_rounding=6): a number of 6+ places in
  a and b rounded to 6 places agree, b a constant with no exact decimal as long as a's:
  radicals, pi, e, logarithms, a rational such as 2/3 (0.6666667 and 0.666667 for 2/3, 3.141593 for pi,
  1.414214 for sqrt 2). A b that is such a decimal, or an integer, is compared exactly:
  Math-Verify equates 2.5000001 with 2.5 and the MATH answer 0.0000672 with 0.0000673 (both
  0.000067), nanoRM does not; 0.0000001 is not 0 in either.
  Measured on dev (bench/CORPUS.md): no false positive added.
"""

import math
import re
from fractions import Fraction

_CONSTANTS = {"\\pi": math.pi, "e": math.e}
_LN_PRIME = re.compile(r"\\ln\(\(\), \(\(\(1, \(\)\), ([0-9]{1,30})\),\)\)")  # logs.py's \ln p


def _ln_prime(name):
    """ln p as a float for logs.py's factor \\ln p, else None."""
    m = _LN_PRIME.fullmatch(name)
    return math.log(int(m[1])) if m else None


PLACES = 6


def close(a, b):
    """Keys a (written in decimals) and b equal, or equal up to the rounding rules above."""
    if a == b:
        return True
    if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and a):
        return False
    if a[0] == b[0] == "num":
        d = _rational(a[1])
        if d is None:
            return False
        x = _rational(b[1])
        return (x is not None and _rounds(d, x)) or _six_places(d, b[1])
    return a[0] != "set" and all(close(x, y) for x, y in zip(a, b, strict=True))


def _rational(frozen):
    """The rational number a frozen value is, or None (0 is the empty value)."""
    if not frozen:
        return Fraction(0)
    value = dict(frozen)
    return Fraction(value[(1, ())]) if len(value) == 1 and (1, ()) in value else None


def _rounds(d, x):
    places = next((k for k in range(40) if (d * 10**k).denominator == 1), 0)
    if places < 2 or (x * 10**places).denominator == 1 or (x < 0) != (d < 0):
        return False
    gap, place = abs(x) - abs(d), Fraction(1, 10**places)  # rounded: within half a place;
    return abs(gap) <= place / 2 or 0 < gap < place  # cut: below x by less than a place


def _six_places(d, frozen):
    """d (6+ places) and the constant b agree to PLACES places, b no decimal as long as d."""
    places = next((k for k in range(40) if (d * 10**k).denominator == 1), 0)
    if places < PLACES:  # 2.5 does not stand for 2.5000001
        return False
    x = _rational(frozen)
    if x is not None:  # and, as above, only a value with no exact decimal as long as d's
        return (x * 10**places).denominator != 1 and _round(d) == _round(x)
    total = 0.0
    for (radicand, symbols), coef in frozen:  # coef * sqrt(radicand) * pi^k e^j (ln p)^m
        values = [_CONSTANTS.get(name) or _ln_prime(name) for name, _ in symbols]
        if None in values or not all(-40 < p < 40 for _, p in symbols):
            return False
        try:
            term = float(coef) * math.sqrt(radicand)
            for value, (_, p) in zip(values, symbols, strict=True):
                term *= value**p
        except OverflowError:
            return False
        total += term
    if not abs(total) < 1e8:  # a float's 16 digits hold 6 places below 10^8 (and not nan)
        return False
    return _round(d) == _round(total)


def _round(q):
    """q (a Fraction or a float) * 10^PLACES rounded to an integer, halves away from zero."""
    n = math.floor(abs(q) * 10**PLACES + Fraction(1, 2))
    return -n if q < 0 else n
