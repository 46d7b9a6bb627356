"""
A command line's options and files: a script's options are one dataclass whose fields say their
default, help and check (`opt`); `parse_config` turns it into argparse options and checks every
value, so a wrong one is one line naming the option (UsageError, printed by run).
`check_device` refuses a device this machine does not have.
"""

import argparse
import re
from dataclasses import MISSING, field, fields

import torch

from nanorm.base.errors import UsageError


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
    """The type an option's text is read as: its annotation's (float for `float | None`, str
    for `list[str]`)."""
    args = [a for a in getattr(f.type, "__args__", ()) if a is not type(None)]
    return args[0] if args else f.type


def parse_config(cls, argv=None, description=None):
    """An instance of the dataclass cls from the command line: --field for every field (a bool
    takes --x, --x true/false/1/0; never a silent False), each value checked by its field's
    check. A value that fails is one line: --field must be ..., got ..."""
    p = ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for f in fields(cls):
        if value_type(f) is bool:  # bool, or bool | None (unset: None)
            kind = dict(type=boolean, nargs="?", const=True)
        elif getattr(f.type, "__origin__", None) is list:  # list[str]: one or more values
            kind = dict(type=f.type.__args__[0], nargs="+")
        else:
            kind = dict(type=value_type(f))
        if f.default is MISSING:
            kind["required"] = True
        else:
            kind["default"] = f.default
        p.add_argument(f"--{f.name}", **kind, help=f.metadata.get("help"))
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
