"""
Benchmark verifiable.answers_match against Math-Verify on real gold answers and on completions.

Every GSM8K test answer and every MATH-500 answer is rendered in surface forms that mean the
same thing (label True: "$1,000.", "\\dfrac{3}{4}" for "0.75", \\left( \\right) added...) and
in perturbations that do not (label False: sign flip, off by one, 18 -> 180, a dropped list
element, a flipped interval bracket, another text answer). Both graders compare each form
with the untouched gold answer; we report agreement with the labels and answers per second.

    python bench/bench_verifiable.py                 # full run (Math-Verify takes minutes)
    python bench/bench_verifiable.py --limit 200     # the first 200 gold answers per dataset
    python bench/bench_verifiable.py --out bench.md  # also write the table to a file
    python bench/bench_verifiable.py --no_gold       # the labelled completions only (~15 s)
    python bench/bench_verifiable.py --no_gold --misses dev   # nanoRM's wrong verdicts on dev
    python bench/bench_verifiable.py --completions a.jsonl b.jsonl  # other completion files

Completions: labelled rows {"reference", "completion", "equal", "split", "source"} from
bench/completions.jsonl and bench/corpus_*.jsonl (see bench/CORPUS.md), or --completions.
nanoRM grades with math_reward; Math-Verify reads the whole completion, the reference in $...$
unless it has $ or a box. Per source and split ("dev" was read while changing verifiable.py,
"heldout" was not) and overall: agreement with the labels, false positives (unequal pairs
accepted) and false negatives; then both graders' completions per second, timed in this run,
and their ratio.

Math-Verify (pip install math-verify) is optional; without it only our figures are printed.
It gets its input three ways (raw, wrapped in $...$, wrapped in \\boxed{}), and its best way
is the one compared. The forms are ours, so the set reflects our notion of "same answer";
the per-form table shows where the two graders part.
"""

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nanorm.base.algebra.exact import wraps
from verifiable import answers_match, canonical, extract_answer, math_reward  # noqa: I001

DATA = ROOT.parent / "shared" / "data"

# ------------------------------------------------------------------ surface forms and labels


def gsm8k_cases(gold):
    """(form, text, label) for a GSM8K integer answer like "2,125" or "-5"."""
    v = int(gold.replace(",", ""))
    cases = [("plain", str(v), True), ("dollar", f"${v}", True), ("latex dollar", f"\\${v}", True),
             ("decimals", f"{v}.00", True), ("trailing period", f"{v}.", True),
             ("unit word", f"{v} dollars", True), ("text unit", f"{v} \\text{{ dollars}}", True),
             ("off by one", str(v + 1), False), ("off by one", f"${v - 1}.00", False)]  # fmt: skip
    if abs(v) >= 1000:
        cases += [("thousands", f"{v:,}", True), ("thousands", f"${v:,}.00", True)]
    if v > 0:
        cases.append(("plus sign", f"+{v}", True))
    if v < 0:
        cases.append(("unicode minus", f"\u2212{-v}", True))
    if v != 0:
        cases += [("sign flip", str(-v), False), ("times ten", str(10 * v), False),
                  ("times ten", f"{10 * v:,}", False)]  # fmt: skip
    if v % 10:
        cases.append(("divided by ten", _decimal(Fraction(v, 10)), False))
    return cases


_FRAC = re.compile(r"^(-?)\\frac\{(\d+)\}\{(\d+)\}$")
_MIXED = re.compile(r"^(\d+) ?\\frac\{(\d+)\}\{(\d+)\}$")
_INT = re.compile(r"\d+")


def _decimal(q):
    """Exact decimal string for a Fraction with a terminating expansion, else None."""
    for k in range(30):
        n = q * 10**k
        if n.denominator == 1:
            digits = str(abs(n.numerator)).rjust(k + 1, "0")
            return ("-" if q < 0 else "") + (digits[:-k] + "." + digits[-k:] if k else digits)
    return None


def _shift_int(gold, fn, skip_after_point=False):
    """Apply fn to the first integer literal of gold (None: leave it, try the next)."""
    for m in _INT.finditer(gold):
        if skip_after_point and m.start() > 0 and gold[m.start() - 1] == ".":
            continue
        new = fn(m.group())
        if new is not None:
            return gold[: m.start()] + new + gold[m.end() :]
    return None


def _split_commas(s):
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return parts + [s[start:]]


# Hand-written equivalents that need algebra rather than notation; some are beyond
# answers_match (trigonometry, products of letters, rearranged equations) on purpose.
ALGEBRA = {
    "(a+5)(b+2)": ["ab + 2a + 5b + 10"],
    "\\cot x": ["\\frac{\\cos x}{\\sin x}"],
    "6r^2-4r-24": ["2(3r^2-2r-12)"],
    "\\frac{\\sqrt{3}}{3}": ["\\frac{1}{\\sqrt{3}}"],
    "\\frac{3\\sqrt{3}}{4}": ["\\frac{3}{4}\\sqrt{3}", "\\frac{9}{4\\sqrt{3}}"],
    "11 \\sqrt{5} + 11": ["11(1+\\sqrt{5})"],
    "\\frac{20000}{\\pi}": ["20000\\pi^{-1}"],
    "x^5 - x^4 + x^3 - x^2 + x - 1": ["(x-1)(x^4+x^2+1)"],
    "p - q": ["-(q-p)"],
    "1+2i": ["i(2-i)"],
    "y = 2x + 3": ["2x - y + 3 = 0"],
    "x=5": ["5 = x"],
}


def math_cases(gold, other_texts):
    """(form, text, label) for a MATH-500 answer string."""
    g, out = gold, []

    def add(form, text, label):
        if text is not None and text != g:
            out.append((form, text, label))

    add("no spaces", re.sub(r"(?<![a-zA-Z]) | (?![a-zA-Z])", "", g), True)
    thousands = re.fullmatch(r"-?(\\\$)?\d{1,3}(,(\\!)? ?\d{3})+", g)  # "10,\!080"
    if not thousands:  # "58 , 500" would read as a list
        add("extra spaces", re.sub(r"\s*([,+=])\s*", r" \1 ", g).strip(), True)
    add("dfrac", g.replace("\\frac", "\\dfrac"), True)
    add("tfrac", g.replace("\\frac", "\\tfrac"), True)
    add("braced frac", re.sub(r"\\frac ?(\d)(\d)", r"\\frac{\1}{\2}", g), True)
    add("compact frac", re.sub(r"\\frac\{(\d)\}\{(\d)\}", r"\\frac\1\2", g), True)
    add("compact sqrt", re.sub(r"\\sqrt\{(\d)\}", r"\\sqrt\1", g), True)
    add("unicode pi", g.replace("\\pi", "\u03c0"), True)
    add("degrees", g.replace("^\\circ", "\u00b0") if "^\\circ" in g else None, True)
    add("no degrees", g.replace("^\\circ", ""), True)
    add("no \\!", re.sub(r",\\! ?", ",", g).replace("\\!", ""), True)
    add("no thousands", re.sub(r",(\\!)? ?(?=\d{3})", "", g) if "\\!" in g else None, True)
    add("no \\$", g.replace("\\$", ""), True)
    m = re.fullmatch(r"\\text\{\s*([^{}]*)\}", g)
    add("no \\text", m.group(1) if m else None, True)
    m = re.fullmatch(r"([\d.]+) ?\\(?:text|mbox)\{ [a-z]+\}(\^2)?", g)
    add("no unit", m.group(1) if m else None, True)
    m = re.fullmatch(r"[a-z] ?= ?(-?[\d.]+)", g)
    add("no variable", m.group(1) if m else None, True)
    bracketed = g[:1] in "([" and g[-1:] in ")]" and wraps(g)
    if bracketed and "\\left" not in g:
        add("\\left \\right", "\\left" + g[0] + g[1:-1] + "\\right" + g[-1], True)
    add("no \\left \\right", g.replace("\\left", "").replace("\\right", ""), True)
    m = _FRAC.match(g)
    if m:
        q = Fraction(int(m[2]), int(m[3])) * (-1 if m[1] else 1)
        add("slash", f"{m[1]}{m[2]}/{m[3]}", True)
        add("decimal", _decimal(q), True)
    m = _MIXED.match(g)
    if m:
        q = int(m[1]) + Fraction(int(m[2]), int(m[3]))
        add("improper", f"\\frac{{{q.numerator}}}{{{q.denominator}}}", True)
    if re.fullmatch(r"-?\d*\.\d+", g):
        q = Fraction(g)
        add("as fraction", f"\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}", True)
        add("as fraction", ("-" if q < 0 else "") + f"{abs(q.numerator)}/{q.denominator}", True)
    add("math mode", f"${g}$", True)
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", g)
    if m:
        add("unreduced", f"{m[1]}\\frac{{{3 * int(m[2])}}}{{{3 * int(m[3])}}}", True)
        add("sign inside", f"\\frac{{-{m[2]}}}{{{m[3]}}}" if m[1] else None, True)
    m = re.fullmatch(r"(\d+) ?\\sqrt\{(\d+)\}", g)
    add("unsimplified root", f"\\sqrt{{{int(m[1]) ** 2 * int(m[2])}}}" if m else None, True)
    m = re.fullmatch(r"(-?[^-+,={}]+?) ?\+ ?([^-+,={}]+)", g)
    add("commuted", f"{m[2]} + {m[1]}".replace("+ -", "- ") if m else None, True)
    m = re.fullmatch(r"(\d+) ?\\pi", g)
    add("explicit times", f"{m[1]} \\cdot \\pi" if m else None, True)
    m = re.fullmatch(r"(\d+)\^\\circ", g)
    add("degrees word", f"{m[1]} degrees" if m else None, True)
    if re.fullmatch(r"-?\d+", g):
        add("decimals", g + ".0", True)
        add("trailing period", g + ".", True)
        if abs(int(g)) >= 1000:
            add("thousands", f"{int(g):,}", True)
            if int(g) % 100 == 0:
                mant = _decimal(Fraction(int(g), 10 ** (len(g.lstrip("-")) - 1)))
                add("scientific", f"{mant} \\times 10^{{{len(g.lstrip('-')) - 1}}}", True)
    items = _split_commas(g)
    bare_list = len(items) > 1 and g[:1] not in "([\\" and "=" not in g and not thousands
    if bare_list:
        add("reordered", ", ".join(x.strip() for x in reversed(items)), True)
    m = re.fullmatch(r"([^\\{},]+?) ?\\pm ?([^{},]*(?:\{[^{}]*\})?)", g)
    if m:
        add("\\pm expanded", f"{m[1]} + {m[2]}, {m[1]} - {m[2]}", True)
    if "begin{pmatrix}" in g:
        add("matrix fractions", re.sub(r"(-?)(\d+)/(\d+)", r"\1\\frac{\2}{\3}", g), True)

    for text in ALGEBRA.get(g, []):
        add("algebra (hand-written)", text, True)

    # perturbations: each is a different answer by construction
    add("off by one", _shift_int(g, lambda t: str(int(t) + 1).zfill(len(t))), False)
    add("times ten", _shift_int(g, lambda t: None if int(t) == 0 else t + "0", True), False)
    if re.search(r"[1-9]", g) and not g.startswith(("(", "[", "\\begin", "\\{", "\\left")):
        add("sign flip", g[1:] if g.startswith("-") else "-" + g, False)
    if bare_list:
        add("dropped element", ", ".join(items[:-1]), False)
    if bracketed:
        inner = _split_commas(g[1:-1])
        if len(inner) > 2:
            add("dropped element", g[0] + ",".join(inner[:-1]) + g[-1], False)
        if len(inner) > 1 and inner[0].strip() != inner[1].strip():
            swapped = [inner[1], inner[0]] + inner[2:]
            add("swapped", g[0] + ",".join(swapped) + g[-1], False)
        if len(inner) == 2 and ("infty" in g or g[0] != "(" or g[-1] != ")"):
            # flip the bracket at a finite end: "(2,\infty]" would be no real change
            if "infty" in inner[-1]:
                add("interval bracket", ("[" if g[0] == "(" else "(") + g[1:], False)
            else:
                add("interval bracket", g[:-1] + (")" if g[-1] == "]" else "]"), False)
    if g.startswith("\\text{") and g in other_texts:
        add("other text", other_texts[(other_texts.index(g) + 1) % len(other_texts)], False)
    return out


def load_cases(limit=None):
    """{dataset: [(gold, form, text, label)]}; None when the data directory is absent."""
    if not DATA.is_dir():
        return None
    cases = {"GSM8K": [], "MATH-500": []}
    with open(DATA / "gsm8k" / "test.jsonl") as f:
        golds = [json.loads(line)["answer"].split("####")[-1].strip() for line in f]
    for gold in golds[:limit]:
        cases["GSM8K"] += [(gold, *c) for c in gsm8k_cases(gold)]
    with open(DATA / "math500" / "test.jsonl") as f:
        golds = [json.loads(line)["answer"] for line in f]
    texts = sorted({g for g in golds if g.startswith("\\text{")})
    for gold in golds[:limit]:
        cases["MATH-500"] += [(gold, *c) for c in math_cases(gold, texts)]
    return cases


def load_completions(paths=None):
    """Labelled completions by (source, split): bench/completions.jsonl (hand-written along with
    the code) and bench/corpus_*.jsonl (see bench/CORPUS.md); rows without a label are skipped."""
    if not paths:
        paths = [ROOT / "bench" / "completions.jsonl"]
        paths += sorted(
            p for p in (ROOT / "bench").glob("corpus_*.jsonl") if p.stem != "corpus_raw"
        )
    groups = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                row = json.loads(line) if line.strip() else {}
                if isinstance(row.get("equal"), bool):
                    source = row.get("source", Path(path).stem)
                    groups[source, row.get("split", "all")].append(row)
    return dict(sorted(groups.items()))


# ------------------------------------------------------------------ graders and timing


def math_verify_grader(wrap):
    from math_verify import parse, verify

    def grade(predicted, gold):
        try:
            return bool(verify(parse(wrap(gold)), parse(wrap(predicted))))
        except Exception:  # a grader that raises has said "no"
            return False

    return grade


def ours_on_completion(completion, reference):
    """nanoRM's math_reward: the completion's answer vs the reference's (gsm8k_reward reads a
    bare reference the same way)."""
    return math_reward(completion, reference) == 1.0


def math_verify_on_completion(completion, reference):
    """Math-Verify reads the whole completion; a reference without $ or \\boxed gets $...$
    (its LaTeX extraction needs a delimiter; its own test cases keep theirs)."""
    from math_verify import parse, verify

    if "$" not in reference and "\\boxed" not in reference:
        reference = f"${reference}$"
    try:
        return bool(verify(parse(reference), parse(completion)))
    except Exception:
        return False


def completion_table(groups, graders):
    """Per (source, split) and overall: agreement with the labels, false positives (unequal
    pairs accepted) and false negatives, per grader; then each grader's pairs per second."""
    names = list(graders)
    head = "| source | split | n |" + "".join(f" {n}: agree / FP / FN |" for n in names)
    lines = ["\n## Completions: agreement with the labels, false positives, false negatives\n",
             head, "|---|---|---|" + "---|" * len(names)]  # fmt: skip
    seconds, misses, totals = defaultdict(float), {}, defaultdict(lambda: [0, 0, 0, 0])
    for (source, split), rows in groups.items():
        cells = ""
        for name, grade in graders.items():
            canonical.cache_clear()  # only repeats inside a group count (one prompt, N samples)
            start = time.perf_counter()
            verdicts = [grade(r["completion"], r["reference"]) for r in rows]
            seconds[name] += time.perf_counter() - start
            fp = sum(v and not r["equal"] for v, r in zip(verdicts, rows, strict=True))
            fn = sum(r["equal"] and not v for v, r in zip(verdicts, rows, strict=True))
            cells += f" {1 - (fp + fn) / len(rows):.3f} / {fp} / {fn} |"
            for t in (totals[name, split], totals[name, "all"]):
                t[0], t[1], t[2], t[3] = t[0] + len(rows), t[1] + fp, t[2] + fn, 0
            misses[name, source, split] = [
                r for v, r in zip(verdicts, rows, strict=True) if v != r["equal"]
            ]
        lines.append(f"| {source} | {split} | {len(rows)} |{cells}")
    for split in sorted({s for _, s in totals}):
        n = totals[names[0], split][0]
        cells = "".join(f" **{1 - (totals[g, split][1] + totals[g, split][2]) / n:.3f}** / "
                        f"{totals[g, split][1]} / {totals[g, split][2]} |" for g in names)  # fmt: skip
        lines.append(f"| **all** | {split} | {n} |{cells}")
    n_all = totals[names[0], "all"][0]
    rates = {name: n_all / seconds[name] for name in names}
    lines.append("\n" + ", ".join(f"{n}: {r:,.0f} completions/s" for n, r in rates.items()))
    if len(names) > 1:
        lines.append(
            f"speed ratio {names[0]} / {names[1]}: {rates[names[0]] / rates[names[1]]:,.0f}x"
        )
    return lines, misses


WRAPS = {"raw": lambda s: s, "$...$": lambda s: f"${s}$", "\\boxed{}": lambda s: f"\\boxed{{{s}}}"}


def run(grade, pairs, min_seconds=2.0):
    """Accuracy per form and in all, and answers per second. Passes repeat until min_seconds
    have gone by, so a fast grader is timed over as long a stretch as a slow one: the rate is
    the mean over all passes, not the best one. Each pass starts with verifiable's cache of
    canonical forms empty: a gold answer read once per pass is reused for its forms (as a
    reference is for a prompt's samples in RL), a form is never remembered from a past pass."""
    right, seen = defaultdict(int), defaultdict(int)
    start, passes = time.perf_counter(), 0
    while passes == 0 or time.perf_counter() - start < min_seconds:
        canonical.cache_clear()
        verdicts = [grade(text, gold) for gold, _, text, _ in pairs]
        passes += 1
    seconds = (time.perf_counter() - start) / passes
    for (_, form, _, label), verdict in zip(pairs, verdicts, strict=True):
        key = (form, label)
        seen[key] += 1
        right[key] += verdict == label
    return {"acc": sum(right.values()) / len(pairs), "rate": len(pairs) / seconds,
            "by_form": {k: right[k] / seen[k] for k in seen}, "seen": dict(seen)}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="gold answers per dataset")
    parser.add_argument("--out", type=str, default=None, help="also write the report here")
    parser.add_argument(
        "--completions",
        nargs="*",
        default=None,
        help="jsonl files of completions (default: bench/completions*.jsonl)",
    )  # several files: hand-written ones and model-generated ones are reported apart
    parser.add_argument(
        "--misses",
        nargs="*",
        default=(),
        help="print nanoRM's wrong verdicts "
        "on these splits (e.g. --misses dev; held-out misses are not for tuning)",
    )
    parser.add_argument("--no_gold", action="store_true", help="completions only")
    args = parser.parse_args()
    cases = {} if args.no_gold else load_cases(args.limit)
    if cases is None:
        print(f"data not found at {DATA} (../shared/data from the repo root): completions only")
        cases = {}
    try:
        import math_verify  # noqa: F401

        graders = {f"Math-Verify {name}": math_verify_grader(w) for name, w in WRAPS.items()}
    except ImportError:
        print("math-verify is not installed (pip install math-verify): only nanoRM is run")
        graders = {}
    graders_c = {"nanoRM": ours_on_completion}
    if graders:
        graders_c["Math-Verify"] = math_verify_on_completion
    lines, misses = completion_table(load_completions(args.completions), graders_c)
    if args.misses:
        for (name, source, split), rows in misses.items():
            for r in rows if name == "nanoRM" and split in args.misses else []:
                print(f"MISS {source}/{split} equal={r['equal']} ref={r['reference']!r} "
                      f"completion={r['completion'][-120:]!r} -> {extract_answer(r['completion'])!r}")  # fmt: skip
    for dataset, pairs in cases.items():
        positives = sum(label for *_, label in pairs)
        ours = run(answers_match, pairs)
        theirs = {name: run(grade, pairs) for name, grade in graders.items()}
        lines += [f"\n## {dataset}: {len(pairs)} pairs ({positives} same, "
                  f"{len(pairs) - positives} different)\n",
                  "| grader | agreement with labels | answers / s |", "|---|---|---|",
                  f"| nanoRM answers_match | {ours['acc']:.2%} | {ours['rate']:,.0f} |",
                  ]  # fmt: skip
        lines += [f"| {n} | {r['acc']:.2%} | {r['rate']:,.0f} |" for n, r in theirs.items()]
        if theirs:
            name, best = max(theirs.items(), key=lambda kv: kv[1]["acc"])
            lines.append(f"\nspeed ratio nanoRM / {name} (most accurate way): "
                         f"{ours['rate'] / best['rate']:,.0f}x\n")  # fmt: skip
        lines += ["| form | label | n | nanoRM |" + "".join(f" {n} |" for n in theirs),
                  "|---|---|---|---|" + "---|" * len(theirs)]  # fmt: skip
        for key in sorted(ours["seen"], key=lambda k: (-k[1], k[0])):
            cells = "".join(f" {r['by_form'][key]:.1%} |" for r in theirs.values())
            lines.append(f"| {key[0]} | {key[1]} | {ours['seen'][key]} | "
                         f"{ours['by_form'][key]:.1%} |{cells}")  # fmt: skip
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
