"""notebooks/: each notebook is stored with the outputs of a real run, small, in sync with its
source in notebooks/src/, and a fresh run prints what is stored: words equal, numbers within a
unit of their last written digit (and 2%), lines about time and speed left out. With
../shared/data every cell is compared; without it each notebook runs its fallbacks
(NANORM_DATA=none) and the cells not tagged "shared-data" are compared."""

import importlib.util
import math
import re
import time

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
]
MAX_KB = 300  # stored size: pictures at 72 dpi, no embedded data
BUDGET_S = 180  # each notebook, top to bottom, on a CPU
REL_TOL = 0.02  # a number may move by this much between machines (float sums in another order)
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
# lines that report time or speed: they differ on every run
TIMING = re.compile(r"\d\s*(?:s|ms|sec|seconds|min)\b|tok/s|it/s|done in|elapsed", re.I)
# temporary directories and object addresses differ on every run
VOLATILE = re.compile(r"\S*(?:nanorm_|/tmp/|tmp[a-z0-9_]{6,})\S*|\b0x[0-9a-f]{6,}", re.I)


def build_module():
    spec = importlib.util.spec_from_file_location("notebooks_build", NB_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(name):
    nbformat = pytest.importorskip("nbformat", reason="reading notebooks needs nbformat")
    return nbformat.read(NB_DIR / name, as_version=4)


def test_every_source_has_a_notebook():
    sources = sorted(p.stem for p in (NB_DIR / "src").glob("*.py"))
    assert sources == [n.removesuffix(".ipynb") for n in NOTEBOOKS]


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


def printed(cell):
    """The lines a code cell printed (stdout and its value; not stderr's warnings, not
    pictures), with temporary paths masked and the lines about time left out."""
    text = ""
    for o in cell.get("outputs", []):
        if o.output_type == "stream" and o.name == "stdout":
            text += o.text
        elif o.output_type in ("execute_result", "display_data"):
            text += o.get("data", {}).get("text/plain", "") + "\n"
    lines = [VOLATILE.sub("<tmp>", line).rstrip() for line in text.splitlines()]
    return [line for line in lines if line and not TIMING.search(line)]


def close(stored, fresh):
    """Two numbers as printed: equal within REL_TOL or one unit of the last digit written."""
    unit = max(10.0 ** -len(s.split(".")[1].split("e")[0].split("E")[0]) if "." in s else 1.0
               for s in (stored, fresh))  # fmt: skip
    if "e" in stored.lower() or "e" in fresh.lower():
        unit = 0.0
    a, b = float(stored), float(fresh)
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=unit * 1.01)


def same_line(stored, fresh):
    words = lambda line: NUMBER.split(line)
    if words(stored) != words(fresh):
        return False
    return all(
        close(a, b) for a, b in zip(NUMBER.findall(stored), NUMBER.findall(fresh), strict=True)
    )


def differences(stored_nb, fresh_nb, skip_tag=None):
    """[(cell index, stored line, fresh line)] for each line that differs."""
    found = []
    pairs = zip(stored_nb.cells, fresh_nb.cells, strict=True)
    for i, (old, new) in enumerate(pairs):
        if old.cell_type != "code" or skip_tag in old.metadata.get("tags", []):
            continue
        a, b = printed(old), printed(new)
        if len(a) != len(b):
            found.append((i, f"{len(a)} lines", f"{len(b)} lines: {b[:3]}"))
        found += [(i, x, y) for x, y in zip(a, b, strict=False) if not same_line(x, y)]
    return found


def execute(nb):
    nbclient = pytest.importorskip("nbclient", reason="executing notebooks needs nbclient")
    client = nbclient.NotebookClient(
        nb,
        timeout=BUDGET_S,  # per cell
        kernel_name="python3",
        resources={"metadata": {"path": str(NB_DIR)}},  # cwd: notebooks/, as in Jupyter
    )
    start = time.time()
    client.execute()  # raises CellExecutionError, naming the cell, if any cell raises
    return time.time() - start


def test_comparison_sees_a_stale_output_and_ignores_timing():
    assert same_line(
        "step 400: eval loss 0.4888 acc 0.7433", "step 400: eval loss 0.4889 acc 0.7433"
    )
    assert not same_line(
        "step 400: eval loss 0.4888 acc 0.7433", "step 400: eval loss 0.4282 acc 0.7467"
    )
    assert not same_line("4.667 \\frac{14}{3} True", "4.667 \\frac{14}{3} False")
    assert same_line("1200 of 1319", "1200 of 1319") and not same_line(
        "1200 of 1319", "1230 of 1319"
    )
    assert same_line("-0.00", "0.00") and same_line("12345.6", "12350.1")  # 2% of a large number
    nbformat = pytest.importorskip("nbformat", reason="reading notebooks needs nbformat")
    cell = nbformat.v4.new_code_cell("print()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        "done in 3.2s\nstep 10: 512 tok/s\nwrote /tmp/nanorm_rm_ab12/ckpt.pt\nacc 0.75\n"))]  # fmt: skip
    assert printed(cell) == ["wrote <tmp>", "acc 0.75"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_fresh_run_prints_what_is_stored(name, monkeypatch):
    pytest.importorskip("ipykernel", reason="executing notebooks needs ipykernel")
    stored = read(name)
    fresh = read(name)  # executed in memory: the stored file is not touched
    have_data = SHARED.exists()
    if not have_data:  # the fallbacks run; cells whose output needs the data are not compared
        monkeypatch.setenv("NANORM_DATA", "none")
    elapsed = execute(fresh)
    assert elapsed < BUDGET_S, f"{name} took {elapsed:.0f}s; keep each notebook under {BUDGET_S}s"
    diff = differences(stored, fresh, skip_tag=None if have_data else "shared-data")
    shown = "\n".join(f"  cell {i}: stored {a!r}\n           fresh  {b!r}" for i, a, b in diff[:8])
    assert not diff, (
        f"{name}: {len(diff)} printed lines differ from a fresh run "
        f"({'with' if have_data else 'without'} ../shared/data); "
        f"run python notebooks/build.py {name[:2]}\n{shown}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_runs_without_the_shared_data(name, monkeypatch):
    """Every notebook has a fallback for a machine without ../shared/data (the run above covers
    it where the data is absent)."""
    if not SHARED.exists():
        pytest.skip("covered by test_a_fresh_run_prints_what_is_stored on this machine")
    pytest.importorskip("ipykernel", reason="executing notebooks needs ipykernel")
    monkeypatch.setenv("NANORM_DATA", "none")
    nb = read(name)
    execute(nb)
    stored = read(name)
    diff = differences(stored, nb, skip_tag="shared-data")
    assert not diff, f"{name}: an untagged cell prints differently without the data: {diff[:4]}"
