r"""
Solution to exercise 9: a verifiable reward for GSM8K.

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex9
nanoRM's version is verifiable.gsm8k_reward (extract_answer, then answers_match).
"""


def _last_box(text):
    """The content of the last \boxed{...}, braces counted, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # never closed


def extract(response):
    """The final answer: the last box, else the line after the last '####', else what follows
    the last 'answer is' up to the end of its sentence; None when there is none."""
    box = _last_box(response)
    if box is not None:
        return box
    if "####" in response:
        return response[response.rfind("####") + 4 :].split("\n")[0]
    i = response.lower().rfind("answer is")
    if i >= 0:
        rest = response[i + len("answer is") :].split("\n")[0]
        return rest.split(". ")[0]  # a decimal point is not the end of the sentence
    return None


def number(answer):
    """The answer as a float, or None: ': \\$1,234.50.' -> 1234.5."""
    s = answer.strip().lstrip(":").strip().rstrip(".").strip()
    s = s.replace("\\$", "").replace("$", "").replace(",", "")  # $, LaTeX's \$, separators
    try:
        return float(s)
    except ValueError:
        return None


def gsm8k_reward(response, gt_answer):
    """1.0 when the response's final answer is the number gt_answer, else 0.0."""
    answer = extract(response)
    if answer is None:
        return 0.0
    a, b = number(answer), number(gt_answer)
    return 1.0 if a is not None and b is not None and a == b else 0.0
