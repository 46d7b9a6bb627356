"""
Unions of intervals and finite sets as one key, for exact.key: a union is a set of reals, so
the order of its parts does not matter ("(1,\\infty) \\cup (-\\infty,-1)" is
"(-\\infty,-1) \\cup (1,\\infty)"), finite sets join ("\\{1,2\\} \\cup \\{3\\}" is "\\{1,2,3\\}"),
and intervals that overlap or touch at a closed end merge ("[1,2] \\cup [2,3]" is "[1,3]",
"[1,2) \\cup (2,3]" stays two). Endpoints merge only when both are rational or infinite;
others keep their parts, sorted. Work is a sort of the parts: bounded by their number.
"""

from fractions import Fraction

INFINITE = {("str", "\\infty"): 1, ("str", "-\\infty"): -1}


def _end(k):
    """An endpoint key as a comparable (infinity, Fraction), or None when it is no rational."""
    if k in INFINITE:
        return (INFINITE[k], Fraction(0))
    if k[0] != "num" or len(k[1]) > 1 or (k[1] and k[1][0][0] != (1, ())):
        return None
    return (0, Fraction(k[1][0][1]) if k[1] else Fraction(0))


def _interval(k):
    """(low, high, closed low, closed high, k) for an interval key with rational ends, else None."""
    if k[0] != "seq" or len(k) != 5 or k[1] not in "([" or k[2] not in ")]":
        return None
    low, high = _end(k[3]), _end(k[4])
    if low is None or high is None or high < low:
        return None
    return (low, high, k[1] == "[", k[2] == "]", k)


def union(parts):
    """The key of the union of these keys (each a part of "A \\cup B \\cup ...")."""
    flat = []
    for part in parts:
        flat.extend(part[1:] if part[0] == "union" else [part])
    items = {x for p in flat if p[0] == "set" for x in p[1:]}
    spans = sorted((s for s in map(_interval, flat) if s), key=lambda s: (s[0], not s[2]))
    rest = [p for p in flat if p[0] != "set" and not _interval(p)]
    merged = []
    for low, high, closed_low, closed_high, k in spans:
        if merged:
            m_low, m_high, m_closed_low, m_closed_high, m_k = merged[-1]
            if low < m_high or (low == m_high and (m_closed_high or closed_low)):
                if (high, closed_high) > (m_high, m_closed_high):
                    m_k = (m_k[0], m_k[1], k[2], m_k[3], k[4])
                    m_high, m_closed_high = high, closed_high
                merged[-1] = (m_low, m_high, m_closed_low, m_closed_high, m_k)
                continue
        merged.append((low, high, closed_low, closed_high, k))
    out = [m[4] for m in merged] + rest
    if items:
        out.append(("set",) + tuple(sorted(items, key=repr)))
    return out[0] if len(out) == 1 else ("union",) + tuple(sorted(out, key=repr))


def difference(a, b):
    """The key of "A \\setminus B" for A an interval or a union of intervals with rational ends
    and B a finite set of rational points ("(0,2) \\setminus \\{1\\}" is "(0,1) \\cup (1,2)",
    "\\mathbb{R} \\setminus \\{0\\}" is "x \\ne 0"); any other difference is kept as written."""
    spans = [_interval(k) for k in (a[1:] if a[0] == "union" else (a,))]
    points = sorted(((_end(x), x) for x in b[1:]), key=repr) if b[0] == "set" else [(None, 0)]
    if None in spans or any(p is None or p[0] for p, _ in points):  # p[0]: an infinite point
        return ("minus", a, b)
    pieces = []
    for low, high, closed_low, closed_high, k in spans:
        start, closed_start = k[3], closed_low
        for p, point in sorted((p, x) for p, x in points if low <= p <= high):
            if p == high:  # an end only opens
                closed_high = False
            elif p == low:
                closed_start = False
            else:
                pieces.append(("seq", "[" if closed_start else "(", ")", start, point))
                start, closed_start = point, False
        pieces.append(
            ("seq", "[" if closed_start else "(", "]" if closed_high else ")", start, k[4])
        )
    return union(pieces)
