"""
How nanoRM writes a file: aside, then renamed whole (`atomic_write`), so a reader, or a kill at
any moment, sees the old file or the new one, never half of one.
"""

import os
from contextlib import contextmanager


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
