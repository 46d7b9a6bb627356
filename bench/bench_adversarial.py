"""
Adversarial text against the verifiers: does any answer extractor, grader or regex of
verifiable.py do more than linear work on it? A reward is called on every sample of an RL run,
so one that hangs on a policy's garbage stops the run.

    python bench/bench_adversarial.py        # the table; exit 1 past a limit

Two measurements, both this thread's CPU time (another job on the machine changes it little),
each the least of three runs:
  1. every public verifier function on megabyte inputs and on short hard ones: the slowest
     call against a limit of 0.1 s (a linear pass over a megabyte takes milliseconds);
  2. every compiled regex of the verifiers on text of n and 8n characters built to provoke
     backtracking: the work's growth, near 8 for linear work, 64 for quadratic. Past 20 fails.
     The detector is checked first on patterns known to be quadratic, exponential and linear.
The test suite feeds the same inputs and checks the verdicts (tests/test_verifiable.py); the
times are measured here, as the project measures every time.
"""

import gc
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nanorm.base.algebra as algebra  # noqa: E402
import verifiable as V  # noqa: E402
from nanorm.base.algebra import canonical, spellings  # noqa: E402

MB = 1 << 20
ADVERSARIAL = [
    "{" * MB, "\\boxed{" * (MB // 7), "\\boxed{" + "{" * MB, "1" * MB, "#### " + "9" * MB,
    "the answer is " + "1," * (MB // 2), "<answer>" * (MB // 8) + "</answer>",
    "\\frac{" * (MB // 6), "(" * MB, "answer is " * (MB // 10), "\\sqrt" * (MB // 5),
]  # fmt: skip
SHORT_HARD = [
    "(" * 999, "{" * 999 + "}" * 1, "1e999999", "10^{10^{10^{10}}}", "(x+1)^{400}",
    "\\sqrt{99999999999999}" * 40, "1e400*" * 160 + "1", "2^{400}" * 100,
    "(a+b+c+d+e+f+g+h)" * 58, "\\frac{" * 150 + "1", "9" * 1000, "1/0", "\\frac{1}{0}",
    "\\{" + "1e400*" * 150 + "1,2\\}", "\\pm" * 300, "," * 999, "\\left(" * 160,
]  # fmt: skip
# (prefix, repeated unit, suffix): texts on which a backtracking regex does quadratic work
NASTY = [("", "\\", ""), ("", "1", "x"), ("", "a", "1"), ("", " ", "x"), ("\\frac", " ", ""),
         ("\\text", " ", ""), ("", "1,", "x"), ("", "^", ""), ("\\frac{", "1", ""), ("", "1.", ""),
         ("\\sin", " ", "x"), ("\\begin{pmatrix}", "1&", "")]  # fmt: skip
EXTRACTORS = (V.extract_answer, V.extract_boxed, V.extract_gsm8k, V.extract_answer_tag,
              V.extract_answer_is, V.format_reward)  # fmt: skip
GRADERS = (V.math_reward, V.gsm8k_reward, V.answers_match)
CALL_LIMIT_S, LINEAR = 0.1, 20


def cpu_seconds(fn, *args, runs=3):
    """The least of runs calls' CPU time on this thread, the garbage collector paused (a
    collection of what came before is not this call's work)."""
    best = float("inf")
    gc.disable()
    try:
        for _ in range(runs):
            start = time.thread_time()
            fn(*args)
            best = min(best, time.thread_time() - start)
    finally:
        gc.enable()
    return best


def regex_growth(pattern, prefix, unit, suffix, repeats):
    """CPU time of findall + fullmatch on prefix + unit * 8k + suffix over the same on k."""

    def work(text):
        return cpu_seconds(lambda: (pattern.findall(text), pattern.fullmatch(text)))

    small = work(prefix + unit * repeats + suffix)
    large = work(prefix + unit * (8 * repeats) + suffix)
    return large / max(small, 1e-5)  # below 10 us the clock's grain is too coarse to divide by


def verifier_patterns():
    """Every compiled regex of verifiable.py and the algebra package it reads answers with."""
    import pkgutil
    from importlib import import_module

    modules = [V] + [import_module(f"{algebra.__name__}.{m.name}")
                     for m in pkgutil.iter_modules(algebra.__path__)]  # fmt: skip
    patterns = [v for m in modules for v in vars(m).values() if isinstance(v, re.Pattern)]
    return patterns + [p for _, p, _ in canonical._BRACE_ARGS + spellings._PLAIN]


def main():
    failed = []
    # the detector first: it must tell quadratic and exponential from linear
    known = [(r"a*b", "", "a", "", 1000, True), (r"(a+)+$", "", "a", "b", 2, True),
             (r"a+b", "", "ab", "", 2000, False)]  # fmt: skip
    for source, prefix, unit, suffix, repeats, superlinear in known:
        g = regex_growth(re.compile(source), prefix, unit, suffix, repeats)
        print(f"detector: {source!r:12} growth {g:8.1f} (expected {'>' if superlinear else '<'}"
              f" {LINEAR})")  # fmt: skip
        if (g > LINEAR) != superlinear:
            failed.append(f"the detector misreads {source!r}")
    worst = {}
    for text in ADVERSARIAL + SHORT_HARD:
        for fn in EXTRACTORS:
            worst[fn.__name__] = max(worst.get(fn.__name__, 0), cpu_seconds(fn, text, runs=1))
        for fn in GRADERS:
            for args in ((text, text), (text, "1")):
                s = cpu_seconds(fn, *args, runs=1)
                worst[fn.__name__] = max(worst.get(fn.__name__, 0), s)
    print(f"\nslowest call on {len(ADVERSARIAL)} megabyte and {len(SHORT_HARD)} short hard inputs")
    for name, s in sorted(worst.items(), key=lambda kv: -kv[1]):
        print(f"  {name:20} {s * 1000:8.1f} ms")
        if s > CALL_LIMIT_S:
            failed.append(f"{name} took {s:.2f} s of CPU on one input")
    patterns = verifier_patterns()
    top = []
    for pattern in patterns:
        for prefix, unit, suffix in NASTY:
            repeats = 100_000 // 8 // len(unit)  # 100,000 characters at 8k
            g = regex_growth(pattern, prefix, unit, suffix, repeats)
            top.append((g, pattern.pattern[:60], prefix + unit))
    top.sort(reverse=True)
    print(f"\n{len(patterns)} regexes x {len(NASTY)} texts; the largest growths (8 = linear):")
    for g, source, text in top[:5]:
        print(f"  {g:6.1f}  {source!r} on {text!r}...")
    failed += [f"{s!r} grows {g:.0f}x on {t!r}..." for g, s, t in top if g > LINEAR]
    for line in failed:
        print("FAILED:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
