"""notebooks/exercises/: every solution passes its checker, every blank template fails it, and the checker
gives the advertised hint for the classic mistakes."""

import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT

sys.path.insert(0, str(ROOT / "notebooks" / "exercises"))
import check  # notebooks/exercises/check.py

NAMES = list(check.EXERCISES)


def test_every_exercise_has_a_template_and_a_solution():
    for name in NAMES:
        assert (ROOT / "notebooks" / "exercises" / f"{name}.py").is_file(), name
        assert (ROOT / "notebooks" / "exercises" / "solutions" / f"{name}.py").is_file(), name
    assert len(NAMES) >= 5


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    passed, message = check.check(
        check.load(ROOT / "notebooks" / "exercises" / "solutions" / f"{name}.py"), name
    )
    assert passed, message


@pytest.mark.parametrize("name", NAMES)
def test_blank_template_fails(name):
    path = ROOT / "notebooks" / "exercises" / f"{name}.py"
    assert "TODO" in path.read_text()
    passed, message = check.check(check.load(path), name)
    assert not passed and message.startswith("not implemented yet"), message


def mistake(**functions):
    return types.SimpleNamespace(**functions)


@pytest.mark.parametrize(
    "name, module, hint",
    [
        ("ex1", mistake(last_real_index=lambda m: m.long().sum(-1) - 1), "with left padding"),
        (
            "ex1",
            mistake(last_real_index=lambda m: torch.full((len(m),), m.size(1) - 1)),
            "last column",
        ),
        (
            "ex2",
            mistake(
                logsig_loss=lambda c, r, m=None: (
                    -torch.log(torch.sigmoid(c - r - (0 if m is None else m))).mean()
                )
            ),
            "logsigmoid",
        ),
        ("ex2", mistake(logsig_loss=lambda c, r, m=None: -F.logsigmoid(r - c).mean()), "swapped"),
        ("ex3", mistake(apply_rope=check._rotate_half), "rotate_half"),
        (
            "ex4",
            mistake(gae=lambda r, v, m, gamma=1.0, lam=0.95: (0 * v, v)),
            "advantages are wrong",
        ),
        ("ex5", mistake(extract_boxed=lambda t: None), "expected"),
        (
            "ex6",
            mistake(value_loss=lambda v, o, r, m, clip_eps=0.2: ((v - r) ** 2).mean()),
            "values",
        ),
        ("ex6", mistake(), "no function named 'value_loss'"),
    ],
)
def test_checker_hints_at_the_mistake(name, module, hint):
    passed, message = check.check(module, name)
    assert not passed and hint in message, message


def test_command_line():
    run = lambda *a: subprocess.run(
        [sys.executable, str(ROOT / "notebooks" / "exercises" / "check.py"), *a],
        capture_output=True,
        text=True,
    )
    ok = run("--solutions")
    assert ok.returncode == 0 and f"{len(NAMES)}/{len(NAMES)} passed" in ok.stdout, ok.stdout
    blank = run("ex1", "ex5_boxed")
    assert blank.returncode == 1 and blank.stdout.count("not implemented yet") == 2, blank.stdout


def test_a_solution_that_calls_the_project_fails_with_a_hint(tmp_path):
    import reward

    borrowed = mistake(last_real_index=reward.last_real_index)  # the function itself
    passed, message = check.check(borrowed, "ex1")
    assert not passed and "nanoRM's own code" in message, message
    inside = tmp_path / "ex1_pooling.py"  # imported inside the function: found in the source
    inside.write_text(
        "def last_real_index(mask):\n    import reward\n\n    return reward.last_real_index(mask)\n"
    )
    passed, message = check.check(check.load(inside), "ex1")
    assert not passed and "imports from nanoRM" in message, message


def test_an_exception_names_its_input():
    def fails_on_one_token(mask):  # right on every other case
        if mask.size(1) == 1:
            raise IndexError("row 0 is out of range")
        return torch.stack([row.nonzero().max() for row in mask.long()])

    passed, message = check.check(mistake(last_real_index=fails_on_one_token), "ex1")
    assert not passed and "raised IndexError: row 0 is out of range" in message, message
    assert "on the input: [[1]" in message and "device" in message, message


def test_a_result_on_another_device_fails(monkeypatch):
    """The inputs sit on check.DEVICE; a result made elsewhere fails with a hint. Here the
    inputs go to the 'meta' device and a result built on the CPU is caught before any value
    is compared (on a GPU machine, check.py --device cuda runs the whole checker there)."""
    monkeypatch.setattr(check, "DEVICE", torch.device("meta"))
    on_cpu = lambda m: torch.zeros(len(m), dtype=torch.long)
    passed, message = check.check(mistake(last_real_index=on_cpu), "ex1")
    assert not passed and "your result is on cpu but the inputs were on meta" in message, message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_solutions_pass_on_a_gpu(monkeypatch):
    monkeypatch.setattr(check, "DEVICE", torch.device("cuda"))
    for name in NAMES:
        path = ROOT / "notebooks" / "exercises" / "solutions" / f"{name}.py"
        passed, message = check.check(check.load(path), name)
        assert passed, f"{name}: {message}"
