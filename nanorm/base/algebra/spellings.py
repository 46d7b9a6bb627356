"""
Other spellings of math in answers, as LaTeX, for verifiable.canonical: unicode math (\u2212,
\u00d7, \u03c0, \u221a ...), plain-text and programming spellings that Math-Verify's normalizer
also reads ("(0, inf)", " sqrt 2", "2**10") and ordinals ("5^{\\text{th}}" is 5). Each rewrite
runs only when its trigger is in the answer; every regex is linear (tests/test_verifiable.py).
"""

import re

# Unicode math as LaTeX: minus, times, dot, divide, fraction slash, no-break space, pi, root,
# infinity, plus-minus, union, euro, pound, squared, cubed
_UNICODE_MATH = (
    "\u2212\u00d7\u00b7\u00f7\u2044\u00a0\u03c0\u221a\u221e\u00b1\u222a\u20ac\u00a3\u00b2\u00b3"
)
_AS_LATEX = "-|*|*|/|/| |\\pi |\\sqrt|\\infty |\\pm |\\cup |||^2|^3".split("|")
_UNICODE = str.maketrans(dict(zip(_UNICODE_MATH, _AS_LATEX, strict=True)))
_PLAIN = (  # other spellings: "5^{\\text{th}}" is 5, "(0, inf)", " sqrt 2", "2**10" (triggered)
    ("^{\\", re.compile(r"\^\{\\(?:text|mathrm)\{(?:st|nd|rd|th)\}\}"), ""),
    ("inf", re.compile(r"(?<![\\a-zA-Z])inf(?![a-zA-Z])"), r"\\infty"),
    ("sqrt", re.compile(r"(?<![\\a-zA-Z])sqrt"), r"\\sqrt"),
    ("**", re.compile(r"(?<=[0-9a-zA-Z)}])\*\*(?=[0-9a-zA-Z({])"), "^"),
)


def respell(answer):
    """answer with the spellings above as LaTeX."""
    s = answer if answer.isascii() else answer.translate(_UNICODE)
    for trigger, pattern, replacement in _PLAIN:
        s = pattern.sub(replacement, s) if trigger in s else s
    return s
