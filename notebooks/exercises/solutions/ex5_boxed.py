r"""
Solution to exercise 5: extracting a \boxed{} answer.

A verifiable reward checks a math response's final answer, so it first has to find it. MATH
solutions (and most reasoning models) put it in \boxed{...}. The content can itself contain
braces, \boxed{\frac{1}{2}}, so a regex like \\boxed\{(.*?)\} stops too early: match the
braces by counting them.

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex5
nanoRM's version is verifiable.extract_boxed, for comparison.
"""


def extract_boxed(text: str) -> str | None:
    r"""The content of the LAST \boxed{...} or \fbox{...} in text, or None.

    - Only the last occurrence of "\boxed" or "\fbox" counts. If it is never closed, the
      answer is None (do not fall back to an earlier box).
    - Spaces may separate the command from its brace: "\boxed {5}".
    - Braces nest: "\boxed{\frac{1}{2}}" -> "\frac{1}{2}".
    - An escaped brace "\{" or "\}" is a literal brace in LaTeX: it does not open or close a
      group. "\boxed{\{1, 2\}}" -> "\{1, 2\}". (Skip the character after every backslash.)
    - Strip spaces around the content; an empty answer ("\boxed{ }") is None.

        extract_boxed(r"so x = \boxed{4}.")                  -> "4"
        extract_boxed(r"\boxed{1} then \fbox{\sqrt{2}}")     -> "\sqrt{2}"
        extract_boxed(r"\boxed{1} and then \boxed{2")        -> None
        extract_boxed("no box here")                         -> None

    (nanoRM's version also reads "\boxed 18" without braces and caps answers at 1000
    characters; the checker never tests those.)
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    while i < len(text) and text[i].isspace():  # "\boxed {5}"
        i += 1
    if i == len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 1  # skip the escaped character: \{ and \} are literal braces
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                answer = text[i + 1 : j].strip()
                return answer or None
        j += 1
    return None  # never closed
