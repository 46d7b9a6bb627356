"""The shape of the code a student reads: the top level the design card names, imports that go
one way, runs that load what they run, and words about the code rather than about its making."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"train_rm", "eval_rm"}  # the entry points: they stand on everything, nothing on them
CARD = {"model.py", "reward.py", "critic.py", "verifiable.py", "train_rm.py", "data", "notebooks"}
CARD |= {"tests", "requirements.txt", "README.md", "pyproject.toml"}
MORE = 3  # at most three more top-level entries (here: eval_rm.py, nanorm/, bench/)


def project_files():
    files = sorted(ROOT.glob("*.py")) + sorted((ROOT / "data").rglob("*.py"))
    return files + sorted((ROOT / "nanorm").rglob("*.py"))


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree, top_level):
    """(module, node) of every import: at the top level of the file, or inside functions."""
    nodes = tree.body if top_level else [n for n in ast.walk(tree) if n not in tree.body]
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from ((a.name, node) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module, node


def graph(top_level=True):
    modules = {module_name(f): f for f in project_files()}
    out = {}
    for name, f in modules.items():
        found = (m for m, _ in imports(ast.parse(f.read_text()), top_level))
        out[name] = {m for m in found if m in modules and m != name}
    return out


def is_library(m):
    return m == "nanorm" or m.startswith("nanorm.")


def test_the_top_level_is_the_design_cards():
    seen = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    seen -= {"out", "__pycache__"} | {p for p in seen if p.startswith("out")}  # a run's output
    assert CARD <= seen, CARD - seen
    assert len(seen - CARD) <= MORE, sorted(seen - CARD)
    assert len(list(ROOT.glob("*.py"))) <= 6


def floor(m):
    """0: the ground floor (nanorm/base/, and model.py, which imports nothing); 1: data/ and the
    concept files; 2: the attic (the rest of nanorm/); 3: the scripts."""
    if m == "model" or m == "nanorm.base" or m.startswith("nanorm.base."):
        return 0
    if is_library(m):
        return 2
    return 3 if m in SCRIPTS else 1


def test_imports_go_one_way():
    """Every import, at the top of a file or inside a function, goes to the module's own floor or
    one below it; the verifier's algebra (nanorm/base/algebra/) is verifiable.py's alone and
    imports nothing outside itself. There is no exception, by comment or otherwise."""
    for g in (graph(top_level=True), graph(top_level=False)):
        for m, deps in g.items():
            up = {d for d in deps if floor(d) > floor(m)}
            assert not up, f"{m} imports {sorted(up)} from a floor above it"
            algebra = {d for d in deps if d.startswith("nanorm.base.algebra")}
            if m.startswith("nanorm.base.algebra"):
                assert algebra == deps, (m, deps - algebra)
            else:
                assert not algebra or m == "verifiable", (m, algebra)
    assert floor("nanorm.base.checkpoints") < floor("reward") < floor("nanorm.ckpt")


def test_torch_files_are_read_in_one_module():
    """torch.load (always weights_only=True) is nanorm/base/checkpoints.py's alone; tests and bench/
    may read what they wrote."""
    readers = []
    for f in project_files():
        calls = [
            n
            for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.load"
        ]
        if calls:
            readers.append(module_name(f))
            for call in calls:
                assert "weights_only=True" in ast.unparse(call), (f.name, ast.unparse(call))
    assert readers == ["nanorm.base.checkpoints"], readers


def test_imports_have_no_cycle():
    """Not even through an import inside a function: a format read lazily still goes one way."""
    top = graph(top_level=True)
    g = {m: top[m] | deps for m, deps in graph(top_level=False).items()}
    state = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", "import cycle: " + " -> ".join([*path, m])
        state[m] = "open"
        for d in sorted(g[m]):
            visit(d, [*path, m])
        state[m] = "done"

    for m in sorted(g):
        visit(m, [])
    # training calls evaluation, never the other way; nothing imports the two scripts
    assert "eval_rm" in g["train_rm"] and "train_rm" not in g["eval_rm"]
    assert not [m for m, deps in g.items() if "train_rm" in deps]


def loaded(code):
    """The project's modules a fresh interpreter holds after running code."""
    probe = (
        "import json, sys, os\n" + code + "\nroot = os.getcwd()\n"
        "print(json.dumps(sorted(n for n, m in sys.modules.items() if n not in ('__main__', '__mp_main__')"
        " and not n.startswith('torch') and os.path.abspath(getattr(m, '__file__', None) or"
        " '/').startswith(root + os.sep))))"
    )
    p = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_run_loads_what_it_runs(tmp_path):
    # reward.py stands on model.py, the checkpoint reader, the command's errors, ColossalChat's
    # and LLMBook's conventions and the batch layouts, in three packages; critic.py on reward.py
    under_reward = {"model", "nanorm.base.checkpoints", "nanorm.base.command", "nanorm.base.compat"}
    under_reward |= {"data.pairs", "data", "nanorm", "nanorm.base", "reward"}
    assert set(loaded("import reward")) == under_reward, loaded("import reward")
    assert set(loaded("import critic")) == under_reward | {"critic"}, loaded("import critic")
    # a default run on the built-in data (conftest's built_in_arith made it): the verifier
    # labels the data, training never imports it; the cache, LoRA, FSDP, ODIN and the subset
    # experts stay behind flags
    args = ["--out_dir", str(tmp_path / "b"), "--max_iters", "2", "--eval_interval", "2"]
    args += ["--eval_pairs", "8", "--batch_size", "4"]
    mods = loaded(f"import train_rm; train_rm.main({args!r})") + ["train_rm"]
    assert len(set(mods)) <= 18, sorted(set(mods))
    flagged = {"verifiable", "nanorm.cache", "nanorm.lora", "nanorm.fsdp", "nanorm.length_head"}
    flagged.add("nanorm.subset_experts")
    assert not flagged & set(mods), flagged & set(mods)


def test_readme_is_a_learning_path():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)


def test_requirement_files_include_what_exists():
    """pip reads `-r other.txt` relative to the file that says it; an include that names the file
    itself (or nothing) makes every install fail before it starts."""
    for req in [ROOT / "requirements.txt", ROOT / "tests" / "requirements.txt"]:
        for n, line in enumerate(req.read_text().splitlines(), 1):
            if line.startswith(("-r ", "--requirement ")):
                target = (req.parent / line.split(maxsplit=1)[1]).resolve()
                assert target.is_file() and target != req.resolve(), f"{req}:{n}: {line}"
