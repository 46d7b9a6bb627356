"""notebooks/: each notebook is stored with the outputs of a real run, small and in sync with its
source in notebooks/src/, and a fresh run shows what its prose claims.

A fresh run's digits are not compared with the stored ones: fp32 sums run in another order on
another CPU (AVX-512, AVX2 or scalar kernels, MKL's branch) and a training run drifts from that
over hundreds of steps (eval losses 7-10% apart, other generated text). What holds on any CPU
are the claims the text makes, CLAIMS below: per notebook, each a regex on the printed output
(its groups the numbers) and a bound or a comparison. Each bound is the range measured on three
kernel paths, each a full run of every notebook, widened by the margin its comment states:

  (a) a 2-core AMD EPYC without AVX-512 (AVX2 kernels), MKL_CBWR="" (MKL's own kernels);
  (b) the same CPU with ATEN_CPU_CAPABILITY=default (PyTorch's scalar kernels);
  both at one thread, as each notebook sets it (OMP_NUM_THREADS=1 for the commands it starts);
  (c) the outputs stored before this table existed (AMD EPYC Zen 4, AVX-512, MKL_CBWR=COMPATIBLE),
      for the cells whose settings and arithmetic have not changed since.

The stored outputs are run (a)'s. With ../shared/data every claim is checked; without it each
notebook that reads the data runs its fallbacks (NANORM_DATA=none) and the claims not tagged
"shared-data" are checked, which read only the cells not tagged "shared-data". A notebook that
reads no data (06, 07, 08) runs once. Nothing here reads the clock: no notebook has a time budget,
no cell a timeout (CI has its own overall limit)."""

import importlib.util
import math
import os
import re
import shutil
import tempfile
from typing import NamedTuple

import pytest
from conftest import ROOT, SHARED

NB_DIR = ROOT / "notebooks"
NOTEBOOKS = [
    "01_llama.ipynb",
    "02_reward_model.ipynb",
    "03_verifiable_rewards.ipynb",
    "04_critic.ipynb",
    "05_evaluation.ipynb",
    "06_rlhf_and_scale.ipynb",
    "07_rl.ipynb",
    "08_beyond_one_score.ipynb",
]
MAX_KB = 300  # stored size: pictures at 72 dpi, no embedded data
NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan)"  # one printed number, a group


class Claim(NamedTuple):
    says: str  # the claim, in the words of the notebook's text
    pattern: str  # a regex on the printed output; NUM groups are handed to holds as floats
    holds: object  # (*numbers) -> bool
    shared: bool = False  # needs ../shared/data: read from the cells tagged "shared-data" too


def C(says, pattern, holds, shared=False):
    return Claim(says, pattern.replace("NUM", NUM), holds, shared)


def every(xs, bound):
    return all(bound(x) for x in xs)


def floats(text):
    """The numbers of a printed list or array, "[1. 1. 1.]" or "[0.0, 0.1]"."""
    return [float(x) for x in re.findall(NUM, text)]


CLAIMS = {}  # per notebook, filled below


def build_module():
    spec = importlib.util.spec_from_file_location("notebooks_build", NB_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(name):
    nbformat = pytest.importorskip("nbformat", reason="reading notebooks needs nbformat")
    return nbformat.read(NB_DIR / name, as_version=4)


def printed(cell):
    """The text a code cell printed: stdout and its value, not stderr's warnings, not pictures."""
    text = ""
    for o in cell.get("outputs", []):
        if o.output_type == "stream" and o.name == "stdout":
            text += o.text
        elif o.output_type in ("execute_result", "display_data"):
            text += o.get("data", {}).get("text/plain", "") + "\n"
    return text


def output(nb, with_shared):
    """All the code cells' printed text; without with_shared, only the cells not tagged
    "shared-data" (the ones whose output is the same without ../shared/data)."""
    cells = [c for c in nb.cells if c.cell_type == "code"]
    if not with_shared:
        cells = [c for c in cells if "shared-data" not in c.metadata.get("tags", [])]
    return "\n".join(printed(c) for c in cells)


def as_number(text):
    return float(text) if re.fullmatch(NUM, text) else text


def broken(claims, nb, have_data=True):
    """[(claim, why)] for each claim the printed output of nb does not show: its pattern is not
    printed, or its numbers break its bound. Claims tagged shared are skipped without data."""
    found = []
    for claim in claims:
        if claim.shared and not have_data:
            continue
        match = re.search(claim.pattern, output(nb, with_shared=claim.shared), re.M)
        if match is None:
            found.append((claim, "not printed"))
            continue
        values = [as_number(g) for g in match.groups()]
        try:
            ok = claim.holds(*values)
        except (TypeError, ValueError, IndexError, ZeroDivisionError) as e:
            ok, values = False, f"{values}: {e!r}"
        if not ok:
            found.append((claim, f"printed {match.group(0)!r} -> {values}"))
    return found


def report(name, found):
    return f"{name}: {len(found)} claims fail\n" + "\n".join(
        f"  {claim.says}: {why}" for claim, why in found
    )


def test_every_source_has_a_notebook_and_claims():
    sources = sorted(p.stem for p in (NB_DIR / "src").glob("*.py"))
    assert sources == [n.removesuffix(".ipynb") for n in NOTEBOOKS]
    assert sorted(CLAIMS) == sorted(NOTEBOOKS)
    for name, claims in CLAIMS.items():
        assert len({c.says for c in claims}) == len(claims), f"{name}: a claim said twice"
        for c in claims:
            assert re.compile(c.pattern).groups >= 1, f"{name}: {c.says!r} reads no number"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_with_outputs_small_and_in_sync(name):
    nb = read(name)
    cells = [(c.cell_type, c.source) for c in nb.cells]
    source = build_module().parse(NB_DIR / "src" / name.replace(".ipynb", ".py"))
    assert cells == source, f"{name} differs from its source: run python notebooks/build.py"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), f"{name} is stored without running every cell"
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"], f"{name} was stored with an error"
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{name} has no pictures"
    size_kb = (NB_DIR / name).stat().st_size / 1024
    assert size_kb < MAX_KB, f"{name} is {size_kb:.0f} KB; keep figures small (dpi 72)"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_stored_run_shows_the_claims(name):
    """The stored outputs (a run with ../shared/data) make every claim of the text."""
    found = broken(CLAIMS[name], read(name))
    assert not found, report(name, found)


def test_a_claim_that_does_not_hold_fails():
    nbformat = pytest.importorskip("nbformat", reason="reading notebooks needs nbformat")
    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output
    nb.cells = [nbformat.v4.new_code_cell("print()"), nbformat.v4.new_code_cell("print()")]
    nb.cells[0].outputs = [
        out("stream", name="stdout", text="step 400: eval loss 0.4548 acc 0.72\n")
    ]
    nb.cells[1].metadata["tags"] = ["shared-data"]
    nb.cells[1].outputs = [out("stream", name="stdout", text="longer wins 0.613, max 6.2e+00\n")]
    falls = C("the loss falls", r"step 400: eval loss NUM acc NUM", lambda loss, acc: loss < 0.6)
    acc = C("accuracy above 0.8", r"step 400: eval loss NUM acc NUM", lambda loss, acc: acc > 0.8)
    gone = C("a line that is not printed", r"step 800: eval loss NUM", lambda x: True)
    data = C("longer wins", r"longer wins NUM, max NUM", lambda a, b: a > 0.6 and b > 1, True)
    untagged = data._replace(shared=False)  # reads only the untagged cell: not printed there
    assert broken([falls, data], nb) == []
    assert broken([data], nb, have_data=False) == []  # skipped without the data
    assert [c for c, _ in broken([falls, acc, gone, untagged], nb)] == [acc, gone, untagged]
    assert (
        broken([acc], nb)[0][1] == "printed 'step 400: eval loss 0.4548 acc 0.72' -> [0.4548, 0.72]"
    )
    inf = C("naive overflow", r"naive: \[NUM, NUM\]", lambda a, b: math.isinf(a) and b == 0.5)
    nb.cells[0].outputs = [out("stream", name="stdout", text="naive: [inf, 0.5]\n")]
    assert broken([inf], nb) == []


def execute(nb):
    nbclient = pytest.importorskip("nbclient", reason="executing notebooks needs nbclient")
    from jupyter_client.manager import KernelManager

    # the kernel's channels on Unix sockets (where there are any), in a folder of its own: over
    # TCP the client picks free ports and the kernel binds them later, and a port taken in
    # between (the other worker's kernel, a torchrun) killed a kernel at its start ("Address
    # already in use", once in a whole-suite run)
    folder = tempfile.mkdtemp(prefix="nb-")  # short: a socket's path holds at most 107 bytes
    ipc = dict(transport="ipc", ip=os.path.join(folder, "kernel")) if os.name == "posix" else {}
    km = KernelManager(kernel_name="python3", **ipc)
    client = nbclient.NotebookClient(
        nb,
        km=km,
        timeout=None,  # no cell has a time limit: CI's overall limit is the only one
        resources={"metadata": {"path": str(NB_DIR)}},  # cwd: notebooks/, as in Jupyter
    )
    try:
        client.execute()  # raises CellExecutionError, naming the cell, if any cell raises
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def cell_seconds(nb):
    """[(seconds, cell number)] of an executed notebook, the slowest first: the times nbclient
    records, printed with the run for bench/README.md (a student's wait per cell), never judged."""
    from datetime import datetime

    def at(stamp):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    times = []
    for i, cell in enumerate(nb.cells):
        e = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in e and "shell.execute_reply" in e:
            times.append(
                ((at(e["shell.execute_reply"]) - at(e["iopub.execute_input"])).total_seconds(), i)
            )
    return sorted(times, reverse=True)


def say_cell_times(name, nb, record_property):
    times = cell_seconds(nb)
    if times:
        slow = ", ".join(f"{t:.1f} s (cell {i})" for t, i in times[:3])
        record_property(
            "measured", f"{name}: slowest cells {slow}; all {sum(t for t, _ in times):.0f} s"
        )


def reads_the_data(name):
    """Whether a notebook's source reads ../shared/data: a cell tagged "shared-data", or the
    NANORM_DATA variable that names another place for it."""
    source = (NB_DIR / "src" / name.replace(".ipynb", ".py")).read_text()
    return "NANORM_DATA" in source or 'tags=["shared-data"]' in source


# The fresh runs, the longest first: pytest -n 2 hands them out in this order, so the two
# workers share the long ones. Notebooks 06, 07 and 08 read nothing from ../shared/data: a run
# without it is the same computation as one with it, so they run once, and every claim is
# checked on that run; each other notebook runs twice, with the data and without.
FRESH = [
    "07_rl.ipynb",
    "06_rlhf_and_scale.ipynb",
    "05_evaluation.ipynb",
    "03_verifiable_rewards.ipynb",
    "02_reward_model.ipynb",
    "08_beyond_one_score.ipynb",
    "01_llama.ipynb",
    "04_critic.ipynb",
]
NO_DATA = ("06_rlhf_and_scale.ipynb", "07_rl.ipynb", "08_beyond_one_score.ipynb")
READS_DATA = [n for n in FRESH if n not in NO_DATA]


def test_the_notebooks_run_without_data_are_those_that_read_it():
    assert sorted(FRESH) == NOTEBOOKS
    assert READS_DATA == [n for n in FRESH if reads_the_data(n)]
    for name in set(NOTEBOOKS) - set(READS_DATA):  # one run checks all their claims
        assert not any(c.shared for c in CLAIMS[name]), f"{name}: a claim tagged shared-data"


@pytest.mark.slow
@pytest.mark.parametrize("name", FRESH)
def test_a_fresh_run_shows_the_claims(name, monkeypatch, record_property):
    pytest.importorskip("ipykernel", reason="executing notebooks needs ipykernel")
    nb = read(name)  # executed in memory: the stored file is not touched
    have_data = SHARED.exists()
    if not have_data or name not in READS_DATA:  # no data, or a notebook that reads none
        monkeypatch.setenv("NANORM_DATA", "none")
    execute(nb)
    say_cell_times(name, nb, record_property)
    found = broken(CLAIMS[name], nb, have_data)
    how = "with" if have_data and name in READS_DATA else "without"
    assert not found, report(f"{name} ({how} ../shared/data)", found)


@pytest.mark.slow
@pytest.mark.parametrize("name", READS_DATA)
def test_runs_without_the_shared_data(name, monkeypatch, record_property):
    """Every notebook that reads ../shared/data has a fallback for a machine without it, and
    its claims not tagged shared hold there too. Where the data is absent (CI's fresh clone)
    the run above is that run. Where it is present, this second run of five notebooks is asked
    for by NANORM_TEST_FALLBACKS=1: what it adds is the fallback cells (the other cells compute
    what the run above computed), and it costs the suite about a minute on two cores."""
    if not SHARED.exists():
        pytest.skip("covered by test_a_fresh_run_shows_the_claims on this machine")
    if os.environ.get("NANORM_TEST_FALLBACKS") != "1":
        pytest.skip(
            "the fallbacks are checked without ../shared/data (CI); "
            "NANORM_TEST_FALLBACKS=1 checks them here"
        )
    pytest.importorskip("ipykernel", reason="executing notebooks needs ipykernel")
    monkeypatch.setenv("NANORM_DATA", "none")
    nb = read(name)
    execute(nb)
    say_cell_times(f"{name} without the data", nb, record_property)
    found = broken(CLAIMS[name], nb, have_data=False)
    assert not found, report(f"{name} (without ../shared/data)", found)


# Beside each claim, what runs (a) and (b) of the module's docstring printed: "AVX2" is (a), the
# stored outputs, "scalar" (b). A claim without a comment printed the same on both.
CLAIMS["01_llama.ipynb"] = [
    C("RMSNorm brings each vector's RMS to 1", r"RMS after: +\[(.*?)\]",
      lambda s: len(floats(s)) == 4 and every(floats(s), lambda x: abs(x - 1) < 0.01)),
    C("RMSNorm does not center (a mean stays far from 0)", r"mean after: +\[(.*?)\]",
      lambda s: max(map(abs, floats(s))) > 0.1),
    C("LayerNorm's means are 0", r"LayerNorm's mean: \[(.*?)\]",
      lambda s: every(floats(s), lambda x: abs(x) < 0.01)),
    C("enable_gqa equals repeating the key/value heads", r"enable_gqa == repeated key/value heads: (\w+)",
      lambda ok: ok == "True"),
    C("4 key/value heads halve the KV cache of 8", r"KV cache for 512 tokens: NUM KiB with 8 kv heads, NUM KiB with 4",
      lambda eight, four: eight == 2 * four == 1280),
    C("FeedForward is w2(silu(w1 x) * w3 x)", r"FeedForward\(x\) == w2\(silu\(w1 x\) \* w3 x\): (\w+)",
      lambda ok: ok == "True"),
    C("stories260K has 260k parameters", r"([\d,]+) parameters", lambda n: n == "260,032", True),
    C("model(tokens, mask) equals the forward given positions and mask", r"given positions and mask explicitly: (\w+)",
      lambda ok: ok == "True", True),
    C("the padded row matches its run alone to rounding with positions from the mask or columns, "
      "not with mixed numbering",
      r"row 0 \(10 padding\), max \|logit difference\| vs\. alone: from the mask (.+?), column index (.+?), mixed (\S+)",
      lambda mask, col, mixed: mask == col == "< 1e-3 (rounding)" and float(mixed) > 0.1, True),
    C("the unpadded row matches every way", r"row 1 \(0 padding\), max \|logit difference\| vs\. alone: (.*)",
      lambda s: s.count("< 1e-3 (rounding)") == 3, True),
    C("batched generation picks the tokens each row picks alone",
      r"the same as generating it alone: (\w+)[\s\S]*the same as generating it alone: (\w+)",
      lambda a, b: a == b == "True", True),
]  # fmt: skip

CLAIMS["04_critic.ipynb"] = [
    C("the critic starts as the reward model at the last token",
      r"critic's value at the last token: NUM +reward model: NUM", lambda v, r: v == r, True),
    C("the critic returns 0 at the left padding",
      r"values \(0 at the left padding\):\n \[\[[^\]]*\]\n \[ *NUM +NUM +NUM ",
      lambda *v: v == (0, 0, 0), True),
    C("GAE with lam = 1 is the Monte-Carlo advantage", r"lam = 1 is the Monte-Carlo advantage: (\w+)",
      lambda ok: ok == "True"),
    C("GAE with lam = 0 is the one-step TD error", r"lam = 0 is the one-step TD error: +(\w+)",
      lambda ok: ok == "True"),
    C("the clipped value stops just past old + eps = 0.2", r"V over 8 steps towards G = 1: \[(.*?)\]",
      lambda s: 0.2 < floats(s)[-1] < 0.3 and len(set(floats(s)[-4:])) == 1),
    C("the value loss's mean ignores padding", r"masked mean: NUM", lambda m: abs(m - 0.32) < 1e-6),
]  # fmt: skip

LOG2 = math.log(2)

CLAIMS["02_reward_model.ipynb"] = [
    C("the pad id is the EOS id", r"pad id NUM \(= eos id NUM", lambda pad, eos: pad == eos),
    C("with left padding the last real token is the last column",
      r"last_real_index, right padding: \[(.*?)\]\nlast_real_index, left padding: +\[(.*?)\]",
      lambda right, left: set(floats(left)) == {max(floats(right))} and min(floats(right)) < max(floats(right))),
    C("right-padded, left-padded and one row at a time give the same rewards",
      r"right-padded batch: \[(.*?)\]\nleft-padded batch: +\[(.*?)\]\none row at a time: +\[(.*?)\]",
      lambda *rows: every(zip(*map(floats, rows), strict=True), lambda r: max(r) - min(r) < 2e-5)),
    C("the last column reads padding: another reward on each padded row, the same on the full one",
      r"right-padded batch: \[(.*?)\][\s\S]*last column, right padding: \[(.*?)\]",
      lambda right, last: [abs(a - b) < 2e-5 for a, b in zip(floats(right), floats(last), strict=True)]
      == [False, False, True, False]),
    C("the naive log(1 + exp(-delta)) overflows at delta = -1e4",
      r"naive log\(1 \+ exp\(-delta\)\) at delta = 1e4, 0, -1e4: \[NUM, NUM, NUM\]",
      lambda big, zero, small: math.isinf(big) and abs(zero - LOG2) < 1e-6),
    C('pairwise_loss("logexp") is 1e4, log 2 and 0 there', r'pairwise_loss\("logexp"\), pair by pair: +\[NUM, NUM, NUM\]',
      lambda a, b, c: a == 1e4 and abs(b - LOG2) < 1e-6 and c < 1e-6),
    C("accuracy counts a tie as wrong", r"accuracy counts a tie as wrong: NUM", lambda acc: acc == 0.5),
    C("the held-out loss starts at log 2", r"step 0: eval loss NUM", lambda loss: abs(loss - LOG2) < 0.005),  # AVX2 0.6929, scalar 0.6929
    C("the held-out loss falls below 0.64 by step 150 (measured 0.575-0.576)",
      r"step 150: eval loss NUM", lambda loss: loss < 0.64),  # AVX2 0.5750, scalar 0.5757
    C("the trained model beats chance and longer-wins on all 1000 held-out pairs (measured 0.642-0.646)",
      r"held-out accuracy NUM on 1000 pairs \(chance 0.5; 'longer response wins' NUM\)",
      lambda acc, longer: acc > 0.56 and longer < 0.5),  # AVX2 0.642, scalar 0.646; longer 0.454
    C("the short run still ranks some pairs wrong", r"chosen '.*?' +NUM +rejected '.*?' +NUM",
      lambda c, r: c <= r),  # AVX2 1.21 <= 1.26, scalar 1.58 <= 1.62
]  # fmt: skip

CLAIMS["03_verifiable_rewards.ipynb"] = [
    C("a thousands comma matches", r"'2,125' matches '2125': (\w+)", lambda ok: ok == "True"),
    C("the last answer counts: 'No wait, the answer is 20' gives 20, reward 0",
      r"No wait, the answer is 20\. +'(\w+)' +NUM", lambda a, r: a == 20 and r == 0),
    C("MATH-500's last box matches its answer field in 500 of 500",
      r"matches the 'answer' field in NUM of NUM items", lambda a, n: a == n == 500, True),
    C("every assert on answers_match holds", r"every claim above (holds)", lambda s: s == "holds"),
    C("added, the format bonus makes the long wrong answer A1 the best (advantage +1.5); gated, 0",
      r"A1 long, formatted, wrong +NUM +NUM +NUM \| +NUM +NUM \| +NUM +NUM",
      lambda n, f, acc, add, add_adv, gated, gated_adv: add_adv == 1.5 and gated_adv == 0),
    C("gated, the terse right answer B1 gets a positive advantage",
      r"B1 terse, formatted, right +NUM +NUM +NUM \| +NUM +NUM \| +NUM +NUM",
      lambda n, f, acc, add, add_adv, gated, gated_adv: gated_adv > 0),
    C("the overlong penalty hits the 564-character answer, not the 44-character one",
      r"564 chars +overlong_penalty NUM\n.*44 chars +overlong_penalty NUM", lambda a, b: a < 0 and b == 0),
    C("the verifier agrees with its own labels in 1000 of 1000 pairs",
      r"chosen scores 1 in NUM/NUM pairs, rejected 0 in NUM/NUM", lambda a, n, b, m: a == b == n == m == 1000),
    C("the reward model ranks most pairs as the verifier does (measured 64.2-64.6%)",
      r"prefers the verifier's choice in NUM% of the pairs", lambda pct: pct > 56),  # AVX2 64.2, scalar 64.6
    C("it catches most answers off by 10 or with two digits swapped (measured 0.84-0.90), "
      "answers off by 1 or 2 barely better than a coin (measured 0.54-0.56)",
      r"by error: digits swapped NUM of 41, off by 1-2 NUM of 690, off by 10 NUM of 269",
      lambda swapped, near, ten: swapped > 0.7 and ten > 0.7 and 0.4 < near < 0.65),  # AVX2 0.90 0.54 0.85, scalar 0.90 0.56 0.84
    C("the answer's format matters far less than the kind of error (spreads 0.05-0.08 against 0.34-0.36)",
      r"by error: digits swapped NUM of 41, off by 1-2 NUM of 690, off by 10 NUM of 269\n"
      r".*by format: #### NUM of 331, \\boxed\{\} NUM of 345, answer is NUM of 324",
      lambda a, b, c, x, y, z: max(x, y, z) - min(x, y, z) < (max(a, b, c) - min(a, b, c)) / 2),  # formats: AVX2 0.64 0.67 0.62, scalar 0.60 0.66 0.68
]  # fmt: skip

CLAIMS["05_evaluation.ipynb"] = [
    C("in helpful-base's held-out pairs the longer answer is the chosen one about 60% of the time",
      r"helpful-base: NUM held-out pairs, longer wins NUM", lambda n, longer: n == 469 and 0.58 < longer < 0.64, True),  # both: 469, 0.613
    C("on its held-out pairs the model's accuracy is close to longer_wins (measured within 0.01)",
      r"^helpful-base +469 +NUM +NUM +NUM", lambda acc, ties, longer: abs(acc - longer) < 0.04, True),  # both: 0.6162 against 0.613
    C("its rewards correlate strongly with length (measured 0.57-0.65)",
      r"^helpful-base +469" + r" +NUM" * 11, lambda *c: c[9] > 0.3, True),  # c[9]: len_corr; AVX2 0.5702, scalar 0.5703
    C("it is right mostly when the chosen answer is the longer one (measured 0.60-0.73 apart)",
      r"^helpful-base +469 +NUM +NUM +NUM +NUM +NUM", lambda acc, ties, longer, al, ash: al > ash + 0.4, True),  # both: 0.8566 and 0.259
    C("on harmless-base its accuracy falls below chance (measured 0.43)",
      r"^harmless-base +500 +NUM", lambda acc: acc < 0.5, True),  # both: 0.426
    C("on the length trap it prefers the padded answer in most pairs (measured 0.11-0.20)",
      r"^length-trap +300 +NUM", lambda acc: acc < 0.3, True),  # both: 0.1133
    C("split by length: right when the chosen is longer, wrong when it is shorter",
      r"\{'chosen longer': NUM, 'chosen shorter': NUM\}", lambda lo, sh: lo > 0.75 and sh < 0.35, True),  # both: 0.857 and 0.259
]  # fmt: skip

CLAIMS["06_rlhf_and_scale.ipynb"] = [
    C("4 accumulated micro-batches give the big batch's gradient to float32 rounding",
      r"max \|big batch - 4 accumulated micro-batches\| = NUM", lambda d: d < 1e-6),  # AVX2 4.5e-08, scalar 6e-08
    C("without the 1/k the gradient is k = 4 times too large",
      r"without the 1/4: \|gradient\| / \|big batch's\| = NUM", lambda r: r == 4),
    C("Adam magnifies the same rounding with the learning rate (lr 0.1 over 10x lr 1e-5's gap)",
      r"Adam lr 1e-05: max weight difference after 30 steps NUM\nAdam lr 1e-03: .* NUM\nAdam lr 1e-01: .* NUM",
      lambda a, b, c: c > 10 * a and c > b),  # AVX2 7.3e-06 0.0014 0.95, scalar 1.6e-05 0.0017 0.13
    C("two DDP processes under torchrun", r"8 pairs x 1 accumulation x NUM ranks", lambda n: n == 2),
    C("DDP's weights equal one process's with --grad_accum 2 to 1e-6",
      r"max \|two processes - one process with --grad_accum 2\| = NUM", lambda d: d < 1e-6),
    C("RewardModelTrainer: 32 steps, the scheduler stepped with each, the last-token rule learned",
      r"NUM optimizer steps, scheduler at NUM; held-out accuracy NUM",
      lambda steps, sched, acc: steps == sched == 32 and acc > 0.9),
    C("7B with AdamW: DDP does not fit an 80 GB GPU, FSDP over 8 does",
      r"Llama-2-7B: DDP +NUM GiB per GPU; FSDP/2 +NUM, FSDP/8 +NUM", lambda ddp, f2, f8: ddp > 80 > f8),
    C("with the LM term the held-out pairwise loss ends lower, by more than 0.04 (measured 0.100-0.102), "
      "and the accuracy above chance",
      r"lm_coef 0: held-out \(step, accuracy, pairwise loss\) \[(.*)\]\n"
      r"lm_coef 1: held-out \(step, accuracy, pairwise loss\) \[(.*)\]",
      lambda lm0, lm1: floats(lm1)[-1] < floats(lm0)[-1] - 0.04 and floats(lm1)[-2] > 0.56),  # AVX2 0.675 - 0.575 = 0.100, accuracy 0.65; scalar 0.678 - 0.576 = 0.102, 0.63
    C("the response LM term equals the direct computation, and differs without the shift",
      r"response_lm_loss NUM; by hand NUM; without the shift NUM", lambda t, h, n: t == h and abs(n - t) > 0.01),
    C("on random tokens the shifted LM term stays near log 64, the unshifted one learns to copy",
      r"shifted NUM, without the shift NUM", lambda s, c: s > 3.5 and c < 0.5),
    C("the label-0 loss pushes r_chosen down", r"d loss / d r_chosen = NUM", lambda g: g > 0),
    C("best_of_n and pass_at_n equal the brute force", r"best_of_n and pass_at_n (equal) the average", lambda s: s == "equal"),
    C("13 of 640 answers right", r"NUM of NUM answers right", lambda right, n: right == 13 and n == 640),
    C("at N = 1 every pick is random: gold 0.020 either way, proxy 4.60",
      r"^ +1 +NUM +NUM +NUM +NUM +NUM$", lambda kl, g, o, p, t: g == o == 0.02 and abs(p - 4.60) < 0.005),
    C("at N = 16 the proxy's pick is never right (oracle about 0.22), its proxy score 5.34",
      r"^ +16 +NUM +NUM +NUM +NUM +NUM$", lambda kl, g, o, p, t: g == 0 and abs(o - 0.22) < 0.01 and abs(p - 5.34) < 0.005),
]  # fmt: skip

CLAIMS["07_rl.ipynb"] = [
    C("before any update the KL to the reference is 0", r"KL per sequence: \[(.*?)\]",
      lambda s: len(floats(s)) == 8 and every(floats(s), lambda x: x == 0)),
    C("the reward is the proxy's score at the last token, 0 elsewhere", r"row 0's rewards: \[(.*?)\]",
      lambda s: sum(x != 0 for x in floats(s)) == 1),
    C("the critic reproduces the proxy at the last token", r"critic at row 0's last token NUM, proxy NUM",
      lambda v, p: v == p),
    C("on the first pass every ratio is 1 and the policy loss 0",
      r"ratios in \[NUM, NUM\], policy loss NUM", lambda lo, hi, loss: lo == hi == 1 and abs(loss) < 1e-3),
    C("the proxy, trained on 300 pairs, beats chance on held-out pairs (measured 0.630-0.637)",
      r"held-out accuracy NUM; 'longer response wins'", lambda acc: acc > 0.58),  # AVX2 0.637, scalar 0.630
    C("SFT teaches the policy to answer: its loss falls from 5.8 to below 0.7 in 200 steps (measured 0.557-0.585)",
      r"sft step 0: loss NUM[\s\S]*sft step 199: loss NUM",
      lambda first, last: first > 5 and last < 0.7),  # AVX2 5.797 -> 0.557, scalar 5.797 -> 0.585
    C("on all 600 questions greedy answers are right more often than sampled ones (measured 0.072-0.079 apart)",
      r"All NUM questions, each answer cut at its EOS: sampled NUM right \(4 answers each\), greedy NUM right",
      lambda n, sampled, greedy: n == 600 and greedy > sampled + 0.03),  # AVX2 0.136 / 0.208, scalar 0.136 / 0.215
    C("one step at rl's lr 1e-4 moves the policy a little (measured 0.010-0.012 nats), the same step "
      "at 1e-3 fifty to a hundred times further (measured 0.71-0.83)",
      r"one step at lr NUM: KL to the reference on 64 fresh samples NUM nats \(exact per token\).*\n"
      r"one step at lr NUM: KL to the reference on 64 fresh samples NUM nats",
      lambda lr, small, big_lr, big: lr == 1e-4 and big_lr == 1e-3 and 0.002 < small < 0.05 and big > 20 * small),
    # AVX2 0.0097 and 0.8276 (85x), scalar 0.0117 and 0.7102 (61x)
    C("rl.main: the KL starts at 0 and grows, the proxy's reward rises in 10 steps",
      r"^step 0: kl NUM, proxy NUM, gold NUM\nstep 10: kl NUM, proxy NUM, gold NUM",
      lambda kl0, p0, g0, kl, p, g: kl0 == 0 and kl > 0.3 and p > p0),  # AVX2 kl 0.92, proxy 1.64 -> 3.01; scalar 1.38, 0.99 -> 2.25
    C("PPO against the 5,000-pair proxy, every seed: the gold rises by 0.04 or more, the proxy climbs",
      "\n".join([r"ppo_proxy5000_kl0.02 seed \d: gold NUM -> peak NUM at step NUM \(kl NUM\) -> end NUM; proxy NUM -> NUM"] * 5),
      lambda *v: all(g0 + 0.04 <= pk and p1 > p0 for g0, pk, _, _, _, p0, p1 in zip(*[iter(v)] * 7, strict=True))),
    C("against the 1,000-pair proxy the gold ends below its start, every seed",
      "\n".join([r"ppo_proxy1000_kl0.02 seed \d: gold NUM -> peak NUM at step NUM \(kl NUM\) -> end NUM;.*"] * 5),
      lambda *v: all(end < g0 for g0, _, _, _, end in zip(*[iter(v)] * 5, strict=True))),
    C("GRPO against the verifier, every seed: the gold rises by 0.15 or more to a peak above 0.7 and "
      "ends within 0.06 of it (measured peaks 0.74-0.78, ends 0.69-0.77)",
      "\n".join([r"grpo_verifier_kl0.02 seed \d: gold NUM -> peak NUM .*-> end NUM;.*"] * 5),
      lambda *v: all(pk > 0.7 and end > g0 + 0.15 and pk - end < 0.065
                     for g0, pk, end in zip(*[iter(v)] * 3, strict=True))),
]  # fmt: skip

# 08's figures of bench/ are read from the files the runs stored there: the same on any CPU. Its
# live cells are closed forms (DPO at its first step, the rules on a fixed table) and the
# zero-shot judge, whose p('Y') was 8.7e-06 and 9.0e-06 (AVX2), 5.4e-06 and 5.3e-06 (scalar).
CLAIMS["08_beyond_one_score.ipynb"] = [
    C("at DPO's first step every implicit reward is 0 and the loss log 2",
      r"implicit rewards at the start: \[(.*?)\]\nDPO loss at the start: NUM \(log 2 = NUM\)",
      lambda s, loss, log2: every(floats(s), lambda x: x == 0) and abs(loss - log2) < 1e-4),
    C("the implicit reward (sum) ranks held-out pairs better than the plain reward model on every "
      "seed, and every model is within 0.05 of chance on numbers up to 99",
      "\n".join([r"seed \d \(in distribution / up to 99\): DPO sum NUM / NUM \| RM NUM / NUM \| RM \+ LM NUM / NUM"] * 3),
      lambda *v: all(d > rm and all(abs(x - 0.5) < 0.05 for x in (dl, rl, ll))
                     for d, dl, rm, rl, _, ll in zip(*[iter(v)] * 6, strict=True))),
    C("the exact labeller: the right chain on track throughout, the slipped one off track from its slip",
      r"right: .* -> exact labels \[(.*?)\]\n +slipped: .* -> exact labels \[(.*?)\]",
      lambda a, b: floats(a) == [1, 1, 1, 1] and floats(b) == [1, 0, 0, 0]),
    C("the minimum keeps the first solution, the product the second",
      r"solution rewards, min: \[NUM, NUM\] product: \[NUM, NUM\]",
      lambda m0, m1, p0, p1: m0 > m1 and p1 > p0),
    C("on every seed: Math-Shepherd's hard labels equal the exact ones on 0.85 or more of the steps; "
      "the PRM's step accuracy is above the base rate; best-of-64 by PRM min and by the ORM is below "
      "one solution at random, PRM min above the ORM, and majority vote above them all",
      "\n".join([r"seed \d: Math-Shepherd \(hard\) = exact on NUM of steps; held-out step accuracy PRM NUM, base rate NUM; "
                  r"best-of-64: PRM min NUM, PRM product NUM, ORM NUM, majority NUM, N=1 NUM, pass@N NUM"] * 3),
      lambda *v: all(agree >= 0.85 and acc > base and pmin < one and orm < one and pmin > orm
                     and maj > max(one, pmin, prod, orm)
                     for agree, acc, base, pmin, prod, orm, maj, one, _ in zip(*[iter(v)] * 9, strict=True))),
    C("zero-shot, the policy gives 'Y' almost no probability (below 1e-3)",
      r"right: .* p\('Y'\) = NUM\nwrong: .* p\('Y'\) = NUM", lambda a, b: a < 1e-3 and b < 1e-3),
    C("on every seed the pairwise head beats the fine-tuned Yes/No judge, and the fine-tuned A/B "
      "judge picks A in 0.99 or more of judgments (zero-shot: above 0.7)",
      "\n".join([r"seed \d, in distribution: pairwise RM NUM, Yes/No judge NUM; A/B judge picks A in NUM of judgments \(zero-shot NUM\)"] * 3),
      lambda *v: all(rm > yn and a >= 0.99 and z > 0.7 for rm, yn, a, z in zip(*[iter(v)] * 4, strict=True))),
    C("model 3 alone and the mean rank the exploit first; the minimum and mean - std do not",
      r"mean: .* -> answer (\d) first\n +min: .* -> answer (\d) first\n +mean_minus_std: .* -> answer (\d) first\n +model 3 alone: answer (\d) first",
      lambda mean, mn, ms, alone: (mean, mn, ms, alone) == (3, 1, 1, 3)),
    C("best-of-64 by one proxy ends below best-of-1, and every ensemble rule ends above one proxy, "
      "on every seed",
      "\n".join([r"best-of-N seed \d: N=1 NUM; N=64 one member NUM, mean NUM, min NUM, mean_minus_std NUM, mean_minus_2std NUM"] * 3),
      lambda *v: all(one < g1 and min(rest) > one for g1, one, *rest in zip(*[iter(v)] * 6, strict=True))),
    C("under PPO every rule falls less than one proxy; at the same KL the mean keeps more gold than "
      "one proxy and the minimum less, on every seed",
      "\n".join([r"PPO seed \d: K=1 fall NUM end NUM at sqrt\(KL\) NUM; mean fall NUM end NUM at sqrt\(KL\) NUM \(K=1 there NUM\), "
                  r"min fall NUM end NUM at sqrt\(KL\) NUM \(K=1 there NUM\), mean_minus_std fall NUM end NUM at sqrt\(KL\) NUM \(K=1 there NUM\)"] * 3),
      lambda *v: all(max(mf, nf, sf) < kf and me > mt and ne < nt
                     for kf, _, _, mf, me, _, mt, nf, ne, _, nt, sf, _, _, _ in zip(*[iter(v)] * 15, strict=True))),
    C("Gao's best-of-N form fits every rule's curve within 0.02 (RMSE)",
      "\n".join([r"Gao best-of-N fit, \w+: alpha NUM, beta NUM, RMSE NUM"] * 5),
      lambda *v: all(r < 0.02 and b > 0 for _, b, r in zip(*[iter(v)] * 3, strict=True))),
]  # fmt: skip
