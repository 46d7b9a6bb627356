"""notebooks/exercises/: every solution passes its checker, every blank template fails it, and the checker
gives the advertised hint for the classic mistakes."""

import contextlib
import inspect
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from launcher import python

sys.path.insert(0, str(ROOT / "notebooks" / "exercises"))
import check  # notebooks/exercises/check.py

NAMES = list(check.EXERCISES)


def test_every_exercise_has_a_template_and_a_solution():
    for name in NAMES:
        assert (ROOT / "notebooks" / "exercises" / f"{name}.py").is_file(), name
        assert (ROOT / "notebooks" / "exercises" / "solutions" / f"{name}.py").is_file(), name
    assert len(NAMES) >= 10


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name, monkeypatch):
    """With the tensors a solution makes without device= landing elsewhere than its inputs
    ("meta" here, as the CPU is elsewhere when the inputs are on a GPU): a solution that passes
    here makes every tensor on its inputs' device."""
    monkeypatch.setattr(check, "DEVICE", torch.device("cpu"))
    monkeypatch.setattr(check, "MADE_ON", "meta")
    passed, message = check.check(
        ROOT / "notebooks" / "exercises" / "solutions" / f"{name}.py", name
    )
    assert passed, message


@pytest.mark.parametrize("name", NAMES)
def test_blank_template_fails(name):
    path = ROOT / "notebooks" / "exercises" / f"{name}.py"
    assert "TODO" in path.read_text()
    passed, message = check.check(path, name)
    assert not passed and message.startswith("not implemented yet"), message


EX = ROOT / "notebooks" / "exercises"
HEADER = "import contextlib\nimport re\n\nimport torch\nimport torch.nn.functional as F\n\n\n"


def solution_file(folder, name, *parts):
    """A solution file for exercise `name` in its own folder under `folder`: each part is source
    text or a function of this module (its source is copied), and the first function given is
    bound to the exercise's function name. The checker runs files, in a process of their own."""
    name = check.resolve(name)
    folder = folder / f"{name}-{len(list(folder.glob(name + '-*')))}"
    folder.mkdir()
    text, first = HEADER, None
    for part in parts:
        if callable(part):
            first = first or part.__name__
            part = inspect.getsource(part)
        text += part + "\n\n"
    if first and first != check.EXERCISES[name][0]:
        text += f"{check.EXERCISES[name][0]} = {first}\n"
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


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
        return solution_reward(response, gt_answer)  # noqa: F821 (the solution's, in the file)
    return float(
        number(response[i + 7 : response.index("}", i)])  # noqa: F821
        == float(gt_answer.replace(",", ""))
    )


def as_strings(response, gt_answer):
    """Strings compared after trimming: '1,000' is not '1000'."""
    answer = extract(response)  # noqa: F821 (the solution's, in the file)
    answer = None if answer is None else answer.strip(" :.$").removesuffix(".00")
    return float(answer == gt_answer)


def score_at_last_column(logp, ref, mask, score, kl_coef):
    rewards = -kl_coef * (logp - ref) * mask
    return torch.cat([rewards[:, :-1], rewards[:, -1:] + score[:, None]], 1)


def unmasked_penalty(logp, ref, mask, score, kl_coef):
    last = mask.long().cumsum(1).argmax(1, keepdim=True)
    return (-kl_coef * (logp - ref)).scatter_add(1, last, score[:, None])


# ex11: DPO's loss with one thing wrong each
def dpo_without_reference(c, r, ref_c, ref_r, beta):
    return -F.logsigmoid(beta * (c - r)).mean()


def dpo_swapped(c, r, ref_c, ref_r, beta):
    return -F.logsigmoid(beta * ((r - ref_r) - (c - ref_c))).mean()


def dpo_without_beta(c, r, ref_c, ref_r, beta):
    return -F.logsigmoid((c - ref_c) - (r - ref_r)).mean()


def dpo_log_of_sigmoid(c, r, ref_c, ref_r, beta):
    return -torch.log(torch.sigmoid(beta * ((c - ref_c) - (r - ref_r)))).mean()


# ex12: a PRM's best-of-N with one thing wrong each
def prm_counts_padding(p, steps, how):
    return (p.min(-1).values if how == "min" else p.prod(-1)).argmax(-1)


def prm_keeps_the_worst(p, steps, how):
    p = torch.where(steps.bool(), p, torch.ones_like(p))
    return (p.min(-1).values if how == "min" else p.prod(-1)).argmin(-1)


def prm_last_step(p, steps, how):
    last = steps.long().cumsum(-1).argmax(-1, keepdim=True)
    return p.gather(-1, last).squeeze(-1).argmax(-1)


def prm_keeps_the_last_of_equals(p, steps, how):
    p = torch.where(steps.bool(), p, torch.ones_like(p))
    r = (p.min(-1).values if how == "min" else p.prod(-1)).flip(-1)
    return r.size(-1) - 1 - r.argmax(-1)


# ex13: an ensemble's conservative reward with one thing wrong each
def ensemble_unbiased_std(r, rule, lam):
    if rule == "mean":
        return r.mean(0)
    if rule == "min":
        return r.min(0).values
    return r.mean(0) - lam * r.std(0)


def ensemble_plus_std(r, rule, lam):
    if rule == "mean":
        return r.mean(0)
    if rule == "min":
        return r.min(0).values
    return r.mean(0) + lam * r.std(0, unbiased=False)


def ensemble_over_responses(r, rule, lam):
    if rule == "mean":
        return r.mean(0)
    if rule == "min":
        return r.min(1).values
    return r.mean(0) - lam * r.std(0, unbiased=False)


def ensemble_detached(r, rule, lam):
    if rule == "mean":
        return r.mean(0).detach()
    if rule == "min":
        return r.min(0).values.detach()
    return (r.mean(0) - lam * r.std(0, unbiased=False)).detach()


# the ex9 mistakes below are built on the solution's helpers (extract, number), copied into
# each mistake's file
SOLUTION_9 = (EX / "solutions" / "ex9_gsm8k_reward.py").read_text() + (
    "\n\nsolution_reward = gsm8k_reward  # before the mistake takes the name\n"
)


def rotate_half(x, cos, sin):
    """Hugging Face's layout: pairs (i, i + D/2)."""
    D = x.size(-1)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


LM = (_pooled, _lm_term)  # the helpers the ex7 mistakes call


@pytest.mark.parametrize(
    "name, parts, hint",
    [
        ("ex1", ["def last_real_index(m):\n    return m.long().sum(-1) - 1"], "with left padding"),
        (
            "ex1",
            ["def last_real_index(m):\n    return torch.full((len(m),), m.size(1) - 1)"],
            "last column",
        ),
        (
            "ex2",
            [
                "def logsig_loss(c, r, m=None):\n"
                "    return -torch.log(torch.sigmoid(c - r - (0 if m is None else m))).mean()"
            ],
            "logsigmoid",
        ),
        (
            "ex2",
            ["def logsig_loss(c, r, m=None):\n    return -F.logsigmoid(r - c).mean()"],
            "swapped",
        ),
        ("ex3", [rotate_half], "rotate_half"),
        (
            "ex4",
            ["def gae(r, v, m, gamma=1.0, lam=0.95):\n    return 0 * v, v"],
            "advantages are wrong",
        ),
        ("ex5", ["def extract_boxed(t):\n    return None"], "expected"),
        (
            "ex6",
            ["def value_loss(v, o, r, m, clip_eps=0.2):\n    return ((v - r) ** 2).mean()"],
            "values",
        ),
        ("ex6", [], "no function named 'value_loss'"),
        (
            "ex7",
            [(EX / "ex7_lm_loss.py").read_text(), "lm_regularized_loss = as_published"],
            "bug 1, no pooling",
        ),
        ("ex7", [label_zero, *LM], "bug 2, the label"),
        ("ex7", [no_shift, *LM], "bug 3, no shift"),
        ("ex8", [unscaled], "did not scale the losses"),
        ("ex8", [syncs_every_step], "every micro-step all-reduces"),
        ("ex8", [never_syncs], "the last micro-step must sync"),
        ("ex9", [last_number], "a \\boxed{} answer comes first"),
        ("ex9", [first_box, SOLUTION_9], "take the LAST box"),
        ("ex9", [as_strings, SOLUTION_9], "commas separate thousands"),
        ("ex10", [score_at_last_column], "not the last column"),
        ("ex10", [unmasked_penalty], "mask the penalty"),
        ("ex11", [dpo_without_reference], "left out the reference"),
        ("ex11", [dpo_swapped], "swapped"),
        ("ex11", [dpo_without_beta], "left out beta"),
        ("ex11", [dpo_log_of_sigmoid], "logsigmoid"),
        ("ex12", [prm_counts_padding], "past a solution's end"),
        ("ex12", [prm_keeps_the_worst], "WORST"),
        ("ex12", [prm_last_step], "last step alone"),
        ("ex12", [prm_keeps_the_last_of_equals], "keep the FIRST"),
        ("ex13", [ensemble_unbiased_std], "divide by K"),
        ("ex13", [ensemble_plus_std], "a sign"),
        ("ex13", [ensemble_over_responses], "over the members"),
        ("ex13", [ensemble_detached], "no gradient flows"),
    ],
)
def test_checker_hints_at_the_mistake(tmp_path, name, parts, hint):
    passed, message = check.check(solution_file(tmp_path, name, *parts), name)
    assert not passed and hint in message, message


@pytest.mark.slow
def test_command_line():
    run = lambda *a: python([ROOT / "notebooks" / "exercises" / "check.py", *a])
    ok = run("--solutions")
    assert ok.returncode == 0 and f"{len(NAMES)}/{len(NAMES)} passed" in ok.stdout, ok.stdout
    blank = run("ex1", "ex5_boxed")
    assert blank.returncode == 1 and blank.stdout.count("not implemented yet") == 2, blank.stdout


def test_a_solution_that_calls_the_project_fails_with_a_hint(tmp_path):
    borrowed = solution_file(tmp_path, "ex1", "from reward import last_real_index")  # itself
    passed, message = check.check(borrowed, "ex1")
    assert not passed and "nanoRM's own code" in message, message
    inside = solution_file(  # imported inside the function: found in the source
        tmp_path,
        "ex1",
        "def last_real_index(mask):\n    import reward\n\n    return reward.last_real_index(mask)",
    )
    passed, message = check.check(inside, "ex1")
    assert not passed and "imports from nanoRM" in message, message


def fails_on_one_token(mask):  # right on every other case
    if mask.size(1) == 1:
        raise IndexError("row 0 is out of range")
    return torch.stack([row.nonzero().max() for row in mask.long()])


def test_an_exception_names_its_input(tmp_path):
    passed, message = check.check(solution_file(tmp_path, "ex1", fails_on_one_token), "ex1")
    assert not passed and "raised IndexError: row 0 is out of range" in message, message
    assert "on the input: [[1]" in message and "device" in message, message


def test_a_result_on_another_device_fails(tmp_path, monkeypatch):
    """The inputs sit on check.DEVICE; a result made elsewhere fails with a hint. Here the
    inputs go to the 'meta' device and a result built on the CPU is caught before any value
    is compared (on a GPU machine, check.py --device cuda runs the whole checker there)."""
    monkeypatch.setattr(check, "DEVICE", torch.device("meta"))
    on_cpu = "def last_real_index(m):\n    return torch.zeros(len(m), dtype=torch.long)"
    passed, message = check.check(solution_file(tmp_path, "ex1", on_cpu), "ex1")
    assert not passed and "your result is on cpu but the inputs were on meta" in message, message


def test_a_tensor_made_off_the_inputs_device_fails(monkeypatch, tmp_path):
    """Exercise 4's solution with its carries made by torch.zeros(B), on the default device:
    it passed on a CPU and failed on an H200; with MADE_ON it fails on a CPU too."""
    monkeypatch.setattr(check, "DEVICE", torch.device("cpu"))
    source = (ROOT / "notebooks" / "exercises" / "solutions" / "ex4_gae.py").read_text()
    assert source.count("values.new_zeros(B)") == 2
    (tmp_path / "ex4_gae.py").write_text(
        source.replace("values.new_zeros(B)", "torch.zeros(B, dtype=values.dtype)")
    )
    assert check.check(tmp_path / "ex4_gae.py", "ex4_gae")[0]  # the CPU alone does not see it
    monkeypatch.setattr(check, "MADE_ON", "meta")
    passed, message = check.check(tmp_path / "ex4_gae.py", "ex4_gae")
    assert not passed and "is not on the expected device cpu" in message, message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_solutions_pass_on_a_gpu(monkeypatch):
    monkeypatch.setattr(check, "DEVICE", torch.device("cuda"))
    for name in NAMES:
        path = ROOT / "notebooks" / "exercises" / "solutions" / f"{name}.py"
        passed, message = check.check(path, name)
        assert passed, f"{name}: {message}"


# Every route to the answer fails: nanoRM's modules are not on the path where the solution runs
# (nor loaded there), and an import of one in the file's source is named before it runs.
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
    return solution_file(tmp_path, name, f"{before}def {signature}:\n    {body}\n")


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
    # a reference saved at import time, under another name, by path: the file is out of reach
    solution = EX / "solutions" / f"{name}.py"
    saved = (
        "import importlib.util as u\n\n"
        f"s = u.spec_from_file_location('elsewhere', {str(solution)!r})\n"
        "m = u.module_from_spec(s)\ns.loader.exec_module(m)\n"
        f"_F = m.{fn}\n\n\n"
    )
    borrowed = _file(tmp_path, name, f"return _F({args}", before=saved)
    passed, message = check.check(borrowed, name)
    assert not passed and "out of reach" in message and f"solutions/{name}.py" in message, message


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
    answer = extract(response)  # noqa: F821 (the solution's, in the file)
    if answer is None:
        numbers = re.findall(r"-?\d+", response)
        answer = numbers[-1] if numbers else None
    return float(
        answer is not None and number(answer) == float(gt_answer.replace(",", ""))  # noqa: F821
    )


def anywhere(response, gt_answer):
    """The reference anywhere among the numbers: pays 'I tried 17, 18 and 19.'"""
    answer = extract(response)  # noqa: F821 (the solution's, in the file)
    if answer is not None:
        return solution_reward(response, gt_answer)  # noqa: F821
    return float(gt_answer.replace(",", "") in re.findall(r"-?\d+", response))


@pytest.mark.parametrize(
    "name, parts, hint",
    [
        ("ex8", [sums_then_backward], "graphs were alive together"),
        ("ex8", [retains_graphs], "graphs were alive together"),
        ("ex9", [counts_up, SOLUTION_9], "lists every number up to it"),
        ("ex9", [anywhere, SOLUTION_9], "lists every number up to it"),
    ],
)
def test_checker_catches_the_hidden_costs_and_hacks(tmp_path, name, parts, hint):
    passed, message = check.check(solution_file(tmp_path, name, *parts), name)
    assert not passed and hint in message, message
