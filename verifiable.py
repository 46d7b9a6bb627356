"""
Verifiable rewards: score a response by checking its final answer against the reference, in pure
Python. RLVR needs no learned reward model:

    1. extract the answer     extract_answer(response)            "... \\boxed{3/4}." -> "3/4"
    2. compare                answers_match("3/4", "0.75")          exact, never a float guess
    3. the reward functions   math_reward(response, gt_answer)      1.0 or 0.0
    4. the reward model       RLVRRewardModel([math_reward, ...], tokenizer=tok)(input_ids, ...)
                              (ColossalChat's class: each function gets the caller's values)

    python verifiable.py          # a tiny demo
    from verifiable import math_reward, gsm8k_reward, RLVRRewardModel

Both answers become a canonical string, then an exact key: 3/4 == \\frac34 == 0.75, units and
LaTeX noise gone, sets compared as sets (nanorm/base/algebra/: canonical.py states each policy,
exact.py what the algebra leaves out). Safe on any str: no eval or exec, no regex that can
backtrack catastrophically, bounded work on megabyte inputs (an answer longer than
MAX_ANSWER_CHARS never matches). torch is imported only by RLVRRewardModel's call.
"""

import functools

import nanorm.base.algebra.extract as _extract
from nanorm.base.algebra.canonical import (  # noqa: F401 (canonical re-exported: bench times it)
    BASE,
    DECIMAL_COMMA,
    RATIO,
    as_tuple,
    canonical,
    fold,
)
from nanorm.base.algebra.decimals import close  # a written decimal as a rounded value
from nanorm.base.algebra.exact import same_set, split_top, unlabel, wraps
from nanorm.base.algebra.extract import (  # noqa: F401 (re-exported: callers import the extractors from here)
    MAX_ANSWER_CHARS,
    extract_answer_tag,
    extract_boxed,
    extract_conclusion,
    extract_gsm8k,
)
from nanorm.base.algebra.matrices import key  # exact.key, with matrix literals read first
from nanorm.base.algebra.named import named
from nanorm.base.algebra.units import is_percent

# ------------------------------------------------------------------ 1. extract the answer
# extract.py finds answers; where it must tell whether two candidates are one answer ("\\boxed{2}
# or \\boxed{2.0}", a repeated "A: x" line) it takes the matcher as an argument, so it never
# imports this file. These are its extractors with answers_match, under their usual names.


def extract_answer(text):
    """The response's final answer (a box, "#### x", "the answer is x", a concluding
    sentence), or None."""
    return _extract.extract_answer(text, answers_match)


def extract_boxes(text):
    """The last \\boxed{} and the boxes joined to it ("\\boxed{1}, \\boxed{2}" is "1, 2")."""
    return _extract.extract_boxes(text, answers_match)


def extract_answer_is(text):
    """What follows the last "answer is"."""
    return _extract.extract_answer_is(text, answers_match)


# ------------------------------------------------------------------ 2. compare


def answers_match(predicted, reference):
    """True when the two answer strings denote the same answer (nanorm/base/algebra/canonical.py lists the policies).
    Never raises: non-str, empty or over-long (> MAX_ANSWER_CHARS) answers do not match."""
    if not isinstance(predicted, str) or not isinstance(reference, str):
        return False
    if len(predicted) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    a, b = canonical(predicted), canonical(reference)
    if not a or not b:
        return False
    if a == b:
        return True
    base_a, base_b = BASE.fullmatch(a), BASE.fullmatch(b)
    if (base_a is None) != (base_b is None):  # a base written on one side only: 4210_5, 4210
        a, b = (base_a[1], b) if base_a else (a, base_b[1])
        return a == b
    if (a + b).lower() != a + b:  # an upper-case letter: words ignore case
        a, b = fold(a), fold(b)
        if a == b:
            return True
    key_a, key_b = key(a), key(b)
    if key_a == key_b or same_set(key_a, key_b) or as_tuple(a, b) or as_tuple(b, a):
        return True
    for one, other in ((a, key_b), (b, key_a)):  # "\\{2\\}" answers "2" (Math-Verify's reading)
        inside = one[1:-1] if one[:1] == "\u2983" and wraps(one) else ","
        if len(split_top(inside, ",")) == 1 and key(inside) == other:
            return True
    bare_a, bare_b = unlabel(a), unlabel(b)
    if bare_a and bare_b and "," not in a + b and a.split("=")[0] == b.split("=")[0]:
        key_a, key_b = key(bare_a), key(bare_b)  # one label: "x=5+5+1=11" is "x=11"
    elif (bare_a is None) != (bare_b is None):  # "(a,b)=(2,7)" answers "(2,7)"; "x=5" != "y=5"
        key_a, key_b = key(bare_a or a), key(bare_b or b)
        if as_tuple(bare_a or a, bare_b or b) or as_tuple(bare_b or b, bare_a or a):
            return True  # "x=2, y=3" answers "(2,3)", in the order written
    elif bare_a and bare_b and (named(a) or 0) == named(b):  # "(x,y)=(2,3)" == "y=3,x=2"
        return True
    elif DECIMAL_COMMA.fullmatch(a) or DECIMAL_COMMA.fullmatch(b):  # "0,25" vs "0.25"
        key_a = key(a.replace(",", ".")) if DECIMAL_COMMA.fullmatch(a) else key_a
        key_b = key(b.replace(",", ".")) if DECIMAL_COMMA.fullmatch(b) else key_b
    if key_a == key_b or same_set(key_a, key_b):
        return True
    decimal_a, decimal_b = ("." in x and "/" not in x and "frac" not in x for x in (a, b))
    if (decimal_a and close(key_a, key_b)) or (decimal_b and close(key_b, key_a)):
        return True
    if is_percent(reference) and not is_percent(predicted) and "," not in b:  # 28% is 0.28
        return key("(" + b + ")/100") == key_a
    ratio_a, ratio_b = RATIO.fullmatch(a), RATIO.fullmatch(b)
    if (ratio_a is None) != (ratio_b is None):  # "3:4" is 3/4 against a number; "3:45" != "1:15"
        ratio, other = (ratio_a, b) if ratio_a else (ratio_b, a)
        return ratio[2].strip("0.") != "" and key(ratio[1] + "/" + ratio[2]) == key(other)
    return False


# ------------------------------------------------------------------ 3. the reward functions
# Every reward function has the signature fn(response: str, gt_answer: str | None) -> float,
# and text_reward makes it callable as ColossalChat calls its functions on token ids too.


def text_reward(fn):
    """fn(response, gt_answer), also callable as RLVRRewardModel calls a reward function:
    fn(input_ids, attention_mask, response_start=s, response_end=e, gt_answer=gt,
    tokenizer=tok, **kwargs) scores tokenizer.decode(input_ids[s : e + 1]), e inclusive
    (ColossalChat's reading); s defaults to 0, e to the last real token. Other keywords (a
    ColossalChat function's tags=, ...) are not this function's and are ignored."""

    @functools.wraps(fn)
    def reward(response, *args, **kwargs):
        if isinstance(response, str):
            return fn(response, *args, **kwargs)
        return fn(decode_response(response, *args, **kwargs), kwargs.get("gt_answer"))

    return reward


def decode_response(
    input_ids, attention_mask=None, response_start=None, response_end=None, tokenizer=None, **_
):
    """The text of input_ids[response_start : response_end + 1] (one row of token ids)."""
    if tokenizer is None:
        raise ValueError("a reward function reads token ids with tokenizer=: pass it")
    ids = [int(t) for t in input_ids]
    start = 0 if response_start is None else int(response_start)
    if response_end is not None:
        end = int(response_end)
    elif attention_mask is not None:  # the last real token
        end = max((t for t, m in enumerate(attention_mask) if int(m)), default=-1)
    else:
        end = len(ids) - 1
    return tokenizer.decode(ids[start : end + 1])


def _accuracy(response, gt_answer, extract):
    """1.0 when the response's answer matches gt_answer's, read by extract or else whole;
    a reference too long to be an answer is a solution, read like a response."""
    if not isinstance(gt_answer, str):
        return 0.0
    reference = extract(gt_answer) or gt_answer.strip()
    if len(reference) > MAX_ANSWER_CHARS:  # it could never match: its final answer might
        reference = extract_answer(gt_answer)
    predicted = extract_answer(response)
    if reference is None or predicted is None:
        return 0.0
    return 1.0 if answers_match(predicted, reference) else 0.0


@text_reward
def gsm8k_reward(response, gt_answer):
    """1.0 if the response's answer matches; gt_answer is "18" or a whole "... #### 18" solution."""
    return _accuracy(response, gt_answer, extract_gsm8k)


@text_reward
def math_reward(response, gt_answer):
    """1.0 if the response's answer matches; gt_answer is the answer or a \\boxed{} solution
    (boxes joined as in extract_boxes: "\\boxed{1}, \\boxed{2}" is the answer "1, 2")."""
    return _accuracy(response, gt_answer, extract_boxes)


_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@text_reward
def format_reward(response, gt_answer=None):
    """1.0 when each of <think> </think> <answer> </answer> occurs exactly once, in that order."""
    if not isinstance(response, str) or any(response.count(t) != 1 for t in _TAGS):
        return 0.0
    positions = [response.find(t) for t in _TAGS]
    return 1.0 if positions == sorted(positions) else 0.0


def format_gated(accuracy_fn):
    """accuracy if the format is right, else 0: a gate, not a bonus. An added format reward
    pays a long wrong answer in the right tags more than a short right one without them
    (allenai/open-instruct#659)."""

    def gated(response, gt_answer):
        return accuracy_fn(response, gt_answer) if format_reward(response) else 0.0

    gated.__name__ = f"format_gated_{getattr(accuracy_fn, '__name__', 'reward')}"
    return text_reward(gated)


gated_math_reward = format_gated(math_reward)


def overlong_penalty(max_length, buffer, length=len):
    """DAPO's soft over-length penalty as a reward function: 0 up to max_length - buffer,
    then linear down to -1 at max_length, -1 beyond. length() measures the response
    (characters by default; pass lambda s: len(tok.encode(s)) to count tokens)."""
    if buffer <= 0:
        raise ValueError("buffer must be positive")

    def penalty(response, gt_answer=None):
        return min(0.0, max(-1.0, (max_length - buffer - length(response)) / buffer))

    return text_reward(penalty)


# ------------------------------------------------------------------ 4. the reward model


class RLVRRewardModel:
    """ColossalChat's RLVRRewardModel: the sum of reward functions, shaped like a reward model.

        rm = RLVRRewardModel([math_reward, format_reward], tokenizer=tok)
        r = rm(input_ids, attention_mask, response_start=s, response_end=e, gt_answer=answers)

    Each function is called per row exactly as ColossalChat calls it, with the caller's values as
    they are (tensors stay tensors) and every constructor keyword:

        fn(input_ids[i], attention_mask[i], response_start=response_start[i],
           response_end=response_end[i], gt_answer=gt_answer[i], **kwargs)

    The convention for the ends is between the caller and its functions. nanoRM's functions
    (math_reward, gsm8k_reward, format_reward, ...: text_reward) read ColossalChat's: the
    response is input_ids[s : e + 1], e the index of its last token. A caller holding exclusive
    ends (input_ids[s:end] is the response) passes response_end=end - 1. Returns a float32
    tensor (B,) on input_ids' device; to() and eval() do nothing."""

    def __init__(self, reward_fn_list, **kwargs):
        self.reward_fn_list = reward_fn_list
        self.kwargs = kwargs

    def __call__(
        self, input_ids, attention_mask=None, response_start=None, response_end=None, gt_answer=None
    ):
        import torch  # lazily: the graders above work without torch

        rewards = torch.zeros(input_ids.size(0), dtype=torch.float32, device=input_ids.device)
        for i in range(input_ids.size(0)):
            for fn in self.reward_fn_list:
                rewards[i] += fn(
                    input_ids[i],
                    None if attention_mask is None else attention_mask[i],
                    response_start=None if response_start is None else response_start[i],
                    response_end=None if response_end is None else response_end[i],
                    gt_answer=None if gt_answer is None else gt_answer[i],
                    **self.kwargs,
                )
        return rewards

    def to(self, *args, **kwargs):
        return self

    def eval(self):
        return self


DEMO = r"""
$1,000.              | 1000
\dfrac{3}{4}         | 0.75
\frac{1}{\sqrt3}     | \frac{\sqrt{3}}{3}
y = 2x + 3           | 2x - y + 3 = 0
(a,b)=(2,7)          | (2, 7)
y \geq 3             | [3, \infty)
0,25                 | 0.25
32, 349              | 32349
50%                  | 0.5
(3,4]                | (3,4)
"""


def main():
    for line in DEMO.strip().splitlines():
        predicted, reference = (side.strip() for side in line.split("|"))
        print(f"{predicted!r:>24} vs {reference!r:<24} -> {answers_match(predicted, reference)}")
    response = "<think>2 + 2 = 4</think> <answer>The answer is \\boxed{4}.</answer>"
    print(
        f"extract_answer -> {extract_answer(response)!r}, reward {gated_math_reward(response, '4')}"
    )


if __name__ == "__main__":
    main()
