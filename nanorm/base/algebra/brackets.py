"""
Brackets in answer strings: split at a separator outside every bracket, and tell whether one
bracket group wraps a whole string. Used by exact.py, matrices.py and verifiable.py; linear
scans, no regex.
"""


def split_top(s, sep):
    """Split s on sep where no bracket is open. Brackets of any kind count, so "(3,4]" works."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        if depth == 0 and s.startswith(sep, i):  # no separator starts with a bracket
            parts.append(s[start:i])
            start = i = i + len(sep)
            continue
        depth += (s[i] in "([{\u2983") - (s[i] in ")]}\u2984")
        i += 1
    return parts + [s[start:]]


def wraps(s):
    """True when the bracket at s[0] closes at s[-1] (so "(a)(b)" is not one group)."""
    depth = 0
    for i, c in enumerate(s):
        depth += c in "([{\u2983"
        depth -= c in ")]}\u2984"
        if depth == 0:
            return i == len(s) - 1
    return False
