r"""
Exercise 9: a verifiable reward for GSM8K.

RLVR (GRPO on math, DeepSeek-R1) needs no learned reward model: the reward is 1.0 when the
response's final answer equals the reference, else 0.0. Everything hangs on two policies:

  1. extraction: WHICH part of the response is its final answer. In this order:
       - the LAST \boxed{...} (the response's own final mark), if there is one;
       - else the rest of the line after the LAST "####" (GSM8K's format);
       - else what follows the LAST "answer is" ("The answer is 18." -> "18"; any case,
         a colon after it dropped), up to the end of its sentence or line;
       - else there is no answer: reward 0.0 (never the last number of the text).
  2. matching: WHEN two answers are equal. GSM8K's answers are numbers: compare numbers, not
     strings. "1,000" is 1000, "$18" and LaTeX's "\$18" are 18, "18.00" and "18." are 18;
     "18.5" is not 18 and "-3" is not 3.

The reference (gt_answer) is a number as GSM8K writes it ("18", "1,000", "-3").

Fill in `gsm8k_reward`, then run:  python notebooks/exercises/check.py ex9
nanoRM's version is verifiable.gsm8k_reward; it reads many more forms (fractions, LaTeX, units,
a concluding sentence without a mark): read it only after your own passes.
"""


def gsm8k_reward(response: str, gt_answer: str) -> float:
    r"""1.0 when the response's final answer is the number gt_answer, else 0.0.

        gsm8k_reward("3 * 6 = 18\n#### 18", "18")                    -> 1.0
        gsm8k_reward(r"First \boxed{12}. No: \boxed{18}.", "18")     -> 1.0
        gsm8k_reward("#### 1,000", "1000")                           -> 1.0
        gsm8k_reward("The answer is 18. We used 3 and 6.", "6")      -> 0.0
        gsm8k_reward("I am not sure.", "18")                         -> 0.0

    Boxes here hold a number (braces inside a box are exercise 5's subject).
    """
    # TODO: your code here (about twenty lines; helper functions are welcome)
    raise NotImplementedError
