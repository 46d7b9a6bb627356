"""notebooks/exercises/check.py as a grader. A solution runs in a process of its own and is given
the inputs only; the expected values are computed and compared in the checker's process, from
cases drawn afresh each run. So each way a solution running beside the checker reached the
answer now fails, copies of nanoRM's code are reported, and the cases cover what is taught."""

import inspect
import re
import sys

import pytest
import torch
from conftest import ROOT
from launcher import python

sys.path.insert(0, str(ROOT / "notebooks" / "exercises"))
import check  # notebooks/exercises/check.py

EX = ROOT / "notebooks" / "exercises"

# Each of these passed the checker when it ran solutions in its own process:
# exercise, the file, and what the checker now says about it.
FRAME = '''
import sys


def _expected():
    """The checker's expected value, read from a caller's frame (it called `want`)."""
    f = sys._getframe(1)
    while f is not None:
        seen = f.f_locals
        if "want_adv" in seen:
            return seen["want_adv"].clone(), seen["want_ret"].clone()
        if "want" in seen:
            return seen["want"]
        f = f.f_back
    raise LookupError("no expected value within reach")


def {signature}:
    return _expected()
'''
SIGNATURES = {
    "ex1_pooling": "last_real_index(attention_mask)",
    "ex4_gae": "gae(rewards, values, mask, gamma=1.0, lam=0.95)",
    "ex9_gsm8k_reward": "gsm8k_reward(response, gt_answer)",
    "ex10_kl_penalty": "kl_penalty_rewards(logp, ref_logp, response_mask, score, kl_coef)",
    "ex11_dpo_loss": "dpo_loss(logp_chosen, logp_rejected, ref_c, ref_r, beta)",
    "ex12_prm_best_of_n": "select_best(step_probs, steps, how)",
    "ex13_conservative_reward": "conservative_reward(rewards, rule, lam)",
}
ATTACKS = {
    f"1. the caller's frame, {name}": (name, FRAME.format(signature=s), "no expected value")
    for name, s in SIGNATURES.items()
}
ATTACKS["2. the comparison patched"] = (
    "ex4_gae",
    """
import sys

import torch

for _m in list(sys.modules.values()):
    if hasattr(_m, "_close") and hasattr(_m, "EXERCISES"):
        _m._close = lambda *a, **k: True
del _m


def gae(rewards, values, mask, gamma=1.0, lam=0.95):
    return torch.zeros_like(rewards), torch.zeros_like(rewards)
""",
    "the advantages are wrong",
)
ATTACKS["3. the watcher switched off"] = (
    "ex4_gae",
    """
import sys


def gae(rewards, values, mask, gamma=1.0, lam=0.95):
    old = sys.getprofile()
    sys.setprofile(None)
    try:
        return sys.modules["critic"].gae(rewards, values, mask, gamma, lam)
    finally:
        sys.setprofile(old)
""",
    "sys.modules['critic']",
)
ATTACKS["4. the reference in a thread"] = (
    "ex4_gae",
    """
import sys
import threading


def gae(rewards, values, mask, gamma=1.0, lam=0.95):
    out = []
    run = lambda: out.append(sys.modules["critic"].gae(rewards, values, mask, gamma, lam))
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]
""",
    "your function raised IndexError",
)
ATTACKS["5. a spy on the reference"] = (
    "ex10_kl_penalty",
    """
import sys

_box = [sys.modules["critic"].kl_penalty_rewards]
_seen = []


def _spy(*args, **kwargs):
    result = _box[0](*args, **kwargs)
    _seen.append(result)
    return result


sys.modules["critic"].kl_penalty_rewards = _spy


def kl_penalty_rewards(logp, ref_logp, response_mask, score, kl_coef):
    return _seen[-1].clone()
""",
    "sys.modules['critic']",
)
ATTACKS["6. a table from the checker's cases"] = (
    "ex4_gae",
    """
import sys

_T = {}


def _key(r, v, m, g, l):
    flat = lambda t: tuple(t.flatten().tolist())
    return flat(r), flat(v), flat(m), g, l


def _build():
    chk = next(m for m in list(sys.modules.values()) if "_gae_cases" in vars(m))
    ref = sys.modules["critic"].gae
    for what, r, v, m, g, l in chk._gae_cases():
        _T[_key(r, v, m, g, l)] = ref(r, v, m, g, l)


_build()


def gae(rewards, values, mask, gamma=1.0, lam=0.95):
    a, ret = _T[_key(rewards, values, mask, gamma, lam)]
    return a.clone(), ret.clone()
""",
    "sys.modules['critic']",
)
ATTACKS["7. exec(compile()) of nanoRM's source"] = (
    "ex4_gae",
    f"""
_ns = {{}}
with open({str(ROOT / "critic.py")!r}) as _f:
    exec(compile(_f.read(), "<my own>", "exec"), _ns)
gae = _ns["gae"]
""",
    "nanoRM's critic.py, which is out of reach",
)
ATTACKS["8. a copy of critic.py beside the file"] = (
    "ex10_kl_penalty",
    """
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from my_rl import kl_penalty_rewards  # noqa: E402
""",
    "imports my_rl, which is not installed",
)
ATTACKS["8. a copy of critic.py by its path"] = (
    "ex10_kl_penalty",
    """
import sys

sys.path.insert(0, {folder!r})
from my_rl import kl_penalty_rewards  # noqa: E402
""",
    "my_rl.py, which is out of reach",
)


def _renamed_kl():
    """critic.py's kl_penalty_rewards with every name changed, its docstring dropped."""
    source = inspect.getsource(check._ref("kl_penalty_rewards"))
    source = re.sub(r'    """.*?"""\n', "", source, flags=re.S)
    for old, new in [("kl_penalty_rewards", "shaped"), ("ref_logp", "q"), ("logp", "p"),
                     ("resp_mask", "keep"), ("rewards", "out"), ("last", "end"), ("m ", "w "),
                     ("* m\n", "* w\n"), ("score", "s")]:  # fmt: skip
        source = source.replace(old, new)
    return "import torch\n\n\n" + source + "\n\nkl_penalty_rewards = shaped\n"


ATTACKS["8. critic.py's function pasted, renamed"] = (
    "ex10_kl_penalty",
    _renamed_kl(),
    "copied from critic.py",
)
ATTACKS["7. nanoRM's source in a string, exec'd"] = (
    "ex4_gae",
    f"""import torch

_SRC = {inspect.getsource(check._ref("gae"))!r}
_ns = {{"torch": torch}}
exec(compile(_SRC, "<my own>", "exec"), _ns)
gae = _ns["gae"]
""",
    "copied from critic.py",
)

GAE_LOOP = """
import torch


def gae(rewards, values, mask, gamma=1.0, lam=0.95):
    {lam_line}
    mask = mask.bool()
    B, R = rewards.shape
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype)
    next_adv = torch.zeros(B, dtype=values.dtype)
    for t in reversed(range(R)):
        adv = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        real = mask[:, t]
        advantages[:, t] = torch.where(real, adv, torch.zeros_like(adv))
        next_value = torch.where(real, values[:, t], next_value)
        next_adv = torch.where(real, adv, {masked_adv})
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns
"""
WRONG_GAE = {  # each passed the old cases, whose masked steps all had lam = 1 and no 0.95
    "decays the advantage across masked steps": (
        GAE_LOOP.format(lam_line="pass", masked_adv="gamma * lam * next_adv"),
        "a masked step is not a step",
    ),
    "lam**2 unless lam is 0, 0.8 or 1": (
        GAE_LOOP.format(
            lam_line="lam = lam if lam in (0.0, 0.8, 1.0) else lam**2", masked_adv="next_adv"
        ),
        "advantages",
    ),
}


def write(folder, name, source):
    """source as the file of exercise `name`, alone in a folder of its own under `folder`."""
    folder = folder / f"{len(list(folder.iterdir()))}"
    folder.mkdir()
    (folder / "my_rl.py").write_text((ROOT / "critic.py").read_text())
    path = folder / f"{name}.py"
    path.write_text(source.replace("{folder!r}", repr(str(folder))))
    return path


def fails(path, name, hint):
    """The checker's line for the file is a FAIL with the hint, and no PASS."""
    passed, message = check.check(path, name)
    shown = check.line(name, passed, message)
    assert not passed and shown.startswith(f"{name:<16} FAIL  "), shown
    assert "PASS" not in shown and hint in message, shown


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_attack_fails(tmp_path, attack):
    name, source, hint = ATTACKS[attack]
    fails(write(tmp_path, name, source), name, hint)


@pytest.mark.parametrize("mistake", WRONG_GAE)
def test_wrong_gae_fails(tmp_path, mistake):
    source, hint = WRONG_GAE[mistake]
    fails(write(tmp_path, "ex4_gae", source), "ex4_gae", hint)


def test_the_decay_mistake_on_a_worked_example():
    """rewards [0, 0, 0, 1], mask [1, 0, 0, 1], gamma 1, lam 0.95: A_0 is 0.95 * A_3 (the
    masked steps are skipped), not 0.95^3 * A_3; with values 0.5, 0.475 and not 0.4287."""
    rewards, mask = torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    wrong = {}
    exec(WRONG_GAE["decays the advantage across masked steps"][0], wrong)
    for v, right, decayed in ((0.0, 0.95, 0.857375), (0.5, 0.475, 0.4286875)):
        values = torch.full((1, 4), v)
        assert check._ref("gae")(rewards, values, mask, 1.0, 0.95)[0][0, 0].item() == (
            pytest.approx(right)
        )
        assert wrong["gae"](rewards, values, mask, 1.0, 0.95)[0][0, 0].item() == (
            pytest.approx(decayed)
        )


# Beyond the audit's list: what the solution's process refuses, however the file asks.
ESCAPES = {
    "nanoRM's root on the path": (
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n_G = __import__('critic').gae",
        "the module critic",
    ),
    "a process started": (
        f"import subprocess\nsubprocess.run(['cat', {str(ROOT / 'critic.py')!r}])",
        "subprocess.Popen",
    ),
    "a file written": ("open('/tmp/nanorm-leak.txt', 'w').write('x')", "writing"),
    "a relative path": (f"import os\nos.chdir({str(ROOT)!r})\nopen('critic.py')", "relative"),
    "the guard replaced": (
        "import gc, types\n"
        "h = [f for f in gc.get_objects() if isinstance(f, types.FunctionType)"
        " and f.__name__ == '_nanorm_checker_guard'][0]\n"
        "h.__code__ = (lambda *a, **k: None).__code__",
        "the checker's guard",
    ),
    "ctypes": ("import ctypes\nctypes.CDLL(None)", "ctypes.dlopen"),
    "a solution by its path": (
        f"open({str(EX / 'solutions' / 'ex4_gae.py')!r}).read()",
        "nanoRM's notebooks/exercises/solutions/ex4_gae.py",
    ),
}


@pytest.mark.parametrize("escape", ESCAPES)
def test_the_solution_process_keeps_nanorm_out_of_reach(tmp_path, escape):
    code, hint = ESCAPES[escape]
    source = f"import torch\n\n{code}\n\n\ndef gae(rewards, values, mask, gamma=1.0, lam=0.95):\n"
    source += "    return torch.zeros_like(rewards), torch.zeros_like(rewards)\n"
    fails(write(tmp_path, "ex4_gae", source), "ex4_gae", hint)


def test_a_correct_solution_elsewhere_passes_and_may_print(tmp_path):
    source = (EX / "solutions" / "ex4_gae.py").read_text()
    source = source.replace(
        "    mask = mask.bool()\n", "    print('debugging', mask)\n    mask = mask.bool()\n"
    )
    passed, message = check.check(write(tmp_path, "ex4_gae", source), "ex4_gae")
    assert passed, message


def test_a_loop_that_never_ends_fails_in_time(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "TIME_LIMIT", 3)
    source = "def last_real_index(attention_mask):\n    while True:\n        pass\n"
    fails(write(tmp_path, "ex1_pooling", source), "ex1_pooling", "did not finish")


def test_a_file_that_ends_the_process_fails(tmp_path):
    fails(write(tmp_path, "ex1_pooling", "import os\n\nos._exit(3)\n"), "ex1_pooling", "status 3")


# The cases: drawn afresh each run, and covering what is taught, not only the special values.
def test_the_cases_are_drawn_afresh_each_run():
    one, two = (list(check._gae_cases(*check._draw())) for _ in range(2))
    # the first is the docstring's example; the random ones differ, in values or in shape
    assert not all(torch.equal(a.args[0], b.args[0]) for a, b in zip(one[1:], two[1:], strict=True))
    texts = lambda: [c.args[0] for c in check._boxed_cases(check._draw()[0])]
    assert texts() != texts()


def test_the_cases_cover_gae_as_taught():
    rl = check._rl_defaults()
    cases = list(check._gae_cases(*check._draw()))
    shapes = [tuple(c.args[0].shape) for c in cases]
    gl = [(c.kwargs["gamma"], c.kwargs["lam"], c.tags) for c in cases]
    assert (rl.gamma, rl.lam) == (1.0, 0.95)
    assert any(g == rl.gamma and l == rl.lam and "holes" in t for g, l, t in gl)
    assert sum(g < 1 and 0 < l < 1 and "holes" in t for g, l, t in gl) >= 3
    assert any(l == 0 and "holes" in t for g, l, t in gl)
    assert any(B == 1 for B, _ in shapes) and any(R == 1 for _, R in shapes)
    assert any(R >= 100 for _, R in shapes)
    assert {"left", "right"} <= {w.split(" padding")[0] for w in (c.what for c in cases)}


def test_the_cases_cover_the_other_exercises_as_taught():
    rl = check._rl_defaults()
    rng, g = check._draw()
    masks = [c.args[0] for c in check._pooling_cases(rng)]
    assert any(m.shape[0] == 1 for m in masks) and any(m.shape[1] == 1 for m in masks)
    assert any(m.shape[1] >= 200 for m in masks) and any(m.dtype == torch.bool for m in masks)
    assert any(not m[:, 0].all() for m in masks) and any(not m[:, -1].all() for m in masks)
    kl = list(check._kl_cases(rng, g))
    assert any(c.args[4] == rl.kl_coef for c in kl)
    assert {c.args[0].shape[0] for c in kl} >= {1} and any(c.args[0].shape[1] == 1 for c in kl)
    assert any(c.args[0].shape[1] >= 100 for c in kl)
    values = list(check._value_cases(rng, g))
    assert any(c.kwargs["clip_eps"] == rl.clip_eps for c in values)
    assert any(c.args[0].shape == (1, 1) for c in values)
    assert any(c.args[0].shape[1] >= 100 for c in values)
    assert any(c.args[0].shape[1] >= 100 for c in check._rope_cases(rng, g))
    assert any(c.args[2].shape[0] == 1 for c in check._lm_cases(rng, g))


def test_a_reference_that_moves_is_one_line_in_references(tmp_path, monkeypatch):
    """kl_penalty_rewards given another home: the expected values and
    the copy check both follow REFERENCES."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "newhome.py").write_text(
        "import torch\n\n\n" + inspect.getsource(check._ref("kl_penalty_rewards"))
    )
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.setitem(check.REFERENCES, "kl_penalty_rewards", "newhome")
    assert check._ref("kl_penalty_rewards").__module__ == "newhome"
    passed, message = check.check(EX / "solutions" / "ex10_kl_penalty.py", "ex10")
    assert passed, message
    passed, message = check.check(write(tmp_path, "ex10_kl_penalty", _renamed_kl()), "ex10")
    assert not passed and message.startswith("copied from") and "newhome.py" in message


@pytest.mark.slow
def test_command_line_fails_every_attack(tmp_path):
    files = [write(tmp_path, name, source) for name, source, _ in ATTACKS.values()]
    files += [write(tmp_path, "ex4_gae", source) for source, _ in WRONG_GAE.values()]
    run = python([EX / "check.py", *files])
    heads = [line for line in run.stdout.splitlines() if line.startswith(str(tmp_path))]
    assert len(heads) == len(files) and all(" FAIL  " in h for h in heads), run.stdout
    assert "PASS" not in run.stdout and f"0/{len(files)} passed" in run.stdout, run.stdout
    assert run.returncode == 1
