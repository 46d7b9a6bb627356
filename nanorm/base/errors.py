"""
What every command does with a mistake: an expected failure (a missing or corrupt file, a bad
row, an option out of range) is a `UsageError` whose message names the file or option and what
to do; `run(main)` prints it as one line on stderr and exits with status 2. Anything else is a
bug and keeps its traceback.

    from nanorm.base.errors import UsageError, run
    ...
    if __name__ == "__main__":
        run(main)   # main raises UsageError (data.rows.BadRowError is one) or FileNotFoundError
"""

import os
import sys


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
