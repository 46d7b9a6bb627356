"""
What every command shares: its options, its mistakes, and how it writes files.

Mistakes. An expected failure (a missing or corrupt file, a
bad row, an option out of range) is a `UsageError` whose message names the file or option and
what to do; `run(main)` prints it as one line on stderr and exits with status 2; anything else is
a bug and keeps its traceback. A script's options are one dataclass whose fields say their
default, help and check (`opt`); `parse_config` turns it into argparse options and checks every
value, so a wrong one is one line naming the option. `check_device` refuses a device this machine
does not have.

Files. Nothing a user has is lost: a command writes only files it made or a previous run of it
made, and says which before it writes; it never writes through a link; every refusal is one line
naming the input and the fix, exit 2. Each output folder holds a record, .nanorm, of the files
nanoRM wrote there and which command wrote each (`Outputs`); a command checks it before any work
and adds its names before it writes, and a file the record does not list is never replaced or
deleted, --overwrite or not. A file is written aside under a fresh name (created exclusively,
never through a link), flushed to disk and renamed whole (`atomic_write`; a folder: `new_folder`),
so a reader, or a kill at any moment, sees the old file or the new one, never half of one. A full
or read-only disk is one line naming the path (`run`), and the previous file is kept.

    from nanorm.base.command import UsageError, run
    ...
    if __name__ == "__main__":
        run(main)   # main raises UsageError (data.rows.BadRowError is one) or FileNotFoundError
"""

import argparse
import errno
import json
import math
import os
import re
import shutil
import sys
from contextlib import contextmanager
from dataclasses import MISSING, field, fields, replace

import torch


class UsageError(ValueError):
    """An expected failure: the message says which file or option, and what to do."""


def run(main, argv=None):
    """main(argv), with an expected failure printed as `<script>: error: <message>`, exit 2: a
    UsageError, a missing file, and a disk that is full or read-only (disk_error)."""
    try:
        return main(argv)
    except (UsageError, FileNotFoundError) as e:  # data.rows.BadRowError is a UsageError
        message = str(e)
    except Exception as e:
        disk = disk_error(e)
        if disk is None:  # a bug: its traceback
            raise
        message = disk_message(disk)
    message = " ".join(message.split())  # one line, whatever the message held
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


def run_folders(cfg):
    """A run's --out_dir and --cache_dir (nanorm.rl, dpo, judge, prm): each a folder where it
    exists (made later if missing); the cache is out_dir unless one is named. cfg, the cache set."""
    for name in ("out_dir", "cache_dir"):
        path = getattr(cfg, name)
        if path and os.path.lexists(path) and not os.path.isdir(path):
            raise UsageError(f"--{name} {path} is not a folder: name a folder (made if missing)")
    return replace(cfg, cache_dir=cfg.cache_dir or cfg.out_dir)


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
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EROFS, errno.EACCES)


def disk_error(e):
    """The OSError of a full or read-only disk, or of a path without permission, that e is or
    wraps (torch.save reports a failed write as a RuntimeError raised while handling it), else
    None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL + NOT_WRITABLE:
            return e
        e = e.__cause__ or e.__context__
    return None


def disk_message(e):
    """disk_error's one line: the path, what the disk said, and what to do."""
    if e.errno in DISK_FULL:
        fix = "free space, or write to another folder; the files written before are kept"
    elif e.errno == errno.EROFS:
        fix = "write to a folder on a writable disk"
    else:
        fix = "give a path you may use, or change its permissions"
    return f"{e.filename or 'a file'}: {e.strerror}: {fix}"


def _aside(path):
    """A fresh hidden name beside path, for a new version of it while it is written."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.{os.urandom(6).hex()}.tmp")


@contextmanager
def atomic_write(path, mode="wb"):
    """open(path, mode) for writing, but the bytes go to a new file beside path (a fresh name,
    created exclusively: never an existing file, never through a link), which is flushed to disk
    and renamed over path only when the block ends without an error; else it is removed and path
    is as it was. A path that is a link is refused: its target is not ours to replace. A full or
    read-only disk raises its OSError, naming path."""
    path = os.fspath(path)
    if os.path.islink(path):
        raise UsageError(f"{path} is a link, and nanoRM never writes through one: remove it")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    tmp = None
    try:
        while tmp is None:
            name = _aside(path)
            try:
                fd, tmp = os.open(name, flags, 0o666), name  # 0o666 less the umask, as open()
            except FileExistsError:  # the name is taken (by another writer): another one
                continue
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        disk = disk_error(e)  # torch.save's RuntimeError wraps it: the OSError, naming path
        if disk is not None:
            raise OSError(disk.errno, disk.strerror, path) from None
        raise
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.remove(tmp)


def append_text(path, text):
    """Add text at the end of path (made if missing), never through a link."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise UsageError(
            f"{path} is a link, and nanoRM never writes through one: remove it"
        ) from None
    with os.fdopen(fd, "a") as f:
        f.write(text)


@contextmanager
def new_folder(path):
    """A new folder beside path to fill, which replaces path whole when the block ends without
    an error (the old folder moved aside, then removed), so that no file of the old one
    survives beside the new ones; after an error it is removed and path is as it was."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    while True:
        tmp = _aside(path)
        try:
            os.mkdir(tmp, 0o777)  # 0o777 less the umask, as os.makedirs makes a folder
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        if not os.path.lexists(path):
            os.replace(tmp, path)
            return
        old = _aside(path)
        os.rename(path, old)
        try:
            os.rename(tmp, path)
        except BaseException:
            os.rename(old, path)  # the previous folder back where it was
            raise
        shutil.rmtree(old)
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp)


# ----------------------------------------------------------------------------- what is whose
MARKER = ".nanorm"  # in each output folder: the files nanoRM wrote there, and which command


MAX_RECORD_BYTES = 1 << 20  # a record lists file names: far less than a megabyte


def write_record(folder, files):
    """folder/.nanorm := {file name: the command that wrote it}, written aside and renamed."""
    with atomic_write(os.path.join(folder, MARKER), "w") as f:
        json.dump({"files": dict(sorted(files.items()))}, f, indent=1)


def read_record(folder, flag):
    """{file name: the command that wrote it} of folder/.nanorm, or None where there is none.
    flag: the option that named the folder, for the message."""
    path = os.path.join(folder, MARKER)
    if not os.path.lexists(path):
        return None
    files = (json_object(path, MAX_RECORD_BYTES) or {}).get("files")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise UsageError(
            f"{path} is not nanoRM's record of the files it wrote: remove it, or choose "
            f"another {flag}"
        )
    return files


def json_object(path, max_bytes=64 << 20):
    """The JSON object in path, or None where path is not a plain file (absent, a link, a
    folder), holds over max_bytes (checked before it is read), or is not a JSON object: how a
    command tells whether a file in an output folder is one nanoRM wrote."""
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > max_bytes:
            return None
        with open(path) as f:
            held = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    return held if isinstance(held, dict) else None


class Outputs:
    """The files `command` writes into `folder` (named by the option `flag`): names, file or
    folder names in it. check() refuses, in one line, a folder that is a file, a name that is a
    link, and a name already there that the record does not give to this command: a file the
    user put there, or another command wrote. claim() checks again, makes the folder and adds
    the names to the record, before any of them is written. earlier(folder): whether a folder
    without a record holds what an older nanoRM (which kept none) wrote by this command, told by
    its content; its names there then count as this command's."""

    def __init__(self, folder, command, names, flag, earlier=None):
        self.folder, self.command, self.names = os.fspath(folder), command, list(names)
        self.flag, self.earlier = flag, earlier

    def check(self):
        """Refuse what must not be written over; -> the folder's record ({} if none)."""
        folder, flag = self.folder, self.flag
        if not os.path.lexists(folder):
            return {}
        if not os.path.isdir(folder):
            raise UsageError(f"{flag} {folder} is a file: give a folder")
        files = read_record(folder, flag)
        kept = "its record, .nanorm, does not list it" if files is not None else "no .nanorm record"
        if files is None:
            files = {}
            if self.earlier is not None and self.earlier(folder):  # an older nanoRM's output
                there = (n for n in self.names if os.path.lexists(os.path.join(folder, n)))
                files = dict.fromkeys(there, self.command)
        for name in self.names:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                raise UsageError(
                    f"{path} is a link, and nanoRM never writes through one: remove it, or "
                    f"choose another {flag}"
                )
            if not os.path.lexists(path) or files.get(name) == self.command:
                continue
            if name in files:
                raise UsageError(
                    f"{path} was written by {files[name]}, not {self.command}: choose another "
                    f"{flag}"
                )
            raise UsageError(
                f"{path} is not a file nanoRM wrote ({kept}): move it away, or choose another "
                f"{flag}"
            )
        return files

    def claim(self):
        """check(), then the names added to the record (the folder made if missing)."""
        files = self.check() | dict.fromkeys(self.names, self.command)
        if os.path.isdir(self.folder) and read_record(self.folder, self.flag) == files:
            return  # recorded already
        os.makedirs(self.folder, exist_ok=True)
        write_record(self.folder, files)
