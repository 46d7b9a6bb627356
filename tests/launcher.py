"""`python script.py ...`, `python -m module ...` and `python -c code ...` run as a user runs
them, each in a process of its own, less the seconds every command spends importing torch,
numpy and matplotlib (3 s on a 2-core CPU) and torch._dynamo (2 s more, at its first optimizer
step or first model built on the meta device): a launcher process imports those once, and each
command runs in a fork of it, with its own arguments, folder, environment, stdin, stdout and
stderr, and fresh imports of every project module.

Where a fork could differ from a fresh interpreter: the variables that those imports read (OMP_*,
MKL_*, PYTHON*, ...) are the launcher's own, or another launcher starts with the command's
(PYTHONPATH alone is set in each fork's sys.path, as the interpreter would put it; a
sitecustomize module on it is not run);
numpy's global generator is seeded afresh in each fork, as Python's `random` is (torch's starts
at its fixed default in both); the exit runs the atexit functions and flushes stdout and stderr
but tears no module down. A command that must be a plain process (its peak memory measured,
a signal sent to it, the modules it imports counted) runs under subprocess in its test.
NANORM_TEST_FORK=0 runs every command as a subprocess.
"""

import atexit
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# read at import time by torch, numpy, matplotlib or the interpreter itself: a command whose
# environment differs from the launcher's in any of these gets a launcher of its own
AT_IMPORT = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "ATEN_", "TORCH", "PYTORCH", "CUDA",
             "NVIDIA", "MPL", "NUMPY", "PYTHON", "LD_", "HOME", "XDG_")  # fmt: skip

_LAUNCHER = r"""
import atexit, json, os, resource, runpy, sys, threading, time, types
import matplotlib
import matplotlib.figure
import numpy
import torch
import torch._dynamo  # a command imports it at its first optimizer step or meta-device build
mine = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
base = [p for p in sys.path[1:] if p not in mine]  # the interpreter's own, after PYTHONPATH's
sys.stdout.write("ready\n")
sys.stdout.flush()
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid:
        end = time.monotonic() + job["timeout"]
        while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < end:
            time.sleep(0.01)
        timed_out = not done[0]
        if timed_out:  # past the caller's timeout: killed, as subprocess.run would
            os.kill(pid, 9)
            done = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(done[1])
        sys.stdout.write(json.dumps(dict(rc=rc, timed_out=timed_out)) + "\n")
        sys.stdout.flush()
        continue
    # the command: its own stdin, stdout, stderr, folder, environment and arguments
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(os.open(job["out"], os.O_WRONLY), 1)
    os.dup2(os.open(job["err"], os.O_WRONLY), 2)
    sys.stdin = open(0, closefd=False)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    if job["cap"]:  # its address space capped, as a plain process under setrlimit
        resource.setrlimit(resource.RLIMIT_AS, (job["cap"], job["cap"]))
    numpy.random.seed()  # as a fresh interpreter's; Python's random reseeds itself in a fork
    how, what, args = job["how"], job["what"], job["args"]
    sys.path[1:] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + base
    try:
        if how == "-m":
            sys.argv, sys.path[0] = [what, *args], os.getcwd()
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        else:  # -c code, or a script: its __main__ as python makes it (__file__ absolute)
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            if how == "-c":
                sys.argv, sys.path[0], source, name = ["-c", *args], "", what, "<string>"
            else:
                sys.argv, name = [what, *args], os.path.abspath(what)
                sys.path[0] = os.path.dirname(os.path.realpath(what))
                source = open(name, "rb").read()
                main.__file__, main.__cached__ = name, None
            exec(compile(source, name, "exec"), main.__dict__)
        code = 0
    except SystemExit as e:  # as the interpreter reads it
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException as e:  # its traceback from the command's first frame, as python prints
        tb = e.__traceback__.tb_next
        while tb and tb.tb_frame.f_code.co_filename == runpy.__file__:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        code = 1
    # an interpreter's exit, less the second of tearing down torch's modules: the threads
    # joined, the atexit functions run, stdout and stderr flushed (a file the command never
    # closed is not flushed by a teardown here: the command must close what it writes)
    threading._shutdown()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        f.flush()
    os._exit(code)
"""

_launchers = {}  # the AT_IMPORT part of an environment -> its launcher process


def _at_import(env):  # PYTHONPATH: set in each fork's sys.path
    return tuple(
        sorted((k, v) for k, v in env.items() if k.startswith(AT_IMPORT) and k != "PYTHONPATH")
    )


def _launcher(env):
    key = _at_import(env)
    if key not in _launchers:
        p = subprocess.Popen([sys.executable, "-c", _LAUNCHER], cwd="/", env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        if p.stdout.readline() != "ready\n":
            raise RuntimeError("the test launcher did not start")
        _launchers[key] = p
    return _launchers[key]


@atexit.register
def _close():
    for p in _launchers.values():  # its end of input ends its loop
        p.stdin.close()
        p.wait(timeout=60)


def _form(argv):
    """(how, what, args) of `python argv...`, or None where the launcher cannot run it alike."""
    if argv and argv[0] in ("-c", "-m") and len(argv) > 1:
        return argv[0], argv[1], argv[2:]
    if argv and not argv[0].startswith("-"):
        return "", argv[0], argv[1:]
    return None  # interpreter flags (-u, -X, -W ...): a plain subprocess


def python(argv, cwd=ROOT, env=None, timeout=600, cap=0):
    """subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout), the command run in a fork of a launcher that has torch imported; its
    address space capped at cap bytes (0: no cap), so a reader that slurps a file fails there
    instead of taking the machine's memory."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    form = _form(argv)
    if form is None or os.environ.get("NANORM_TEST_FORK") == "0" or not hasattr(os, "fork"):
        limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap))) if cap else None
        cmd = [sys.executable, *argv]
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limit)  # fmt: skip
    how, what, args = form
    p = _launcher(env)
    with tempfile.TemporaryDirectory() as d:
        out, err = Path(d) / "out", Path(d) / "err"
        out.touch(), err.touch()
        job = dict(
            how=how,
            what=what,
            args=args,
            cwd=str(cwd),
            env=env,
            out=str(out),
            err=str(err),
            timeout=timeout or 1e9,
            cap=cap,
        )
        p.stdin.write(json.dumps(job) + "\n")
        p.stdin.flush()
        done = json.loads(p.stdout.readline())
        if done["timed_out"]:
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
        said = (f.read_text(errors="replace") for f in (out, err))
        return subprocess.CompletedProcess([sys.executable, *argv], done["rc"], *said)
