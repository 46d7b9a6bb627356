"""notebooks/exercises/: every solution passes its checker, every blank template fails it, and the checker
gives the advertised hint for the classic mistakes."""

import contextlib
import re
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
    assert len(NAMES) >= 10


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


EX = ROOT / "notebooks" / "exercises"


def mistake(**functions):
    return types.SimpleNamespace(**functions)


# ex7: LLMBook's bugs one at a time (the other two fixed)
def _pooled(head, h, mask):
    last = (torch.arange(mask.size(1)) * mask.bool()).max(-1).values
    return head(h[torch.arange(h.size(0)), last]).squeeze(-1)


def label_zero(rh, lh, hc, hr, mc, mr, ids, response, lm_coef):
    """BCE with label 0: -log sigmoid(r_r - r_c)."""
    r_c, r_r = _pooled(rh, hc, mc), _pooled(rh, hr, mr)
    rm = F.binary_cross_entropy_with_logits(r_c - r_r, torch.zeros_like(r_c))
    return rm + lm_coef * _lm_term(lh, hc, ids, response, shift=1)


def no_shift(rh, lh, hc, hr, mc, mr, ids, response, lm_coef):
    """Position t scored on its own token."""
    rm = -F.logsigmoid(_pooled(rh, hc, mc) - _pooled(rh, hr, mr)).mean()
    return rm + lm_coef * _lm_term(lh, hc, ids, response, shift=0)


def _lm_term(lh, hc, ids, response, shift):
    T = ids.size(1)
    ce = F.cross_entropy(lh(hc[:, : T - shift]).transpose(1, 2), ids[:, shift:], reduction="none")
    w = response[:, shift:].float()
    return ((ce * w).sum(-1) / w.sum(-1).clamp(min=1)).mean()


# ex8: the two halves of the answer, each missing once
def unscaled(model, micro_batches, loss_fn):
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            loss_fn(model, batch).backward()


def syncs_every_step(model, micro_batches, loss_fn):
    for batch in micro_batches:
        (loss_fn(model, batch) / len(micro_batches)).backward()


def never_syncs(model, micro_batches, loss_fn):
    with model.no_sync():
        for batch in micro_batches:
            (loss_fn(model, batch) / len(micro_batches)).backward()


# ex9: three extraction or matching policies that look right
def last_number(response, gt_answer):
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", response)
    return float(
        bool(numbers) and float(numbers[-1].replace(",", "").rstrip(".")) == float(gt_answer)
    )


def first_box(response, gt_answer):
    i = response.find("\\boxed{")
    if i < 0:
        return SOLUTION_9.gsm8k_reward(response, gt_answer)
    return float(
        SOLUTION_9.number(response[i + 7 : response.index("}", i)])
        == float(gt_answer.replace(",", ""))
    )


def as_strings(response, gt_answer):
    """Strings compared after trimming: '1,000' is not '1000'."""
    answer = SOLUTION_9.extract(response)
    answer = None if answer is None else answer.strip(" :.$").removesuffix(".00")
    return float(answer == gt_answer)


# the solution's helpers, compiled under another file name: the mistakes below are built on
# them, and the checker forbids running the solutions' own files
def score_at_last_column(logp, ref, mask, score, kl_coef):
    rewards = -kl_coef * (logp - ref) * mask
    return torch.cat([rewards[:, :-1], rewards[:, -1:] + score[:, None]], 1)


def unmasked_penalty(logp, ref, mask, score, kl_coef):
    last = mask.long().cumsum(1).argmax(1, keepdim=True)
    return (-kl_coef * (logp - ref)).scatter_add(1, last, score[:, None])


SOLUTION_9 = types.SimpleNamespace()
_source = (EX / "solutions" / "ex9_gsm8k_reward.py").read_text()
exec(compile(_source, "<the ex9 solution, copied into a mistake>", "exec"), vars(SOLUTION_9))


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
        (
            "ex7",
            mistake(lm_regularized_loss=check.load(EX / "ex7_lm_loss.py").as_published),
            "bug 1, no pooling",
        ),
        ("ex7", mistake(lm_regularized_loss=label_zero), "bug 2, the label"),
        ("ex7", mistake(lm_regularized_loss=no_shift), "bug 3, no shift"),
        ("ex8", mistake(accumulate=unscaled), "did not scale the losses"),
        ("ex8", mistake(accumulate=syncs_every_step), "every micro-step all-reduces"),
        ("ex8", mistake(accumulate=never_syncs), "the last micro-step must sync"),
        ("ex9", mistake(gsm8k_reward=last_number), "a \\boxed{} answer comes first"),
        ("ex9", mistake(gsm8k_reward=first_box), "take the LAST box"),
        ("ex9", mistake(gsm8k_reward=as_strings), "commas separate thousands"),
        ("ex10", mistake(kl_penalty_rewards=score_at_last_column), "not the last column"),
        ("ex10", mistake(kl_penalty_rewards=unmasked_penalty), "mask the penalty"),
    ],
)
def test_checker_hints_at_the_mistake(name, module, hint):
    passed, message = check.check(module, name)
    assert not passed and hint in message, message


@pytest.mark.slow
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


# Every route to the answer fails: the checker watches which functions the student's call runs.
ROUTES = {  # how the file reaches reward.py
    "__import__": 'reward = __import__("reward")',
    "sys.modules": 'import sys\n    reward = sys.modules["reward"]',
    "importlib": 'import importlib\n    reward = importlib.import_module("reward")',
    "import os, reward": "import os, reward",
}
USES = {  # what it then returns, right on every input
    "ex1_pooling": ("last_real_index(mask)", "return reward.last_real_index(mask)"),
    "ex7_lm_loss": (
        "lm_regularized_loss(rh, lh, hc, hr, mc, mr, ids, response, lm_coef)",
        "import types\n"
        "    r_c, r_r = reward.score_last_token(rh, hc, mc), reward.score_last_token(rh, hr, mr)\n"
        "    owner = types.SimpleNamespace(backbone=types.SimpleNamespace(output=lh))\n"
        "    lm = reward.LMRegularizedRewardModel.response_lm_loss(owner, hc, ids, response)\n"
        '    return reward.pairwise_loss("logsig", r_c, r_r) + lm_coef * lm',
    ),
}


def _file(tmp_path, name, body, before=""):
    signature = USES[name][0]
    path = tmp_path / f"{name}.py"
    path.write_text(f"{before}def {signature}:\n    {body}\n")
    return check.load(path)


@pytest.mark.parametrize("name", USES)
@pytest.mark.parametrize("route", ROUTES)
def test_every_route_to_the_project_fails(tmp_path, name, route):
    module = _file(tmp_path, name, f"{ROUTES[route]}\n    {USES[name][1]}")
    passed, message = check.check(module, name)
    assert not passed and "nanoRM" in message, message


@pytest.mark.parametrize("name", USES)
def test_a_solution_is_no_route_either(tmp_path, name):
    fn, args = USES[name][0].split("(")
    imported = _file(tmp_path, name, f"from solutions.{name} import {fn} as f\n    return f({args}")
    passed, message = check.check(imported, name)
    assert not passed and "solution" in message, message
    # a reference saved at import time, under another name, by path: the watch still sees it
    solution = EX / "solutions" / f"{name}.py"
    saved = (
        "import importlib.util as u\n\n"
        f"s = u.spec_from_file_location('elsewhere', {str(solution)!r})\n"
        "m = u.module_from_spec(s)\ns.loader.exec_module(m)\n"
        f"_F = m.{fn}\n\n\n"
    )
    borrowed = _file(tmp_path, name, f"return _F({args}", before=saved)
    passed, message = check.check(borrowed, name)
    assert not passed and "runs" in message, message


def sums_then_backward(model, micro_batches, loss_fn):
    """The right gradients and the right syncs, but all k graphs alive at once."""
    k = len(micro_batches)
    losses = []
    for i, batch in enumerate(micro_batches):
        with model.no_sync() if i < k - 1 else contextlib.nullcontext():
            losses.append(loss_fn(model, batch) / k)
    sum(losses).backward()


def retains_graphs(model, micro_batches, loss_fn):
    """backward per micro-batch, but retain_graph keeps every graph's activations."""
    k, kept = len(micro_batches), []
    for i, batch in enumerate(micro_batches):
        with model.no_sync() if i < k - 1 else contextlib.nullcontext():
            kept.append(loss_fn(model, batch) / k)
            kept[-1].backward(retain_graph=True)


def counts_up(response, gt_answer):
    """The marks first, then the last number of the text: pays '1 2 3 ... 18' for 18."""
    answer = SOLUTION_9.extract(response)
    if answer is None:
        numbers = re.findall(r"-?\d+", response)
        answer = numbers[-1] if numbers else None
    return float(
        answer is not None and SOLUTION_9.number(answer) == float(gt_answer.replace(",", ""))
    )


def anywhere(response, gt_answer):
    """The reference anywhere among the numbers: pays 'I tried 17, 18 and 19.'"""
    answer = SOLUTION_9.extract(response)
    if answer is not None:
        return SOLUTION_9.gsm8k_reward(response, gt_answer)
    return float(gt_answer.replace(",", "") in re.findall(r"-?\d+", response))


@pytest.mark.parametrize(
    "name, module, hint",
    [
        ("ex8", mistake(accumulate=sums_then_backward), "graphs were alive together"),
        ("ex8", mistake(accumulate=retains_graphs), "graphs were alive together"),
        ("ex9", mistake(gsm8k_reward=counts_up), "lists every number up to it"),
        ("ex9", mistake(gsm8k_reward=anywhere), "lists every number up to it"),
    ],
)
def test_checker_catches_the_hidden_costs_and_hacks(name, module, hint):
    passed, message = check.check(module, name)
    assert not passed and hint in message, message
