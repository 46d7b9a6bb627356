"""
Matrices in answers: literals and their arithmetic, read into exact keys (exact.py) for
verifiable.answers_match.

A matrix is a \\begin{pmatrix} (bmatrix, matrix, [array] ...) literal, whatever its brackets:
its key is ("matrix", rows of cell keys), so a pmatrix equals the same bmatrix. An answer that
is arithmetic on matrix literals is evaluated exactly, as Math-Verify's sympy does: sums and
differences, a scalar times a matrix, products of matrices (juxtaposed, * or \\cdot), a
transpose ^T and a small integer power: "2\\begin{pmatrix}1\\\\2\\end{pmatrix}" equals
"\\begin{pmatrix}2\\\\4\\end{pmatrix}". Anything else (a bracketed sum times a matrix, a
determinant, a shape mismatch) is no matrix key, and the answer goes to exact.key as a string.
Matrices can be the items of a tuple, list or set ("(\\begin{pmatrix}..\\end{pmatrix}, 5)", a
list of vectors): each item is read as above (Math-Verify compares such a tuple as a string).

    from nanorm.base.algebra.matrices import key     # exact.key, with matrices read first
"""

import re

from nanorm.base.algebra.exact import MAX_TERMS, _frozen, _mul, _value
from nanorm.base.algebra.exact import key as exact_key

MAX_SIDE = 16  # rows or columns; bigger literals are compared as strings
MAX_POWER = 16
# one literal, no nesting; the column spec of an array is skipped: {cc}, {c|c}
_LITERAL = re.compile(r"\\begin\{([a-zA-Z]+)\}(?:\{[lcr|]+\})?(.*?)\\end\{\1\}", re.S)
_PLACE = 0xE000  # literal number k stands in the expression as the private-use chr(0xE000 + k)
_FACTOR = re.compile(r"([\ue000-\ue0ff])(\^\{?(?:T|[0-9]+)\}?)?")
_PLACED = re.compile("[\ue000-\ue0ff]")


class _NoMatrix(Exception):
    pass


def key(s):
    """exact.key(s), except that an answer made of matrix literals is a ("matrix", ...) key, and
    so is each item of a tuple, list or set that is one."""
    if "\\end{" in s:
        found = _matrix_key(s)
        if found is None:
            found = _items_key(s)
        if found is not None:
            return found
    return exact_key(s)


def _items_key(s):
    """Matrices as items: "(\\begin{pmatrix}1\\\\2\\end{pmatrix}, 5)", "\\{A, B\\}", "A, B". Each
    literal stands as one private-use character while exact.key reads the structure; an item
    holding one is then read as a matrix expression, or else stays a string (with its text)."""
    if _PLACED.search(s):  # the text has the stand-in characters itself
        return None
    literals = []

    def place(m):
        literals.append(m.group())
        return chr(_PLACE + len(literals) - 1)

    text = _LITERAL.sub(place, s)
    if not literals or len(literals) > 0xFF or "\\end{" in text:
        return None
    structure = exact_key(text)
    return _fill(structure, literals) if structure[0] in ("seq", "set", "union") else None


def _fill(node, literals):
    if node[0] == "str":
        text = _PLACED.sub(lambda m: literals[ord(m.group()) - _PLACE], node[1])
        return (_matrix_key(text) or ("str", text)) if text != node[1] else node
    if node[0] == "set":  # sets are sorted (and without repeats) as exact._multiset has them
        items = [_fill(x, literals) for x in node[1:]]
        return ("set",) + tuple(sorted(set(items), key=repr))
    if node[0] in ("seq", "union"):
        return tuple(_fill(x, literals) if isinstance(x, tuple) else x for x in node)
    return node


def _matrix_key(s):
    if s[:1] + s[-1:] in ("()", "[]") and _wrapped(s):  # "(\begin{array}...\end{array})"
        s = s[1:-1]
    literals = []

    def place(m):
        rows = [row.split("&") for row in m[2].split("\\\\") if row.strip()]
        literals.append(rows)
        return chr(_PLACE + len(literals) - 1)

    expression = _LITERAL.sub(place, s)
    if not literals or len(literals) > 0xFF or "\\end{" in expression:
        return None
    if len(literals) == 1 and expression == chr(_PLACE):  # one literal: cells as exact keys
        rows = literals[0]
        return ("matrix",) + tuple(tuple(exact_key(c) for c in row) for row in rows)
    try:
        value = _evaluate(expression, literals)
    except (_NoMatrix, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None
    if not isinstance(value, list):
        return None
    return ("matrix",) + tuple(tuple(("num", _frozen(c)) for c in row) for row in value)


def _wrapped(s):
    depth = 0
    for i, c in enumerate(s):
        depth += (c in "([{") - (c in ")]}")
        if depth == 0:
            return i == len(s) - 1
    return False


def _evaluate(expression, literals):
    """The sum of the expression's terms: a matrix (a list of rows of exact values)."""
    total = None
    for sign, term in _terms(expression):
        value = _term(term, literals)
        if sign < 0:
            value = _scale(value, {(1, ()): -1})
        total = value if total is None else _add(total, value)
    if total is None:
        raise _NoMatrix
    return total


def _terms(expression):
    """(sign, text) for each term of a sum, split at a top-level + or - (not in a bracket and
    not right after "^" or "*")."""
    out, depth, start, sign = [], 0, 0, 1
    for i, c in enumerate(expression):
        depth += (c in "([{") - (c in ")]}")
        if depth or c not in "+-":
            continue
        if i == start or expression[i - 1] in "^*":  # a sign, not an operator
            if i == start:
                sign, start = (-sign if c == "-" else sign), i + 1
            continue
        out.append((sign, expression[start:i]))
        sign, start = (-1 if c == "-" else 1), i + 1
    return out + [(sign, expression[start:])]


def _term(term, literals):
    """A product: scalar factors (exact values, in any order) and matrices (in order)."""
    scalar, matrix = {(1, ()): 1}, None
    pieces = _FACTOR.split(term)  # text, literal, power, text, literal, power, ..., text
    for i in range(0, len(pieces), 3):
        text = pieces[i].strip("*")
        if text:
            value = _value(text)
            if value is None:
                raise _NoMatrix  # "2(" before a bracketed sum of matrices is not read
            scalar = _mul(scalar, value)
        if i + 1 < len(pieces):
            factor = _literal(literals[ord(pieces[i + 1]) - _PLACE])
            factor = _power(factor, pieces[i + 2].strip("^{}")) if pieces[i + 2] else factor
            matrix = factor if matrix is None else _product(matrix, factor)
    if matrix is None:
        raise _NoMatrix  # a scalar term beside matrices
    return _scale(matrix, scalar)


def _literal(rows):
    if len(rows) > MAX_SIDE or len({len(r) for r in rows}) != 1 or len(rows[0]) > MAX_SIDE:
        raise _NoMatrix
    cells = [[_value(c.strip()) for c in row] for row in rows]
    if any(c is None for row in cells for c in row):
        raise _NoMatrix
    return cells


def _add(a, b):
    if len(a) != len(b) or len(a[0]) != len(b[0]):
        raise _NoMatrix
    return [[_sum(x, y) for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]


def _sum(x, y):
    out = dict(x)
    for t, c in y.items():
        out[t] = out.get(t, 0) + c
    if len(out) > MAX_TERMS:
        raise _NoMatrix
    return {t: c for t, c in out.items() if c}


def _scale(a, scalar):
    return [[_mul(scalar, c) for c in row] for row in a]


def _product(a, b):
    if len(a[0]) != len(b):
        raise _NoMatrix
    out = []
    for row in a:
        cells = []
        for j in range(len(b[0])):
            cell = {}
            for k, x in enumerate(row):
                cell = _sum(cell, _mul(x, b[k][j]))
            cells.append(cell)
        out.append(cells)
    return out


def _power(a, exponent):
    if exponent == "T":
        return [list(col) for col in zip(*a, strict=True)]
    n = int(exponent)
    if len(a) != len(a[0]) or not 1 <= n <= MAX_POWER:
        raise _NoMatrix  # A^0 and inverses are not computed
    out = a
    for _ in range(n - 1):
        out = _product(out, a)
    return out
