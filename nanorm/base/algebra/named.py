"""
Answers that name their values, for verifiable.answers_match: "p=5,q=2;p=7,q=2" lists two
solutions (";" between groups that name the same variables in alphabetical order: tuples
"(5,2),(7,2)"), and "x=2, y=3" or "(x,y)=(2,3)" name x and y (named: equal when each name
has the same value, in any order: "y=3, x=2"). A name is one letter with an optional
subscript: x, p, x_1, a_{12}.
"""

import re

from nanorm.base.algebra.brackets import split_top, wraps
from nanorm.base.algebra.matrices import key

_NAME = re.compile(r"[a-zA-Z](?:_\{?[0-9a-zA-Z]{1,3}\}?)?")  # a variable: x, p, x_1, a_{12}


def solutions(s):
    """ "p=5,q=2;p=7,q=2" -> "(5,2),(7,2)": ";" separates solutions, each naming the same
    variables in alphabetical order, the order of a tuple. Anything else is left as it is."""
    groups = [[split_top(item, "=") for item in split_top(g, ",")] for g in split_top(s, ";")]
    names = [[x[0].strip() for x in g] for g in groups]
    if len(groups) < 2 or len(names[0]) < 2 or names[0] != sorted(names[0]):
        return s
    if any(n != names[0] for n in names) or not all(_NAME.fullmatch(x) for x in names[0]):
        return s
    return ",".join("(" + ",".join(x[1] for x in g) + ")" for g in groups)


def named(s):
    """{name: key of its value} for an answer naming 2+ values, or None: "(x,y)=(2,3)" and
    "y=3,x=2" are both {x: 2, y: 3}."""
    items = split_top(s, ",")
    if len(items) == 1 and s[:1] == "(" and s.count("=") == 1:
        left, right = s.split("=")
        if not (wraps(left) and right[:1] == "(" and wraps(right)):
            return None
        names, values = split_top(left[1:-1], ","), split_top(right[1:-1], ",")
        pairs = list(zip(names, values, strict=True)) if len(names) == len(values) else []
    else:
        pairs = [x.split("=") for x in items if x.count("=") == 1]
        pairs = pairs if len(pairs) == len(items) else []
    if len(pairs) < 2 or not all(_NAME.fullmatch(name) and value for name, value in pairs):
        return None
    named = {name: key(value) for name, value in pairs}
    return named if len(named) == len(pairs) else None
