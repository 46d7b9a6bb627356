"""
What every command shares: its options, its mistakes, and how it writes files.

Mistakes. An expected failure (a missing or corrupt file, a
bad row, an option out of range) is a `UsageError` whose message names the file or option and
what to do; `run(main)` prints it as one line on stderr and exits with status 2; anything else is
a bug and keeps its traceback. A script's options are one dataclass whose fields say their
default, help and check (`opt`); `parse_config` turns it into argparse options and checks every
value, so a wrong one is one line naming the option. `check_device` refuses a device this machine
does not have.

Files. A command writes a file aside and renames it whole (`atomic_write`), so a reader, or a
kill at any moment, sees the old file or the new one, never half of one.

    from nanorm.base.command import UsageError, run
    ...
    if __name__ == "__main__":
        run(main)   # main raises UsageError (data.rows.BadRowError is one) or FileNotFoundError
"""

import argparse
import math
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import MISSING, field, fields

import torch


class UsageError(ValueError):
    """An expected failure: the message says which file or option, and what to do."""


def run(main, argv=None):
    """main(argv), with an expected failure printed as `<script>: error: <message>`, exit 2."""
    try:
        return main(argv)
    except (UsageError, FileNotFoundError) as e:  # data.rows.BadRowError is a UsageError
        message = " ".join(str(e).split())  # one line, whatever the message held
        print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
        sys.exit(2)


def boolean(text):
    """An option's true/false, 1/0 or yes/no (any case); anything else is an error, never False."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in value:
        raise argparse.ArgumentTypeError(f"expected true/false, 1/0 or yes/no, got {text!r}")
    return value[text.lower()]


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with an error as one line like every other failure (--help shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


# ----------------------------------------------------------------------------- options
def opt(default, help, check=None):
    """A config field: its default, --help text and check = (test, what the value must be).
    default REQUIRED: the option must be given."""
    if default is REQUIRED:
        return field(metadata={"help": help, "check": check})
    return field(default=default, metadata={"help": help, "check": check})


REQUIRED = object()  # opt's default for an option without one


AT_LEAST_1 = (lambda v: v >= 1, ">= 1")
NON_NEGATIVE = (lambda v: v >= 0, ">= 0")
POSITIVE = (lambda v: v > 0, "> 0")


def one_of(*names):
    return (lambda v: v in names, f"one of {', '.join(names)}")


def value_type(f):
    """The type an option's value has: its annotation's, less None (float for `float | None`,
    list[str] for `list[str] | None`)."""
    if getattr(f.type, "__origin__", None) is list:
        return f.type
    args = [a for a in getattr(f.type, "__args__", ()) if a is not type(None)]
    return args[0] if args else f.type


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help: each option's default beside its help, the description as written."""


def parse_config(cls, argv=None, description=None):
    """An instance of the dataclass cls from the command line: --field for every field (a bool
    takes --x, --x true/false/1/0; never a silent False), each value checked by its field's
    check. A value that fails is one line: --field must be ..., got ..."""
    p = ArgumentParser(description=description, formatter_class=HelpFormatter)
    for f in fields(cls):
        if value_type(f) is bool:  # bool, or bool | None (unset: None)
            kind = dict(type=boolean, nargs="?", const=True)
        elif getattr(value_type(f), "__origin__", None) is list:  # list[str]: one or more
            kind = dict(type=value_type(f).__args__[0], nargs="+")
        else:
            kind = dict(type=value_type(f))
        if f.default is MISSING:
            kind["required"] = True
        else:
            kind["default"] = f.default
        p.add_argument(f"--{f.name}", **kind, help=f.metadata.get("help"))
    cfg = cls(**vars(p.parse_args(argv)))
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--{f.name} must be a finite number, got {value}")
        if isinstance(value, int) and not -(2**63) <= value < 2**63:  # torch's int64
            raise UsageError(f"--{f.name} must fit in 64 bits, got {value}")
        test, must = f.metadata.get("check") or (None, None)
        if test and not test(value):
            raise UsageError(f"--{f.name} must be {must}, got {value!r}")
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
    renamed over path only when the block ends without an error."""
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
