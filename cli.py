"""
What every command line here does with a mistake: an expected failure (a missing or corrupt file,
an option out of range, a run that would replace another) is one line on stderr that names the
file or option and what to do, exit status 2. Anything else is a bug and keeps its traceback.

    from cli import UsageError, run
    ...
    if __name__ == "__main__":
        run(main)   # main raises UsageError, FileNotFoundError or BadRowError for those

A script's options are one dataclass whose fields say their default, help and check (`opt`);
`parse_config` turns it into argparse options and checks every value, so a wrong one is one
line naming the option. Files are written aside and renamed (`atomic_write`), so a kill at any
moment leaves the previous file whole.

Expected failures are UsageError (a ValueError, so callers that catch ValueError still do; the
data's BadRowError is one), plus FileNotFoundError, whose message already names the file.
"""

import argparse
import os
import pickle
import re
import sys
import zipfile
from contextlib import contextmanager
from dataclasses import field, fields

import torch


class UsageError(ValueError):
    """An expected failure: the message says which file or option, and what to do."""


def run(main, argv=None):
    """main(argv), with an expected failure printed as `<script>: error: <message>`, exit 2."""
    try:
        return main(argv)
    except (UsageError, FileNotFoundError) as e:  # data.pairs.BadRowError is a UsageError
        message = " ".join(str(e).split())  # one line, whatever the message held
        print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
        sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with an error as one line like every other failure (--help shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def boolean(text):
    """An option's true/false, 1/0 or yes/no (any case); anything else is an error, never False."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in value:
        raise argparse.ArgumentTypeError(f"expected true/false, 1/0 or yes/no, got {text!r}")
    return value[text.lower()]


def is_torch_file(path):
    """Whether path starts as torch.save's zip archive does (a truncated one does too)."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(2) == b"PK"


def load_torch(path, **kwargs):
    """torch.load(path, weights_only=True), a missing or unreadable file as one UsageError."""
    if not os.path.isfile(path):
        raise UsageError(f"{path} not found")
    if not is_torch_file(path):
        raise UsageError(f"{path} is corrupt (not a zip archive, which torch.save writes)")
    if not zipfile.is_zipfile(path):  # the archive's directory is at its end: cut off
        raise UsageError(f"{path} is corrupt (truncated: its zip archive has no end)")
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except (RuntimeError, EOFError, OSError) as e:  # e.g. a truncated file: no central directory
        reason = str(e).split(". ")[0]  # torch's first sentence; the rest is advice
        raise UsageError(f"{path} is corrupt ({reason})") from None
    except pickle.UnpicklingError:
        raise UsageError(f"{path} holds more than tensors and plain data: not loaded") from None


# ----------------------------------------------------------------------------- options
def opt(default, help, check=None):
    """A config field: its default, --help text and check = (test, what the value must be)."""
    return field(default=default, metadata={"help": help, "check": check})


AT_LEAST_1 = (lambda v: v >= 1, ">= 1")
NON_NEGATIVE = (lambda v: v >= 0, ">= 0")
POSITIVE = (lambda v: v > 0, "> 0")


def one_of(*names):
    return (lambda v: v in names, f"one of {', '.join(names)}")


def parse_config(cls, argv=None, description=None):
    """An instance of the dataclass cls from the command line: --field for every field (a bool
    takes --x, --x true/false/1/0; never a silent False), each value checked by its field's
    check. A value that fails is one line: --field must be ..., got ..."""
    p = ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for f in fields(cls):
        if f.type in (bool, "bool"):
            kind = dict(type=boolean, nargs="?", const=True)
        else:
            kind = dict(type=type(f.default) if f.default is not None else str)
        p.add_argument(f"--{f.name}", **kind, default=f.default, help=f.metadata.get("help"))
    cfg = cls(**vars(p.parse_args(argv)))
    for f in fields(cfg):
        test, must = f.metadata.get("check") or (None, None)
        if test and not test(getattr(cfg, f.name)):
            raise UsageError(f"--{f.name} must be {must}, got {getattr(cfg, f.name)!r}")
    return cfg


def check_device(device):
    """A --device this machine has (auto, cpu, cuda, cuda:N, mps), else one line saying why."""
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):
        raise UsageError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        where = "this torch build" if torch.version.cuda is None else "this machine (no GPU seen)"
        raise UsageError(f"--device {device}: CUDA is not available in {where}; use --device cpu")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: there are {torch.cuda.device_count()} GPUs")
    if device == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: MPS is not available here; use --device cpu")
    return device


# ----------------------------------------------------------------------------- files
@contextmanager
def atomic_write(path, mode="wb"):
    """open(path, mode) for writing, but the bytes go to path.tmp, which is flushed to disk and
    renamed over path only when the block ends without an error: a reader, or a kill at any
    moment, sees the old file or the new one, never half of one."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
