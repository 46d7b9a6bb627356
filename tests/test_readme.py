"""The README's commands as written: every `python X.py --flag` in its bash blocks names a script
that exists and flags that script accepts (its --help lists them), and the quick ones run.
The long ones run elsewhere: `python train_rm.py` in .ci/run, `python notebooks/exercises/check.py` in
test_exercises.py, the "own data" commands in
test_own_data.py, the recipe and the benchmarks by hand (their figures are in bench/)."""

import re
import shlex
import subprocess
import sys
from functools import cache

import pytest
from conftest import ROOT, SHARED
from launcher import python

ENV = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
# run as written: they finish in seconds and write nothing outside /tmp or out/
QUICK = ["python -m nanorm.sample", "python train_rm.py --help"]


def commands():
    """Each command of the README's ```bash blocks, continuation lines joined, comments cut."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def python_calls(cmd):
    """(script, flags) for each `python script.py ...` inside a command (also after &&)."""
    for part in re.split(r"&&|;", cmd):
        words = shlex.split(part)
        words = [w for w in words if "=" not in w or w.startswith("-")]  # drop VAR=value
        if len(words) >= 2 and words[0] == "python" and words[1].endswith(".py"):
            yield words[1], [w.split("=")[0] for w in words[2:] if w.startswith("--")]
        if len(words) >= 3 and words[:2] == ["python", "-m"] and words[2].startswith("nanorm."):
            script = words[2].replace(".", "/") + ".py"  # a library script, run as a module
            yield script, [w.split("=")[0] for w in words[3:] if w.startswith("--")]
        if words[:1] == ["torchrun"]:
            script = next((w for w in words if w.endswith(".py")), None)
            i = words.index(script)
            yield script, [w.split("=")[0] for w in words[i + 1 :] if w.startswith("--")]


@cache
def accepted(script):
    how = ["-m", script[:-3].replace("/", ".")] if script.startswith("nanorm/") else [script]
    p = python([*how, "--help"], timeout=120)
    assert p.returncode == 0, (script, p.stderr[-500:])
    return set(re.findall(r"--[a-z_]+", p.stdout))


def test_the_readme_has_commands():
    cmds = commands()
    # the README opens with the two commands that do everything on a fresh machine
    assert cmds[0].endswith("python train_rm.py") and cmds[1].endswith("python -m pytest")
    assert all(c.startswith("pip install torch==2.13.0 && ") for c in cmds[:2])
    assert len(cmds) >= 15  # and the commands of each section, which the tests below check


@pytest.mark.parametrize("cmd", commands())
@pytest.mark.slow
def test_every_flag_exists(cmd):
    for script, flags in python_calls(cmd):
        assert (ROOT / script).exists(), f"README runs {script}, which does not exist"
        unknown = set(flags) - accepted(script) - {"--help"}
        assert not unknown, f"README: {cmd!r}: {script} has no {sorted(unknown)}"


@pytest.mark.parametrize("cmd", QUICK)
@pytest.mark.slow
def test_quick_commands_run_as_written(cmd):
    assert cmd in commands(), f"{cmd!r} is no longer in the README"
    if "nanorm.sample" in cmd and not (SHARED / "llama2c").exists():
        pytest.skip("nanorm.sample's default checkpoint is in ../shared/data")
    p = subprocess.run(
        cmd,
        shell=True,
        cwd=ROOT,
        env=ENV | {"PATH": f"{sys.prefix}/bin:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, (cmd, p.stderr[-1000:])
