"""
Checks the classroom exercises against nanoRM's own functions on randomized inputs.

    python notebooks/exercises/check.py               # every exercise in exercises/ex*.py (the student's)
    python notebooks/exercises/check.py ex2 ex4       # only these
    python notebooks/exercises/check.py --solutions   # the teacher's exercises/solutions/ex*.py
    python notebooks/exercises/check.py --device cuda # the inputs on a GPU (default: cuda if any)

For each exercise it prints PASS, or FAIL with a hint about the most likely mistake and the
input that showed it. The exit status is 0 when every checked exercise passes.

From Python (this is what tests/test_exercises.py does):

    import check
    passed, message = check.check(check.load("exercises/ex1_pooling.py"), "ex1_pooling")

Every exercise is compared with the function nanoRM itself uses, never with a second copy of
the answer: reward.last_real_index, reward.pairwise_loss, model.apply_rope, critic.gae,
verifiable.extract_boxed, critic.value_loss, reward.py's LM-regularized loss (its pieces) and
verifiable.gsm8k_reward, critic.kl_penalty_rewards; gradient accumulation (ex8) is compared with one big batch's
gradients, and its no_sync with a stand-in for DDP (FakeDDP) that records each call. So a solution may not reach
those files, nanorm or the solutions/ folder by any route: while the student's function runs,
the checker watches every Python function it calls (sys.setprofile), and one defined in
nanoRM's files or in another solution fails with a hint, however it was reached (import,
__import__, sys.modules, importlib, a reference saved at import). ex8 also watches the tensors
each micro-batch's graph saved: they must be freed (by its backward) before the next forward.
ex9 includes the reward hacks (a last-number fallback, the reference anywhere in the text).
The inputs are put on the device being checked (a GPU when there is one): a
solution that makes a new tensor on the CPU beside them fails there, as it would in training.
"""

import argparse
import contextlib
import copy
import importlib.util
import inspect
import os
import random
import re
import sys
import textwrap
import types
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)  # nanoRM's files live in the project root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import critic  # noqa: E402
import model  # noqa: E402
import reward  # noqa: E402
import verifiable  # noqa: E402

SEEDS = range(6)  # every randomized check runs on several seeds
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the inputs go
PROJECT = ("reward", "critic", "model", "verifiable", "nanorm", "train_rm", "eval_rm", "data")
SOLUTIONS = os.path.join(HERE, "solutions")


class Fail(Exception):
    """A check failed; the message is what the student reads."""


# ----------------------------------------------------------------------------- helpers
def _show(t):
    """A tensor as a short readable string."""
    if not torch.is_tensor(t):
        return repr(t)
    if t.dtype.is_floating_point:
        return (
            str([[round(v, 4) for v in row] for row in t.tolist()])
            if t.dim() == 2
            else (str([round(v, 4) for v in t.flatten().tolist()]))
        )
    return str(t.tolist())


class Raised(Exception):
    """The student's function raised on an input; the message names the input."""


def _on_device(x):
    if isinstance(x, torch.nn.Module):  # a head: the student's copy, on the checked device
        return copy.deepcopy(x).to(DEVICE)
    return x.clone().to(DEVICE) if torch.is_tensor(x) else x


def _back(out):
    """The student's result, moved to the CPU for comparison, after checking its device."""
    if isinstance(out, (tuple, list)):
        return type(out)(_back(o) for o in out)
    if torch.is_tensor(out):
        if out.device != DEVICE:
            raise Fail(
                f"your result is on {out.device} but the inputs were on {DEVICE}: make new "
                "tensors on the inputs' device (torch.arange(T, device=x.device), "
                "torch.zeros_like(x)), or training on a GPU would fail"
            )
        return out.to("cpu")
    return out


def _call(fn, *args, **kwargs):
    """Call the student's function on copies of the inputs (on DEVICE), check it left them
    alone, and name the input in the message when it raises."""
    copies = [_on_device(a) for a in args]
    kw = {k: _on_device(v) for k, v in kwargs.items()}
    try:
        out = _watched(fn, *copies, **kw)
    except (NotImplementedError, Fail):
        raise
    except Exception as e:
        shown = ", ".join([_show(a) for a in args] + [f"{k}={_show(v)}" for k, v in kwargs.items()])
        raise Raised(
            f"your function raised {type(e).__name__}: {e}\n  on the input: {shown}"
            f"\n  (device {DEVICE})"
        ) from e
    out = _back(out)
    for a, c in zip(args, copies, strict=True):
        if torch.is_tensor(a) and not torch.equal(a, c.detach().cpu()):
            raise Fail(
                "your function changed its input tensor in place; work on new tensors instead "
                "(e.g. x = x - y, not x -= y), the caller still needs its inputs"
            )
    return out


# The file being checked: its own functions may run, nanoRM's and the solutions' may not.
OWN = {"file": None}
_FORBIDDEN = {}  # filename -> whether running its code is reaching for the answer


def _forbidden(filename):
    if filename not in _FORBIDDEN:
        path = os.path.abspath(filename)
        top = os.path.relpath(path, ROOT).split(os.sep)[0].removesuffix(".py")
        in_solutions = path.startswith(SOLUTIONS + os.sep)
        _FORBIDDEN[filename] = top in PROJECT or in_solutions
    return _FORBIDDEN[filename] and os.path.abspath(filename) != OWN["file"]


def _watched(fn, *args, **kwargs):
    """fn(*args, **kwargs), watching every Python function it runs: one defined in nanoRM's
    files or in solutions/ (other than the checked file) means the answer was reached for, by
    whatever route (an import, __import__, sys.modules, importlib, a saved reference)."""
    reached = []

    def watch(frame, event, arg):
        if event == "call" and _forbidden(frame.f_code.co_filename):
            code = frame.f_code
            reached.append(f"{code.co_name} in {os.path.relpath(code.co_filename, ROOT)}")

    old = sys.getprofile()
    sys.setprofile(watch)
    try:
        out = fn(*args, **kwargs)
    finally:
        unwatched = sys.getprofile() is not watch
        sys.setprofile(old)
        if reached or unwatched:
            raise Fail(
                (
                    f"your function runs {reached[0]}: "
                    if reached
                    else "your function stops the checker watching what it calls: "
                )
                + "write it yourself, with torch and Python only. The checker compares with "
                "nanoRM's version, so calling it (or a solution) would pass without teaching "
                "anything."
            )
    return out


def _tensor(out, what, shape=None):
    if not torch.is_tensor(out):
        raise Fail(f"{what} must be a torch.Tensor, got {type(out).__name__}")
    if shape is not None and tuple(out.shape) != tuple(shape):
        raise Fail(f"{what} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    return out


def _close(a, b, atol=1e-5, rtol=1e-5):
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol)


def _grads(loss, *inputs):
    """Gradients of a scalar loss with respect to inputs, or a Fail when none flows."""
    if not loss.requires_grad:
        raise Fail(
            "no gradient flows through your loss: keep every step in torch (no .item(), "
            "numpy, float() or .detach()), or training could not use it"
        )
    return torch.autograd.grad(loss, inputs, allow_unused=True)


# ----------------------------------------------------------------------------- ex1: pooling
def _padded_mask(rng, B, T, side):
    mask = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        n = rng.randint(1, T)  # at least one real token
        row_side = rng.choice(["left", "right"]) if side == "mixed" else side
        if row_side == "none":
            n = T
        if row_side == "left":
            mask[b, T - n :] = 1
        else:
            mask[b, :n] = 1
    return mask


def check_pooling(mod):
    fn = _function(mod, "last_real_index")
    cases = [("no padding", torch.ones(2, 5, dtype=torch.long))]
    for seed in SEEDS:
        rng = random.Random(seed)
        for side in ("right", "left", "mixed"):
            B, T = rng.randint(1, 6), rng.randint(1, 10)
            cases.append((f"{side} padding", _padded_mask(rng, B, T, side)))
    cases.append(("a bool mask", _padded_mask(random.Random(0), 4, 7, "mixed").bool()))
    cases.append(("a single token", torch.ones(1, 1, dtype=torch.long)))
    for what, mask in cases:
        want = reward.last_real_index(mask)
        got = _tensor(_call(fn, mask), "the result", want.shape)
        if got.dtype.is_floating_point:
            raise Fail(
                f"return integer indices (e.g. torch.long), got {got.dtype}: the index is used "
                "as h[torch.arange(B), index]"
            )
        if torch.equal(got.long(), want):
            continue
        m = mask.long()
        T = m.size(1)
        first = (m * torch.arange(T)).masked_fill(m == 0, T).min(-1).values
        if torch.equal(got.long(), torch.full_like(want, T - 1)):
            hint = (
                "your index is always the last column (T - 1). With right padding the last "
                "column is padding, and the reward would be read from a pad token."
            )
        elif torch.equal(got.long(), m.sum(-1) - 1):
            hint = (
                "you count the real tokens (mask.sum(-1) - 1). That is the last real index only "
                "with right padding: with left padding the real tokens END at the last column. "
                "Look for the largest t where the mask is 1."
            )
        elif torch.equal(got.long(), m.sum(-1)) or torch.equal(got.long(), want + 1):
            hint = "off by one: indices start at 0, so a row with n real tokens ends at n - 1."
        elif torch.equal(got.long(), first):
            hint = "that is each row's FIRST real token; the reward is read at the LAST one."
        else:
            hint = "this is not the last real token of every row."
        raise Fail(
            f"{hint}\n  mask ({what}):\n{mask}\n  expected {want.tolist()}, got {got.tolist()}"
        )
    return len(cases)


# ----------------------------------------------------------------------------- ex2: logsig
def _reference_logsig(r_c, r_r, margin=None):
    return reward.pairwise_loss("logsig", r_c, r_r, margin=margin)


def check_logsig(mod):
    fn = _function(mod, "logsig_loss")
    n = 0
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        B = 1 + seed * 3
        r_c, r_r = (
            (3 * torch.randn(B, generator=g)).requires_grad_(),
            3 * torch.randn(B, generator=g),
        )
        r_r.requires_grad_()
        for margin in (None, torch.rand(B, generator=g) * 2):
            n += 1
            want = _reference_logsig(r_c, r_r, margin)
            got = _tensor(_call(fn, r_c, r_r, margin), "the loss")
            if got.dim() != 0:
                if got.shape == r_c.shape:
                    raise Fail(
                        f"return one number, the MEAN over the pairs (shape ()), not one loss per "
                        f"pair (shape {tuple(got.shape)})"
                    )
                raise Fail(f"return a scalar (shape ()), got shape {tuple(got.shape)}")
            if not torch.isfinite(got):
                raise Fail(f"your loss is {got.item()} on ordinary rewards {_show(r_c)}")
            if not _close(got, want):
                raise Fail(_logsig_hint(got, r_c, r_r, margin))
            g_want = torch.autograd.grad(want, (r_c, r_r))
            g_got = _grads(got, r_c, r_r)
            for a, b in zip(g_got, g_want, strict=True):
                if a is None or not _close(a, b):
                    raise Fail(
                        "your loss has the right value but the wrong gradient; did you detach "
                        "part of it (or use .data)?"
                    )
    # stability: the reference stays finite, log(sigmoid(x)) does not
    r_c = torch.tensor([-200.0, 0.0, 150.0, 900.0], requires_grad=True)
    r_r = torch.tensor([0.0, 300.0, -5.0, -900.0], requires_grad=True)
    want = _reference_logsig(r_c, r_r)
    got = _tensor(_call(fn, r_c, r_r), "the loss")
    if not torch.isfinite(got).all() or not _close(got, want, rtol=1e-4):
        raise Fail(
            f"with large reward gaps (r_chosen = {_show(r_c)}, r_rejected = {_show(r_r)}) the "
            f"loss should be {want.item():.2f}, yours is {got.item()}. sigmoid(-200) rounds to 0 "
            "in float32 and log(0) = -inf: use torch.nn.functional.logsigmoid, which computes "
            "log(sigmoid(x)) in one stable step."
        )
    grads = _grads(got, r_c, r_r)
    if any(gr is None or not torch.isfinite(gr).all() for gr in grads):
        raise Fail(
            "with large reward gaps your loss is finite but its gradient is not (nan or inf): "
            "use torch.nn.functional.logsigmoid rather than log(sigmoid(x)) or log(1 + exp(-x))"
        )
    return n + 1


def _logsig_hint(got, r_c, r_r, margin):
    ref = _reference_logsig
    with torch.no_grad():
        B = r_c.numel()
        known = [
            (
                ref(r_r, r_c, None if margin is None else -margin),
                "chosen and rejected are swapped: the loss must be SMALL when r_chosen > "
                "r_rejected, i.e. -log sigmoid(r_chosen - r_rejected).",
            ),
            (-ref(r_c, r_r, margin), "a sign: the loss is MINUS log sigmoid(...), so it is >= 0."),
            (
                ref(r_c, r_r, margin) * B,
                "you summed over the pairs; take the mean, so the loss (and the learning rate "
                "that suits it) does not depend on the batch size.",
            ),
        ]
        if margin is not None:
            known += [
                (
                    ref(r_c, r_r, -margin),
                    "the margin is SUBTRACTED: -log sigmoid(r_c - r_r - margin) asks for a gap of "
                    "at least `margin` before the loss gets small.",
                ),
                (ref(r_c, r_r), "you ignored the margin argument."),
            ]
        for value, hint in known:
            if _close(got, value):
                return hint
        where = "" if margin is None else f", margin = {_show(margin)}"
        return (
            f"for r_chosen = {_show(r_c)}, r_rejected = {_show(r_r)}{where} the loss should be "
            f"{ref(r_c, r_r, margin).item():.6f}, yours is {got.item():.6f}."
        )


# ----------------------------------------------------------------------------- ex3: RoPE
def _rope_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    B, T, H, D = rng.randint(1, 3), rng.randint(1, 7), rng.randint(1, 4), 2 * rng.randint(1, 8)
    x = torch.randn(B, T, H, D, generator=g)
    # positions as model.py derives them: left-padded rows start at position 0
    mask = _padded_mask(rng, B, T, "mixed")
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + rng.choice([0, 0, 37])
    inv_freq = model.rope_frequencies(model.ModelConfig(dim=H * D, n_heads=H))
    angles = positions[..., None].float() * inv_freq  # (B, T, D/2)
    return x, angles.cos(), angles.sin()


def _rotate_half(x, cos, sin):
    """Hugging Face's layout: pairs (i, i + D/2)."""
    D = x.size(-1)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def check_rope(mod):
    fn = _function(mod, "apply_rope")
    for seed in SEEDS:
        x, cos, sin = _rope_inputs(seed)
        want = model.apply_rope(x, cos, sin)
        got = _tensor(_call(fn, x, cos, sin), "the result", x.shape)
        if got.dtype != x.dtype:
            raise Fail(f"return the dtype of x ({x.dtype}), got {got.dtype}")
        if _close(got, want):
            continue
        shapes = f"x {tuple(x.shape)}, cos and sin {tuple(cos.shape)}"
        if _close(got, _rotate_half(x, cos, sin)):
            hint = (
                "you rotated the pairs (i, i + D/2), Hugging Face's rotate_half layout. model.py "
                "rotates ADJACENT pairs (x[2i], x[2i+1]) like Meta's code and llama2.c (HF "
                "checkpoints permute the rows of wq and wk so that both agree)."
            )
        elif _close(got, model.apply_rope(x, cos, -sin)):
            hint = (
                "you rotate by minus the angle: out[2i] = x[2i] cos - x[2i+1] sin and "
                "out[2i+1] = x[2i] sin + x[2i+1] cos."
            )
        elif _close(got, x):
            hint = "your output is x unchanged."
        elif not _close(
            got.pow(2).unflatten(-1, (-1, 2)).sum(-1),
            x.pow(2).unflatten(-1, (-1, 2)).sum(-1),
            atol=1e-4,
        ):
            hint = (
                "a rotation keeps the length of every pair (x[2i], x[2i+1]); yours changes it: "
                "use the cos and sin of the same angle in both lines, with the signs above."
            )
        else:
            hint = (
                "each pair keeps its length, but the angle is wrong: is pair i using cos[..., i]?"
            )
        diff = (got - want).abs().max().item()
        raise Fail(f"{hint}\n  shapes: {shapes}; largest difference {diff:.3g}")
    return len(SEEDS)


# ----------------------------------------------------------------------------- ex4: GAE
def _gae_cases():
    one = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.5]]), torch.ones(1, 3)
    yield "one episode (the docstring's example), gamma = 1, lam = 1", *one, 1.0, 1.0
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        rng = random.Random(seed)
        B, R = rng.randint(1, 3), rng.randint(2, 6)
        rewards, values = torch.randn(B, R, generator=g), torch.randn(B, R, generator=g)
        gamma, lam = rng.choice([1.0, 0.99, 0.9]), rng.choice([0.95, 0.0, 1.0, 0.8])
        kind = ["no padding", "right padding", "masked steps inside the response"][seed % 3]
        mask = torch.ones(B, R)
        if kind != "no padding":
            mask = _padded_mask(rng, B, R, "right").float()
        if kind == "masked steps inside the response":
            mask[:, 0] = 1
            holes = torch.rand(B, R, generator=g) < 0.3
            holes[:, 0] = False
            mask = mask * ~holes
        yield f"{kind}, gamma = {gamma}, lam = {lam}", rewards, values, mask, gamma, lam


def _gae_loop_no_carry(rewards, values, mask, gamma, lam):
    """A common mistake: treat a masked step as the end of the episode."""
    B, R = rewards.shape
    adv = torch.zeros(B, R)
    nv, na = torch.zeros(B), torch.zeros(B)
    for t in reversed(range(R)):
        m = mask[:, t].bool()
        a = rewards[:, t] + gamma * nv - values[:, t] + gamma * lam * na
        adv[:, t] = torch.where(m, a, 0.0)
        nv, na = torch.where(m, values[:, t], 0.0), torch.where(m, a, 0.0)
    return adv


def check_gae(mod):
    fn = _function(mod, "gae")
    n = 0
    for what, rewards, values, mask, gamma, lam in _gae_cases():
        n += 1
        want_adv, want_ret = critic.gae(rewards, values, mask, gamma, lam)
        out = _call(fn, rewards, values, mask, gamma=gamma, lam=lam)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise Fail("return a pair (advantages, returns)")
        adv = _tensor(out[0], "advantages", rewards.shape)
        ret = _tensor(out[1], "returns", rewards.shape)
        if _close(adv, want_adv) and _close(ret, want_ret):
            continue
        inputs = (
            f"\n  case: {what}\n  rewards {_show(rewards)}\n  values  {_show(values)}"
            f"\n  mask    {_show(mask.long())}"
        )
        if not _close(adv, want_adv):
            masked = mask == 0
            if masked.any() and adv.detach()[masked].abs().max() > 1e-6:
                hint = "masked steps must get advantage 0 (and return 0)."
            elif what.startswith("masked") and _close(
                adv, _gae_loop_no_carry(rewards, values, mask, gamma, lam)
            ):
                hint = (
                    "a masked step INSIDE a response is not the end of the episode: skip it, so "
                    "the action before it bootstraps from the next real action's V and A (keep "
                    "carrying them across masked steps instead of resetting them to 0)."
                )
            elif what.startswith("right") or what.startswith("masked"):
                hint = (
                    "your advantages are wrong once there is padding: padding is not part of "
                    "the episode, so after a row's last real action V_{t+1} = 0 and A_{t+1} = 0."
                )
            else:
                hint = (
                    "the advantages are wrong. From the last step backwards: delta_t = r_t + "
                    "gamma * V_{t+1} - V_t (V after the last step is 0), A_t = delta_t + gamma * "
                    "lam * A_{t+1}."
                )
            raise Fail(
                f"{hint}{inputs}\n  expected advantages {_show(want_adv)}\n  got {_show(adv)}"
            )
        if _close(ret, adv):
            hint = "the returns are advantages + values (the lambda-return), not the advantages."
        elif _close(ret, (want_adv + values)) and not _close(ret, want_ret):
            hint = "masked steps must get return 0."
        else:
            hint = (
                "the advantages are right but the returns are not: returns = advantages + values."
            )
        raise Fail(f"{hint}{inputs}\n  expected returns {_show(want_ret)}\n  got {_show(ret)}")
    return n


# ----------------------------------------------------------------------------- ex5: boxed
_BOXED_EDGE = [
    ("no box", "The answer is 42."),
    ("one box", r"So the total is \boxed{42}."),
    ("nested braces", r"Hence $x = \boxed{\frac{1}{2}}$."),
    ("deeper nesting", r"\boxed{\sqrt{\frac{a^{2}}{b}}} is it"),
    ("two boxes", r"First \boxed{3}, no wait: \boxed{4}."),
    ("an \\fbox", r"the result is \fbox{7}"),
    ("a \\boxed then an \\fbox", r"\boxed{1} then \fbox{\sqrt{2}}"),
    ("an \\fbox then a \\boxed", r"\fbox{1} then \boxed{2}"),
    ("an unclosed last box", r"\boxed{1} and then \boxed{2"),
    ("escaped braces", r"The set is \boxed{\{1, 2\}}."),
    ("an unbalanced escaped brace", r"\boxed{\left\{ x \right.}"),
    ("spaces inside", r"\boxed{  5 }"),
    ("a space before the brace", r"so \boxed {5}"),
    ("an empty box", r"\boxed{ }"),
    ("text after the box", r"\boxed{12} dollars. Done: {yes}"),
]
_ATOMS = [
    "42",
    "-7",
    "3.5",
    r"\frac{1}{2}",
    r"\sqrt{3}",
    "x^{2}",
    r"\pi",
    r"\{1, 2\}",
    r"(1, 2)",
    r"\text{Evelyn}",
    r"\frac{\sqrt{2}}{2}",
    r"2\sqrt{5}",
    "y = 2x + 3",
]
_PROSE = ["We compute ", "so ", "Therefore $", ". Then {a} ", "and the answer is ", "\n", "$. "]


def _boxed_texts():
    yield from _BOXED_EDGE
    for seed in SEEDS:
        rng = random.Random(seed)
        for _ in range(5):
            text = ""
            for _ in range(rng.randint(0, 3)):
                answer = " ".join(rng.choice(_ATOMS) for _ in range(rng.randint(1, 2)))
                cmd = rng.choice([r"\boxed", r"\boxed", r"\fbox"]) + rng.choice(["", "", " "])
                text += rng.choice(_PROSE) + cmd + "{" + answer + "}" + rng.choice(_PROSE)
            if rng.random() < 0.15:
                text += r"\boxed{" + rng.choice(_ATOMS)  # unclosed
            yield f"random text (seed {seed})", text


def check_boxed(mod):
    fn = _function(mod, "extract_boxed")
    n = 0
    for what, text in _boxed_texts():
        n += 1
        want = verifiable.extract_boxed(text)
        got = _call(fn, text)
        if got == want:
            continue
        if got is not None and not isinstance(got, str):
            raise Fail(f"return a str or None, got {type(got).__name__}")
        if want is None and "\\boxed" not in text and "\\fbox" not in text:
            hint = "there is no box in this text: return None."
        elif want is None and got is not None and got.strip() and what != "an empty box":
            hint = (
                "the last \\boxed{ is never closed, so there is no final answer: return None "
                "(do not fall back to an earlier box)."
            )
        elif want is None:
            hint = "an empty box (only spaces) is no answer: return None."
        elif got is not None and want is not None and got.strip() == want:
            hint = "strip the spaces around the answer."
        elif got is not None and want is not None and want.startswith(got):
            hint = (
                "your answer stops at the first '}', but braces nest: \\boxed{\\frac{1}{2}} "
                "holds \\frac{1}{2}. Count the depth: +1 at '{', -1 at '}', stop at 0."
            )
        elif "\\{" in text or "\\}" in text:
            hint = (
                "\\{ and \\} are literal braces in LaTeX: they do not open or close a group. "
                "Skip the character that follows a backslash when you count braces."
            )
        elif "\\fbox" in text and got is None:
            hint = "\\fbox{...} is a box too: look for the last \\boxed OR \\fbox."
        elif "\\boxed {" in text and got is None:
            hint = "spaces may separate \\boxed from its brace: \\boxed {5} holds 5."
        elif got is not None and want is not None and text.find(got) < text.rfind(want):
            hint = "that is an earlier box; the final answer is in the LAST one."
        else:
            hint = "not the content of the last box."
        raise Fail(f"{hint}\n  text ({what}): {text!r}\n  expected {want!r}, got {got!r}")
    return n


# ----------------------------------------------------------------------------- ex6: value loss
def _value_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    B, R = rng.randint(1, 3), rng.randint(1, 5)
    old = torch.randn(B, R, generator=g)
    values = (old + 0.5 * torch.randn(B, R, generator=g)).requires_grad_()  # some beyond eps
    returns = old + torch.randn(B, R, generator=g)
    mask = _padded_mask(rng, B, R, "right").float()
    return values, old, returns, mask, rng.choice([0.1, 0.2, 0.3])


def _value_variants(values, old, returns, mask, eps):
    """Common mistakes, each with its hint."""
    unclipped = (values - returns).pow(2)
    clipped = (old + (values - old).clamp(-eps, eps) - returns).pow(2)
    m = mask / mask.sum().clamp(min=1)
    return [
        (
            0.5 * (torch.minimum(unclipped, clipped) * m).sum(),
            "take the MAXIMUM of the two errors, not the minimum: the loss is pessimistic, so "
            "moving V further than clip_eps from the old value earns no gradient.",
        ),
        (
            2 * critic.value_loss(values, old, returns, mask, eps),
            "you are a factor 2 off: the loss is 0.5 * max(...).",
        ),
        (
            0.5 * torch.maximum(unclipped, clipped).mean(),
            "average over the real tokens only (where mask is 1): padding must not count.",
        ),
        (
            0.5
            * (
                torch.maximum(
                    unclipped, (returns + (values - returns).clamp(-eps, eps) - returns).pow(2)
                )
                * m
            ).sum(),
            "clip V around the OLD values: V_clip = old_V + clamp(V - old_V, -eps, eps).",
        ),
        (0.5 * (unclipped * m).sum(), "you forgot the clipped term."),
    ]


def check_value_loss(mod):
    fn = _function(mod, "value_loss")
    for seed in SEEDS:
        values, old, returns, mask, eps = _value_inputs(seed)
        want = critic.value_loss(values, old, returns, mask, eps)
        got = _tensor(_call(fn, values, old, returns, mask, clip_eps=eps), "the loss", ())
        if not _close(got, want):
            hint = next(
                (h for v, h in _value_variants(values, old, returns, mask, eps) if _close(got, v)),
                f"the loss should be {want.item():.6f}, yours is {got.item():.6f}.",
            )
            raise Fail(
                f"{hint}\n  clip_eps {eps}\n  values {_show(values)}\n  old    {_show(old)}"
                f"\n  returns {_show(returns)}\n  mask   {_show(mask.long())}"
            )
        (g_want,) = torch.autograd.grad(want, values)
        (g_got,) = _grads(got, values)
        if g_got is None or not _close(g_got, g_want):
            raise Fail(
                "your loss has the right value but not the right gradient with respect to values"
            )
    return len(SEEDS)


# ----------------------------------------------------------------------------- ex7: LM-regularized
def _lm_inputs(seed, padding="right", same_length=True):
    """Heads, hidden states and a right- (or left-) padded pair batch with a prompt and a
    response in each chosen row."""
    g = torch.Generator().manual_seed(100 + seed)
    rng = random.Random(seed)
    B, dim, vocab = rng.randint(2, 4), rng.choice([4, 8]), rng.choice([7, 11])
    reward_head, lm_head = torch.nn.Linear(dim, 1), torch.nn.Linear(dim, vocab)
    for p in (*reward_head.parameters(), *lm_head.parameters()):
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g))
    T = rng.randint(5, 9)
    T2 = T if same_length else T + rng.choice([-2, 2])
    masks, response = [], torch.zeros(B, T, dtype=torch.long)
    for T_, side in ((T, padding), (T2, padding)):
        mask = torch.zeros(B, T_, dtype=torch.long)
        for b in range(B):
            n = rng.randint(3, T_)  # prompt (>= 1) + response (>= 1) + EOS
            if side == "left":
                mask[b, T_ - n :] = 1
            else:
                mask[b, :n] = 1
        masks.append(mask)
    chosen_mask, rejected_mask = masks
    for b in range(B):  # the response: the real tokens after a prompt of 1 .. n-2 tokens
        real = chosen_mask[b].nonzero().flatten()
        p = rng.randint(1, len(real) - 1)
        response[b, real[p:]] = 1
    chosen_ids = torch.randint(vocab, (B, T), generator=g)
    h_c = torch.randn(B, T, dim, generator=g).requires_grad_()
    h_r = torch.randn(B, T2, dim, generator=g).requires_grad_()
    return [reward_head, lm_head, h_c, h_r, chosen_mask, rejected_mask, chosen_ids, response]


def _lm_parts(reward_head, lm_head, h_c, h_r, mask_c, mask_r, ids, response):
    """(pairwise term, LM term) as reward.py computes them."""
    r_c = reward.score_last_token(reward_head, h_c, mask_c)
    r_r = reward.score_last_token(reward_head, h_r, mask_r)
    owner = types.SimpleNamespace(backbone=types.SimpleNamespace(output=lm_head))
    lm = reward.LMRegularizedRewardModel.response_lm_loss(owner, h_c, ids, response)
    return reward.pairwise_loss("logsig", r_c, r_r), lm


def _lm_rm_variants(reward_head, h_c, h_r, mask_c, mask_r):
    """Pairwise terms the classic mistakes compute, each with its hint."""
    pooled = lambda h, m: reward.score_last_token(reward_head, h, m)
    last_col = lambda h: reward_head(h[:, -1]).squeeze(-1)
    r_c, r_r = pooled(h_c, mask_c), pooled(h_r, mask_r)
    out = [
        (
            -F.logsigmoid(r_r - r_c).mean(),
            "bug 2, the label: BCE(r_c - r_r, label 0) = -log sigmoid(r_r - r_c) trains the "
            "REJECTED response to win. The chosen must win: -log sigmoid(r_c - r_r) (label 1).",
        ),
        (
            -F.logsigmoid(last_col(h_c) - last_col(h_r)).mean(),
            "you read the reward at the last column; with padding that is a pad token. Read "
            "it at each row's last real token (the largest t with mask 1, exercise 1).",
        ),
    ]
    if h_c.shape == h_r.shape:
        per_token = reward_head(h_c).squeeze(-1) - reward_head(h_r).squeeze(-1)  # (B, T)
        both = (mask_c * mask_r).float()
        no_pooling = (
            "bug 1, no pooling: reward_head(h) is (B, T), one score per POSITION, and r0 - r1 "
            "compares token t of one sequence with token t of the other. A sequence has one "
            "reward: reward_head(h[b, last real index of row b])."
        )
        out += [
            (-F.logsigmoid(per_token).mean(), no_pooling),
            (-F.logsigmoid(-per_token).mean(), no_pooling + " (and bug 2 is still there)"),
            ((-F.logsigmoid(per_token) * both).sum() / both.sum(), no_pooling),
        ]
    return out


def _lm_term_variants(lm_head, h_c, ids, response):
    """LM terms the classic mistakes compute, each with its hint."""
    ce_same = F.cross_entropy(lm_head(h_c).transpose(1, 2), ids, reduction="none")  # (B, T)
    ce_next = F.cross_entropy(lm_head(h_c[:, :-1]).transpose(1, 2), ids[:, 1:], reduction="none")
    resp, nxt = response.float(), response[:, 1:].float()
    pair_mean = lambda ce, w: ((ce * w).sum(-1) / w.sum(-1).clamp(min=1)).mean()
    no_shift = (
        "bug 3, no shift: CE(logits[:, t], ids[:, t]) asks position t to copy its own input "
        "token, which a transformer learns at once and which teaches nothing. The state at t "
        "predicts the token at t + 1: logits[:, :-1] against ids[:, 1:]."
    )
    real_after_prompt = torch.zeros_like(nxt)  # every next token, prompt included
    for b in range(ids.size(0)):
        real_after_prompt[b, : int(response[b].nonzero().max())] = 1
    return [
        ((ce_same * resp).sum() / resp.sum(), no_shift),
        (pair_mean(ce_same, resp), no_shift),
        (
            (ce_next * nxt).sum() / nxt.sum(),
            "the shift is right, but you averaged over all the response tokens of the batch: "
            "then a long response weighs more, and micro-batches with fewer tokens count more "
            "(gradient accumulation would no longer equal one big batch). Average over each "
            "response's tokens, then over the pairs.",
        ),
        (
            pair_mean(ce_next, real_after_prompt),
            "the LM term is on the RESPONSE tokens only: the prompt is given, not generated, "
            "so do not score its tokens (use response_mask[:, 1:] for the targets).",
        ),
        (
            (ce_next * nxt).sum(-1).mean(),
            "you summed over each response's tokens; take their mean, so a long response does "
            "not outweigh a short one.",
        ),
    ]


def check_lm_loss(mod):
    fn = _function(mod, "lm_regularized_loss")
    cases = []
    for seed in SEEDS:  # lm_coef 0 first: the pairwise term alone
        cases.append((f"right padding, lm_coef 0 (seed {seed})", _lm_inputs(seed), 0.0))
    cases.append(("left padding, lm_coef 0", _lm_inputs(7, "left"), 0.0))
    cases.append(
        ("chosen and rejected of different lengths", _lm_inputs(8, same_length=False), 0.0)
    )
    for seed in SEEDS:
        cases.append((f"right padding, lm_coef 1 (seed {seed})", _lm_inputs(seed), 1.0))
    cases.append(("left padding, lm_coef 1", _lm_inputs(9, "left"), 1.0))
    cases.append(("lm_coef 0.25", _lm_inputs(10), 0.25))
    for what, inputs, coef in cases:
        rm_want, lm_want = _lm_parts(*inputs)
        want = rm_want + coef * lm_want
        got = _tensor(_call(fn, *inputs, lm_coef=coef), "the loss")
        if got.dim() != 0:
            raise Fail(f"return one number (shape ()), got shape {tuple(got.shape)} ({what})")
        if _close(got, want, atol=1e-4, rtol=1e-4):
            states = inputs[2], inputs[3]
            grads = _grads(got, *states)
            g_want = torch.autograd.grad(want, states, allow_unused=True)
            for a, b, h in zip(grads, g_want, states, strict=True):
                a = torch.zeros_like(h) if a is None else a.cpu()
                b = torch.zeros_like(h) if b is None else b
                if not _close(a, b, atol=1e-4, rtol=1e-4):
                    raise Fail(
                        "your loss has the right value but the wrong gradient with respect to "
                        f"the hidden states; did you detach part of it? ({what})"
                    )
            continue
        hint = None
        with torch.no_grad():
            if coef == 0:
                variants = _lm_rm_variants(inputs[0], *inputs[2:6])
                variants.append((rm_want + lm_want, "multiply the LM term by lm_coef (here 0)."))
                hint = next((h for v, h in variants if _close(got, v, 1e-4, 1e-4)), None)
                hint = hint or (
                    "with lm_coef 0 the loss is the pairwise term alone: mean of "
                    "-log sigmoid(r_c - r_r), each reward read at its row's last real token."
                )
            else:
                got_lm = (got - rm_want) / coef
                if _close(got, rm_want + lm_want, 1e-4, 1e-4):
                    hint = f"multiply the LM term by lm_coef (here {coef})."
                if hint is None:
                    variants = _lm_term_variants(inputs[1], inputs[2], inputs[6], inputs[7])
                    hint = next((h for v, h in variants if _close(got_lm, v, 1e-4, 1e-4)), None)
                hint = hint or (
                    f"the pairwise term passed with lm_coef 0; the LM term should be "
                    f"{lm_want.item():.5f}, yours is {got_lm.item():.5f}: the mean over pairs "
                    "of the mean cross-entropy of each response token given the states before it."
                )
        raise Fail(
            f"{hint}\n  case: {what}\n  chosen_mask   {_show(inputs[4])}\n  rejected_mask "
            f"{_show(inputs[5])}\n  response_mask {_show(inputs[7])}\n  expected "
            f"{want.item():.6f}, got {got.item():.6f}"
        )
    return len(cases)


# ----------------------------------------------------------------------------- ex8: accumulation
class FakeDDP(torch.nn.Module):
    """Stands for DistributedDataParallel in one process: no_sync() as DDP's, and a record of
    each call's sync decision (DDP reads require_backward_grad_sync when it is called, and
    then all-reduces in that call's backward)."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True
        self.synced = []  # one entry per call: would its backward all-reduce?
        self.saved = []  # weak references to the tensors each call's graph saved for backward
        self.held = []  # one entry per call: earlier calls' saved tensors still alive then

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *args):
        self.synced.append(self.require_backward_grad_sync and torch.is_grad_enabled())
        self.held.append(self.alive())
        # the graph holds what it saved until its backward frees it: watch each saved tensor
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor):
            return self.module(*args)

    def _pack(self, tensor):
        held = _Saved(tensor)
        self.saved.append(weakref.ref(held))
        return held

    def alive(self):
        return sum(ref() is not None for ref in self.saved)


class _Saved:
    """A tensor saved by the graph of a forward; it dies with the graph (a weakref tells)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


def _accum_case(seed, k):
    g = torch.Generator().manual_seed(200 + seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    m = 1 + seed % 3  # pairs per micro-batch
    x, y = torch.randn(k * m, 3, generator=g), torch.randn(k * m, 1, generator=g)
    return net, [(x[i * m : (i + 1) * m], y[i * m : (i + 1) * m]) for i in range(k)], (x, y)


def _mse(model, batch):
    x, y = batch
    return (model(x) - y).pow(2).mean()


def _grads_of(net, batches, scale=1.0):
    """Summed gradients of scale * mean loss over each batch, on a copy of net."""
    net = copy.deepcopy(net)
    for b in batches:
        (scale * _mse(net, b)).backward()
    return [p.grad.clone() for p in net.parameters()]


def check_grad_accum(mod):
    fn = _function(mod, "accumulate")
    n = 0
    for seed in SEEDS:
        for k in (1, 2, 4) if seed % 2 else (3,):
            n += 1
            net, micro, big = _accum_case(seed, k)
            ddp = FakeDDP(copy.deepcopy(net).to(DEVICE))
            on_device = [tuple(t.to(DEVICE) for t in b) for b in micro]
            what = f"k = {k} micro-batches of {len(micro[0][0])} (seed {seed})"
            try:
                _watched(fn, ddp, on_device, _mse)  # the gradients are what it gives
            except (NotImplementedError, Fail):
                raise
            except Exception as e:
                raise Raised(f"your function raised {type(e).__name__}: {e}\n  case: {what}") from e
            if len(ddp.synced) != k:
                raise Fail(
                    f"call the model once per micro-batch, through loss_fn(model, batch): {k} "
                    f"micro-batches, {len(ddp.synced)} calls of the wrapped model ({what}). "
                    "(model.module(...) would bypass DDP, and its gradients would never sync.)"
                )
            got = [
                torch.zeros_like(p) if p.grad is None else p.grad.detach().cpu()
                for p in ddp.module.parameters()
            ]
            want = _grads_of(net, [big])
            same = lambda a, got=got: all(
                _close(x, y, atol=1e-5, rtol=1e-4) for x, y in zip(got, a, strict=True)
            )
            if not same(want):
                variants = [
                    (
                        _grads_of(net, micro),
                        "you did not scale the losses: the k gradients add up, so the sum is k "
                        "times the big batch's. Divide each micro-step's loss by k before its "
                        "backward (each loss is a mean over its micro-batch).",
                    ),
                    (
                        _grads_of(net, micro, 1 / k**2),
                        "you divided by k twice (once in the loss and once more): divide each "
                        "micro-step's loss by k, once.",
                    ),
                    (
                        _grads_of(net, micro[-1:], 1 / k),
                        "only the last micro-batch's gradient is left: did you zero the "
                        "gradients (zero_grad) inside the loop? They must add up over the k "
                        "micro-steps; the caller zeroes them before and steps after.",
                    ),
                    (
                        _grads_of(net, micro[-1:]),
                        "only the last micro-batch's gradient is left, unscaled: the gradients "
                        "must add up over the micro-steps (no zero_grad in the loop), each loss "
                        "divided by k.",
                    ),
                ]
                hint = next((h for v, h in variants if same(v)), None) or (
                    "the accumulated gradients differ from the big batch's: sum the gradients "
                    "of loss / k over the k micro-batches."
                )
                diff = max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))
                raise Fail(f"{hint}\n  case: {what}; largest difference {diff:.3g}")
            if any(ddp.held) or ddp.alive():
                raise Fail(
                    "the gradients are right, but the micro-batches' graphs were alive together: "
                    "call backward on each micro-batch's loss before the next forward (no "
                    "summing of the k losses, no retain_graph), so that only one micro-batch's "
                    "activations are in memory at a time, which is what accumulation is for."
                    f"\n  case: {what}; saved tensors of earlier micro-batches alive at each "
                    f"call: {ddp.held}"
                )
            pattern = [False] * (k - 1) + [True]
            if ddp.synced == pattern:
                continue
            shown = ", ".join("sync" if s else "no_sync" for s in ddp.synced)
            if all(ddp.synced):
                hint = (
                    "the gradients are right, but every micro-step all-reduces: k all-reduces "
                    "where one would do. Run all but the last micro-step inside model.no_sync()."
                )
            elif not ddp.synced[-1]:
                hint = (
                    "the last micro-step must sync (outside no_sync): otherwise the gradients "
                    "are never averaged over the processes, and each process steps with its own "
                    "(the replicas drift apart)."
                )
            else:
                hint = (
                    "no_sync on every micro-step but the last: the all-reduce of the last one "
                    "averages the whole sum, so a sync before it is wasted communication."
                )
            raise Fail(f"{hint}\n  case: {what}\n  your micro-steps: {shown}")
    return n


# ----------------------------------------------------------------------------- ex9: GSM8K reward
# (what it tests, response, reference, the hint when the student's reward differs)
_FIRST_BOX = "take the LAST box: a response may box a first try and then correct it."
_BOX_FIRST = (
    "a \\boxed{} answer comes first, whatever follows it: the box is the response's own "
    "final mark, '####' and 'the answer is' are read only when there is no box."
)
_HASH_FIRST = "'####' (GSM8K's own mark) comes before 'the answer is' when both are there."
_COMMAS = "commas separate thousands: '1,000' is 1000 (remove them before comparing)."
_DOLLARS = "drop a currency sign: '$18' and LaTeX's '\\$18' state 18."
_NUMERIC = "compare numbers, not strings: '18.00' is 18, and '18.' ends a sentence."
_ANSWER_IS = (
    "read what follows the last 'answer is' up to the end of its sentence, and compare it as a "
    "number: '18.' there ends the sentence, it is 18."
)
_NONE = "with no final answer (no box, no '####', no 'answer is') the reward is 0.0."
_LAST_NUMBER = (
    "the last number of the text is not the answer: read what follows the answer mark "
    "(box, '####', 'answer is')."
)
_NO_MARK = (
    "no answer mark (box, '####', 'answer is') states this number as THE answer: a reward that "
    "falls back to the last number, or pays the reference wherever it appears, pays a response "
    "that lists every number up to it (a reward hack)."
)
_GSM8K_EDGE = [
    ("'####'", "She pays 3 * 6 = 18 dollars.\n#### 18", "18", "read the line after '####'."),
    ("a box", r"So she pays $3 \times 6 = 18$ in all: \boxed{18}.", "18", "read the box."),
    ("'the answer is'", "3 * 6 = 18, so the answer is 18.", "18", _ANSWER_IS),
    ("'The answer is'", "The answer is 18.", "18", "'The answer is' counts too: " + _ANSWER_IS),
    ("'answer is:'", "So, the answer is: 18", "18", "drop a colon after 'answer is'."),
    ("a wrong answer", "#### 17", "18", "17 is not 18: the reward is 0.0."),
    ("a wrong sign", "#### -3", "3", "-3 is not 3."),
    ("a negative answer", "It falls 3 degrees.\n#### -3", "-3", "keep the minus sign."),
    ("not an integer", "#### 18.5", "18", "18.5 is not 18."),
    ("no answer", "I am not sure how to solve this.", "18", _NONE),
    ("two boxes", r"First \boxed{12}. No, wait: \boxed{18}.", "18", _FIRST_BOX),
    ("two boxes, the first right", r"\boxed{18}? No: \boxed{12}.", "18", _FIRST_BOX),
    ("a box after '####'", "#### 12\nActually, \\boxed{18}", "18", _BOX_FIRST),
    ("a box before '####'", "\\boxed{18}\n#### 12", "18", _BOX_FIRST),
    ("'####' then 'answer is'", "#### 18\nSo the answer is 12.", "18", _HASH_FIRST),
    ("'answer is' then '####'", "The answer is 12.\n#### 18", "18", _HASH_FIRST),
    ("two '####'", "#### 12\n#### 18", "18", "read the LAST '####'."),
    (
        "two 'answer is'",
        "The answer is 12. No, the answer is 18.",
        "18",
        "read the LAST 'answer is'.",
    ),
    ("numbers after the answer", "The answer is 18. We used 3 and 6.", "18", _LAST_NUMBER),
    ("numbers after the box", "\\boxed{18} (3 times 6)", "18", _LAST_NUMBER),
    # the hacks the course warns about: a reward that pays the last number, or the reference
    # anywhere in the text, pays a response that counts up to it
    ("counting up to it", " ".join(str(i) for i in range(1, 19)), "18", _NO_MARK),
    ("two guesses", "It is 17 or 18", "18", _NO_MARK),
    ("the reference among others", "I tried 17, 18 and 19.", "18", _NO_MARK),
    ("a wrong '####', then a number", "#### 17\n18", "18", _NO_MARK),
    ("thousands", "#### 1,000", "1000", _COMMAS),
    ("thousands in the reference", "#### 1000", "1,000", _COMMAS),
    ("thousands in a box", r"\boxed{12,500}", "12500", _COMMAS),
    ("a dollar sign", "The answer is $18.", "18", _DOLLARS),
    ("a LaTeX dollar", r"\boxed{\$1,250}", "1250", _DOLLARS),
    ("trailing zeros", "#### 18.00", "18", _NUMERIC),
    ("a period", "#### 18.", "18", _NUMERIC),
    ("a decimal answer", "The answer is 0.5.", "0.5", _NUMERIC),
]


def _gsm8k_texts():
    yield from _GSM8K_EDGE
    for seed in SEEDS:
        rng = random.Random(seed)
        for _ in range(8):
            a, b = rng.randint(2, 40), rng.randint(2, 400)
            gold = a * b
            said = rng.choice([gold, gold, gold + rng.choice([-1, 1, 10]), a])
            shown = f"{said:,}" if rng.random() < 0.4 else str(said)
            shown = rng.choice(["", "", "$"]) + shown + rng.choice(["", "", ".00"])
            body = f"Each box holds {b} and there are {a} boxes, so {a} * {b} = {a * b}."
            end = rng.choice(
                [f"\n#### {shown}", f" The answer is {shown}.", f" \\boxed{{{shown}}}"]
            )
            reference = f"{gold:,}" if rng.random() < 0.3 else str(gold)
            yield f"random response (seed {seed})", body + end, reference, None


def check_gsm8k_reward(mod):
    fn = _function(mod, "gsm8k_reward")
    n = 0
    for what, response, reference, hint in _gsm8k_texts():
        n += 1
        want = verifiable.gsm8k_reward(response, reference)
        got = _call(fn, response, reference)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Fail(f"return a float, 1.0 or 0.0, got {got!r} ({what})")
        if got == want:
            continue
        hint = hint or (
            "the final answer is the last box, else the line after the last '####', else "
            "what follows the last 'answer is'; compare it with the reference as a number."
        )
        raise Fail(
            f"{hint}\n  case: {what}\n  response:  {response!r}\n  reference: {reference!r}\n"
            f"  expected {want}, got {got}"
        )
    return n


# ----------------------------------------------------------------------------- ex10: KL penalty
def _kl_cases():
    yield (
        "the docstring's example",
        (
            torch.tensor([[-1.0, -2.0, 0.0]]),
            torch.tensor([[-1.5, -2.0, 0.0]]),
            torch.tensor([[1, 1, 0]]),
            torch.tensor([3.0]),
            0.1,
        ),
    )
    for seed in SEEDS:
        g = torch.Generator().manual_seed(300 + seed)
        B, R = 2 + seed % 3, 3 + seed
        lengths = torch.randint(1, R + 1, (B,), generator=g)
        lengths[0] = R  # one full row, and a one-token row where there is room
        lengths[-1] = 1 if B > 2 else lengths[-1]
        mask = torch.arange(R) < lengths[:, None]
        mask = mask if seed % 2 else mask.long()
        # log-probabilities everywhere, padding included: an unmasked penalty shows there
        logp, ref = -torch.rand(B, R, generator=g) * 3, -torch.rand(B, R, generator=g) * 3
        score, coef = torch.randn(B, generator=g) * 2, [0.05, 0.1, 0.2][seed % 3]
        yield (
            f"random, lengths {lengths.tolist()} of {R} (seed {seed})",
            (
                logp,
                ref,
                mask,
                score,
                coef,
            ),
        )


def _kl_variants(logp, ref, mask, score, coef):
    m = mask.float()
    pen = -coef * (logp - ref)
    at_end = torch.zeros_like(pen)
    at_end[:, -1] = score
    last = m.cumsum(1).argmax(1, keepdim=True)  # (B, 1) each row's last response token
    at_last = torch.zeros_like(pen).scatter(1, last, score[:, None])
    return [
        (
            pen * m + at_end,
            "the score goes to the LAST RESPONSE TOKEN, not the last column: "
            "a response shorter than R is padded, and its last column is padding",
        ),
        (pen + at_last, "mask the penalty: padding is no token of the response, its reward is 0"),
        (
            -pen * m + at_last,
            "the sign: the penalty is -kl_coef * (logp - ref_logp), a cost for "
            "moving away from the reference (log pi > log pi_ref)",
        ),
        (
            pen * m + score[:, None] * m,
            "the score is paid once, at the last token, not at every token",
        ),
        (pen * m, "add the score at each response's last token"),
        (at_last, "every token pays -kl_coef * (logp - ref_logp), the last one too"),
    ]


def check_kl_penalty(mod):
    fn = _function(mod, "kl_penalty_rewards")
    n = 0
    for what, (logp, ref, mask, score, coef) in _kl_cases():
        n += 1
        want = critic.kl_penalty_rewards(logp, ref, mask.bool(), score, coef)
        got = _tensor(_call(fn, logp, ref, mask, score, coef), "the rewards", want.shape)
        if _close(got, want):
            continue
        hint = next(
            (h for v, h in _kl_variants(logp, ref, mask, score, coef) if _close(got, v)),
            "the rewards differ: -kl_coef * (logp - ref_logp) on each response token, 0 on "
            "padding, plus the score at each response's last token",
        )
        raise Fail(
            f"{hint}\n  case: {what}\n  mask {_show(mask.long())}\n  expected {_show(want)}"
            f"\n  got      {_show(got)}"
        )
    return n


# ----------------------------------------------------------------------------- the registry
# name -> (function the student writes, the check). The file is exercises/<name>.py.
EXERCISES = {
    "ex1_pooling": ("last_real_index", check_pooling),
    "ex2_logsig": ("logsig_loss", check_logsig),
    "ex3_rope": ("apply_rope", check_rope),
    "ex4_gae": ("gae", check_gae),
    "ex5_boxed": ("extract_boxed", check_boxed),
    "ex6_value_loss": ("value_loss", check_value_loss),
    "ex7_lm_loss": ("lm_regularized_loss", check_lm_loss),
    "ex8_grad_accum": ("accumulate", check_grad_accum),
    "ex9_gsm8k_reward": ("gsm8k_reward", check_gsm8k_reward),
    "ex10_kl_penalty": ("kl_penalty_rewards", check_kl_penalty),
}


def _function(mod, name):
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise Fail(f"no function named {name!r} in {getattr(mod, '__file__', mod)}")
    return fn


def resolve(name):
    """'ex1', 'ex1_pooling' or 'ex1_pooling.py' -> 'ex1_pooling'."""
    stem = os.path.basename(name).removesuffix(".py")
    matches = [k for k in EXERCISES if k == stem or k.split("_")[0] == stem]
    if len(matches) != 1:
        raise KeyError(f"unknown exercise {name!r}; choose from {', '.join(EXERCISES)}")
    return matches[0]


def load(path):
    """Import a Python file as a fresh module (student and solution files share names)."""
    path = os.path.abspath(path)
    tag = "solution" if os.path.basename(os.path.dirname(path)) == "solutions" else "student"
    name = f"_{tag}_{os.path.basename(path).removesuffix('.py')}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _uses_the_answer(module, name):
    """A hint when the student's file reaches for nanoRM's own answer, else None."""
    function = EXERCISES[name][0]
    answers = PROJECT + ("solutions",)

    def is_answer(owner):  # a module name: nanoRM's, or a solution other than this file
        return owner != getattr(module, "__name__", None) and (
            owner.split(".")[0] in answers or owner.startswith("_solution_")
        )

    for key, value in vars(module).items():
        owner = getattr(value, "__module__", None) or ""
        is_project = isinstance(value, types.ModuleType) and is_answer(value.__name__)
        if is_project or (callable(value) and is_answer(owner)):
            return (
                f"your file imports nanoRM's own code ({key!r} from {owner or value.__name__}): "
                f"write {function} yourself, with torch and Python only. The checker compares "
                "with nanoRM's version, so calling it would pass without teaching anything."
            )
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):  # a module built in memory (the tests' mistakes)
        return None
    names = "|".join(answers)
    # import reward / import os, reward / from solutions.ex1_pooling import ...
    if re.search(
        rf"^\s*(?:from\s+(?:{names})\b|import\s+(?:[\w.]+\s*,\s*)*(?:{names})\b)", source, re.M
    ):
        return (
            f"your file imports from nanoRM ({', '.join(PROJECT)}) or the solutions: write "
            f"{function} yourself, with torch and Python only; read nanoRM's version after "
            "yours passes."
        )
    return None


# what a passing solution was compared with, where it is not nanoRM's function of its name
REFERENCE = {
    "ex2_logsig": 'reward.pairwise_loss("logsig")',
    "ex7_lm_loss": "reward.py's score_last_token, pairwise_loss and response_lm_loss",
    "ex8_grad_accum": "one big batch's gradients",
}


def check(module, name):
    """(passed, message) for one exercise; module holds the student's function."""
    name = resolve(name)
    torch.manual_seed(0)
    own = getattr(module, "__file__", None)
    OWN["file"] = own and os.path.abspath(own)
    hint = _uses_the_answer(module, name)
    if hint:
        return False, hint
    try:
        n = EXERCISES[name][1](module)
    except NotImplementedError:
        return False, "not implemented yet: replace the TODO (and its raise NotImplementedError)"
    except (Fail, Raised) as e:
        return False, str(e)
    except Exception as e:  # the student's code raised: say what and where
        return False, f"your function raised {type(e).__name__}: {e}"
    against = REFERENCE.get(name, f"nanoRM's {EXERCISES[name][0]}")
    return True, f"PASS ({n} checks against {against})"


def main(argv=None):
    p = argparse.ArgumentParser(description="Check the nanoRM classroom exercises.")
    p.add_argument(
        "names", nargs="*", help="exercises to check (ex1, ex2_logsig, ...); default all"
    )
    p.add_argument("--solutions", action="store_true", help="check exercises/solutions/ instead")
    p.add_argument("--device", default=None, help="where the inputs go (default: cuda if any)")
    args = p.parse_args(argv)
    if args.device:
        global DEVICE
        DEVICE = torch.device(args.device)
    folder = os.path.join(HERE, "solutions") if args.solutions else HERE
    names = [resolve(n) for n in args.names] or list(EXERCISES)
    failed = 0
    for name in names:
        path = os.path.join(folder, name + ".py")
        try:
            passed, message = check(load(path), name)
        except Exception as e:  # a syntax error or an import error in the file itself
            passed, message = False, f"could not import {path}: {type(e).__name__}: {e}"
        failed += not passed
        status = "PASS" if passed else "FAIL"
        message = message.removeprefix("PASS ") if passed else message
        lines = [w for line in message.split("\n") for w in textwrap.wrap(line, 77) or [""]]
        print(f"{name:<16} {status}  " + ("\n" + " " * 23).join(lines))
    print(f"\n{len(names) - failed}/{len(names)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
