"""
Checks the classroom exercises against nanoRM's own functions on randomized inputs.

    python notebooks/exercises/check.py               # every exercise in exercises/ex*.py (the student's)
    python notebooks/exercises/check.py ex2 ex4       # only these
    python notebooks/exercises/check.py path/to/ex4_gae.py  # a file elsewhere (a handed-in copy)
    python notebooks/exercises/check.py --solutions   # the teacher's exercises/solutions/ex*.py
    python notebooks/exercises/check.py --device cuda # the inputs on a GPU (default: cuda if any)

For each exercise it prints PASS, or FAIL with a hint about the most likely mistake and the
input that showed it. The exit status is 0 when every checked exercise passes.

From Python (this is what tests/test_exercises.py does):

    import check
    passed, message = check.check("exercises/ex1_pooling.py", "ex1_pooling")

How a solution is checked, and what that guarantees:

- The checker draws each run's cases afresh (from os.urandom), in its own process.
- The solution runs in another process, in an empty folder holding a copy of its file: on
  Linux a fresh fork, per file, of a server that has imported torch and never imports nanoRM
  (on the command line the checker itself, forked before it imports anything of nanoRM; from
  Python, where the caller may hold anything, a `python -I` it starts); elsewhere a new
  `python -I` per file. It receives the inputs of the cases and nothing else, and sends back
  what its function returned (and the gradients, for the losses). The checker loads that reply
  as data only (torch.load(weights_only=True)), then computes the expected values with nanoRM's
  functions and compares, in its own process: the solution cannot reach the expected values,
  the comparison, or the randomness the cases came from.
- In the solution's process, nanoRM's files are not on the path, and an audit hook (which
  Python cannot remove) refuses to open any file outside Python's library, the installed
  packages and the solution's folder, to import nanoRM's modules, to write files, to start
  processes and to use ctypes. Audit hooks are not a sandbox (PEP 578): they stop a solution
  that reaches for nanoRM's code, not one written to break out of the interpreter.
- A solution whose code holds one of nanoRM's functions from the files it is compared with
  (the same statements, whatever the names, as code or in a string) fails as copied. Functions
  of a couple of lines, which anyone may write alike, are not compared.
- ex8's stand-in for DDP (FakeDDP) records the calls in the solution's process, where the
  solution could tamper with it: it catches mistakes, and the gradients it returns are judged
  by the checker against one big batch's.

Every exercise is compared with the function nanoRM itself uses (REFERENCES names where each
lives), never with a second copy of the answer. ex9 includes the reward hacks (a last-number
fallback, the reference anywhere in the text). The inputs are put on the device being checked
(a GPU when there is one): a solution that makes a new tensor on the CPU beside them fails there,
as it would in training.
"""

import argparse
import ast
import atexit
import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOLUTIONS = os.path.join(HERE, "solutions")
PROJECT = ("reward", "critic", "model", "verifiable", "nanorm", "train_rm", "eval_rm", "data")
DEVICE = None  # where the inputs go; None: cuda if there is one, else cpu
# where a tensor the solution makes without device= lands (None: torch's default, the CPU).
# The project's tests set "meta": a solution that makes tensors off its inputs' device then
# fails on the CPU as it would on a GPU, where the inputs are on cuda and torch.zeros(n) is not
MADE_ON = None
TIME_LIMIT = 120  # seconds one solution file may take on all its cases


# ----------------------------------------------------------------------------- the runner
_FORKS = sys.platform == "linux"  # elsewhere every solution run starts its own Python
_ENV = ("PATH", "LANG", "LD_LIBRARY_PATH", "TMPDIR", "TEMP", "TMP", "SYSTEMROOT")
_ENV_PREFIXES = ("LC_", "OMP_", "MKL_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "TORCH_")


class _Forked:
    """The server as a fork of the checker: the part of subprocess.Popen that _Runner uses."""

    def __init__(self, pid, requests, replies):
        self.pid, self.stdin, self.stdout = pid, requests, replies
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("the solutions' server", timeout)
            time.sleep(0.01)

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)


class _Runner:
    """Starts the solutions' processes: on Linux one server that has imported torch and forks a
    fresh process per solution file; elsewhere one new Python per file."""

    def __init__(self):
        self.proc = None
        self.folder = None

    def _command(self, mode):
        # where torch and numpy are installed as this Python finds them (a user's site-packages
        # is not on the path of `python -I`), found without importing them
        found = []
        for package in ("torch", "numpy"):
            spec = importlib.util.find_spec(package)
            if spec is not None and spec.origin:
                found.append(os.path.dirname(os.path.dirname(spec.origin)))
        boot = (
            "import runpy, sys; sys.path += sys.argv[3:]; sys.argv = sys.argv[1:3]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        check_py = os.path.abspath(__file__)
        return [sys.executable, "-I", "-B", "-c", boot, check_py, mode, *dict.fromkeys(found)]

    def _env(self):
        return {k: v for k, v in os.environ.items() if k in _ENV or k.startswith(_ENV_PREFIXES)}

    def start(self, fork=False):
        """Start the server: a new `python -I`, or with fork=True this process forked, which
        shares its torch import. Fork only where this process holds nothing of nanoRM's and no
        case yet (main() forks first thing); from Python the caller may hold anything."""
        if not _FORKS or (self.proc is not None and self.proc.poll() is None):
            return
        self.folder = self.folder or tempfile.mkdtemp(prefix="nanorm-check-")
        loaded = [m for m in sys.modules if m.split(".")[0] in (*PROJECT, "solutions")]
        if fork and not loaded:  # (main() called from Python, after `import reward`: no fork)
            requests, replies = os.pipe(), os.pipe()
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:  # the server: it never returns to the checker
                try:
                    os.chdir(self.folder)
                    os.dup2(requests[0], 0)
                    os.dup2(replies[1], 1)
                    for fd in (*requests, *replies):
                        os.close(fd)
                    _serve()
                finally:
                    os._exit(0)
            os.close(requests[0])
            os.close(replies[1])
            self.proc = _Forked(pid, os.fdopen(requests[1], "wb"), os.fdopen(replies[0], "rb"))
            return
        self.proc = subprocess.Popen(
            self._command("--serve"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.folder,
            env=self._env(),
        )

    def run(self, request):
        """(exit status, timed out, what the solution's process sent back) for one request."""
        frame = struct.pack("<Qd", len(request), TIME_LIMIT) + request
        if not _FORKS:
            folder = tempfile.mkdtemp(prefix="nanorm-check-")
            try:
                done = subprocess.run(
                    self._command("--once"),
                    input=frame,
                    stdout=subprocess.PIPE,
                    cwd=folder,
                    env=self._env(),
                    timeout=TIME_LIMIT,
                )
                return done.returncode, False, done.stdout
            except subprocess.TimeoutExpired:
                return -9, True, b""
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        self.start()
        try:
            self.proc.stdin.write(frame)
            self.proc.stdin.flush()
            head = self.proc.stdout.read(struct.calcsize("<iBQ"))
            code, timed_out, n = struct.unpack("<iBQ", head)
            return code, bool(timed_out), self.proc.stdout.read(n)
        except (OSError, struct.error):  # the server itself stopped: start another next time
            self.close()
            return -1, False, b""

    def close(self):
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc.stdout.close()
            self.proc = None
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


_RUNNER = _Runner()
atexit.register(_RUNNER.close)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Where nanoRM keeps each function the exercises are compared with (and the RL loop's defaults):
# the one place in this file that names nanoRM's modules. A function that moves to another
# file moves here, in one line; the copy check reads its source through this table too.
REFERENCES = {
    "last_real_index": "reward",
    "pairwise_loss": "reward",
    "score_last_token": "reward",
    "LMRegularizedRewardModel": "reward",
    "apply_rope": "model",
    "rope_frequencies": "model",
    "ModelConfig": "model",
    "gae": "critic",
    "value_loss": "critic",
    "extract_boxed": "verifiable",
    "gsm8k_reward": "verifiable",
    "extract_gsm8k": "verifiable",
    "answers_match": "verifiable",
    "kl_penalty_rewards": "critic",
    "dpo_loss": "reward",
    "solution_reward": "reward",
    "conservative_reward": "reward",
    "parse_args": "nanorm.rl",  # the RL loop's command line: its gamma, lam, kl_coef, clip_eps
}


def _ref(name):
    """nanoRM's object `name`, imported (in the checker's process only) from REFERENCES."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)  # nanoRM's files live in the project root
    return getattr(importlib.import_module(REFERENCES[name]), name)


def _rl_defaults():
    """gamma, lam, kl_coef and clip_eps as nanoRM's RL loop uses them by default."""
    return _ref("parse_args")([])


class Fail(Exception):
    """A check failed; the message is what the student reads."""


class Raised(Exception):
    """The student's function raised on an input; the message names the input."""


# ----------------------------------------------------------------------------- helpers
def _show(t):
    """A tensor as a short readable string."""
    if isinstance(t, torch.nn.Module):
        return type(t).__name__
    if not torch.is_tensor(t):
        return repr(t)
    t = t.detach()
    if t.numel() > 64:
        return f"a {tuple(t.shape)} tensor starting {_show(t.flatten()[:6])[:-1]}, ...]"
    if t.dtype.is_floating_point:
        return (
            str([[round(v, 4) for v in row] for row in t.tolist()])
            if t.dim() == 2
            else (str([round(v, 4) for v in t.flatten().tolist()]))
        )
    return str(t.tolist())


class _Foreign:
    """What the solution returned, where it is neither a tensor nor a plain Python value: only
    its type's name comes back."""

    def __init__(self, type_name):
        self.type_name = type_name

    def __repr__(self):
        return f"<a {self.type_name}>"


def _typename(x):
    return x.type_name if isinstance(x, _Foreign) else type(x).__name__


def _tensor(out, what, shape=None):
    if not torch.is_tensor(out):
        raise Fail(f"{what} must be a torch.Tensor, got {_typename(out)}")
    if shape is not None and tuple(out.shape) != tuple(shape):
        raise Fail(f"{what} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    return out


def _close(a, b, atol=1e-5, rtol=1e-5):
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol)


def _device():
    return torch.device(DEVICE or ("cuda" if torch.cuda.is_available() else "cpu"))


def _draw():
    """The random source of one run's cases: fresh from os.urandom each time, so no table made
    in advance can match, and never sent to the solution."""
    rng = random.Random(int.from_bytes(os.urandom(16), "little"))
    return rng, torch.Generator().manual_seed(rng.getrandbits(63))


# =============================================================================================
# The solution's side. Everything from here to "the checker's side" runs in the solutions'
# server and the process it forks for each file, which never import nanoRM.
# =============================================================================================
_REACH = "out of the solution's reach: "  # starts every refusal, so the checker can name it
_REFUSED = frozenset(
    (
        "subprocess.Popen os.system os.exec os.posix_spawn os.spawn os.fork os.forkpty "
        "os.startfile pty.spawn os.kill os.killpg signal.pthread_kill os.symlink os.link "
        "os.rename os.remove os.rmdir os.mkdir os.truncate os.chmod os.chown os.utime "
        "os.chflags os.lchflags os.setxattr os.removexattr shutil.copyfile shutil.copymode "
        "shutil.copystat shutil.copytree shutil.move shutil.rmtree shutil.chown mmap.__new__"
    ).split()
)
_NO_IMPORT = frozenset((*PROJECT, "solutions", "check", "ctypes", "_ctypes", "_posixsubprocess"))


def _guard(allowed, denied):
    """From here on this process may read files only under `allowed` (the deepest of allowed
    and denied folders holding a file decides), and may not write files, start processes, use
    ctypes or import nanoRM's modules. sys.addaudithook's hooks cannot be removed; this one
    keeps everything it needs in its own default arguments (immutable, and guarded against
    replacement), so that nothing a solution changes later changes what it does."""
    o_path = getattr(os, "O_PATH", 0)
    # where /proc tells which file an open descriptor is, a path is judged by the file it
    # names (symbolic links followed), not by how it is spelled
    by_proc = bool(o_path) and os.path.isdir("/proc/self/fd")
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    allowed = tuple(os.path.realpath(d) for d in allowed)
    denied = tuple(os.path.realpath(d) for d in denied)

    def _nanorm_checker_guard(
        event, args, allowed=allowed, denied=denied, refused=_REFUSED, no_import=_NO_IMPORT,
        reach=_REACH, o_path=o_path, by_proc=by_proc, writes=writes, sep=os.sep,
        os_open=os.open, os_close=os.close, readlink=os.readlink, cloexec=os.O_CLOEXEC,
        _type=type, _str=str, _bytes=bytes, _int=int, _len=len, _max=max, _denied=PermissionError,
        _function=types.FunctionType,
    ):  # fmt: skip
        if event == "open":
            path, flags = args[0], args[2]
            flags = flags if _type(flags) is _int else 0
            if _type(path) is _int:
                return  # a descriptor this process already holds
            if _type(path) is _bytes:
                path = path.decode("utf-8", "surrogateescape")
            elif _type(path) is not _str:
                raise _denied(reach + "a path that is not a str")
            if o_path and flags & o_path:
                return  # neither reads nor writes: how this hook looks a path up
            if flags & writes:
                raise _denied(reach + "writing " + path)
            # a relative path may be read from another folder than this hook would judge
            # (os.open's dir_fd): only whole paths are judged, and opened
            if not (path.startswith(sep) or (sep == "\\" and path[1:3] == ":\\")):
                raise _denied(reach + "a relative path " + path)
            real = path
            if by_proc:
                try:
                    fd = os_open(path, o_path | cloexec)
                except OSError:
                    return  # no such file: the open fails by itself
                try:
                    real = readlink("/proc/self/fd/" + _str(fd))
                finally:
                    os_close(fd)
            else:  # no /proc: judged as spelled, '..' resolved (where links cannot be made)
                parts = []
                for part in path.replace("/", sep).split(sep):
                    if part == "..":
                        parts = parts[:-1]
                    elif part and part != ".":
                        parts.append(part)
                real = ("" if sep == "\\" else sep) + sep.join(parts)
            best_allowed = best_denied = -1
            for folder in allowed:
                if real == folder or real.startswith(folder + sep):
                    best_allowed = _max(best_allowed, _len(folder))
            for folder in denied:
                if real == folder or real.startswith(folder + sep):
                    best_denied = _max(best_denied, _len(folder))
            if best_allowed <= best_denied:
                raise _denied(reach + real)
        elif event == "import":
            if _type(args[0]) is _str and args[0].partition(".")[0] in no_import:
                raise _denied(reach + "the module " + args[0])
        elif event in refused or event.startswith("ctypes."):
            raise _denied(reach + event)
        elif event in ("object.__setattr__", "object.__delattr__") and _type(args[0]) is _function:
            if args[0].__code__.co_name == "_nanorm_checker_guard":
                raise _denied(reach + "the checker's guard")

    for name in ("_posixsubprocess",):  # a private way to start a process, without an event
        if name in sys.modules:
            sys.modules[name].fork_exec = None
    sys.addaudithook(_nanorm_checker_guard)


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


def _mse(model, batch):
    x, y = batch
    return (model(x) - y).pow(2).mean()


def _two_layers(w1, b1, w2, b2):
    """The small network ex8 accumulates gradients of, with these weights."""
    net = torch.nn.Sequential(
        torch.nn.Linear(w1.size(1), w1.size(0)), torch.nn.Tanh(), torch.nn.Linear(w2.size(1), 1)
    )
    with torch.no_grad():
        for p, w in zip(net.parameters(), (w1, b1, w2, b2), strict=True):
            p.copy_(w)
    return net


def _unpack(x, device):
    """An input as the checker sent it, on the device being checked."""
    if isinstance(x, dict) and "linear" in x:  # a head
        weight, bias = x["linear"]
        head = torch.nn.Linear(weight.size(1), weight.size(0))
        with torch.no_grad():
            head.weight.copy_(weight)
            head.bias.copy_(bias)
        return head.to(device)
    if torch.is_tensor(x):
        return x.to(device)
    return x


def _encode(x, device, depth=0):
    """What the solution returned, as plain data: tensors (on the CPU), tuples and lists of
    them, None, bool, int, float, str; anything else only by its type's name."""
    if isinstance(x, torch.Tensor):
        if x.device != device:
            return {"device": str(x.device)}
        try:
            plain = x.detach().as_subclass(torch.Tensor).to("cpu").clone()
        except Exception:  # a tensor with no values to read (the meta device)
            return {"other": f"tensor on {x.device}"}
        return {"tensor": plain, "requires_grad": bool(x.requires_grad)}
    if isinstance(x, (tuple, list)) and depth < 3:
        return {"seq": [_encode(v, device, depth + 1) for v in x], "list": isinstance(x, list)}
    if x is None or type(x) in (bool, int, float, str):
        return {"value": x}
    for plain in (int, float, str):  # e.g. numpy's float64, a subclass of float
        if isinstance(x, plain) and not isinstance(x, bool):
            return {"value": plain(x), "type": type(x).__name__}
    return {"other": type(x).__name__}


def _error(e):
    """An exception as plain data."""
    try:
        message = str(e)[:3000]
    except Exception:
        message = "(its message could not be read)"
    err = {"type": type(e).__name__, "message": message}
    err["not_implemented"] = isinstance(e, NotImplementedError)
    if isinstance(e, ModuleNotFoundError) and isinstance(e.name, str):
        err["module"] = e.name
    if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str):
        err["key"] = e.args[0]
    return err


def _call_one(fn, call, device):
    args = [_unpack(a, device) for a in call["args"]]
    kwargs = {k: _unpack(v, device) for k, v in call["kwargs"].items()}
    wrt = [args[g] if isinstance(g, int) else kwargs[g] for g in call["grad"]]
    for t in wrt:
        t.requires_grad_()
    inputs = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
    with torch.device(MADE_ON) if MADE_ON else contextlib.nullcontext():
        out = fn(*args, **kwargs)
    result = {"out": _encode(out, device)}
    if wrt and isinstance(out, torch.Tensor) and out.dim() == 0 and out.requires_grad:
        grads = torch.autograd.grad(out, wrt, allow_unused=True)
        result["grads"] = [{"value": None} if g is None else _encode(g, device) for g in grads]
    # the inputs after the call: the checker tells whether they were changed in place
    if device.type != "meta":
        result["after"] = [t.detach().to("cpu") for t in inputs]
    return result


def _accumulate_one(fn, call, device):
    net = _two_layers(*call["net"]).to(device)
    ddp = FakeDDP(net)
    micro = [tuple(t.to(device) for t in batch) for batch in call["micro"]]
    with torch.device(MADE_ON) if MADE_ON else contextlib.nullcontext():
        fn(ddp, micro, _mse)
    grads = [
        {"value": None} if p.grad is None else _encode(p.grad, device) for p in net.parameters()
    ]
    return {
        "synced": list(ddp.synced),
        "held": list(ddp.held),
        "alive": ddp.alive(),
        "grads": grads,
    }


def _solution_side(req, reply_fd, folder, allowed):
    """In the solution's fresh process, given the request read by the server: copy its file
    into `folder`, guard the process, run the function on every call's inputs (up to the first
    that raises) and write what came back to reply_fd."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)  # what the solution prints goes where the checker's errors go
    path = os.path.join(folder, os.path.basename(req["file"]))
    with open(path, "w", encoding="utf-8") as f:
        f.write(req["source"])
    os.chdir(folder)
    device = torch.device(req["device"])
    global MADE_ON
    MADE_ON = req["made_on"]
    if MADE_ON:  # the first op across devices imports torch's decompositions: before the guard
        _across(device, MADE_ON)
    if device.type not in ("cpu", "meta"):
        device = torch.zeros(1, device=device).device  # CUDA starts before the guard; cuda:0
    run = _accumulate_one if req["kind"] == "accumulate" else _call_one
    calls = req["calls"]
    save = torch.save  # before the solution's code can replace it
    _guard(allowed + [folder], [ROOT])
    reply = {"results": []}
    try:
        spec = importlib.util.spec_from_file_location(req["file"].removesuffix(".py"), path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import would (a dataclass looks itself up there)
        spec.loader.exec_module(module)
        fn = getattr(module, req["function"], None)
    except BaseException as e:  # noqa: B036 (sys.exit in the file is a failure like any other)
        reply["load"] = _error(e)
        fn = None
    if "load" not in reply and not callable(fn):
        reply["missing"] = True
    elif "load" not in reply:
        for call in calls:
            try:
                reply["results"].append(run(fn, call, device))
            except BaseException as e:  # noqa: B036
                reply["results"].append({"raised": _error(e)})
                break
    buf = io.BytesIO()
    save(reply, buf)
    data = memoryview(buf.getvalue())
    while data:
        data = data[os.write(reply_fd, data) :]


def _read_request(stream):
    """(the request's bytes, its time limit in seconds), or (None, 0) when the checker is done."""
    head = stream.read(16)
    if len(head) < 16:
        return None, 0
    n, seconds = struct.unpack("<Qd", head)
    return stream.read(n), seconds


def _allowed():
    """The folders the solution may read from: Python's library and the installed packages.
    The path loses nanoRM's folders (a .pth file may have put the project there)."""
    import sysconfig

    ours = {os.path.realpath(p) for p in (ROOT, HERE, SOLUTIONS)}
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) not in ours]
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return sorted({os.path.realpath(p) for p in folders | set(sys.path)} - ours)


def _across(device, other):
    """An op across two devices, which fails; the first one imports what torch needs to say so."""
    with contextlib.suppress(RuntimeError):
        torch.ones(1, device=device) + torch.ones(2, device=other)


def _serve():
    """The process beside the checker: it imported torch once, and runs each request (a
    solution file and its inputs, from stdin) in a fresh process of its own (a fork), then
    replies on stdout: exit status, whether time ran out, and what the solution sent."""
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing printed here may mix with the replies
    allowed = _allowed()
    # what every solution's process does last (save the reply), done once here: its lazy
    # imports are then shared by the forks instead of repeated in each (the requests are read
    # here, below)
    torch.save({"a": [torch.zeros(2, requires_grad=True), None, 1.0, "b", True]}, io.BytesIO())
    across = False
    while True:
        request, seconds = _read_request(requests)
        if request is None:
            return
        req = torch.load(io.BytesIO(request), weights_only=True)  # data only; the fork inherits it
        if req["made_on"] and not across:
            _across("cpu", "meta")  # once here rather than in every fork (MADE_ON)
            across = True
        folder = tempfile.mkdtemp(prefix="nanorm-solution-")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the solution's process: it never returns to this loop
            code = 0
            try:
                os.close(read)
                _solution_side(req, write, folder, allowed)
            except BaseException:  # noqa: B036
                code = 1
            finally:
                os._exit(code)
        os.close(write)
        data, timed_out = _read_until_closed(read, seconds)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(read)
        shutil.rmtree(folder, ignore_errors=True)
        code = os.waitstatus_to_exitcode(status)
        replies.write(struct.pack("<iBQ", code, timed_out, len(data)) + data)
        replies.flush()


def _read_until_closed(fd, seconds):
    chunks, deadline = [], time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"".join(chunks), True
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)


def _once():
    """Where there is no fork: one request from stdin, run here, the reply on stdout."""
    request, _ = _read_request(sys.stdin.buffer)  # (the checker keeps the time)
    reply_fd = os.dup(1)
    folder = tempfile.mkdtemp(prefix="nanorm-solution-")
    try:
        _solution_side(request, reply_fd, folder, _allowed())
    finally:
        os._exit(0)


# =============================================================================================
# The checker's side.
# =============================================================================================


def _pack(x):
    """An input as it is sent to the solution: tensors, numbers, strings, heads as weights."""
    if isinstance(x, torch.nn.Linear):
        return {"linear": [x.weight.detach().clone(), x.bias.detach().clone()]}
    if torch.is_tensor(x):
        return x.detach().clone()
    return x


class Case:
    """One call of the student's function: what it tests (for the message), its inputs, which
    of them the checker wants the gradients for (positions or names), and tags for the hints."""

    def __init__(self, what, *args, grad=(), tags=(), **kwargs):
        self.what, self.args, self.kwargs, self.grad, self.tags = what, args, kwargs, grad, tags

    def packed(self):
        return {
            "args": [_pack(a) for a in self.args],
            "kwargs": {k: _pack(v) for k, v in self.kwargs.items()},
            "grad": list(self.grad),
        }

    def inputs(self):
        return [a for a in (*self.args, *self.kwargs.values()) if torch.is_tensor(a)]

    def shown(self):
        return ", ".join(
            [_show(a) for a in self.args] + [f"{k}={_show(v)}" for k, v in self.kwargs.items()]
        )


class Got:
    """What the solution returned on one case: its output, and the gradients of a loss."""

    def __init__(self, out, grads=None, requires_grad=False):
        self.out, self.grads, self.requires_grad = out, grads, requires_grad

    def gradients(self):
        """The gradients the checker asked for, or a Fail when none flowed."""
        if self.grads is None or not self.requires_grad:
            raise Fail(
                "no gradient flows through your loss: keep every step in torch (no .item(), "
                "numpy, float() or .detach()), or training could not use it"
            )
        return self.grads


def _decode(enc, device):
    """A value the solution sent, read back here; a Fail names a result on the wrong device."""
    if not isinstance(enc, dict):
        raise ValueError("not an encoded value")
    if "device" in enc:
        raise Fail(
            f"your result is on {enc['device']} but the inputs were on {device}: make new "
            "tensors on the inputs' device (torch.arange(T, device=x.device), "
            "torch.zeros_like(x)), or training on a GPU would fail"
        )
    if "tensor" in enc:
        if type(enc["tensor"]) is not torch.Tensor:
            raise ValueError("not a tensor")
        return enc["tensor"]
    if "seq" in enc:
        items = [_decode(v, device) for v in enc["seq"]]
        return items if enc.get("list") else tuple(items)
    if "value" in enc:
        if enc["value"] is not None and type(enc["value"]) not in (bool, int, float, str):
            raise ValueError("not a plain value")
        return enc["value"]
    return _Foreign(str(enc.get("other", "object")))


class Solution:
    """A student's file. It runs in a process of its own (see _solution_side) on the inputs of
    the cases, and only what it returns comes back here."""

    def __init__(self, path, name):
        self.path, self.name = os.path.abspath(path), name
        self.function = EXERCISES[name][0]
        with open(self.path, encoding="utf-8") as f:
            self.source = f.read()

    def run(self, cases, kind="call"):
        """One reply per case, up to the first whose call raised (that one raises here, where
        the loop over the cases reaches it)."""
        device = _device()
        request = {
            "file": os.path.basename(self.path),
            "source": self.source,
            "function": self.function,
            "device": str(device),
            "made_on": MADE_ON,
            "kind": kind,
            "calls": [c.packed() for c in cases] if kind == "call" else cases,
        }
        buf = io.BytesIO()
        torch.save(request, buf)
        code, timed_out, data = _RUNNER.run(buf.getvalue())
        if timed_out:
            raise Fail(f"your file did not finish its cases in {TIME_LIMIT} s: is there a loop "
                       "that never ends?")  # fmt: skip
        try:  # data only: a reply cannot make this process run anything
            reply = torch.load(io.BytesIO(data), weights_only=True)
            results = reply["results"] if isinstance(reply, dict) else None
            if not isinstance(results, list):
                raise ValueError("no results")
        except Exception:
            raise Fail(
                "your file's process ended before it sent its results back (exit status "
                f"{code}): does it call sys.exit, os._exit, or crash the interpreter?"
            ) from None
        if "load" in reply:
            raise self._failure(reply["load"], "could not import your file")
        if reply.get("missing"):
            raise Fail(f"no function named {self.function!r} in {self.path}")
        return _Replies(self, results, device)

    def _failure(self, err, context, shown=None):
        """The exception a raised error becomes here: NotImplementedError for a blank
        exercise, a Fail with a hint when it reached for nanoRM, else Raised."""
        if not isinstance(err, dict):
            return Fail("the checker could not read your function's error")
        if err.get("not_implemented"):
            return NotImplementedError()
        hint = _reached(err, self.function)
        if hint:
            return Fail(hint)
        text = f"{err.get('type')}: {err.get('message')}"
        if shown is None:
            return Raised(f"{context}: {text}")
        return Raised(f"your function raised {text}\n  {context}: {shown}")


class _Replies:
    """The replies of one run, taken in the order of the cases."""

    def __init__(self, solution, results, device):
        self.solution, self.results, self.device = solution, results, device

    def result(self, i, case, shown=None):
        """The i-th raw reply (for ex8), raising what the call raised."""
        if i >= len(self.results) or not isinstance(self.results[i], dict):
            raise Fail("your file's process stopped before it answered every case")
        r = self.results[i]
        if "raised" in r:
            context = "on the input" if shown is None else "case"
            shown = case.shown() if shown is None else shown
            err = self.solution._failure(r["raised"], context, shown)
            if isinstance(err, Raised) and context == "on the input":
                err = Raised(f"{err}\n  (device {self.device})")
            raise err
        return r

    def got(self, i, case):
        """What the function returned on case i, after checking it left its inputs alone."""
        r = self.result(i, case)
        try:
            out = _decode(r["out"], self.device)
            grads = r.get("grads")
            grads = None if grads is None else [_decode(g, self.device) for g in grads]
            after = r.get("after")
            if not (after is None or isinstance(after, list)):
                raise ValueError("the inputs after the call are not a list")
        except Fail:
            raise
        except Exception:
            raise Fail("the checker could not read what your function returned") from None
        if after is not None:
            before = case.inputs()
            if len(after) != len(before) or not all(
                torch.is_tensor(b) and b.shape == a.shape and torch.equal(a, b.to(a.dtype))
                for a, b in zip(before, after, strict=False)
            ):
                raise Fail(
                    "your function changed its input tensor in place; work on new tensors "
                    "instead (e.g. x = x - y, not x -= y), the caller still needs its inputs"
                )
        requires_grad = isinstance(r["out"], dict) and bool(r["out"].get("requires_grad"))
        return Got(out, grads, requires_grad)


def _reached(err, function):
    """A hint when an error in the solution's process shows it reached for nanoRM (an import, a
    look-up in sys.modules, a file), or for a module that is not there; else None."""
    module, key, message = err.get("module"), err.get("key"), str(err.get("message", ""))
    write_it = (
        f"Write {function} yourself, with torch and Python only: the checker compares with "
        "nanoRM's version, so calling it would pass without teaching anything."
    )
    for name, how in ((module, "imports {} ({}), which is not on the path"),
                      (key, "looks up {} (sys.modules[{!r}]), which is not loaded")):  # fmt: skip
        top = name.split(".")[0] if isinstance(name, str) else None
        if top in PROJECT or top == "solutions":
            whose = "a solution's code" if top == "solutions" else "nanoRM's own code"
            return f"your file {how.format(whose, name)} where your function runs. {write_it}"
    if _REACH in message:
        what = message.split(_REACH, 1)[1]
        if what.startswith(os.path.realpath(ROOT) + os.sep):
            what = "nanoRM's " + os.path.relpath(what, os.path.realpath(ROOT))
        return (
            f"your file reaches for {what}, which is out of reach: your function runs in a "
            "process of its own, with torch, numpy and Python's standard library, and nanoRM's "
            f"files (or any other file) cannot be read there. {write_it}"
        )
    if isinstance(module, str):
        return (
            f"your file imports {module}, which is not installed: the checker runs your file on "
            "its own (a copy in an empty folder), with torch, numpy and Python's standard "
            "library only."
        )
    return None


# ----------------------------------------------------------------------------- the file's code
def _imports_the_answer(tree, function):
    """A hint when the file imports nanoRM's modules or a solution, else None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            names = ", ".join(repr(a.name) for a in node.names)
            if top in PROJECT:
                return (
                    f"your file imports nanoRM's own code ({names} from {node.module}): write "
                    f"{function} yourself, with torch and Python only. The checker compares "
                    "with nanoRM's version, so calling it would pass without teaching anything."
                )
            if top == "solutions":
                return (
                    f"your file imports a solution ({names} from {node.module}): write "
                    f"{function} yourself, with torch and Python only."
                )
        if isinstance(node, ast.Import):
            if any(a.name.split(".")[0] in (*PROJECT, "solutions") for a in node.names):
                return (
                    f"your file imports from nanoRM ({', '.join(PROJECT)}) or the solutions: "
                    f"write {function} yourself, with torch and Python only; read nanoRM's "
                    "version after yours passes."
                )
    return None


# Copies: two pieces of code are one when their statements are the same once every identifier
# (variables, arguments, functions, modules imported under another name) is renamed in order of
# first use, docstrings and annotations dropped. Attribute and keyword names stay: they are
# torch's API. Functions smaller than this many syntax nodes are not compared: a two-line index
# or a masked mean is what anyone writes.
_MIN_NODES = 50
_NAMES = {
    ("Name", "id"), ("arg", "arg"), ("FunctionDef", "name"), ("AsyncFunctionDef", "name"),
    ("ClassDef", "name"), ("ExceptHandler", "name"), ("alias", "asname"), ("Global", "names"),
    ("Nonlocal", "names"),
}  # fmt: skip
_NOT_CODE = {
    "annotation",
    "returns",
    "type_comment",
    "decorator_list",
    "type_params",
    "ctx",
    "kind",
}


def _statements(body):
    """A block's statements less the strings standing alone (docstrings)."""
    return [
        s
        for s in body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        or not isinstance(s.value.value, str)
    ]


def _shape(node, rename):
    """node as text, each identifier through rename."""
    if isinstance(node, list):
        return "[" + ",".join(_shape(n, rename) for n in _statements(node)) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    kind, parts = type(node).__name__, []
    for field, value in ast.iter_fields(node):
        if field in _NOT_CODE:
            continue
        if (kind, field) in _NAMES and value is not None:
            value = [rename(v) for v in value] if isinstance(value, list) else rename(value)
            parts.append(repr(value))
        else:
            parts.append(_shape(value, rename))
    return f"{kind}({','.join(parts)})"


def _anonymous(name):
    return "_"


def _numbered():
    seen = {}
    return lambda name: seen.setdefault(name, len(seen))


_PRINTS = {}  # source file -> its functions' prints


def _prints(path):
    """{the anonymous shapes of a function's statements: (their numbered shape, its name)} for
    every function of a nanoRM file big enough to compare."""
    if path not in _PRINTS:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        prints = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = _statements(node.body)
                if sum(1 for s in body for _ in ast.walk(s)) >= _MIN_NODES:
                    anonymous = tuple(_shape(s, _anonymous) for s in body)
                    prints.setdefault(anonymous, (_shape(body, _numbered()), node.name))
        _PRINTS[path] = prints
    return _PRINTS[path]


def _blocks(tree, depth=0):
    """Every block of statements in the file, and in its strings that hold Python code."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield _statements(block)
        if depth < 2 and isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if "\n" in text:
                try:
                    inner = ast.parse(textwrap.dedent(text))
                except (SyntaxError, ValueError):
                    continue
                yield from _blocks(inner, depth + 1)


def _copied(tree, name):
    """(the nanoRM file, the function) a run of the file's statements was copied from, or None;
    the exercise's own reference first when several were. The files searched are those that
    define the exercise's references, found through REFERENCES."""
    references = EXERCISES[name][2]
    files = []
    for ref in references:
        path = inspect.getsourcefile(inspect.unwrap(_ref(ref)))
        if path not in files:
            files.append(path)
    blocks = list(_blocks(tree))
    shapes = [[_shape(s, _anonymous) for s in block] for block in blocks]
    found = []
    for path in files:
        prints = _prints(path)
        for block, anonymous in zip(blocks, shapes, strict=True):
            for k in {len(key) for key in prints}:
                for i in range(len(block) - k + 1):
                    numbered, function = prints.get(tuple(anonymous[i : i + k]), (None, None))
                    if numbered and _shape(block[i : i + k], _numbered()) == numbered:
                        found.append((os.path.relpath(path, ROOT), function))
    found.sort(key=lambda where: where[1] not in references)
    return found[0] if found else None


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


def _pooling_cases(rng):
    yield Case("no padding", torch.ones(2, 5, dtype=torch.long))
    yield Case("a single token", torch.ones(1, 1, dtype=torch.long))
    for side in ("right", "left", "mixed"):
        shapes = [(1, rng.randint(2, 12)), (rng.randint(2, 8), 1)]
        shapes += [(rng.randint(2, 8), rng.randint(2, 40)) for _ in range(3)]
        for B, T in shapes:
            yield Case(f"{side} padding", _padded_mask(rng, B, T, side))
    B, T = rng.randint(2, 6), rng.randint(200, 500)
    yield Case("long sequences, mixed padding", _padded_mask(rng, B, T, "mixed"))
    B, T = rng.randint(1, 6), rng.randint(1, 12)
    yield Case("a bool mask", _padded_mask(rng, B, T, "mixed").bool())


def check_pooling(solution):
    cases = list(_pooling_cases(_draw()[0]))
    replies = solution.run(cases)
    for i, case in enumerate(cases):
        (mask,) = case.args
        got = _tensor(replies.got(i, case).out, "the result")
        want = _ref("last_real_index")(mask)
        got = _tensor(got, "the result", want.shape)
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
            f"{hint}\n  mask ({case.what}, shape {tuple(mask.shape)}):\n{mask}\n  expected "
            f"{_show(want)}, got {_show(got)}"
        )
    return len(cases)


# ----------------------------------------------------------------------------- ex2: logsig
def _reference_logsig(r_c, r_r, margin=None):
    return _ref("pairwise_loss")("logsig", r_c, r_r, margin=margin)


def _logsig_cases(rng, g):
    for B in (1, rng.randint(2, 8), rng.randint(16, 64)):
        scale = rng.uniform(0.5, 5.0)
        r_c, r_r = scale * torch.randn(B, generator=g), scale * torch.randn(B, generator=g)
        for margin in (None, torch.rand(B, generator=g) * rng.uniform(0.5, 3.0)):
            yield Case(f"{B} pairs", r_c, r_r, margin, grad=(0, 1))
    # stability: the reference stays finite, log(sigmoid(x)) does not
    r_c = torch.tensor([-200.0, 0.0, 150.0, 900.0])
    r_r = torch.tensor([0.0, 300.0, -5.0, -900.0])
    yield Case("large reward gaps", r_c, r_r, grad=(0, 1), tags=("stability",))
    B = rng.randint(2, 8)
    r_c, r_r = 400 * torch.randn(B, generator=g), 400 * torch.randn(B, generator=g)
    yield Case("large reward gaps", r_c, r_r, grad=(0, 1), tags=("stability",))


def check_logsig(solution):
    cases = list(_logsig_cases(*_draw()))
    replies = solution.run(cases)
    for i, case in enumerate(cases):
        r_c, r_r = (a.clone().requires_grad_() for a in case.args[:2])
        margin = case.args[2] if len(case.args) > 2 else None
        result = replies.got(i, case)
        got = _tensor(result.out, "the loss")
        want = _reference_logsig(r_c, r_r, margin)
        if "stability" in case.tags:
            if got.dim() != 0 or not torch.isfinite(got) or not _close(got, want, rtol=1e-4):
                raise Fail(
                    f"with large reward gaps (r_chosen = {_show(r_c)}, r_rejected = "
                    f"{_show(r_r)}) the loss should be {want.item():.2f}, yours is "
                    f"{_show(got)}. sigmoid(-200) rounds to 0 in float32 and log(0) = -inf: "
                    "use torch.nn.functional.logsigmoid, which computes log(sigmoid(x)) in one "
                    "stable step."
                )
            if any(gr is None or not torch.isfinite(gr).all() for gr in result.gradients()):
                raise Fail(
                    "with large reward gaps your loss is finite but its gradient is not (nan or "
                    "inf): use torch.nn.functional.logsigmoid rather than log(sigmoid(x)) or "
                    "log(1 + exp(-x))"
                )
            continue
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
        for a, b in zip(result.gradients(), g_want, strict=True):
            if a is None or not _close(a, b):
                raise Fail(
                    "your loss has the right value but the wrong gradient; did you detach "
                    "part of it (or use .data)?"
                )
    return len(cases)


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
def _rope_case(rng, g, B, T, H, D):
    x = torch.randn(B, T, H, D, generator=g)
    # positions as model.py derives them: left-padded rows start at position 0
    mask = _padded_mask(rng, B, T, "mixed")
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + rng.choice([0, rng.randint(1, 2000)])
    config = _ref("ModelConfig")(dim=H * D, n_heads=H)
    angles = positions[..., None].float() * _ref("rope_frequencies")(config)  # (B, T, D/2)
    return Case(f"x of shape {(B, T, H, D)}", x, angles.cos(), angles.sin())


def _rope_cases(rng, g):
    yield _rope_case(rng, g, 1, 1, 1, 2)
    yield _rope_case(rng, g, 1, rng.randint(2, 12), rng.randint(1, 4), 2 * rng.randint(1, 16))
    for _ in range(4):
        B, T, H = rng.randint(2, 3), rng.randint(1, 12), rng.randint(1, 4)
        yield _rope_case(rng, g, B, T, H, 2 * rng.randint(1, 16))
    yield _rope_case(rng, g, rng.randint(1, 2), rng.randint(100, 200), 2, 2 * rng.randint(4, 16))


def _rotate_half(x, cos, sin):
    """Hugging Face's layout: pairs (i, i + D/2)."""
    D = x.size(-1)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def check_rope(solution):
    cases = list(_rope_cases(*_draw()))
    replies = solution.run(cases)
    apply_rope = _ref("apply_rope")
    for i, case in enumerate(cases):
        x, cos, sin = case.args
        got = _tensor(replies.got(i, case).out, "the result", x.shape)
        if got.dtype != x.dtype:
            raise Fail(f"return the dtype of x ({x.dtype}), got {got.dtype}")
        want = apply_rope(x, cos, sin)
        if _close(got, want, atol=1e-5, rtol=1e-4):
            continue
        shapes = f"x {tuple(x.shape)}, cos and sin {tuple(cos.shape)}"
        if _close(got, _rotate_half(x, cos, sin), atol=1e-5, rtol=1e-4):
            hint = (
                "you rotated the pairs (i, i + D/2), Hugging Face's rotate_half layout. model.py "
                "rotates ADJACENT pairs (x[2i], x[2i+1]) like Meta's code and llama2.c (HF "
                "checkpoints permute the rows of wq and wk so that both agree)."
            )
        elif _close(got, apply_rope(x, cos, -sin), atol=1e-5, rtol=1e-4):
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
            rtol=1e-4,
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
    return len(cases)


# ----------------------------------------------------------------------------- ex4: GAE
def _gae_mask(rng, g, B, R, padding, holes):
    """(B, R) 1 on actions: padding "right", "left" or None, and masked steps inside."""
    mask = torch.ones(B, R)
    if padding:
        mask = _padded_mask(rng, B, R, padding).float()
    if holes:
        inside = torch.rand(B, R, generator=g) < 0.35
        real = mask.nonzero()
        for b in range(B):  # keep each row's first and last action
            cols = real[real[:, 0] == b, 1]
            inside[b, cols.min()] = inside[b, cols.max()] = False
        mask = mask * ~inside
    return mask


def _gae_case(rng, g, B, R, gamma, lam, padding=None, holes=False):
    rewards, values = torch.randn(B, R, generator=g), torch.randn(B, R, generator=g)
    mask = _gae_mask(rng, g, B, R, padding, holes)
    mask = rng.choice([mask, mask.long(), mask.bool()])
    what = "no padding" if padding is None else f"{padding} padding"
    what += ", masked steps inside the responses" if holes else ""
    tags = (("padding",) if padding else ()) + (("holes",) if holes else ())
    what += f", B = {B}, R = {R}, gamma = {gamma:.4g}, lam = {lam:.4g}"
    return Case(what, rewards, values, mask, gamma=gamma, lam=lam, tags=tags)


def _gae_cases(rng, g):
    rl = _rl_defaults()  # what nanoRM's RL loop runs with (gamma 1, lam 0.95)
    one = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.5]]), torch.ones(1, 3)
    yield Case("the docstring's example, gamma = 1, lam = 1", *one, gamma=1.0, lam=1.0)
    below = lambda lo: rng.uniform(lo, 0.999)  # strictly below 1
    yield _gae_case(rng, g, 2, 5, rl.gamma, rl.lam)
    yield _gae_case(rng, g, 3, 6, rl.gamma, rl.lam, "right")
    yield _gae_case(rng, g, 3, 8, rl.gamma, rl.lam, "right", holes=True)
    for _ in range(2):
        yield _gae_case(rng, g, rng.randint(2, 4), rng.randint(4, 10), below(0.8), below(0.5),
                        rng.choice(["right", None]), holes=True)  # fmt: skip
    yield _gae_case(rng, g, 3, rng.randint(4, 10), below(0.8), below(0.5), "left", holes=True)
    yield _gae_case(rng, g, 2, rng.randint(4, 10), below(0.8), 0.0, "right", holes=True)
    yield _gae_case(rng, g, 2, rng.randint(4, 10), below(0.8), 1.0, "right", holes=True)
    yield _gae_case(rng, g, 1, rng.randint(4, 10), below(0.8), below(0.5), "right", holes=True)
    yield _gae_case(rng, g, rng.randint(1, 3), 1, below(0.8), below(0.5))
    yield _gae_case(rng, g, 2, rng.randint(100, 300), rl.gamma, rl.lam, "right", holes=True)
    yield _gae_case(rng, g, 2, rng.randint(100, 300), below(0.9), below(0.8), "left", holes=True)
    for _ in range(3):
        B, R = rng.randint(1, 4), rng.randint(1, 12)
        gamma, lam = rng.choice([1.0, below(0.8)]), rng.choice([rl.lam, below(0.0), 0.0, 1.0])
        yield _gae_case(rng, g, B, R, gamma, lam, rng.choice(["right", "left", None]),
                        holes=R > 2 and rng.random() < 0.7)  # fmt: skip


def _gae_loop(case, at_masked):
    """GAE on a case's inputs with a mistake at masked steps: at_masked(next V, next A) is what
    is carried across them."""
    (rewards, values, mask), gamma, lam = case.args, case.kwargs["gamma"], case.kwargs["lam"]
    B, R = rewards.shape
    adv = torch.zeros(B, R)
    nv, na = torch.zeros(B), torch.zeros(B)
    for t in reversed(range(R)):
        m = mask[:, t].bool()
        a = rewards[:, t] + gamma * nv - values[:, t] + gamma * lam * na
        adv[:, t] = torch.where(m, a, 0.0)
        carried_v, carried_a = at_masked(nv, na)
        nv, na = torch.where(m, values[:, t], carried_v), torch.where(m, a, carried_a)
    return adv


def check_gae(solution):
    cases = list(_gae_cases(*_draw()))
    replies = solution.run(cases)
    gae = _ref("gae")
    for i, case in enumerate(cases):
        rewards, values, mask = case.args
        gamma, lam = case.kwargs["gamma"], case.kwargs["lam"]
        out = replies.got(i, case).out
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise Fail("return a pair (advantages, returns)")
        adv = _tensor(out[0], "advantages", rewards.shape)
        ret = _tensor(out[1], "returns", rewards.shape)
        want_adv, want_ret = gae(rewards, values, mask, gamma, lam)
        tol = dict(atol=1e-5, rtol=1e-4)
        if _close(adv, want_adv, **tol) and _close(ret, want_ret, **tol):
            continue
        inputs = (
            f"\n  case: {case.what}\n  rewards {_show(rewards)}\n  values  {_show(values)}"
            f"\n  mask    {_show(mask.long())}"
        )
        if not _close(adv, want_adv, **tol):
            masked = mask == 0
            reset = lambda v, a: (0 * v, 0 * a)  # a masked step taken for the episode's end
            decay = lambda v, a, k=gamma * lam: (v, k * a)  # time passing at a masked step
            if masked.any() and adv[masked].abs().max() > 1e-6:
                hint = "masked steps must get advantage 0 (and return 0)."
            elif "holes" in case.tags and _close(adv, _gae_loop(case, reset), **tol):
                hint = (
                    "a masked step INSIDE a response is not the end of the episode: skip it, so "
                    "the action before it bootstraps from the next real action's V and A (keep "
                    "carrying them across masked steps instead of resetting them to 0)."
                )
            elif "holes" in case.tags and _close(adv, _gae_loop(case, decay), **tol):
                hint = (
                    "a masked step is not a step: carry the next real action's A across it "
                    "unchanged. Yours is multiplied by gamma * lam at every masked step, as if "
                    "time passed there."
                )
            elif "padding" in case.tags or "holes" in case.tags:
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
        if _close(ret, adv, **tol):
            hint = "the returns are advantages + values (the lambda-return), not the advantages."
        elif _close(ret, (want_adv + values), **tol) and not _close(ret, want_ret, **tol):
            hint = "masked steps must get return 0."
        else:
            hint = (
                "the advantages are right but the returns are not: returns = advantages + values."
            )
        raise Fail(f"{hint}{inputs}\n  expected returns {_show(want_ret)}\n  got {_show(ret)}")
    return len(cases)


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


def _boxed_text(rng, boxes):
    text = ""
    for _ in range(boxes):
        answer = " ".join(rng.choice(_ATOMS) for _ in range(rng.randint(1, 2)))
        if rng.random() < 0.2:  # a box inside the answer's braces
            answer = r"\frac{" + answer + "}{" + rng.choice(_ATOMS) + "}"
        cmd = rng.choice([r"\boxed", r"\boxed", r"\fbox"]) + rng.choice(["", "", " "])
        text += rng.choice(_PROSE) + cmd + "{" + answer + "}" + rng.choice(_PROSE)
    if rng.random() < 0.15:
        text += r"\boxed{" + rng.choice(_ATOMS)  # unclosed
    return text


def _boxed_cases(rng):
    for what, text in _BOXED_EDGE:
        yield Case(what, text)
    for i in range(30):
        yield Case(f"random text {i + 1}", _boxed_text(rng, rng.randint(0, 3)))
    yield Case("a long text", _boxed_text(rng, rng.randint(40, 80)))


def check_boxed(solution):
    cases = list(_boxed_cases(_draw()[0]))
    replies = solution.run(cases)
    extract_boxed = _ref("extract_boxed")
    for i, case in enumerate(cases):
        (text,) = case.args
        got = replies.got(i, case).out
        want = extract_boxed(text)
        if got == want:
            continue
        if got is not None and not isinstance(got, str):
            raise Fail(f"return a str or None, got {_typename(got)}")
        if want is None and "\\boxed" not in text and "\\fbox" not in text:
            hint = "there is no box in this text: return None."
        elif want is None and got is not None and got.strip() and case.what != "an empty box":
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
        shown = text if len(text) < 400 else text[:150] + " ... " + text[-200:]
        raise Fail(f"{hint}\n  text ({case.what}): {shown!r}\n  expected {want!r}, got {got!r}")
    return len(cases)


# ----------------------------------------------------------------------------- ex6: value loss
def _value_case(rng, g, B, R, eps, padding):
    old = torch.randn(B, R, generator=g)
    values = old + 0.5 * torch.randn(B, R, generator=g)  # some beyond eps
    returns = old + torch.randn(B, R, generator=g)
    mask = _padded_mask(rng, B, R, padding).float()
    mask = rng.choice([mask, mask.long(), mask.bool()])
    what = f"{padding} padding, B = {B}, R = {R}, clip_eps = {eps:.4g}"
    return Case(what, values, old, returns, mask, clip_eps=eps, grad=(0,))


def _value_cases(rng, g):
    rl = _rl_defaults()  # the RL loop's clip (0.2)
    yield _value_case(rng, g, 3, 5, rl.clip_eps, "right")
    for padding in ("right", "left", "mixed"):
        for _ in range(2):
            eps = rng.uniform(0.05, 0.5)
            yield _value_case(rng, g, rng.randint(1, 4), rng.randint(1, 8), eps, padding)
    yield _value_case(rng, g, 1, 1, rng.uniform(0.05, 0.5), "right")
    yield _value_case(rng, g, 2, rng.randint(100, 300), rng.uniform(0.05, 0.5), "mixed")


def _value_variants(values, old, returns, mask, eps):
    """Common mistakes, each with its hint."""
    mask = mask.float()
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
            2 * _ref("value_loss")(values, old, returns, mask, eps),
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


def check_value_loss(solution):
    cases = list(_value_cases(*_draw()))
    replies = solution.run(cases)
    for i, case in enumerate(cases):
        values, old, returns, mask = case.args
        eps = case.kwargs["clip_eps"]
        values = values.clone().requires_grad_()
        result = replies.got(i, case)
        got = _tensor(result.out, "the loss", ())
        want = _ref("value_loss")(values, old, returns, mask, eps)
        if not _close(got, want, atol=1e-5, rtol=1e-4):
            hint = next(
                (
                    h
                    for v, h in _value_variants(values.detach(), old, returns, mask, eps)
                    if _close(got, v, atol=1e-5, rtol=1e-4)
                ),
                f"the loss should be {want.item():.6f}, yours is {got.item():.6f}.",
            )
            raise Fail(
                f"{hint}\n  case: {case.what}\n  values {_show(values)}\n  old    {_show(old)}"
                f"\n  returns {_show(returns)}\n  mask   {_show(mask.long())}"
            )
        (g_want,) = torch.autograd.grad(want, values)
        (g_got,) = result.gradients()
        if g_got is None or not _close(g_got, g_want, atol=1e-6, rtol=1e-4):
            raise Fail(
                "your loss has the right value but not the right gradient with respect to values"
            )
    return len(cases)


# ----------------------------------------------------------------------------- ex7: LM-regularized
def _lm_inputs(rng, g, padding="right", same_length=True, B=None, T=None):
    """Heads, hidden states and a right- (or left-) padded pair batch with a prompt and a
    response in each chosen row."""
    B = B or rng.randint(2, 4)
    dim, vocab = rng.choice([4, 8]), rng.choice([7, 11])
    reward_head, lm_head = torch.nn.Linear(dim, 1), torch.nn.Linear(dim, vocab)
    for p in (*reward_head.parameters(), *lm_head.parameters()):
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g))
    T = T or rng.randint(5, 9)
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
    h_c = torch.randn(B, T, dim, generator=g)
    h_r = torch.randn(B, T2, dim, generator=g)
    return [reward_head, lm_head, h_c, h_r, chosen_mask, rejected_mask, chosen_ids, response]


def _lm_cases(rng, g):
    lm = lambda what, inputs, coef: Case(what, *inputs, lm_coef=coef, grad=(2, 3))
    # lm_coef 0 first: the pairwise term alone
    for i in range(4):
        yield lm(f"right padding, lm_coef 0 (random case {i + 1})", _lm_inputs(rng, g), 0.0)
    yield lm("a batch of one pair, lm_coef 0", _lm_inputs(rng, g, B=1), 0.0)
    yield lm("left padding, lm_coef 0", _lm_inputs(rng, g, "left"), 0.0)
    different = _lm_inputs(rng, g, same_length=False)
    yield lm("chosen and rejected of different lengths, lm_coef 0", different, 0.0)
    for i in range(4):
        coef = 1.0 if i == 0 else round(rng.uniform(0.1, 2.0), 3)
        yield lm(f"right padding, lm_coef {coef} (random case {i + 1})", _lm_inputs(rng, g), coef)
    coef = round(rng.uniform(0.1, 2.0), 3)
    yield lm(f"left padding, lm_coef {coef}", _lm_inputs(rng, g, "left"), coef)
    yield lm(f"a batch of one pair, lm_coef {coef}", _lm_inputs(rng, g, B=1), coef)
    long = _lm_inputs(rng, g, rng.choice(["left", "right"]), T=rng.randint(40, 80))
    yield lm(f"long sequences, lm_coef {coef}", long, coef)


def _lm_parts(reward_head, lm_head, h_c, h_r, mask_c, mask_r, ids, response):
    """(pairwise term, LM term) as reward.py computes them."""
    score = _ref("score_last_token")
    r_c, r_r = score(reward_head, h_c, mask_c), score(reward_head, h_r, mask_r)
    owner = types.SimpleNamespace(backbone=types.SimpleNamespace(output=lm_head))
    lm = _ref("LMRegularizedRewardModel").response_lm_loss(owner, h_c, ids, response)
    return _ref("pairwise_loss")("logsig", r_c, r_r), lm


def _lm_rm_variants(reward_head, h_c, h_r, mask_c, mask_r):
    """Pairwise terms the classic mistakes compute, each with its hint."""
    pooled = lambda h, m: _ref("score_last_token")(reward_head, h, m)
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


def check_lm_loss(solution):
    cases = list(_lm_cases(*_draw()))
    replies = solution.run(cases)
    for i, case in enumerate(cases):
        inputs, coef, what = list(case.args), case.kwargs["lm_coef"], case.what
        inputs[2], inputs[3] = (h.clone().requires_grad_() for h in inputs[2:4])
        result = replies.got(i, case)
        got = _tensor(result.out, "the loss")
        if got.dim() != 0:
            raise Fail(f"return one number (shape ()), got shape {tuple(got.shape)} ({what})")
        rm_want, lm_want = _lm_parts(*inputs)
        want = rm_want + coef * lm_want
        if _close(got, want, atol=1e-4, rtol=1e-4):
            states = inputs[2], inputs[3]
            grads = result.gradients()
            g_want = torch.autograd.grad(want, states, allow_unused=True)
            for a, b, h in zip(grads, g_want, states, strict=True):
                a = torch.zeros_like(h) if a is None else a
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
def _accum_case(rng, g, k):
    d_in, hidden = rng.randint(2, 6), rng.randint(3, 8)
    weights = [
        torch.randn(hidden, d_in, generator=g),
        torch.randn(hidden, generator=g),
        torch.randn(1, hidden, generator=g),
        torch.randn(1, generator=g),
    ]
    m = rng.randint(1, 4)  # pairs per micro-batch
    x, y = torch.randn(k * m, d_in, generator=g), torch.randn(k * m, 1, generator=g)
    micro = [(x[i * m : (i + 1) * m], y[i * m : (i + 1) * m]) for i in range(k)]
    return weights, micro, (x, y)


def _grads_of(weights, batches, scale=1.0):
    """Summed gradients of scale * mean loss over each batch, of the network with weights."""
    net = _two_layers(*weights)
    for b in batches:
        (scale * _mse(net, b)).backward()
    return [p.grad.clone() for p in net.parameters()]


def check_grad_accum(solution):
    rng, g = _draw()
    cases = [_accum_case(rng, g, k) for k in (1, 2, 3, 4, 2, 5, 8)]
    replies = solution.run(
        [{"net": w, "micro": [list(b) for b in micro]} for w, micro, _ in cases], "accumulate"
    )
    for i, (weights, micro, big) in enumerate(cases):
        k = len(micro)
        what = f"k = {k} micro-batches of {len(micro[0][0])}"
        r = replies.result(i, None, shown=what)
        try:
            synced, held = [bool(s) for s in r["synced"]], [int(h) for h in r["held"]]
            alive = int(r["alive"])
            got = [_decode(p, replies.device) for p in r["grads"]]
        except Fail:
            raise
        except Exception:
            raise Fail("the checker could not read what your function left behind") from None
        if len(synced) != k:
            raise Fail(
                f"call the model once per micro-batch, through loss_fn(model, batch): {k} "
                f"micro-batches, {len(synced)} calls of the wrapped model ({what}). "
                "(model.module(...) would bypass DDP, and its gradients would never sync.)"
            )
        want = _grads_of(weights, [big])
        got = [torch.zeros_like(w) if p is None else p for p, w in zip(got, want, strict=True)]
        same = lambda a, got=got: all(
            torch.is_tensor(x) and _close(x, y, atol=1e-5, rtol=1e-4)
            for x, y in zip(got, a, strict=True)
        )
        if not same(want):
            variants = [
                (
                    _grads_of(weights, micro),
                    "you did not scale the losses: the k gradients add up, so the sum is k "
                    "times the big batch's. Divide each micro-step's loss by k before its "
                    "backward (each loss is a mean over its micro-batch).",
                ),
                (
                    _grads_of(weights, micro, 1 / k**2),
                    "you divided by k twice (once in the loss and once more): divide each "
                    "micro-step's loss by k, once.",
                ),
                (
                    _grads_of(weights, micro[-1:], 1 / k),
                    "only the last micro-batch's gradient is left: did you zero the "
                    "gradients (zero_grad) inside the loop? They must add up over the k "
                    "micro-steps; the caller zeroes them before and steps after.",
                ),
                (
                    _grads_of(weights, micro[-1:]),
                    "only the last micro-batch's gradient is left, unscaled: the gradients "
                    "must add up over the micro-steps (no zero_grad in the loop), each loss "
                    "divided by k.",
                ),
            ]
            hint = next((h for v, h in variants if same(v)), None) or (
                "the accumulated gradients differ from the big batch's: sum the gradients "
                "of loss / k over the k micro-batches."
            )
            diffs = [(a - b).abs().max().item() for a, b in zip(got, want, strict=True)]
            raise Fail(f"{hint}\n  case: {what}; largest difference {max(diffs):.3g}")
        if any(held) or alive:
            raise Fail(
                "the gradients are right, but the micro-batches' graphs were alive together: "
                "call backward on each micro-batch's loss before the next forward (no "
                "summing of the k losses, no retain_graph), so that only one micro-batch's "
                "activations are in memory at a time, which is what accumulation is for."
                f"\n  case: {what}; saved tensors of earlier micro-batches alive at each "
                f"call: {held}"
            )
        if synced == [False] * (k - 1) + [True]:
            continue
        shown = ", ".join("sync" if s else "no_sync" for s in synced)
        if all(synced):
            hint = (
                "the gradients are right, but every micro-step all-reduces: k all-reduces "
                "where one would do. Run all but the last micro-step inside model.no_sync()."
            )
        elif not synced[-1]:
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
    return len(cases)


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


def _gsm8k_cases(rng):
    for what, response, reference, hint in _GSM8K_EDGE:
        yield Case(what, response, reference, tags=(hint,))
    for i in range(48):
        a, b = rng.randint(2, 40), rng.randint(2, 400)
        gold = a * b
        said = rng.choice([gold, gold, gold + rng.choice([-1, 1, 10]), a])
        shown = f"{said:,}" if rng.random() < 0.4 else str(said)
        shown = rng.choice(["", "", "$"]) + shown + rng.choice(["", "", ".00"])
        body = f"Each box holds {b} and there are {a} boxes, so {a} * {b} = {a * b}."
        end = rng.choice([f"\n#### {shown}", f" The answer is {shown}.", f" \\boxed{{{shown}}}"])
        reference = f"{gold:,}" if rng.random() < 0.3 else str(gold)
        yield Case(f"random response {i + 1}", body + end, reference, tags=(None,))


def check_gsm8k_reward(solution):
    cases = list(_gsm8k_cases(_draw()[0]))
    replies = solution.run(cases)
    gsm8k_reward = _ref("gsm8k_reward")
    for i, case in enumerate(cases):
        response, reference = case.args
        got = replies.got(i, case).out
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Fail(f"return a float, 1.0 or 0.0, got {got!r} ({case.what})")
        want = gsm8k_reward(response, reference)
        if got == want:
            continue
        hint = case.tags[0] or (
            "the final answer is the last box, else the line after the last '####', else "
            "what follows the last 'answer is'; compare it with the reference as a number."
        )
        raise Fail(
            f"{hint}\n  case: {case.what}\n  response:  {response!r}\n  reference: "
            f"{reference!r}\n  expected {want}, got {got}"
        )
    return len(cases)


# ----------------------------------------------------------------------------- ex10: KL penalty
def _kl_case(rng, g, B, R, coef):
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    lengths[0] = R  # one full row, and a one-token row where there is room
    if B > 2:
        lengths[-1] = 1
    mask = torch.arange(R) < lengths[:, None]
    mask = rng.choice([mask, mask.long(), mask.float()])
    # log-probabilities everywhere, padding included: an unmasked penalty shows there
    logp, ref = -torch.rand(B, R, generator=g) * 3, -torch.rand(B, R, generator=g) * 3
    score = torch.randn(B, generator=g) * 2
    lengths = lengths.tolist() if R <= 12 else f"{min(lengths.tolist())} to {R}"
    what = f"lengths {lengths} of {R}, kl_coef {coef:.4g}"
    return Case(what, logp, ref, mask, score, coef)


def _kl_cases(rng, g):
    yield Case(
        "the docstring's example",
        torch.tensor([[-1.0, -2.0, 0.0]]),
        torch.tensor([[-1.5, -2.0, 0.0]]),
        torch.tensor([[1, 1, 0]]),
        torch.tensor([3.0]),
        0.1,
    )
    coef = lambda: rng.uniform(0.01, 0.5)
    yield _kl_case(rng, g, 3, rng.randint(3, 8), _rl_defaults().kl_coef)  # the RL loop's
    for _ in range(4):
        yield _kl_case(rng, g, rng.randint(2, 5), rng.randint(2, 10), coef())
    yield _kl_case(rng, g, 1, rng.randint(2, 10), coef())
    yield _kl_case(rng, g, rng.randint(1, 4), 1, coef())
    yield _kl_case(rng, g, rng.randint(3, 5), rng.randint(100, 300), coef())


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


def check_kl_penalty(solution):
    cases = list(_kl_cases(*_draw()))
    replies = solution.run(cases)
    kl_penalty_rewards = _ref("kl_penalty_rewards")
    for i, case in enumerate(cases):
        logp, ref, mask, score, coef = case.args
        got = _tensor(replies.got(i, case).out, "the rewards")
        want = kl_penalty_rewards(logp, ref, mask.bool(), score, coef)
        got = _tensor(got, "the rewards", want.shape)
        if _close(got, want):
            continue
        hint = next(
            (h for v, h in _kl_variants(logp, ref, mask, score, coef) if _close(got, v)),
            "the rewards differ: -kl_coef * (logp - ref_logp) on each response token, 0 on "
            "padding, plus the score at each response's last token",
        )
        raise Fail(
            f"{hint}\n  case: {case.what}\n  mask {_show(mask.long())}\n  expected {_show(want)}"
            f"\n  got      {_show(got)}"
        )
    return len(cases)


# ----------------------------------------------------------------------------- ex11: DPO's loss
def _dpo_case(rng, g, B, beta, spread=3.0, what=None):
    logp = [-spread * torch.rand(B, generator=g) * rng.uniform(1, 20) for _ in range(4)]
    return Case(what or f"{B} pairs, beta {beta:.4g}", *logp, beta, grad=(0, 1))


def _dpo_cases(rng, g):
    ex = [torch.tensor([v]) for v in (-1.0, -3.0, -1.5, -2.0)]
    yield Case("the docstring's example", *ex, 0.5, grad=(0, 1))
    yield _dpo_case(rng, g, rng.randint(2, 8), 0.1)  # DPO's usual beta (nanorm.dpo's default)
    for B in (1, rng.randint(2, 8), rng.randint(16, 64)):
        yield _dpo_case(rng, g, B, rng.uniform(0.05, 2.0))
    # stability: log-ratios hundreds of nats apart, where log(sigmoid(x)) is -inf
    big = [torch.tensor(v) for v in ([-900.0, -1.0], [-1.0, -900.0], [-5.0, -2.0], [-2.0, -5.0])]
    yield Case("log-ratios 900 nats apart", *big, 1.0, grad=(0, 1), tags=("stability",))


def _dpo_variants(c, r, rc, rr, beta):
    ref = _ref("dpo_loss")
    return [
        (
            ref(c, r, torch.zeros_like(rc), torch.zeros_like(rr), beta),
            "you left out the reference: the reward is beta * (log pi - log pi_ref), the "
            "log-RATIO to the reference, not the policy's log-probability alone",
        ),
        (
            ref(r, c, rr, rc, beta),
            "chosen and rejected are swapped: the loss must be small when the chosen "
            "response's log-ratio is the larger, -log sigmoid(r_chosen - r_rejected)",
        ),
        (
            ref(c, r, rc, rr, 1.0),
            "you left out beta: it multiplies the log-ratios INSIDE the sigmoid",
        ),
        (
            beta * ref(c, r, rc, rr, 1.0),
            "beta goes inside the sigmoid, on the log-ratios, not in front of the loss",
        ),
        (
            ref(c, r, -rc, -rr, beta),
            "the reference's log-probability is SUBTRACTED: log pi - log pi_ref",
        ),
        (-ref(c, r, rc, rr, beta), "a sign: the loss is MINUS log sigmoid(...), so it is >= 0"),
        (
            ref(c, r, rc, rr, beta) * c.numel(),
            "you summed over the pairs; take the mean, as exercise 2 does",
        ),
    ]


def check_dpo_loss(solution):
    cases = list(_dpo_cases(*_draw()))
    replies = solution.run(cases)
    dpo_loss = _ref("dpo_loss")
    for i, case in enumerate(cases):
        c, r = (a.clone().requires_grad_() for a in case.args[:2])
        rc, rr, beta = case.args[2:]
        result = replies.got(i, case)
        got = _tensor(result.out, "the loss")
        want = dpo_loss(c, r, rc, rr, beta)
        if got.dim() != 0:
            raise Fail(f"return one number, the mean over the pairs (shape ()), got shape "
                       f"{tuple(got.shape)}")  # fmt: skip
        if not torch.isfinite(got):
            raise Fail(
                f"on {case.what} the loss should be {want.item():.4f}, yours is {got.item()}: "
                "sigmoid(-200) is 0 in float32 and log(0) = -inf; use "
                "torch.nn.functional.logsigmoid, as in exercise 2"
            )
        if not _close(got, want, rtol=1e-4):
            with torch.no_grad():
                hint = next(
                    (h for v, h in _dpo_variants(c, r, rc, rr, beta) if _close(got, v)),
                    "the loss differs: mean of -log sigmoid(beta * ((logp_chosen - "
                    "ref_logp_chosen) - (logp_rejected - ref_logp_rejected)))",
                )
            raise Fail(
                f"{hint}\n  case: {case.what}\n  logp_chosen {_show(c)}, logp_rejected "
                f"{_show(r)}\n  ref_logp_chosen {_show(rc)}, ref_logp_rejected {_show(rr)}\n  "
                f"expected {want.item():.6f}, got {got.item():.6f}"
            )
        g_want = torch.autograd.grad(want, (c, r))
        for a, b in zip(result.gradients(), g_want, strict=True):
            if a is None or not torch.isfinite(a).all() or not _close(a, b, rtol=1e-4):
                raise Fail(
                    "your loss has the right value but not the right gradient in the policy's "
                    "log-probabilities: did you detach part of it, or compute log(sigmoid(x)) "
                    "in two steps (its gradient is not finite where sigmoid rounds to 0)?"
                )
    return len(cases)


# ----------------------------------------------------------------------------- ex12: a PRM's best-of-N
def _prm_case(rng, g, Q, N, S, what, ties=False):
    p = torch.rand(Q, N, S, generator=g)
    lengths = torch.randint(1, S + 1, (Q, N), generator=g)
    steps = (torch.arange(S) < lengths[..., None]).long()  # (Q, N, S)
    p = torch.where(steps.bool(), p, 0.01 * torch.rand(Q, N, S, generator=g))  # low past the end
    how = rng.choice(["min", "prod"])
    if ties:  # each question's best solution twice (at its place and last): the first is kept
        r = _ref("solution_reward")(p.reshape(Q * N, S), steps.reshape(Q * N, S), how)
        for q, best in enumerate(r.reshape(Q, N).argmax(-1).tolist()):
            other = 0 if best == N - 1 else N - 1
            p[q, other], steps[q, other] = p[q, best], steps[q, best]
    return Case(what, p, steps, how)


def _prm_cases(rng, g):
    ex = torch.tensor([[[0.9, 0.2], [0.6, 0.5]]]), torch.tensor([[[1, 1], [1, 0]]])
    yield Case("the docstring's example", *ex, "min")
    yield Case("the docstring's example, by product", *ex, "prod")
    for how in ("min", "prod"):
        Q, N, S = rng.randint(2, 6), rng.randint(4, 16), rng.randint(2, 6)
        case = _prm_case(rng, g, Q, N, S, f"{Q} questions, N = {N}, up to {S} steps")
        yield Case(case.what + f", {how}", *case.args[:2], how)
    yield _prm_case(rng, g, 8, 64, 5, "8 questions, N = 64, up to 5 steps")
    yield _prm_case(rng, g, 3, 1, 4, "N = 1: the only solution")
    yield _prm_case(rng, g, 4, 6, 3, "equal solution rewards", ties=True)


def _prm_variants(p, steps, how):
    solution_reward = _ref("solution_reward")
    Q, N, S = p.shape
    pick = lambda r: r.reshape(Q, N).argmax(-1)
    flat, real = p.reshape(Q * N, S), steps.reshape(Q * N, S)
    other = "prod" if how == "min" else "min"
    last = real.long().cumsum(-1).argmax(-1, keepdim=True)  # the last real step
    mean = (flat * real).sum(-1) / real.sum(-1)
    return [
        (
            pick(solution_reward(flat, torch.ones_like(real), how)),
            "the steps past a solution's end count in yours: mask them out (a padded step must "
            "change neither the minimum nor the product, so make it 1)",
        ),
        (
            pick(solution_reward(flat, real, other)),
            f"you combined the steps by {other}; this case asks for {how}",
        ),
        (
            pick(-solution_reward(flat, real, how)),
            "you kept the WORST solution: argmax, not argmin",
        ),
        (pick(mean), "you averaged the steps; the PRM's solution reward is their min or product"),
        (
            pick(flat.gather(-1, last).squeeze(-1)),
            "you read the last step alone, as an outcome reward model would: combine every step",
        ),
    ]


def check_prm_best_of_n(solution):
    cases = list(_prm_cases(*_draw()))
    replies = solution.run(cases)
    solution_reward = _ref("solution_reward")
    wrong = []  # (case, its inputs, expected, got, the solution rewards) where they differ
    for i, case in enumerate(cases):
        p, steps, how = case.args
        Q, N, S = p.shape
        r = solution_reward(p.reshape(Q * N, S), steps.reshape(Q * N, S), how).reshape(Q, N)
        want = r.argmax(-1)
        got = _tensor(replies.got(i, case).out, "the indices", want.shape)
        if got.dtype.is_floating_point:
            raise Fail(f"return integer indices (torch.argmax gives int64), got {got.dtype}")
        if not torch.equal(got.long(), want):
            wrong.append((case, want, got.long(), r))
    if not wrong:
        return len(cases)
    # an index is a coarse answer: two mistakes may pick alike on one case, so the hint is the
    # mistake that picks as the solution did on every case it got wrong
    variants = [_prm_variants(*c.args) for c, *_ in wrong]
    hint = next(
        (
            variants[0][k][1]
            for k in range(len(variants[0]))
            if all(torch.equal(g, v[k][0]) for (_, _, g, _), v in zip(wrong, variants, strict=True))
        ),
        "the solutions differ: each solution's reward is the min (or product) of its real "
        "steps' probabilities; keep the first highest",
    )
    case, want, got, r = wrong[0]
    if all(
        torch.equal(r.gather(1, g[:, None]).squeeze(1), r.max(-1).values) for _, _, g, r in wrong
    ):
        hint = "among solutions of equal reward keep the FIRST, as torch.argmax does"
    p, steps, how = case.args
    raise Fail(
        f"{hint}\n  case: {case.what} (how={how!r})\n  step_probs {_show(p)}\n  steps "
        f"{_show(steps)}\n  expected {want.tolist()}, got {got.tolist()}"
    )


# ----------------------------------------------------------------------------- ex13: ensembles
def _ensemble_cases(rng, g):
    ex = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    for rule in ("mean", "min", "mean_minus_std"):
        yield Case(f"the docstring's example, {rule}", ex, rule, 1.0, grad=(0,))
    for rule in ("mean", "min", "mean_minus_std", "mean_minus_std"):
        K, B = rng.randint(2, 6), rng.randint(1, 20)
        r = torch.randn(K, B, generator=g) * rng.uniform(0.5, 5) + rng.uniform(-3, 3)
        lam = round(rng.uniform(0.25, 2.0), 2)
        yield Case(f"K = {K} models, B = {B} responses, {rule}, lam {lam}", r, rule, lam, grad=(0,))
    r = torch.randn(1, rng.randint(2, 6), generator=g)
    yield Case("K = 1: one model, no spread", r, "mean_minus_std", 1.0, grad=(0,), tags=("K1",))
    r = torch.randn(4, 3, generator=g)
    yield Case("lam 0: the mean itself", r, "mean_minus_std", 0.0, grad=(0,))


def _ensemble_variants(r, rule, lam):
    ref = _ref("conservative_reward")
    return [
        (
            r.mean(0) - lam * r.std(0),
            "the standard deviation is the K members' own spread: "
            "divide by K (std(dim=0, unbiased=False)), not K - 1",
        ),
        (
            r.mean(0) + lam * r.std(0, unbiased=False),
            "a sign: conservative means mean MINUS lam * std, so disagreement lowers the reward",
        ),
        (ref(r, "mean_minus_std", 1.0), "lam is ignored in yours: mean - lam * std"),
        (r.max(0).values, "you took the best case (max); the conservative one is the minimum"),
        (r.mean(0), f"that is the mean; this case asks for {rule}"),
        (r.min(0).values, f"that is the minimum; this case asks for {rule}"),
        (r.mean(1), "you took the mean over the responses (dim 1): it is over the members (dim 0)"),
        (
            r.min(1).values,
            "you took the minimum over the responses (dim 1): over the members "
            "(dim 0), one reward per response",
        ),
    ]


def check_conservative_reward(solution):
    cases = list(_ensemble_cases(*_draw()))
    replies = solution.run(cases)
    conservative_reward = _ref("conservative_reward")
    for i, case in enumerate(cases):
        r, rule, lam = case.args
        want = conservative_reward(r, rule, lam)
        result = replies.got(i, case)
        got = _tensor(result.out, "the rewards", want.shape)
        if _close(got, want):
            if not result.requires_grad:
                raise Fail(
                    "your reward has the right value but no gradient flows through it: keep it "
                    "in torch (no .item(), numpy, float() or .detach())"
                )
            continue
        if not torch.isfinite(got).all() and "K1" in case.tags:
            hint = (
                "with one model the spread is 0, but dividing by K - 1 = 0 gives nan: the "
                "members' std divides by K (unbiased=False)"
            )
        else:
            hint = next(
                (h for v, h in _ensemble_variants(r, rule, lam) if _close(got, v)),
                "the rewards differ: per response, the mean, the min, or the mean less lam "
                "times the std (dividing by K) over the K members",
            )
        raise Fail(
            f"{hint}\n  case: {case.what}\n  rewards {_show(r)}\n  expected "
            f"{_show(want)}\n  got      {_show(got)}"
        )
    return len(cases)


# ----------------------------------------------------------------------------- the registry
# name -> (function the student writes, the check, the REFERENCES whose files a copy is sought
# in). The file is exercises/<name>.py.
EXERCISES = {
    "ex1_pooling": ("last_real_index", check_pooling, ("last_real_index",)),
    "ex2_logsig": ("logsig_loss", check_logsig, ("pairwise_loss",)),
    "ex3_rope": ("apply_rope", check_rope, ("apply_rope",)),
    "ex4_gae": ("gae", check_gae, ("gae",)),
    "ex5_boxed": ("extract_boxed", check_boxed, ("extract_boxed",)),
    "ex6_value_loss": ("value_loss", check_value_loss, ("value_loss",)),
    "ex7_lm_loss": (
        "lm_regularized_loss",
        check_lm_loss,
        ("score_last_token", "pairwise_loss", "LMRegularizedRewardModel"),
    ),
    "ex8_grad_accum": ("accumulate", check_grad_accum, ()),
    "ex9_gsm8k_reward": (
        "gsm8k_reward",
        check_gsm8k_reward,
        ("gsm8k_reward", "extract_gsm8k", "answers_match"),
    ),
    "ex10_kl_penalty": ("kl_penalty_rewards", check_kl_penalty, ("kl_penalty_rewards",)),
    "ex11_dpo_loss": ("dpo_loss", check_dpo_loss, ("dpo_loss",)),
    "ex12_prm_best_of_n": ("select_best", check_prm_best_of_n, ("solution_reward",)),
    "ex13_conservative_reward": (
        "conservative_reward",
        check_conservative_reward,
        ("conservative_reward",),
    ),
}


def resolve(name):
    """'ex1', 'ex1_pooling' or 'ex1_pooling.py' (or a path to one) -> 'ex1_pooling'."""
    stem = os.path.basename(str(name)).removesuffix(".py")
    matches = [k for k in EXERCISES if k == stem or k.split("_")[0] == stem]
    if len(matches) != 1:
        raise KeyError(f"unknown exercise {name!r}; choose from {', '.join(EXERCISES)}")
    return matches[0]


# what a passing solution was compared with, where it is not nanoRM's function of its name
REFERENCE = {
    "ex2_logsig": 'reward.pairwise_loss("logsig")',
    "ex7_lm_loss": "reward.py's score_last_token, pairwise_loss and response_lm_loss",
    "ex8_grad_accum": "one big batch's gradients",
}


def check(solution, name):
    """(passed, message) for one exercise. solution: the path of the student's file (or a module
    loaded from one: its file is what is checked)."""
    name = resolve(name)
    path = getattr(solution, "__file__", solution)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError("check() takes the path of a solution file")
    try:
        solution = Solution(path, name)
        tree = ast.parse(solution.source, filename=solution.path)
    except (OSError, SyntaxError, ValueError) as e:
        return False, f"could not import {path}: {type(e).__name__}: {e}"
    function = EXERCISES[name][0]
    copied = _copied(tree, name)
    if copied:
        where, what = copied
        return False, (
            f"copied from {where}: your file holds nanoRM's {what} (the same statements, "
            f"whatever the names). Write {function} yourself; read nanoRM's version after "
            "yours passes."
        )
    hint = _imports_the_answer(tree, function)
    if hint:
        return False, hint
    try:
        n = EXERCISES[name][1](solution)
    except NotImplementedError:
        return False, "not implemented yet: replace the TODO (and its raise NotImplementedError)"
    except (Fail, Raised) as e:
        return False, str(e)
    except Exception as e:  # a reply the checks could not make sense of
        return False, f"the checker could not judge what your file sent back: {e!r}"
    against = REFERENCE.get(name, f"nanoRM's {function}")
    return True, f"PASS ({n} checks against {against})"


def line(label, passed, message):
    """The line `check.py` prints for one exercise."""
    message = message.removeprefix("PASS ") if passed else message
    lines = [w for part in message.split("\n") for w in textwrap.wrap(part, 77) or [""]]
    return f"{label:<16} {'PASS' if passed else 'FAIL'}  " + ("\n" + " " * 23).join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description="Check the nanoRM classroom exercises.")
    p.add_argument(
        "names",
        nargs="*",
        help="exercises to check (ex1, ex2_logsig, ...) or paths of files; default all",
    )
    p.add_argument("--solutions", action="store_true", help="check exercises/solutions/ instead")
    p.add_argument("--device", default=None, help="where the inputs go (default: cuda if any)")
    args = p.parse_args(argv)
    _RUNNER.start(fork=True)  # before anything of nanoRM is imported here, or any case drawn
    if args.device:
        global DEVICE
        DEVICE = torch.device(args.device)
    folder = SOLUTIONS if args.solutions else HERE
    targets = []
    for n in args.names or list(EXERCISES):
        if n.endswith(".py") and os.path.isfile(n):
            targets.append((n, resolve(n), n))
        else:
            targets.append((resolve(n), resolve(n), os.path.join(folder, resolve(n) + ".py")))
    failed = 0
    for label, name, path in targets:
        passed, message = check(path, name)
        failed += not passed
        print(line(label, passed, message), flush=True)
    print(f"\n{len(targets) - failed}/{len(targets)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    elif sys.argv[1:] == ["--once"]:
        _once()
    else:
        sys.exit(main())
