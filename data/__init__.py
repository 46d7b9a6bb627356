"""
Reading and writing the data of a reward model: preference rows (rows.py), their chat layout
(chat.py), tokenizers (tokenizer.py, bpe.py), prepared datasets and batches (pairs.py), and the
scripts that prepare them (prepare.py, arith/, hh_rlhf/).

What every command here does with a mistake, data's and the training scripts' alike: an expected
failure (a missing or corrupt file, a bad row, an option out of range) is one line on stderr that
names the file or option and what to do, exit status 2; anything else is a bug and keeps its
traceback. Every file is written aside and renamed (`atomic_write`), so a kill at any moment
leaves the previous file whole.

    from data import UsageError, run
    ...
    if __name__ == "__main__":
        run(main)   # main raises UsageError (BadRowError is one) or FileNotFoundError
"""

import argparse
import os
import sys
from contextlib import contextmanager


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


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with an error as one line like every other failure (--help shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


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
