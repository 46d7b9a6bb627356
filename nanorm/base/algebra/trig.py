"""
Trigonometry on exact values (values.py), as sympy's simplify would see it, for exact.py.

tan, cot, sec, csc are quotients of sin and cos; sin and cos of a sum or of an integer multiple
(up to 6) expand; at k*pi/12 they are exact surds; sin^2 u is rewritten 1 - cos^2 u, so a
polynomial in sines and cosines has one value modulo sin^2 + cos^2 = 1 ("\\sin^2 x+\\cos^2 x" is
1, "\\sin 2x" is 2\\sin x\\cos x). Degrees right after a function become radians in
verifiable.canonical() ("\\sin 30^\\circ" is \\sin(30\\pi/180) = 1/2). \\arcsin, \\arccos, \\arctan
(and \\sin^{-1} ...) of a sine, cosine or tangent of k*pi/12 are that angle in their principal
range ("\\arctan 1" is pi/4, "\\arccos(-1)" is pi); elsewhere they are opaque. Not covered: half
angles (cos(pi/8) is not the surd of a surd).
"""

from fractions import Fraction

from nanorm.base.algebra.values import (
    MAX_DEPTH,
    MAX_TERMS,
    _frozen,
    _inverse,
    _mul,
    _NoValue,
    _opaque,
)

_QUOTIENT = {"\\tan": ("\\sin", "\\cos"), "\\cot": ("\\cos", "\\sin"), "\\sec": (None, "\\cos"),
             "\\csc": (None, "\\sin")}  # fmt: skip
_Q = Fraction(1, 4)
_SIN_DEGREES = {0: {}, 15: {(6, ()): _Q, (2, ()): -_Q}, 30: {(1, ()): Fraction(1, 2)},
                45: {(2, ()): Fraction(1, 2)}, 60: {(3, ()): Fraction(1, 2)},
                75: {(6, ()): _Q, (2, ()): _Q}, 90: {(1, ()): 1}}  # fmt: skip


_ARCS = ("\\arcsin", "\\arccos", "\\arctan")
_INVERSE = {"\\sin": "\\arcsin", "\\cos": "\\arccos", "\\tan": "\\arctan"}  # \\sin^{-1}


def _arc_tables():
    """{arc name: {frozen value: angle}}: sin on [-pi/2, pi/2], cos on [0, pi], tan on
    (-pi/2, pi/2), at multiples of pi/12 (tan(pi/12) = 2 - sqrt 3 is not a quotient here)."""
    angle = lambda k: {(1, (("\\pi", 1),)): Fraction(k, 12)} if k else {}  # noqa: E731
    sin = {_frozen(_sin_cos(True, angle(k), 0)): angle(k) for k in range(-6, 7)}
    cos = {_frozen(_sin_cos(False, angle(k), 0)): angle(k) for k in range(13)}
    tan = {_frozen({(3, ()): Fraction(k, 3)}): angle(2 * k) for k in (-1, 1)}  # pi/6
    tan |= {_frozen({(3, ()): k}): angle(4 * k) for k in (-1, 1)}  # pi/3
    tan |= {_frozen({(1, ()): k}): angle(3 * k) for k in (-1, 0, 1)}  # 0, pi/4
    for k, sign in ((1, 1), (5, -1), (-1, -1), (-5, 1)):  # tan(pi/12) = 2 - sqrt 3 ...
        tan[_frozen({(1, ()): 2 * (1 if k > 0 else -1), (3, ()): -sign})] = angle(k)
    return dict(zip(_ARCS, (sin, cos, tan), strict=True))


def _function(name, base, arg, n):
    if name in _ARCS:
        found = _ARC_TABLES[name].get(_frozen(arg))
        return _opaque(name, base, arg, power=n) if found is None else _pow_small(found, n)
    if name in _QUOTIENT and not base:
        top, bottom = (_function(f, {}, arg, 1) if f else {(1, ()): 1} for f in _QUOTIENT[name])
        try:
            one = _mul(top, _inverse(bottom))
        except _NoValue:  # a sum below (cos of a sum): no quotient
            return _opaque(name, base, arg, power=n)
        return _pow_small(one, n)
    if name not in ("\\sin", "\\cos") or base:
        return _opaque(name, base, arg, power=n)
    return _pow_small(_sin_cos(name == "\\sin", arg, 0), n)


def _pow_small(value, n):
    out = {(1, ()): 1}
    for _ in range(n):
        out = _mul(out, value)
    return out


def _sin_cos(is_sin, arg, depth):
    """sin(arg) or cos(arg) as a value: expanded over sums and multiples, exact at k*pi/12."""
    if depth > MAX_DEPTH:
        raise _NoValue
    pi = [(t, c) for t, c in arg.items() if t == (1, (("\\pi", 1),))]
    if len(arg) == len(pi) and (not pi or (pi[0][1] * 12).denominator == 1):
        degrees = int(pi[0][1] * 180) % 360 if pi else 0
        degrees = degrees if is_sin else (degrees + 90) % 360  # cos u = sin(u + 90)
        sign = -1 if degrees >= 180 else 1
        degrees %= 180
        return {t: sign * c for t, c in _SIN_DEGREES[min(degrees, 180 - degrees)].items()}
    (term, coef), *rest = sorted(arg.items())
    if rest or (coef.denominator == 1 and 1 < abs(coef) <= 6):  # sin(a + b), sin(k a)
        a = dict(rest) if rest else {term: coef - (1 if coef > 0 else -1)}
        b = {term: coef} if rest else {term: 1 if coef > 0 else -1}
        sa, ca, sb, cb = (_sin_cos(f, v, depth + 1) for v in (a, b) for f in (True, False))
        first, second = (_mul(sa, cb), _mul(ca, sb)) if is_sin else (_mul(ca, cb), _mul(sa, sb))
        sign = 1 if is_sin else -1
        out = dict(first)
        for t, c in second.items():
            out[t] = out.get(t, 0) + sign * c
        return {t: c for t, c in out.items() if c}
    if coef < 0:  # sin(-u) = -sin u, cos(-u) = cos u
        return {t: -c if is_sin else c for t, c in _sin_cos(is_sin, {term: -coef}, depth).items()}
    return _opaque("\\sin" if is_sin else "\\cos", {}, arg)


def _pythagoras(value):
    """Rewrite each sin^p u (p >= 2) as sin^(p-2) u (1 - cos^2 u) until none is left."""
    for _ in range(4 * MAX_TERMS):
        found = next(
            ((t, n, p) for t in value for n, p in t[1] if n[:5] == "\\sin(" and p > 1), None
        )
        if found is None:
            return value
        (r, syms), name, p = found
        coef = value.pop((r, syms))
        rest = {
            (r, tuple((k, q - 2 if k == name else q) for k, q in syms if k != name or q > 2)): coef
        }
        cos2 = {(1, ()): 1, (1, (("\\cos" + name[4:], 2),)): -1}
        for t, c in _mul(rest, cos2).items():
            value[t] = value.get(t, 0) + c
        value = {t: c for t, c in value.items() if c}
    raise _NoValue


_ARC_TABLES = _arc_tables()
